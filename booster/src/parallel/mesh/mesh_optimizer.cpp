// mesh_optimizer.cpp — norm accounting of the mesh's optimizer wrappers (see booster/parallel/mesh_optimizer.h).
#include "booster/parallel/mesh_optimizer.h"

#include <functional>
#include <set>

#include "booster/core/flat_layout.h"
#include "booster/core/replica.h"
#include "booster/nn/tensor_parallel.h"
#include "booster/dist/process_group.h"

namespace booster::parallel {

namespace {

using ParamFilter = std::function<bool(const at::Tensor& param)>;

// Appends to `out` the pieces of `grad` (a [shard_numel] gradient shard of `layout`, this rank
// `rank`) that hold parameters `keep` selects; tensor j of the layout is params[index[j]]. The
// padding after the last piece is never included.
void append_pieces(const at::Tensor& grad, const FlatLayout& layout, int rank, const std::vector<size_t>& index,
                   const std::vector<torch::Tensor>& params, const ParamFilter& keep, std::vector<at::Tensor>& out) {
  if (!grad.defined()) return;
  for (size_t j = 0; j < index.size(); ++j) {
    const FlatLayout::Piece piece = layout.piece(j, rank);
    if (piece.length > 0 && keep(params[index[j]])) out.push_back(grad.narrow(0, piece.shard_offset, piece.length));
  }
}

bool replicated_over_tp(const at::Tensor& param) { return !nn::tensor_parallel_spec(param); }

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

// The slices' gradients (one per optimizer group), cut into the pieces of the parameters `keep` selects.
std::vector<at::Tensor> MeshZeroOptimizer::gradient_pieces(const std::function<bool(const at::Tensor&)>& keep) const {
  std::vector<at::Tensor> pieces;
  const auto params = parameters();
  for (size_t g = 0; g < num_groups(); ++g)
    append_pieces(master_slice(g).grad(), layout(g), options_.group->rank(), layout_parameters(g), params, keep, pieces);
  return pieces;
}

void MeshZeroOptimizer::on_gradients_prepared() {
  if (partial_tp_) sum_over(*partial_tp_, gradient_pieces(replicated_over_tp));
}

std::vector<torch::Tensor> MeshZeroOptimizer::norm_gradients() const { return gradient_pieces(counts_); }

MeshFsdpOptimizer::MeshFsdpOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                         std::shared_ptr<ModelHooks> hooks, OptimizerWrapperOptions options,
                                         std::shared_ptr<FullyShardState> state,
                                         std::shared_ptr<dist::ProcessGroup> world, NormFilter counts,
                                         std::shared_ptr<dist::ProcessGroup> partial_tp)
    : FullyShardOptimizer(std::move(optimizer), std::move(hooks), std::move(options), std::move(state)),
      world_(std::move(world)),
      counts_(std::move(counts)),
      partial_tp_(std::move(partial_tp)) {}

// Each shard's reduced gradient, cut into the pieces of the parameters `keep` selects.
std::vector<at::Tensor> MeshFsdpOptimizer::gradient_pieces(const std::function<bool(const at::Tensor&)>& keep) const {
  std::vector<at::Tensor> pieces;
  const auto params = parameters();
  for (const Shard& s : shards())
    append_pieces(s.flat->local_grad(), s.flat->layout(), s.flat->group().rank(), s.param_index, params, keep, pieces);
  return pieces;
}

void MeshFsdpOptimizer::sum_partial_over_tp() {
  if (!partial_tp_ || partial_summed_) return;
  partial_summed_ = true;
  at::NoGradGuard no_grad;
  sum_over(*partial_tp_, gradient_pieces(replicated_over_tp));
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

// tp-replicated parameters count on tp rank 0 only, shared ones on their first stage (counts_).
std::vector<torch::Tensor> MeshFsdpOptimizer::norm_gradients() const { return gradient_pieces(counts_); }

}  // namespace booster::parallel
