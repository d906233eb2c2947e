// flat_param.cpp — a unit's FlatParameter: shard, all-gather, free, reduce-scatter (see
// booster/core/flat_param.h).
#include "booster/core/flat_param.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>

#include <set>
#include <stdexcept>

#include "booster/dist/process_group.h"

namespace booster {

FlatParameter::FlatParameter(std::vector<std::pair<std::string, at::Tensor>> params,
                             std::shared_ptr<dist::ProcessGroup> group)
    : params_(std::move(params)), group_(std::move(group)) {
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
  layout_ = make_flat_layout(numels, group_->size());
  full_ = flatten_into_views(tensors, layout_);  // throws for mixed dtypes / devices
  local_shard_ = full_.narrow(0, layout_.shard_begin(group_->rank()), layout_.shard_numel).clone();
  state_ = State::kUnsharded;
  reshard();
}

FlatParameter::~FlatParameter() = default;

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

void FlatParameter::unshard() {
  if (state_ == State::kUnsharded) return;
  allocate_storage();
  {
    at::NoGradGuard no_grad;
    at::Tensor out = full_;  // the collective's output argument
    group_->all_gather_into_tensor(out, local_shard_).wait();
  }
  state_ = State::kUnsharded;
}

void FlatParameter::reshard() {
  if (state_ == State::kSharded) return;
  free_storage();
  state_ = State::kSharded;
}

void FlatParameter::reduce_gradients() {
  if (state_ != State::kUnsharded)
    throw std::logic_error("booster: FlatParameter::reduce_gradients needs the unsharded state (call unshard() "
                           "before backward)");
  at::NoGradGuard no_grad;
  at::Tensor flat_grad = at::zeros({layout_.padded_numel}, full_.options());
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].second;
    if (!p.grad().defined()) continue;
    flat_grad.narrow(0, layout_.offsets[i], layout_.numels[i]).copy_(p.grad().reshape({-1}));
    p.mutable_grad() = at::Tensor();
  }
  at::Tensor shard_grad = at::empty({layout_.shard_numel}, full_.options());
  group_->reduce_scatter_tensor(shard_grad, flat_grad, dist::ReduceOp::AVG).wait();
  if (local_grad_.defined())
    local_grad_.add_(shard_grad);
  else
    local_grad_ = shard_grad;
}

}  // namespace booster
