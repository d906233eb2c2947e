// fsdp_state.h — the FSDP layout policy on the sharded runtime (booster/parallel/sharded_runtime.h):
// one FlatParameter per (unit, optimizer parameter group, dtype) and the schedule that gathers and
// frees them around each unit's forward and backward. PyTorch FSDP's FullyShardedDataParallel
// runtime (_runtime_utils.py: pre/post forward, pre/post backward, prefetching), driven by
// booster::nn::UnitHooks instead of module hooks.
//
// Schedule of one iteration (unit k, strategy S):
//   model pre_forward       unshard the root unit (parameters outside every Unit); it stays
//                           gathered until the end of backward
//   pre_forward(k)          unshard k (waits for a prefetch in flight); forward_prefetch: start the
//                           all-gather of the unit that followed k in the previous iteration's forward
//   post_forward(k)         FULL_SHARD, HYBRID_SHARD: reshard k; SHARD_GRAD_OP, NO_SHARD: keep it
//   pre_backward(k)         unshard k; BACKWARD_PRE: start the all-gather of the unit that ran
//                           before k in this forward (the next one backward reaches)
//   gradient of every trainable parameter of a FlatParameter accumulated (AccumulateGrad post hooks)
//                           reduce_gradients (reduce-scatter AVG over the shard group, allreduce AVG
//                           over the replicas) into the shard's gradient, unless inside no_sync
//   every FlatParameter of k done: post_backward(k): reshard k; BACKWARD_POST: start the all-gather
//                           of the unit that ran before k
//   end of backward         (autograd engine final callback) reduce what is left — FlatParameters
//                           some of whose parameters got no gradient (unused: they count as zeros)
//                           or got more after their reduction (a unit run twice) — and reshard
//                           everything, root included
//   model post_forward with grad mode off (evaluation): reshard everything
// Every rank must run the same units in the same order (FSDP's own requirement): the collectives
// are matched by order. A unit whose forward ran more than once in an iteration is resharded only at
// the end of backward (its parameters are needed by each of its backward passes).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "booster/dist/process_group.h"
#include "booster/parallel/sharded_runtime.h"

namespace booster::plugins::fsdp {

enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard };
enum class BackwardPrefetch { kNone, kBackwardPre, kBackwardPost };

struct FsdpConfig {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kBackwardPre;
  bool forward_prefetch = false;
  bool limit_all_gathers = true;  // at most one prefetched unit ahead (else two)
  at::ScalarType param_dtype = at::ScalarType::Undefined;   // Undefined: the parameters' dtype
  at::ScalarType reduce_dtype = at::ScalarType::Undefined;  // Undefined: param_dtype
  std::shared_ptr<dist::ProcessGroup> shard_group;          // FlatParameters shard over it
  std::shared_ptr<dist::ProcessGroup> replicate_group;      // gradients are averaged over it too
  // Float8 e4m3 all-gathers of the parameters and reduce-scatters of the gradients over the shard
  // group (FlatParameterOptions::fp8_communication; ColossalAI's fp8_communication).
  bool fp8_communication = false;
};

// The FSDP layout on the sharded runtime: one FlatParameter per (unit, optimizer parameter group or
// frozen, dtype, BatchNorm full precision), in unit order, and the schedule above.
class FsdpState : public parallel::ShardedRuntime {
 public:
  // Builds the FlatParameters of `model` (the model's parameters become views of the flat buffers,
  // sharded). `optimizer` (may be null) decides the FlatParameter of every trainable parameter.
  // Throws std::invalid_argument without a shard group, and as parallel::ShardedRuntime's
  // constructor (a trainable parameter missing from the optimizer, an optimizer parameter the model
  // does not own, nested units, parameters shared by two units). Call install() afterwards.
  FsdpState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, FsdpConfig config);

  const FsdpConfig& config() const { return config_; }
  // The runtime's counters plus flat_parameters and max_gathered_units (the most units with a
  // gathered FlatParameter at one moment).
  std::map<std::string, int64_t> stats() const override;

 private:
  void on_begin_forward() override { unshard_unit(0); }
  void on_pre_forward(size_t u) override;
  void on_post_forward(size_t u) override;
  void on_forward_without_backward() override { release_all(); }
  void on_pre_backward(size_t u) override;
  void on_post_backward(size_t u) override;
  void on_gradients_ready(size_t f) override;
  void on_finish_backward() override;

  void unshard_unit(size_t u);
  void prefetch_unit(size_t u);
  void reshard_unit(size_t u);
  void maybe_post_backward(size_t u);
  void note_gathered();
  bool reshards_after_forward() const;

  FsdpConfig config_;
  std::vector<char> backward_done_;  // per unit: post_backward ran in this pass
  int64_t max_gathered_units_ = 0;
};

}  // namespace booster::plugins::fsdp
