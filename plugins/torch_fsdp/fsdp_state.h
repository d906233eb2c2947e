// fsdp_state.h — the runtime of the FSDP plugin: the model's shard units (booster::nn::Unit plus the
// root unit), one FlatParameter per (unit, optimizer parameter group, dtype) and the schedule that
// gathers and frees them around each unit's forward and backward. PyTorch FSDP's
// FullyShardedDataParallel runtime (_runtime_utils.py: pre/post forward, pre/post backward,
// prefetching), driven by booster::nn::UnitHooks instead of module hooks.
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

#include "booster/core/flat_param.h"
#include "booster/dist/process_group.h"
#include "booster/nn/unit.h"
#include "booster/plugin.h"

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

// One shard unit: a booster::nn::Unit, or the root unit (unit == nullptr).
struct FsdpUnit {
  std::string path;            // dotted module path; "" for the root unit
  nn::UnitBase* unit = nullptr;
  std::vector<std::unique_ptr<FlatParameter>> flats;
  std::vector<int> flat_group;  // per flat: its optimizer parameter group, -1 for frozen parameters
  std::vector<std::vector<char>> arrived;  // per trainable flat, per parameter: gradient arrived
  std::vector<size_t> arrived_count;
  std::vector<char> reduced;   // per flat: reduced in this backward pass
  int forward_calls = 0;       // in the current iteration
  bool backward_done = false;  // post_backward ran in this pass
};

class FsdpState : public nn::UnitHooks, public std::enable_shared_from_this<FsdpState> {
 public:
  // Builds the units and FlatParameters of `model` (the model's parameters become views of the
  // flat buffers, sharded). `optimizer` (may be null) decides the FlatParameter of every trainable
  // parameter: one per (unit, parameter group); frozen parameters get their own. Throws
  // std::invalid_argument naming the parameter for a trainable parameter missing from the optimizer,
  // an optimizer parameter the model does not own, and as nn::collect_named_units (nested units,
  // parameters shared by two units). Call install() afterwards.
  FsdpState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, FsdpConfig config);
  ~FsdpState() override;
  // Installs the unit hooks and the gradient-accumulator hooks.
  void install();

  // nn::UnitHooks
  void pre_forward(nn::UnitBase& unit) override;
  void post_forward(nn::UnitBase& unit) override;
  void pre_backward(nn::UnitBase& unit) override;
  void post_backward(nn::UnitBase& unit) override;

  // Around the whole model's forward (the ModelHooks).
  void begin_forward();
  void end_forward();
  void abort_forward();
  // Frees every gathered unit (after an optimizer step, before a checkpoint, on abort).
  void reshard_all();

  void set_require_grad_sync(bool required) { require_sync_ = required; }
  bool require_grad_sync() const { return require_sync_; }

  std::vector<FsdpUnit>& units() { return units_; }
  torch::nn::Module& module() { return *model_; }
  const FsdpConfig& config() const { return config_; }
  // all_gathers, prefetches, reduce_scatters, units, flat_parameters, max_gathered_units,
  // max_gathered_bytes (the largest gathered parameter bytes at one moment).
  std::map<std::string, int64_t> stats() const;

 private:
  struct Location {
    size_t unit;
    size_t flat;
    size_t param;
  };
  size_t index_of(nn::UnitBase& unit) const;
  size_t trainable_count(size_t u, size_t f) const;
  void unshard_unit(size_t u);
  void prefetch_unit(size_t u);
  void reshard_unit(size_t u);
  void on_grad_accumulated(const Location& where);
  void reduce_flat(size_t u, size_t f);
  void maybe_post_backward(size_t u);
  void arm_final_callback();
  void finish_backward();
  void note_gathered();
  bool reshards_after_forward() const;

  torch::nn::Module* model_;  // owned by the ModelHooks (the units hold this state: no cycle)
  FsdpConfig config_;
  std::vector<FsdpUnit> units_;  // units_[0] is the root unit
  std::map<const nn::UnitBase*, size_t> unit_index_;
  std::vector<size_t> forward_order_, previous_forward_order_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  bool require_sync_ = true;
  bool in_backward_ = false;
  bool pending_backward_ = false;  // a grad-mode forward ran and its backward has not ended
  int64_t all_gathers_ = 0, prefetches_ = 0, reduce_scatters_ = 0, max_gathered_units_ = 0, max_gathered_bytes_ = 0;
};

}  // namespace booster::plugins::fsdp
