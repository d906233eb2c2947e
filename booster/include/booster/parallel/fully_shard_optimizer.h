// fully_shard_optimizer.h — fully_shard's optimizer wrapper (fully_shard.h): the user's optimizer runs on the
// FlatParameters' local shards (one tensor per FlatParameter in the shard's parameter group), as
// PyTorch FSDP's optimizer sees the sharded FlatParameters; any elementwise optimizer registered in
// optim/optimizer_registry.h works unchanged and its state exists only for the shard.
//
// Invariants:
//  - The optimizer's param group g holds the local shards of every trainable FlatParameter built
//    from group g (fully_shard.h), in unit order; group options are kept. Frozen parameters have no
//    shard in the optimizer. parameters() still lists the model's parameters (checkpoint names).
//  - A shard's gradient is its FlatParameter's local_grad(): the gradient averaged over the data-
//    parallel ranks. A FlatParameter that got no gradient in a step has none, so the optimizer skips
//    it, as single-process LibTorch skips a parameter without .grad().
//  - step(): overflow check, global-norm clipping (sum of squares over the shard group: every element
//    counted once), the optimizer's step on the shards; then every gathered unit is freed, so the
//    next forward gathers the updated shards.
//  - Checkpoints: parallel::ShardOptimizer's, gathered or sharded (the default, nothing gathered);
//    replicated shards (HYBRID_SHARD, NO_SHARD) are saved from replica 0 only.
//  - The shard keeps the parameters' original dtype (fp32 under a bf16 param_dtype policy): it is the
//    master copy, so master_weights needs no second copy.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "booster/parallel/shard_optimizer.h"
#include "booster/parallel/fully_shard.h"

namespace booster::parallel {

class BOOSTER_API FullyShardOptimizer : public ShardOptimizer {
 public:
  // options.group: the world (overflow agreement); the norm is summed over the shard group.
  // Throws std::invalid_argument for an optimizer type that is not registered.
  FullyShardOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                      OptimizerWrapperOptions options, std::shared_ptr<FullyShardState> state);

  bool step() override;
  void zero_grad() override;
  double clip_grad_by_norm(double max_norm, double norm_type = 2.0) override;
  void clip_grad_by_value(double clip_value) override;
  void visit_memory(MemoryVisitor& visitor) const override;

 protected:
  // Replicated shards (HYBRID_SHARD, NO_SHARD) are saved from replica 0 only.
  bool saves_pieces(const Shard& s) const override;

 private:
  void attach_grads();

  std::shared_ptr<FullyShardState> state_;
};

}  // namespace booster::parallel
