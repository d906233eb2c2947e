// flat_param.cpp — a unit's FlatParameter: shard, all-gather, free, reduce-scatter (see
// booster/core/flat_param.h).
#include "booster/core/flat_param.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>

#include <set>
#include <stdexcept>

#include "booster/device.h"
#include "booster/dist/fp8.h"

namespace booster {

FlatParameter::FlatParameter(std::vector<std::pair<std::string, at::Tensor>> params,
                             std::shared_ptr<dist::ProcessGroup> group, FlatParameterOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(std::move(options)) {
  if (!group_) throw std::invalid_argument("booster: FlatParameter needs a process group (got null)");
  if (params_.empty()) throw std::invalid_argument("booster: FlatParameter needs at least one parameter");
  std::set<const void*> seen;
  std::vector<int64_t> numels;
  std::vector<at::Tensor> tensors;
  for (const auto& [name, p] : params_) {
    if (!p.defined()) throw std::invalid_argument("booster: FlatParameter: parameter '" + name + "' is undefined");
    if (!seen.insert(p.unsafeGetTensorImpl()).second)
      throw std::invalid_argument("booster: FlatParameter: parameter '" + name +
                                  "' appears twice (a tensor shared by two names belongs to one unit, once)");
    numels.push_back(p.numel());
    tensors.push_back(p);
  }
  const at::ScalarType original = tensors.front().scalar_type();
  if (options_.compute_dtype == at::ScalarType::Undefined) options_.compute_dtype = original;
  if (options_.reduce_dtype == at::ScalarType::Undefined) options_.reduce_dtype = options_.compute_dtype;
  for (at::ScalarType t : {original, options_.compute_dtype, options_.reduce_dtype})
    if (!at::isFloatingType(t))
      throw std::invalid_argument(std::string("booster: FlatParameter: parameters, compute and reduce dtypes must be "
                                              "floating-point, got ") + c10::toString(t));
  layout_ = make_flat_layout(numels, group_->size());
  at::Tensor flat = flatten_into_views(tensors, layout_);  // throws for mixed dtypes / devices
  aliased_ = group_->size() == 1 && options_.compute_dtype == original && !options_.keep_shard_apart;
  if (aliased_) {
    full_ = flat;
    local_shard_ = flat;
    state_ = State::kUnsharded;
    return;
  }
  local_shard_ = flat.narrow(0, layout_.shard_begin(group_->rank()), layout_.shard_numel).clone();
  if (options_.compute_dtype == original) {
    full_ = flat;
  } else {
    at::NoGradGuard no_grad;
    full_ = flat.to(options_.compute_dtype);
    for (size_t i = 0; i < tensors.size(); ++i)
      tensors[i].set_data(full_.narrow(0, layout_.offsets[i], layout_.numels[i]).view(tensors[i].sizes()));
  }
  state_ = State::kUnsharded;
  reshard();
}

FlatParameter::~FlatParameter() {
  try {
    if (pending_) pending_->work.wait();  // the collective writes into full_: never leave it running
    if (reducing_) reducing_->work.wait();
  } catch (...) {
  }
}

int64_t FlatParameter::unsharded_storage_bytes() const {
  return static_cast<int64_t>(full_.storage().nbytes());
}

void FlatParameter::free_storage() {
  c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
}

void FlatParameter::allocate_storage() {
  const size_t nbytes = static_cast<size_t>(layout_.padded_numel) * full_.element_size();
  c10::StorageImpl* storage = full_.storage().unsafeGetStorageImpl();
  c10::Allocator* allocator = storage->allocator() ? storage->allocator() : c10::GetCPUAllocator();
  storage->set_data_ptr_noswap(allocator->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

void FlatParameter::unshard_async() {
  if (state_ == State::kUnsharded || pending_) return;
  allocate_storage();
  at::NoGradGuard no_grad;
  Pending p;
  // A shard kept on another device (an offloaded shard in host memory) travels to the buffer's device
  // first, queued on the current stream (the collective reads and writes one device, after it);
  // shard_read_ marks when the device has read the host shard (wait_shard_reads).
  const bool host_to_device = local_shard_.device().is_cpu() && !full_.device().is_cpu();
  p.input = local_shard_.to(full_.device(), options_.compute_dtype, /*non_blocking=*/host_to_device);
  if (host_to_device) {
    if (!shard_read_) shard_read_ = std::make_unique<StreamEvent>(full_.device());
    shard_read_->record();
  }
  at::Tensor out = full_;  // the collective's output argument
  p.work = options_.fp8_communication && group_->size() > 1 ? dist::fp8_all_gather_into_tensor(*group_, out, p.input)
                                      : group_->all_gather_into_tensor(out, p.input);
  pending_ = std::move(p);
}

void FlatParameter::wait_shard_reads() {
  if (shard_read_) shard_read_->synchronize();
}

void FlatParameter::finish_pending() {
  if (!pending_) return;
  Pending p = std::move(*pending_);
  pending_.reset();
  p.work.wait();
  state_ = State::kUnsharded;
}

void FlatParameter::unshard() {
  if (state_ == State::kUnsharded) return;
  unshard_async();
  finish_pending();
}

void FlatParameter::reshard() {
  if (aliased_) return;
  finish_pending();
  if (state_ == State::kSharded) return;
  free_storage();
  state_ = State::kSharded;
}

void FlatParameter::reduce_gradients() {
  reduce_gradients_async();
  finish_reduce();
}

void FlatParameter::reduce_gradients_async() {
  finish_reduce();
  at::NoGradGuard no_grad;
  const at::TensorOptions reduce_options = full_.options().dtype(options_.reduce_dtype);
  at::Tensor flat_grad = at::zeros({layout_.padded_numel}, reduce_options);
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].second;
    if (!p.grad().defined()) continue;
    flat_grad.narrow(0, layout_.offsets[i], layout_.numels[i]).copy_(p.grad().reshape({-1}));
    p.mutable_grad() = at::Tensor();
  }
  Reducing r;
  if (group_->size() == 1) {
    r.shard_grad = flat_grad;
  } else if (options_.fp8_communication) {
    flat_grad.div_(group_->size());
    const std::vector<int64_t> counts(static_cast<size_t>(group_->size()), layout_.shard_numel);
    dist::fp8_reduce_scatter_in_place(*group_, flat_grad, counts).wait();
    r.shard_grad = flat_grad.narrow(0, group_->rank() * layout_.shard_numel, layout_.shard_numel).clone();
  } else {
    r.shard_grad = at::empty({layout_.shard_numel}, reduce_options);
    r.work = group_->reduce_scatter_tensor_consuming(r.shard_grad, flat_grad, dist::ReduceOp::AVG);
    r.flat_grad = std::move(flat_grad);
  }
  reducing_ = std::move(r);
}

void FlatParameter::finish_reduce() {
  if (!reducing_) return;
  Reducing r = std::move(*reducing_);
  reducing_.reset();
  at::NoGradGuard no_grad;
  r.work.wait();
  r.flat_grad = at::Tensor();
  at::Tensor shard_grad = std::move(r.shard_grad);
  if (options_.replicate_group && options_.replicate_group->size() > 1)
    options_.replicate_group->allreduce(shard_grad, dist::ReduceOp::AVG).wait();
  if (shard_grad.scalar_type() != local_shard_.scalar_type()) shard_grad = shard_grad.to(local_shard_.scalar_type());
  if (local_grad_.defined())
    local_grad_.add_(shard_grad.to(local_grad_.device()));  // its owner may keep it on another device
  else
    local_grad_ = shard_grad;
}

at::Tensor FlatParameter::gather_full() {
  at::NoGradGuard no_grad;
  if (aliased_) return full_.clone();
  at::Tensor out = at::empty({layout_.padded_numel}, local_shard_.options().device(full_.device()));
  group_->all_gather_into_tensor(out, local_shard_.to(full_.device())).wait();
  return out;
}

void FlatParameter::load_full(const at::Tensor& flat) {
  if (flat.numel() != layout_.numel && flat.numel() != layout_.padded_numel)
    throw std::invalid_argument("booster: FlatParameter::load_full: got " + std::to_string(flat.numel()) +
                                " elements, the flat parameter has " + std::to_string(layout_.numel));
  at::NoGradGuard no_grad;
  at::Tensor padded = flat.reshape({-1});
  if (padded.numel() != layout_.padded_numel)
    padded = at::cat({padded, at::zeros({layout_.padded_numel - padded.numel()}, padded.options())});
  finish_pending();
  wait_shard_reads();
  if (aliased_) {
    local_shard_.copy_(padded);
    return;
  }
  local_shard_.copy_(padded.narrow(0, layout_.shard_begin(group_->rank()), layout_.shard_numel));
  if (state_ == State::kUnsharded) full_.copy_(padded);
}

}  // namespace booster
