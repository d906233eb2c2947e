// mesh_optimizer.h — the optimizer wrappers of a model parallelized over a mesh (mesh_model.h; the
// hybrid_parallel plugin's). They count each
// gradient element exactly once in the global norm across the (dp, pp, tp) world (Megatron-LM's
// clip_grad_norm over model-parallel ranks): a parameter replicated across the tp group (no
// TensorParallelSpec: LayerNorm, RowParallelLinear's bias, position embeddings) counts on tp rank 0
// only, a parameter shared by several pipeline stages (tied embedding) on the first of them only; tp
// shards and different stages' parameters are summed. Norms are summed over the world.
//   zero_stage 0: OptimizerWrapper (fp32 master copies for bf16), gradients replicated over dp
//                 (averaged by the plugin), so only dp rank 0 counts them.
//   zero_stage 1: ZeroOptimizer over the dp group (optimizer states sharded across dp, ZeRO-1); its
//                 gradient synchronisation is the plugin's (the reducer stays paused); each dp rank
//                 counts its slice.
//   zero_stage 2 (pp_size = 1): the same, and the ZeroOptimizer's reducer reduce-scatters the
//                 gradients over dp during backward (ZeRO-2); each dp rank counts its slice.
//   zero_stage 3: FullyShardOptimizer on the FlatParameter shards over dp
//                 (fully_shard.h); each dp rank counts its shard's pieces (FlatLayout::piece).
// Under sequence_parallelism_mode = "split_gather" (Megatron-SP) a tp-replicated parameter's gradient
// is a partial sum over this rank's sequence shard. zero_stage 0 and 1 sum the full gradients over
// tp after backward (the plugin's hooks); zero_stage 2 and 3 reduce them over dp during backward, so
// their wrappers sum the replicated parameters' pieces of the reduced shard over tp (`partial_tp`)
// once per step, before clipping and the update (the sum over tp and the average over dp commute;
// every tp rank of one dp rank holds the same layout, so the pieces match). A backward run after
// clip_grad_by_norm and before step() in one iteration is not supported under split_gather.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "booster/export.h"
#include "booster/parallel/fully_shard_optimizer.h"
#include "booster/parallel/mesh_model.h"
#include "booster/wrappers/optimizer_wrapper.h"
#include "booster/wrappers/zero_optimizer.h"

namespace booster::parallel {

// Whether parameters()[i]'s gradient counts in this rank's norm contribution (dp aside).
using NormFilter = std::function<bool(const at::Tensor& param)>;

// The filter above for `model` on this rank of `topo`: false for a tp-replicated parameter (no
// TensorParallelSpec) on tp ranks other than 0, and for a shared parameter on stages other than its
// first; true otherwise.
BOOSTER_API NormFilter mesh_norm_filter(const MeshModel& model, const MeshTopology& topo);

class BOOSTER_API MeshOptimizer : public OptimizerWrapper {
 public:
  MeshOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                  OptimizerWrapperOptions options, std::shared_ptr<dist::ProcessGroup> world, bool dp_rank0,
                  NormFilter counts);

 protected:
  std::vector<torch::Tensor> norm_gradients() const override;
  dist::ProcessGroup* norm_group() const override;

 private:
  std::shared_ptr<dist::ProcessGroup> world_;
  bool dp_rank0_;
  NormFilter counts_;
};

class BOOSTER_API MeshZeroOptimizer : public ZeroOptimizer {
 public:
  // named_model_parameters: this stage's parameters (the optimizer holds exactly these).
  MeshZeroOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                      OptimizerWrapperOptions options, ZeroOptions zero,
                      const std::vector<std::pair<std::string, torch::Tensor>>& named_model_parameters,
                      std::shared_ptr<dist::ProcessGroup> world, NormFilter counts,
                      std::shared_ptr<dist::ProcessGroup> partial_tp = nullptr);

 protected:
  std::vector<torch::Tensor> norm_gradients() const override;
  dist::ProcessGroup* norm_group() const override;
  void on_gradients_prepared() override;  // split_gather: the replicated pieces summed over tp

 private:
  std::vector<at::Tensor> gradient_pieces(const std::function<bool(const at::Tensor&)>& keep) const;

  std::shared_ptr<dist::ProcessGroup> world_;
  NormFilter counts_;
  std::shared_ptr<dist::ProcessGroup> partial_tp_;
};

class BOOSTER_API MeshFsdpOptimizer : public FullyShardOptimizer {
 public:
  MeshFsdpOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                      OptimizerWrapperOptions options, std::shared_ptr<FullyShardState> state,
                      std::shared_ptr<dist::ProcessGroup> world, NormFilter counts,
                      std::shared_ptr<dist::ProcessGroup> partial_tp = nullptr);

  bool step() override;
  double clip_grad_by_norm(double max_norm, double norm_type = 2.0) override;
  void zero_grad() override;

 protected:
  std::vector<torch::Tensor> norm_gradients() const override;
  dist::ProcessGroup* norm_group() const override;

 private:
  void sum_partial_over_tp();  // split_gather: once per step
  std::vector<at::Tensor> gradient_pieces(const std::function<bool(const at::Tensor&)>& keep) const;

  std::shared_ptr<dist::ProcessGroup> world_;
  NormFilter counts_;
  std::shared_ptr<dist::ProcessGroup> partial_tp_;
  bool partial_summed_ = false;
};

}  // namespace booster::parallel
