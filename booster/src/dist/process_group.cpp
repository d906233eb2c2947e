// process_group.cpp — the c10d adapter: rendezvous, sub-groups, collectives, and the emulations
// Gloo lacks.
#include "booster/dist/process_group.h"

#include "process_group_impl.h"
#include "booster/dist/device_backend.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <utility>

namespace booster::dist {

// ---------------------------------------------------------------------------------------------
// Work

bool Work::is_completed() const {
  if (!impl_ || impl_->done) return true;
  if (impl_->ready) return impl_->ready();
  return !impl_->work || impl_->work->isCompleted();
}

void Work::wait() {
  if (!impl_ || impl_->done) return;
  try {
    if (impl_->work) impl_->work->wait();
  } catch (const std::exception& e) {
    impl_->done = true;
    const std::string health = impl_->health ? impl_->health->diagnose(impl_->world) : "";
    throw DistError("booster: " + impl_->what + " failed: " + e.what() +
                    "\n(another rank may have exited or raised an error, or the operation timed out;"
                    " see that rank's log)" + health);
  }
  impl_->done = true;
  if (impl_->finish) impl_->finish();
}

namespace detail {

std::string describe(const char* op, const at::Tensor& t) {
  return std::string(op) + " of " + std::to_string(t.numel()) + " " +
         std::string(c10::toString(t.scalar_type())) + " elements";
}

Work make_work(c10::intrusive_ptr<c10d::Work> w, std::function<void()> finish, std::string what,
               const ProcessGroup::Impl* group) {
  auto impl = std::make_shared<Work::Impl>();
  if (group != nullptr && group->health) {
    if (group->world) group->health->note_collective();
    impl->health = group->health;
    impl->world = group->world;
  }
  impl->work = std::move(w);
  impl->finish = std::move(finish);
  impl->what = std::move(what);
  return Work(impl);
}

}  // namespace detail

using detail::describe;
using detail::make_work;

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM:
    case ReduceOp::AVG: return c10d::ReduceOp::SUM;
    case ReduceOp::MAX: return c10d::ReduceOp::MAX;
    case ReduceOp::MIN: return c10d::ReduceOp::MIN;
    case ReduceOp::PRODUCT: return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

void check_dense(const at::Tensor& t, const char* op) {
  if (!t.defined()) throw DistError(std::string("booster: ") + op + ": tensor is undefined");
  if (!t.is_contiguous())
    throw DistError(std::string("booster: ") + op +
                    ": tensor must be contiguous (call .contiguous() and copy the result back)");
}

std::string list_text(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + "]";
}

// FNV-1a over the ranks: what new_group compares across ranks instead of the lists themselves.
int64_t hash_ranks(const std::vector<int>& ranks) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(ranks.size());
  for (int r : ranks) mix(static_cast<uint32_t>(r));
  return static_cast<int64_t>(h);
}

// The split color of a sub-group (DeviceBackendRequest::split_color): a non-negative int from the
// members' world ranks, equal on every member.
int split_color(const std::vector<int>& global_ranks) {
  return static_cast<int>(static_cast<uint64_t>(hash_ranks(global_ranks)) & 0x7fffffff);
}

// The sub-group of `parent` whose rank r is parent rank members[r]; the calling rank is a member.
// Only members call this; they connect through the shared store under `key_prefix`.
std::shared_ptr<ProcessGroup> make_subgroup(const ProcessGroup::Impl& parent, const std::vector<int>& members,
                                            const std::string& key_prefix) {
  auto impl = std::make_unique<ProcessGroup::Impl>();
  impl->store = parent.store;
  impl->gloo = parent.gloo;
  impl->rank = static_cast<int>(std::find(members.begin(), members.end(), parent.rank) - members.begin());
  impl->size = static_cast<int>(members.size());
  impl->backend = parent.backend;
  impl->timeout_s = parent.timeout_s;
  impl->native_avg = parent.native_avg;
  impl->native_bf16 = parent.native_bf16;
  impl->key_prefix = key_prefix;
  impl->ranks_in_parent = members;
  impl->health = parent.health;
  for (int m : members) impl->global_ranks.push_back(parent.global_ranks[m]);
  impl->device_backend = parent.device_backend;
  impl->device_type = parent.device_type;
  if (impl->size > 1) {
    try {
      auto prefixed = c10::make_intrusive<c10d::PrefixStore>(key_prefix, parent.store);
      impl->pg = detail::make_gloo_process_group(prefixed, impl->rank, impl->size, *parent.gloo);
    } catch (const std::exception& e) {
      throw DistError("booster: connecting the sub-group of world ranks " + list_text(impl->global_ranks) +
                      " as its rank " + std::to_string(impl->rank) + " failed within " +
                      std::to_string(parent.timeout_s) + " s: " + e.what() +
                      "\n(every rank of the parent group must make the same new_group/split calls in the same order)");
    }
    if (!impl->device_backend.empty())
      detail::attach_device_backend(*impl, c10::make_intrusive<c10d::PrefixStore>(key_prefix, parent.store), parent.pg,
                                    std::chrono::milliseconds(static_cast<int64_t>(parent.timeout_s * 1000)),
                                    split_color(impl->global_ranks));
  } else {
    detail::device_backend_non_member(parent);  // a one-rank group gets no backend
  }
  return std::make_shared<ProcessGroup>(std::move(impl));
}

}  // namespace

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessGroup::~ProcessGroup() = default;
int ProcessGroup::rank() const { return impl_->rank; }
int ProcessGroup::size() const { return impl_->size; }
const std::string& ProcessGroup::backend() const { return impl_->backend; }
double ProcessGroup::timeout_s() const { return impl_->timeout_s; }

// ---------------------------------------------------------------------------------------------
// Rendezvous

std::shared_ptr<ProcessGroup> ProcessGroup::rendezvous(const RendezvousOptions& o) {
  if (o.world_size < 1) throw std::invalid_argument("booster: world_size must be >= 1, got " + std::to_string(o.world_size));
  if (o.rank < 0 || o.rank >= o.world_size)
    throw std::invalid_argument("booster: rank " + std::to_string(o.rank) + " is outside [0, " +
                                std::to_string(o.world_size) + ")");
  if (o.backend != "gloo" && o.backend != "nccl" && !find_device_backend(o.backend).factory)
    throw std::invalid_argument("booster: unknown backend '" + o.backend +
                                "' (use \"gloo\" or \"nccl\", or a backend registered with "
                                "booster::dist::register_device_backend)");
  if (o.timeout_s <= 0) throw std::invalid_argument("booster: timeout_s must be > 0");
  if (o.port < 0 || o.port > 65535) throw std::invalid_argument("booster: port " + std::to_string(o.port) + " out of range");

  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  auto impl = std::make_unique<Impl>();
  impl->rank = o.rank;
  impl->size = o.world_size;
  impl->backend = o.backend;
  impl->timeout_s = o.timeout_s;
  impl->ranks_in_parent.resize(o.world_size);
  std::iota(impl->ranks_in_parent.begin(), impl->ranks_in_parent.end(), 0);
  impl->global_ranks = impl->ranks_in_parent;

  try {
    if (o.world_size == 1) {
      impl->store = c10::make_intrusive<c10d::HashStore>();
    } else {
      c10d::TCPStoreOptions so;
      so.port = static_cast<uint16_t>(o.port);
      so.isServer = !o.use_agent_store && o.rank == 0;
      so.numWorkers = o.use_agent_store ? c10::optional<size_t>() : c10::optional<size_t>(o.world_size);
      so.waitWorkers = !o.use_agent_store;
      so.timeout = timeout;
      c10::intrusive_ptr<c10d::Store> tcp = c10::make_intrusive<c10d::TCPStore>(o.host, so);
      if (o.use_agent_store)
        impl->store = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_" + std::to_string(o.restart_count), tcp);
      else
        impl->store = tcp;
    }
    impl->gloo = detail::make_gloo_transport(o.host, o.world_size, timeout);
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("booster_world/", impl->store);
    impl->pg = detail::make_gloo_process_group(prefixed, o.rank, o.world_size, *impl->gloo);
  } catch (const std::exception& e) {
    throw DistError("booster: rendezvous at " + o.host + ":" + std::to_string(o.port) + " as rank " +
                    std::to_string(o.rank) + " of " + std::to_string(o.world_size) + " failed within " +
                    std::to_string(o.timeout_s) + " s: " + e.what() +
                    "\n(check MASTER_ADDR/MASTER_PORT, that rank 0 started, and that the port is free)");
  }
  if (o.backend != "gloo") {  // a device backend beside Gloo (CPU tensors stay on Gloo)
    impl->device_backend = o.backend;
    detail::attach_device_backend(*impl, c10::make_intrusive<c10d::PrefixStore>("booster_world/", impl->store),
                                  nullptr, timeout);
  }
  impl->world = true;
  if (o.world_size > 1)
    impl->health = std::make_shared<detail::Health>(impl->store, o.rank, o.world_size, o.timeout_s);
  return std::make_shared<ProcessGroup>(std::move(impl));
}

// ---------------------------------------------------------------------------------------------
// Collectives

Work ProcessGroup::allreduce(std::vector<at::Tensor>& tensors, ReduceOp op) {
  if (tensors.empty()) return Work();
  if (tensors.size() == 1) return allreduce(tensors[0], op);
  // Several tensors: c10d would treat them as several local inputs of ONE reduction, so they are
  // flattened into one buffer (same dtype required), reduced once, and copied back on wait.
  for (auto& t : tensors) {
    check_dense(t, "allreduce");
    if (t.scalar_type() != tensors[0].scalar_type())
      throw DistError("booster: allreduce of several tensors needs one dtype, got " +
                      std::string(c10::toString(tensors[0].scalar_type())) + " and " +
                      std::string(c10::toString(t.scalar_type())) + "; reduce them in separate calls");
  }
  std::vector<at::Tensor> views;
  for (auto& t : tensors) views.push_back(t.view({-1}));
  at::Tensor flat = at::cat(views, 0);
  auto inner = std::make_shared<Work>(allreduce(flat, op));
  auto impl = std::make_shared<Work::Impl>();
  impl->what = describe("allreduce", flat);
  impl->finish = [inner, flat, views]() mutable {
    inner->wait();
    int64_t off = 0;
    for (auto& v : views) {
      v.copy_(flat.narrow(0, off, v.numel()));
      off += v.numel();
    }
  };
  return Work(impl);
}

Work ProcessGroup::allreduce(at::Tensor& tensor, ReduceOp op) {
  check_dense(tensor, "allreduce");
  if (op == ReduceOp::AVG && !at::isFloatingType(tensor.scalar_type()))
    throw DistError("booster: allreduce with AVG needs a floating-point tensor, got " +
                    std::string(c10::toString(tensor.scalar_type())) + "; use SUM and divide yourself");
  if (detail::needs_staging(*impl_, tensor))
    return detail::staged({tensor}, {true}, [this, op](std::vector<at::Tensor>& h) { return allreduce(h[0], op); });
  std::string what = describe("allreduce", tensor);
  const bool device = detail::on_device_backend(*impl_, tensor);
  bool cast = tensor.scalar_type() == at::kBFloat16 && !impl_->native_bf16 && !device;
  // Gloo: bf16 as a pairwise reduce-scatter + all-gather in bf16 (half the bytes of fp32).
  if (cast && impl_->pg && impl_->size > 1) return detail::allreduce_by_halves(*impl_, tensor, op, what);
  std::vector<at::Tensor> wire{cast ? tensor.to(at::kFloat) : tensor};
  c10d::AllreduceOptions ao;
  ao.reduceOp = device ? detail::device_reduce_op(op) : to_c10d(op);
  auto w = impl_->pg ? impl_->pg->allreduce(wire, ao) : c10::intrusive_ptr<c10d::Work>();
  bool avg = op == ReduceOp::AVG && !impl_->native_avg && !device && impl_->pg;
  int size = impl_->size;
  at::Tensor out = tensor;
  return make_work(w, [out, wire, cast, avg, size]() mutable {
    if (avg) wire[0].div_(size);
    if (cast) out.copy_(wire[0]);
  }, what, impl_.get());
}

Work ProcessGroup::broadcast(at::Tensor& tensor, int root) {
  check_dense(tensor, "broadcast");
  if (root < 0 || root >= impl_->size)
    throw DistError("booster: broadcast root " + std::to_string(root) + " outside [0, " + std::to_string(impl_->size) + ")");
  if (detail::needs_staging(*impl_, tensor))
    return detail::staged({tensor}, {true}, [this, root](std::vector<at::Tensor>& h) { return broadcast(h[0], root); });
  bool cast = tensor.scalar_type() == at::kBFloat16 && !impl_->native_bf16 && !detail::on_device_backend(*impl_, tensor);
  std::vector<at::Tensor> wire{cast ? tensor.to(at::kFloat) : tensor};
  c10d::BroadcastOptions bo;
  bo.rootRank = root;
  auto w = impl_->pg ? impl_->pg->broadcast(wire, bo) : c10::intrusive_ptr<c10d::Work>();
  at::Tensor out = tensor;
  return make_work(w, [out, wire, cast]() mutable { if (cast) out.copy_(wire[0]); }, describe("broadcast", tensor),
                   impl_.get());
}

Work ProcessGroup::allgather(std::vector<at::Tensor>& outputs, const at::Tensor& input) {
  check_dense(input, "allgather");
  if (static_cast<int>(outputs.size()) != impl_->size)
    throw DistError("booster: allgather needs " + std::to_string(impl_->size) + " output tensors, got " +
                    std::to_string(outputs.size()));
  for (auto& o : outputs)
    if (o.numel() != input.numel() || o.scalar_type() != input.scalar_type())
      throw DistError("booster: allgather outputs must match the input's numel and dtype");
  if (detail::needs_staging(*impl_, input)) {
    std::vector<at::Tensor> all = outputs;
    all.push_back(input);
    std::vector<bool> back(all.size(), true);
    back.back() = false;
    return detail::staged(all, back, [this](std::vector<at::Tensor>& h) {
      std::vector<at::Tensor> outs(h.begin(), h.end() - 1);
      return allgather(outs, h.back());
    });
  }
  bool cast = input.scalar_type() == at::kBFloat16 && !impl_->native_bf16 && !detail::on_device_backend(*impl_, input);
  std::vector<at::Tensor> in{cast ? input.to(at::kFloat) : input};
  std::vector<std::vector<at::Tensor>> out(1);
  for (auto& o : outputs) out[0].push_back(cast ? at::empty(o.sizes(), o.options().dtype(at::kFloat)) : o);
  c10::intrusive_ptr<c10d::Work> w;
  if (impl_->pg)
    w = impl_->pg->allgather(out, in);
  else
    out[0][0].copy_(in[0]);
  auto targets = outputs;
  return make_work(w, [targets, out, in, cast]() mutable {
    if (cast) for (size_t i = 0; i < targets.size(); ++i) targets[i].copy_(out[0][i]);
  }, describe("allgather", input), impl_.get());
}


Work ProcessGroup::reduce(at::Tensor& tensor, int root, ReduceOp op) {
  check_dense(tensor, "reduce");
  if (root < 0 || root >= impl_->size)
    throw DistError("booster: reduce root " + std::to_string(root) + " outside [0, " + std::to_string(impl_->size) + ")");
  if (op == ReduceOp::AVG && !at::isFloatingType(tensor.scalar_type()))
    throw DistError("booster: reduce with AVG needs a floating-point tensor, got " +
                    std::string(c10::toString(tensor.scalar_type())));
  if (detail::needs_staging(*impl_, tensor))
    return detail::staged({tensor}, {true}, [this, root, op](std::vector<at::Tensor>& h) { return reduce(h[0], root, op); });
  const bool device = detail::on_device_backend(*impl_, tensor);
  bool cast = tensor.scalar_type() == at::kBFloat16 && !impl_->native_bf16 && !device;
  std::vector<at::Tensor> wire{cast ? tensor.to(at::kFloat) : tensor};
  c10d::ReduceOptions ro;
  ro.reduceOp = device ? detail::device_reduce_op(op) : to_c10d(op);
  ro.rootRank = root;
  ro.rootTensor = 0;
  auto w = impl_->pg ? impl_->pg->reduce(wire, ro) : c10::intrusive_ptr<c10d::Work>();
  bool avg = op == ReduceOp::AVG && !impl_->native_avg && !device && impl_->pg;
  bool is_root = impl_->rank == root;
  int size = impl_->size;
  at::Tensor out = tensor;
  return make_work(w, [out, wire, cast, avg, size, is_root]() mutable {
    if (!is_root) return;
    if (avg) wire[0].div_(size);
    if (cast) out.copy_(wire[0]);
  }, describe("reduce", tensor), impl_.get());
}

void ProcessGroup::barrier() {
  if (!impl_->pg) return;
  if (impl_->health && impl_->world) impl_->health->note_collective();
  try {
    // The CPU backend's barrier, not c10d::ProcessGroup::barrier: that one assigns a function-static
    // tensor, a data race (double free) when ranks run as threads of one process.
    impl_->pg->getBackend(c10::DeviceType::CPU)->barrier(c10d::BarrierOptions())->wait();
  } catch (const std::exception& e) {
    throw DistError(std::string("booster: barrier failed: ") + e.what() +
                    (impl_->health ? impl_->health->diagnose(impl_->world) : std::string()));
  }
}

// ---------------------------------------------------------------------------------------------
// Blocking helpers

std::vector<std::vector<int64_t>> ProcessGroup::all_gather_int64(const std::vector<int64_t>& values) {
  auto n = static_cast<int64_t>(values.size());
  at::Tensor in = at::empty({std::max<int64_t>(n, 1)}, at::kLong);
  for (int64_t i = 0; i < n; ++i) in[i] = values[i];
  at::Tensor out = at::empty({impl_->size * in.numel()}, at::kLong);
  all_gather_into_tensor(out, in).wait();
  std::vector<std::vector<int64_t>> result(impl_->size, std::vector<int64_t>(n));
  auto acc = out.accessor<int64_t, 1>();
  for (int r = 0; r < impl_->size; ++r)
    for (int64_t i = 0; i < n; ++i) result[r][i] = acc[r * in.numel() + i];
  return result;
}

double ProcessGroup::allreduce_scalar(double value, ReduceOp op) {
  at::Tensor t = at::full({1}, value, at::kDouble);
  allreduce(t, op).wait();
  return t.item<double>();
}

std::string ProcessGroup::broadcast_string(const std::string& value, int root) {
  at::Tensor len = at::full({1}, static_cast<int64_t>(value.size()), at::kLong);
  broadcast(len, root).wait();
  int64_t n = len.item<int64_t>();
  at::Tensor bytes = at::empty({std::max<int64_t>(n, 1)}, at::kByte);
  if (impl_->rank == root && n > 0) std::memcpy(bytes.data_ptr(), value.data(), n);
  broadcast(bytes, root).wait();
  return std::string(static_cast<const char*>(bytes.data_ptr()), n);
}

// ---------------------------------------------------------------------------------------------
// Sub-groups

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(const std::vector<int>& ranks) {
  const std::string call = "booster: new_group(" + list_text(ranks) + ")";
  if (ranks.empty())
    throw std::invalid_argument(call + ": needs at least one rank of [0, " + std::to_string(impl_->size) + ")");
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> outside, repeated;
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= impl_->size) outside.push_back(sorted[i]);
    if (i > 0 && sorted[i] == sorted[i - 1] && (repeated.empty() || repeated.back() != sorted[i]))
      repeated.push_back(sorted[i]);
  }
  if (!outside.empty())
    throw std::invalid_argument(call + ": rank(s) " + list_text(outside) + " outside this group's [0, " +
                                std::to_string(impl_->size) + ")");
  if (!repeated.empty())
    throw std::invalid_argument(call + ": rank(s) " + list_text(repeated) + " listed more than once");

  const int64_t id = impl_->next_child_id++;
  if (impl_->size > 1) {
    auto hashes = all_gather_int64({hash_ranks(sorted)});
    for (int r = 1; r < impl_->size; ++r) {
      if (hashes[r][0] == hashes[0][0]) continue;
      // Every rank saw the mismatch, so all take part in these two broadcasts and all throw.
      std::string first = broadcast_string(list_text(ranks), 0);
      std::string other = broadcast_string(list_text(ranks), r);
      throw DistError("booster: new_group call " + std::to_string(id) +
                      " of this group got different rank lists: rank 0 passed " + first + ", rank " +
                      std::to_string(r) + " passed " + other +
                      " (every rank of the group must call new_group with the same list, in the same order of calls)");
    }
  }
  if (!std::binary_search(sorted.begin(), sorted.end(), impl_->rank)) {
    detail::device_backend_non_member(*impl_);
    return nullptr;
  }
  return make_subgroup(*impl_, sorted, impl_->key_prefix + "/g" + std::to_string(id));
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  const int64_t id = impl_->next_child_id++;
  std::vector<std::vector<int64_t>> all{{color, key}};
  if (impl_->size > 1) all = all_gather_int64({color, key});
  if (color < 0) {
    detail::device_backend_non_member(*impl_);
    return nullptr;
  }
  std::vector<std::pair<int64_t, int>> order;  // (key, rank) of the ranks with this color
  for (int r = 0; r < impl_->size; ++r)
    if (all[r][0] == color) order.emplace_back(all[r][1], r);
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  for (const auto& kr : order) members.push_back(kr.second);
  return make_subgroup(*impl_, members, impl_->key_prefix + "/s" + std::to_string(id) + "." + std::to_string(color));
}

const std::vector<int>& ProcessGroup::ranks_in_parent() const { return impl_->ranks_in_parent; }
const std::vector<int>& ProcessGroup::global_ranks() const { return impl_->global_ranks; }

int ProcessGroup::global_rank(int group_rank) const {
  if (group_rank < 0 || group_rank >= impl_->size)
    throw std::invalid_argument("booster: global_rank(" + std::to_string(group_rank) + "): outside this group's [0, " +
                                std::to_string(impl_->size) + ")");
  return impl_->global_ranks[group_rank];
}

int ProcessGroup::group_rank(int global_rank) const {
  auto it = std::find(impl_->global_ranks.begin(), impl_->global_ranks.end(), global_rank);
  return it == impl_->global_ranks.end() ? -1 : static_cast<int>(it - impl_->global_ranks.begin());
}

}  // namespace booster::dist
