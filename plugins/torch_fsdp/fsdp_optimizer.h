// fsdp_optimizer.h — the FSDP plugin's optimizer wrapper: the user's optimizer runs on the
// FlatParameters' local shards (one tensor per FlatParameter in the shard's parameter group), as
// PyTorch FSDP's optimizer sees the sharded FlatParameters; any elementwise optimizer registered in
// wrappers/optimizer_registry.h works unchanged and its state exists only for the shard.
//
// Invariants:
//  - The optimizer's param group g holds the local shards of every trainable FlatParameter built
//    from group g (fsdp_state.h), in unit order; group options are kept. Frozen parameters have no
//    shard in the optimizer. parameters() still lists the model's parameters (checkpoint names).
//  - A shard's gradient is its FlatParameter's local_grad(): the gradient averaged over the data-
//    parallel ranks. A FlatParameter that got no gradient in a step has none, so the optimizer skips
//    it, as single-process LibTorch skips a parameter without .grad().
//  - step(): overflow check, global-norm clipping (sum of squares over the shard group: every element
//    counted once), the optimizer's step on the shards; then every gathered unit is freed, so the
//    next forward gathers the updated shards.
//  - Checkpoints (fsdp_checkpoint_io.h): gathered by gather_param_states, or sharded by
//    local_state_pieces (the default, nothing gathered); either loads through load_state_ranges.
//  - The shard keeps the parameters' original dtype (fp32 under a bf16 param_dtype policy): it is the
//    master copy, so master_weights needs no second copy.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "booster/wrappers/optimizer_wrapper.h"
#include "fsdp_state.h"

namespace booster::plugins::fsdp {

class FsdpOptimizer : public OptimizerWrapper {
 public:
  // options.group: the world (overflow agreement); the norm is summed over the shard group.
  // Throws std::invalid_argument for an optimizer type that is not registered.
  FsdpOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                OptimizerWrapperOptions options, std::shared_ptr<FsdpState> state);

  bool step() override;
  void zero_grad() override;
  double clip_grad_by_norm(double max_norm, double norm_type = 2.0) override;
  void clip_grad_by_value(double clip_value) override;
  std::vector<ParamOptimState> gather_param_states() override;
  // Checkpoints without gathering: the pieces of this rank's shards (per FlatParameter, state tensor
  // and parameter, FlatLayout::piece at the rank in the shard group), only on rank 0 of the replicate
  // group when the shards are replicated (HYBRID_SHARD, NO_SHARD); on load each rank reads just the
  // ranges of its own shards.
  std::vector<checkpoint::StatePiece> local_state_pieces() override;
  std::vector<std::map<std::string, int64_t>> local_state_scalars() override;
  bool state_is_sharded() const override;  // the shard group has more than one rank (not NO_SHARD)
  void load_state_ranges(const std::vector<ParamStateSource>& sources, const StateRangeReader& read) override;
  void sync_master_from_model() override {}  // the shards are the weights (the plugin's checkpoint IO loads them)
  MemoryReport memory_report() const override;

  // Each trainable FlatParameter with the index in parameters() of each of its parameters.
  struct Shard {
    FlatParameter* flat;
    std::vector<size_t> param_index;
  };
  const std::vector<Shard>& shards() const { return shards_; }

 protected:
  std::vector<torch::Tensor> local_gradients() const override;
  dist::ProcessGroup* norm_group() const override;

 private:
  void attach_grads();

  std::shared_ptr<FsdpState> state_;
  std::vector<Shard> shards_;
};

}  // namespace booster::plugins::fsdp
