// mesh_optimizer.cpp — norm accounting of the mesh's optimizer wrappers (see booster/parallel/mesh_optimizer.h).
#include "booster/parallel/mesh_optimizer.h"

#include <set>

#include "booster/core/flat_layout.h"
#include "booster/core/replica.h"
#include "booster/nn/tensor_parallel.h"
#include "booster/dist/process_group.h"

namespace booster::parallel {

namespace {

// Sums `pieces` (views of reduced gradient shards) over `tp`, in place, in buffers of 25 MiB.
void sum_over(dist::ProcessGroup& tp, const std::vector<at::Tensor>& pieces) {
  allreduce_coalesced(tp, pieces, 25LL << 20, false);
}

}  // namespace

NormFilter mesh_norm_filter(const MeshModel& model, const MeshTopology& topo) {
  std::set<const void*> skip;  // counted on another rank
  for (const auto& [name, p] : model.named_parameters)
    if (topo.tp_rank != 0 && !nn::tensor_parallel_spec(p)) skip.insert(p.unsafeGetTensorImpl());
  for (const auto& s : model.shared)
    if (topo.pp_rank != s.stages.front()) skip.insert(s.param.unsafeGetTensorImpl());
  return [skip](const at::Tensor& p) { return !skip.count(p.unsafeGetTensorImpl()); };
}

MeshOptimizer::MeshOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                                 OptimizerWrapperOptions options, std::shared_ptr<dist::ProcessGroup> world,
                                 bool dp_rank0, NormFilter counts)
    : OptimizerWrapper(std::move(optimizer), std::move(hooks), std::move(options)),
      world_(std::move(world)),
      dp_rank0_(dp_rank0),
      counts_(std::move(counts)) {}

dist::ProcessGroup* MeshOptimizer::norm_group() const { return world_->size() > 1 ? world_.get() : nullptr; }
dist::ProcessGroup* MeshZeroOptimizer::norm_group() const { return world_->size() > 1 ? world_.get() : nullptr; }

std::vector<torch::Tensor> MeshOptimizer::norm_gradients() const {
  std::vector<torch::Tensor> grads;
  if (!dp_rank0_) return grads;  // dp replicas hold the same averaged gradients
  for (const auto& p : model_params_)
    if (p.grad().defined() && counts_(p)) grads.push_back(p.grad());
  return grads;
}

MeshZeroOptimizer::MeshZeroOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                         std::shared_ptr<ModelHooks> hooks, OptimizerWrapperOptions options,
                                         ZeroOptions zero,
                                         const std::vector<std::pair<std::string, torch::Tensor>>& named_model_parameters,
                                         std::shared_ptr<dist::ProcessGroup> world, NormFilter counts,
                                         std::shared_ptr<dist::ProcessGroup> partial_tp)
    : ZeroOptimizer(std::move(optimizer), std::move(hooks), std::move(options), zero, named_model_parameters),
      world_(std::move(world)),
      counts_(std::move(counts)),
      partial_tp_(std::move(partial_tp)) {
  // Stage 1: the plugin averages the gradients over dp after backward (the reducer stays paused).
  // Stage 2: the reducer reduce-scatters them over dp during backward.
  if (zero.stage == 1) set_require_grad_sync(false);
}

void MeshZeroOptimizer::on_gradients_prepared() {
  if (!partial_tp_) return;
  std::vector<at::Tensor> pieces;
  const int rank = options_.group->rank();
  const auto params = parameters();
  for (size_t g = 0; g < num_groups(); ++g) {
    const at::Tensor& slice = master_slice(g);
    if (!slice.grad().defined()) continue;
    const FlatLayout& layout = this->layout(g);
    const auto& indices = layout_parameters(g);
    for (size_t j = 0; j < indices.size(); ++j) {
      const FlatLayout::Piece piece = layout.piece(j, rank);
      if (piece.length == 0 || nn::tensor_parallel_spec(params[indices[j]])) continue;
      pieces.push_back(slice.grad().narrow(0, piece.shard_offset, piece.length));
    }
  }
  sum_over(*partial_tp_, pieces);
}

std::vector<torch::Tensor> MeshZeroOptimizer::norm_gradients() const {
  // The slices' gradients (one per optimizer group), cut into each parameter's piece so that
  // replicated parameters can be left out.
  std::vector<torch::Tensor> grads;
  const int rank = options_.group->rank();
  const auto params = parameters();
  for (size_t g = 0; g < num_groups(); ++g) {
    const at::Tensor& slice = master_slice(g);
    if (!slice.grad().defined()) continue;
    const FlatLayout& layout = this->layout(g);
    const auto& indices = layout_parameters(g);
    for (size_t j = 0; j < indices.size(); ++j) {
      FlatLayout::Piece piece = layout.piece(j, rank);
      if (piece.length == 0 || !counts_(params[indices[j]])) continue;
      grads.push_back(slice.grad().narrow(0, piece.shard_offset, piece.length));
    }
  }
  return grads;
}

MeshFsdpOptimizer::MeshFsdpOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                         std::shared_ptr<ModelHooks> hooks, OptimizerWrapperOptions options,
                                         std::shared_ptr<FullyShardState> state,
                                         std::shared_ptr<dist::ProcessGroup> world, NormFilter counts,
                                         std::shared_ptr<dist::ProcessGroup> partial_tp)
    : FullyShardOptimizer(std::move(optimizer), std::move(hooks), std::move(options), std::move(state)),
      world_(std::move(world)),
      counts_(std::move(counts)),
      partial_tp_(std::move(partial_tp)) {}

void MeshFsdpOptimizer::sum_partial_over_tp() {
  if (!partial_tp_ || partial_summed_) return;
  partial_summed_ = true;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> pieces;
  const auto params = parameters();
  for (const Shard& s : shards()) {
    const at::Tensor& grad = s.flat->local_grad();
    if (!grad.defined()) continue;
    const FlatLayout& layout = s.flat->layout();
    const int rank = s.flat->group().rank();
    for (size_t j = 0; j < s.param_index.size(); ++j) {
      const FlatLayout::Piece piece = layout.piece(j, rank);
      if (piece.length == 0 || nn::tensor_parallel_spec(params[s.param_index[j]])) continue;
      pieces.push_back(grad.narrow(0, piece.shard_offset, piece.length));
    }
  }
  sum_over(*partial_tp_, pieces);
}

bool MeshFsdpOptimizer::step() {
  sum_partial_over_tp();
  const bool stepped = FullyShardOptimizer::step();
  partial_summed_ = false;
  return stepped;
}

double MeshFsdpOptimizer::clip_grad_by_norm(double max_norm, double norm_type) {
  sum_partial_over_tp();
  return FullyShardOptimizer::clip_grad_by_norm(max_norm, norm_type);
}

void MeshFsdpOptimizer::zero_grad() {
  FullyShardOptimizer::zero_grad();
  partial_summed_ = false;
}

dist::ProcessGroup* MeshFsdpOptimizer::norm_group() const { return world_->size() > 1 ? world_.get() : nullptr; }

std::vector<torch::Tensor> MeshFsdpOptimizer::norm_gradients() const {
  // Each shard's reduced gradient, cut into its parameters' pieces so that tp-replicated ones are
  // counted on tp rank 0 only (the padding after the last piece is left out).
  std::vector<torch::Tensor> grads;
  const auto params = parameters();
  for (const Shard& s : shards()) {
    const at::Tensor& grad = s.flat->local_grad();
    if (!grad.defined()) continue;
    const FlatLayout& layout = s.flat->layout();
    const int rank = s.flat->group().rank();
    for (size_t j = 0; j < s.param_index.size(); ++j) {
      const FlatLayout::Piece piece = layout.piece(j, rank);
      if (piece.length == 0 || !counts_(params[s.param_index[j]])) continue;
      grads.push_back(grad.narrow(0, piece.shard_offset, piece.length));
    }
  }
  return grads;
}

}  // namespace booster::parallel
