// fully_shard_optimizer.cpp — the optimizer on FlatParameter shards (see
// booster/parallel/fully_shard_optimizer.h).
#include "booster/parallel/fully_shard_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <set>
#include <stdexcept>

#include "booster/optim/cpu_adam.h"
#include "booster/optim/optimizer_registry.h"

namespace booster::parallel {

FullyShardOptimizer::FullyShardOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                         std::shared_ptr<ModelHooks> hooks, OptimizerWrapperOptions options,
                                         std::shared_ptr<FullyShardState> state)
    : ShardOptimizer(std::move(optimizer), std::move(hooks), std::move(options), state->config().shard_group),
      state_(std::move(state)) {
  std::vector<Shard> shards;
  std::vector<int> groups;
  auto& flats = state_->flats();
  for (size_t f = 0; f < flats.size(); ++f) {
    if (flats[f].group < 0) continue;
    Shard s;
    s.flat = flats[f].flat.get();
    s.stepped = s.flat->local_shard();
    s.flat_index = f;
    for (const auto& [name, p] : s.flat->params()) s.param_index.push_back(param_index_of(p));
    shards.push_back(std::move(s));
    groups.push_back(flats[f].group);
  }
  bind_shards(std::move(shards), groups);
}

bool FullyShardOptimizer::saves_pieces(const Shard& s) const {
  const auto& replicas = s.flat->replicate_group();
  return !replicas || replicas->rank() == 0;
}

void FullyShardOptimizer::attach_grads() {
  for (auto& s : shards_) s.flat->local_shard().mutable_grad() = s.flat->local_grad();
}

double FullyShardOptimizer::clip_grad_by_norm(double max_norm, double norm_type) {
  attach_grads();
  return OptimizerWrapper::clip_grad_by_norm(max_norm, norm_type);
}

void FullyShardOptimizer::clip_grad_by_value(double clip_value) {
  attach_grads();
  OptimizerWrapper::clip_grad_by_value(clip_value);
}

bool FullyShardOptimizer::step() {
  at::NoGradGuard no_grad;
  attach_grads();
  // cpu_offload: the host shards are written below; the device has read them for the all-gathers.
  if (state_->offloads())
    for (auto& s : shards_) s.flat->wait_shard_reads();
  // Overflow skip, clip, the optimizer on the shards; in host memory (cpu_offload) the Adam family
  // through the CPU Adam kernel.
  const bool stepped = state_->offloads() ? step_with([](torch::optim::Optimizer& optimizer) {
    if (!optim::step_with_cpu_adam_kernel(optimizer)) optimizer.step();
  })
                                          : OptimizerWrapper::step();
  state_->release_all();                          // the next forward gathers the updated shards
  return stepped;
}

void FullyShardOptimizer::zero_grad() {
  for (auto& s : shards_) {
    s.flat->local_grad() = at::Tensor();
    s.flat->local_shard().mutable_grad() = at::Tensor();
    for (const auto& [name, p] : s.flat->params()) const_cast<at::Tensor&>(p).mutable_grad() = at::Tensor();
  }
  unscaled_ = false;
}


void FullyShardOptimizer::visit_memory(MemoryVisitor& visitor) const {
  bool accelerator = false;
  for (const auto& s : state_->flats()) {
    FlatParameter& f = *s.flat;
    accelerator = accelerator || !f.params().front().second.device().is_cpu();
    if (f.is_aliased()) continue;  // the module's storage (Booster counts it)
    // The shard is the full-precision weight: "parameters" when the compute dtype is the same,
    // the master copy of the low-precision gathered parameters otherwise.
    visitor.visit(f.compute_dtype() == f.shard_dtype() ? MemoryCategory::kParameters : MemoryCategory::kMasterWeights,
                  f.local_shard(), accelerator);
  }
  for (const auto& s : shards_) {
    const at::Tensor& shard = s.flat->local_shard();
    visitor.visit_planned(MemoryCategory::kGradients,
                          s.flat->layout().shard_numel * static_cast<int64_t>(shard.element_size()),
                          !shard.device().is_cpu(), accelerator && shard.device().is_cpu());
  }
  visitor.visit(MemoryCategory::kOptimizerStates, optimizer_state_places(*optimizer_, accelerator, false));
}

}  // namespace booster::parallel
