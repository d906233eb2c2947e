// process_group_p2p.cpp — point-to-point communication of dist::ProcessGroup (torch.distributed's
// send/recv/isend/irecv/batch_isend_irecv), and tensors sent with their shape and dtype.
//
// c10d::ProcessGroupGloo::send/recv post a Gloo unbound buffer on slot `tag` (Gloo's collectives
// use slots with a non-zero prefix byte, so they never meet) and move the tensor's raw bytes: any
// dtype works, bfloat16 needs no fp32 wire. Sub-groups have their own Gloo context numbered
// in-group, so `peer` is passed through unchanged.
#include "booster/dist/process_group.h"

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>

#include "process_group_impl.h"

namespace booster::dist {

namespace {

// First header word: catches a header that is not one (something else sent on the internal tag).
constexpr int64_t kHeaderCheck = 0x42705032;  // "BpP2"

std::string p2p_what(const char* op, const at::Tensor& t, int peer, int tag) {
  const bool to = op[0] == 'i' ? op[1] == 's' : op[0] == 's';  // isend*/send: "to", recv: "from"
  return detail::describe(op, t) + (to ? " to rank " : " from rank ") + std::to_string(peer) + " (tag " +
         std::to_string(tag) + ")";
}

}  // namespace

void ProcessGroup::check_p2p(const char* op, const at::Tensor* tensor, int peer, int tag) const {
  const std::string call = std::string("booster: ") + op;
  if (!impl_->pg || impl_->size < 2)
    throw std::invalid_argument(call + " with peer " + std::to_string(peer) + ": this group has one rank (rank " +
                                std::to_string(impl_->rank) + " of " + std::to_string(impl_->size) +
                                "), so there is no peer to talk to");
  if (peer < 0 || peer >= impl_->size)
    throw std::invalid_argument(call + ": peer " + std::to_string(peer) + " is outside this group's [0, " +
                                std::to_string(impl_->size) + ") (this is rank " + std::to_string(impl_->rank) + ")");
  if (peer == impl_->rank)
    throw std::invalid_argument(call + ": peer " + std::to_string(peer) + " is this rank (rank " +
                                std::to_string(impl_->rank) + " of " + std::to_string(impl_->size) +
                                "); a rank cannot send to or receive from itself");
  if (tag < 0 || tag > kMaxP2PTag)
    throw std::invalid_argument(call + ": tag " + std::to_string(tag) + " is outside [0, " +
                                std::to_string(kMaxP2PTag) + "] (larger tags are reserved for isend_tensor)");
  if (!tensor) return;
  if (!tensor->defined()) throw std::invalid_argument(call + ": tensor is undefined");
  if (tensor->layout() != at::kStrided)
    throw std::invalid_argument(call + ": tensor must be dense (strided), got layout " +
                                std::string(c10::toString(tensor->layout())));
  if (!tensor->is_contiguous())
    throw std::invalid_argument(call + ": tensor must be contiguous (call .contiguous(); for recv, copy the result back)");
  // A CUDA tensor goes to the group's NCCL backend, or through a host copy on a Gloo-only group.
  if (!tensor->device().is_cpu() && !tensor->device().is_cuda())
    throw std::invalid_argument(call + ": needs a CPU or CUDA tensor, got " + tensor->device().str());
}

Work detail::post_p2p(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, bool send, const at::Tensor& tensor, int peer,
                      int wire_tag, std::string what) {
  std::vector<at::Tensor> wire{tensor};
  c10::intrusive_ptr<c10d::Work> w;
  try {
    w = send ? pg->send(wire, peer, wire_tag) : pg->recv(wire, peer, wire_tag);
  } catch (const std::exception& e) {
    throw DistError("booster: " + what + " failed: " + e.what() +
                    "\n(another rank may have exited or raised an error, or an earlier operation timed out)");
  }
  // The Work keeps `wire` (the tensor) alive until it is waited for or dropped.
  return detail::make_work(std::move(w), [wire]() {}, std::move(what));
}

Work ProcessGroup::post_p2p(bool send, const at::Tensor& tensor, int peer, int wire_tag, std::string what) {
  // Gloo's point-to-point cannot send device memory: a device tensor without a device backend
  // travels through a host copy.
  if (detail::needs_staging(*impl_, tensor))
    return detail::staged({tensor}, {!send}, [this, send, peer, wire_tag, what](std::vector<at::Tensor>& h) {
      return detail::post_p2p(impl_->pg, send, h[0], peer, wire_tag, what);
    });
  return detail::post_p2p(impl_->pg, send, tensor, peer, wire_tag, std::move(what));
}

Work ProcessGroup::isend(const at::Tensor& tensor, int peer, int tag) {
  check_p2p("isend", &tensor, peer, tag);
  return post_p2p(true, tensor, peer, tag, p2p_what("isend", tensor, peer, tag));
}

Work ProcessGroup::irecv(at::Tensor& tensor, int peer, int tag) {
  check_p2p("irecv", &tensor, peer, tag);
  return post_p2p(false, tensor, peer, tag, p2p_what("irecv", tensor, peer, tag));
}

void ProcessGroup::send(const at::Tensor& tensor, int peer, int tag) {
  check_p2p("send", &tensor, peer, tag);
  post_p2p(true, tensor, peer, tag, p2p_what("send", tensor, peer, tag)).wait();
}

void ProcessGroup::recv(at::Tensor& tensor, int peer, int tag) {
  check_p2p("recv", &tensor, peer, tag);
  post_p2p(false, tensor, peer, tag, p2p_what("recv", tensor, peer, tag)).wait();
}

std::vector<Work> ProcessGroup::batch_isend_irecv(std::vector<P2POp>& ops) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::string op = "batch_isend_irecv op " + std::to_string(i) +
                           (ops[i].kind == P2POp::Kind::kSend ? " (isend)" : " (irecv)");
    check_p2p(op.c_str(), &ops[i].tensor, ops[i].peer, ops[i].tag);
  }
  std::vector<Work> works;
  works.reserve(ops.size());
  for (auto& op : ops) {
    const bool send = op.kind == P2POp::Kind::kSend;
    works.push_back(post_p2p(send, op.tensor, op.peer, op.tag,
                             p2p_what(send ? "isend" : "irecv", op.tensor, op.peer, op.tag)));
  }
  return works;
}

// ---------------------------------------------------------------------------------------------
// Tensors with their shape and dtype: header, then data, both on the internal tag.

Work ProcessGroup::isend_tensor(const at::Tensor& tensor, int peer, int tag) {
  check_p2p("isend_tensor", nullptr, peer, tag);
  if (!tensor.defined()) throw std::invalid_argument("booster: isend_tensor: tensor is undefined");
  if (tensor.layout() != at::kStrided || !tensor.device().is_cpu())
    throw std::invalid_argument("booster: isend_tensor: needs a dense CPU tensor");
  if (tensor.dim() > kMaxP2PDims)
    throw std::invalid_argument("booster: isend_tensor: the tensor has " + std::to_string(tensor.dim()) +
                                " dimensions, at most " + std::to_string(kMaxP2PDims) + " are supported");
  at::Tensor header = at::zeros({kP2PHeaderLen}, at::kLong);
  int64_t* h = header.data_ptr<int64_t>();
  h[0] = kHeaderCheck;
  h[1] = static_cast<int64_t>(tensor.scalar_type());
  h[2] = tensor.dim();
  h[3] = tensor.numel();
  for (int64_t d = 0; d < tensor.dim(); ++d) h[4 + d] = tensor.size(d);
  const int wire_tag = kMaxP2PTag + 1 + tag;
  const std::string what = p2p_what("isend_tensor", tensor, peer, tag);
  auto works = std::make_shared<std::vector<Work>>();
  works->push_back(post_p2p(true, header, peer, wire_tag, what + " (header)"));
  // An empty tensor sends no data message (the receiver knows numel 0 from the header).
  if (tensor.numel() > 0) works->push_back(post_p2p(true, tensor.contiguous(), peer, wire_tag, what));
  auto impl = std::make_shared<Work::Impl>();
  impl->what = what;
  impl->finish = [works]() {
    for (auto& w : *works) w.wait();
  };
  return Work(impl);
}

at::Tensor ProcessGroup::recv_tensor(int peer, int tag) {
  check_p2p("recv_tensor", nullptr, peer, tag);
  const int wire_tag = kMaxP2PTag + 1 + tag;
  at::Tensor header = at::zeros({kP2PHeaderLen}, at::kLong);
  const std::string where = " from rank " + std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
  post_p2p(false, header, peer, wire_tag, "recv_tensor header" + where).wait();
  const int64_t* h = header.data_ptr<int64_t>();
  const int64_t ndim = h[2];
  bool ok = h[0] == kHeaderCheck && h[1] >= 0 && h[1] < static_cast<int64_t>(at::ScalarType::Undefined) &&
            ndim >= 0 && ndim <= kMaxP2PDims;
  std::vector<int64_t> sizes;
  int64_t numel = 1;
  for (int64_t d = 0; ok && d < ndim; ++d) {
    ok = h[4 + d] >= 0;
    sizes.push_back(h[4 + d]);
    numel *= h[4 + d];
  }
  if (!ok || numel != h[3])
    throw DistError("booster: recv_tensor" + where + ": the header received is not one sent by isend_tensor "
                    "(check word " + std::to_string(h[0]) + ", dtype code " + std::to_string(h[1]) + ", ndim " +
                    std::to_string(ndim) + "); the peer must send with isend_tensor on the same tag");
  at::Tensor out = at::empty(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(h[1])));
  if (numel > 0) post_p2p(false, out, peer, wire_tag, p2p_what("recv_tensor", out, peer, tag)).wait();
  return out;
}

}  // namespace booster::dist
