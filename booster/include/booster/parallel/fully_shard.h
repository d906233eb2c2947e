// fully_shard.h — ZeRO-3 as a function over a mesh: PyTorch FSDP's layout (Zhao et al., "PyTorch
// FSDP: Experiences on Scaling Fully Sharded Data Parallel", VLDB 2023) as a policy on the sharded
// runtime (sharded_runtime.h): one FlatParameter per (unit, optimizer parameter group, dtype) and
// the schedule that gathers and frees them around each unit's forward and backward
// (torch/distributed/fsdp/_runtime_utils.py: pre/post forward, pre/post backward, prefetching),
// driven by booster::nn::UnitHooks instead of module hooks. Usable without a plugin:
//     booster::parallel::FullyShardOptions options;
//     options.shard_group = world;
//     auto sharded = booster::parallel::fully_shard(model, optimizer, options);
//     booster::ModelWrapper<Net> m(model, sharded.hooks);  // forward gathers unit by unit
//     sharded.hooks->backward(loss); sharded.optimizer->step();  // reduce-scatter, step on shards
// The torch_fsdp plugin is this function behind PyTorch FSDP's option names.
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

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "booster/device.h"
#include "booster/dist/process_group.h"
#include "booster/parallel/sharded_runtime.h"

namespace booster::parallel {

enum class ShardingStrategy { kFullShard, kShardGradOp, kNoShard, kHybridShard };
enum class BackwardPrefetch { kNone, kBackwardPre, kBackwardPost };

struct FullyShardOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kBackwardPre;
  bool forward_prefetch = false;
  // FSDP's rate limiter: at most one prefetched unit ahead (else two), and before issuing an
  // all-gather the host waits for the oldest of the frees still in flight once two are (a
  // StreamEvent recorded on the compute stream after each unit's reshard; FSDP's
  // _FreeEventQueue with _max_num_inflight_all_gathers = 2). On the CPU the events are complete at
  // once and only the count (stat rate_limiter_waits) changes.
  bool limit_all_gathers = true;
  at::ScalarType param_dtype = at::ScalarType::Undefined;   // Undefined: the parameters' dtype
  at::ScalarType reduce_dtype = at::ScalarType::Undefined;  // Undefined: param_dtype
  std::shared_ptr<dist::ProcessGroup> shard_group;          // FlatParameters shard over it
  std::shared_ptr<dist::ProcessGroup> replicate_group;      // gradients are averaged over it too
  // Float8 e4m3 all-gathers of the parameters and reduce-scatters of the gradients over the shard
  // group (FlatParameterOptions::fp8_communication; ColossalAI's fp8_communication).
  bool fp8_communication = false;
  // Every rank taking part (the checkpoint IO and the optimizer wrapper's overflow agreement are
  // collective over it); null: shard_group.
  std::shared_ptr<dist::ProcessGroup> world;
  // FSDP's CPUOffload(offload_params=True) on an accelerator: every FlatParameter's local shard and
  // reduced gradient shard live in pinned host memory (the shard is copied to the device for each
  // all-gather; the gradient shard is copied to the host after each reduction, queued without
  // blocking backward, whose end waits for the copies), and the optimizer
  // steps the shards there (the Adam family through the CPU Adam kernel, optim/cpu_adam.h). No
  // FlatParameter aliases its buffer (FlatParameterOptions::keep_shard_apart). On a CPU model the
  // shards are in host memory already: nothing moves, the rest is the same.
  bool cpu_offload = false;
};

// The FSDP layout on the sharded runtime: one FlatParameter per (unit, optimizer parameter group or
// frozen, dtype, BatchNorm full precision), in unit order, and the schedule above.
class BOOSTER_API FullyShardState : public ShardedRuntime {
 public:
  // Builds the FlatParameters of `model` (the model's parameters become views of the flat buffers,
  // sharded). `optimizer` (may be null) decides the FlatParameter of every trainable parameter.
  // Throws std::invalid_argument without a shard group, and as parallel::ShardedRuntime's
  // constructor (a trainable parameter missing from the optimizer, an optimizer parameter the model
  // does not own, nested units, parameters shared by two units). Call install() afterwards.
  // `owner` names the caller in errors.
  FullyShardState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, FullyShardOptions config,
                  const std::string& owner = "fully_shard");

  const FullyShardOptions& config() const { return config_; }
  // config().cpu_offload: the shards and gradient shards live in host memory.
  bool offloads() const { return offload_; }
  // The runtime's counters plus flat_parameters, max_gathered_units (the most units with a
  // gathered FlatParameter at one moment) and rate_limiter_waits (limit_all_gathers: all-gathers
  // issued after synchronizing the oldest free event).
  std::map<std::string, int64_t> stats() const override;

 private:
  void on_begin_forward() override { unshard_unit(0); }
  void on_pre_forward(size_t u) override;
  void on_post_forward(size_t u) override;
  void on_forward_without_backward() override { release_all(); }
  void on_pre_backward(size_t u) override;
  void on_post_backward(size_t u) override;
  void on_gradients_ready(size_t f) override;
  void on_reduced(size_t f) override { offload_gradient(f); }
  void on_finish_backward() override;

  void unshard_unit(size_t u);
  void prefetch_unit(size_t u);
  void reshard_unit(size_t u);
  void maybe_post_backward(size_t u);
  void note_gathered();
  // limit_all_gathers: the rate limiter's two halves (see FullyShardOptions::limit_all_gathers).
  // needs_gather: an all-gather of unit u would be issued now.
  bool needs_gather(size_t u) const;
  void wait_for_oldest_free();
  void record_free();
  bool reshards_after_forward() const;
  // cpu_offload: the reduced gradient shard of FlatParameter f moved to pinned host memory.
  void offload_gradient(size_t f);

  FullyShardOptions config_;
  bool offload_ = false;
  std::vector<char> backward_done_;  // per unit: post_backward ran in this pass
  int64_t max_gathered_units_ = 0;
  c10::Device device_{c10::kCPU};      // the flat buffers' device (where the frees are recorded)
  std::deque<StreamEvent> free_events_;  // one per reshard since, oldest first
  int64_t rate_limiter_waits_ = 0;
  std::optional<StreamEvent> gradient_copies_;  // cpu_offload: after the last queued gradient copy
};

// Shards `model` (its parameters become views of sharded FlatParameters) and wraps `optimizer`
// (may be null) to step the shards. Collective over options.world. optimizer_options: clipping and
// loss scaling as OptimizerWrapper's; its group is set to options.world. `owner` names the caller in
// errors. Throws std::invalid_argument without a shard group, for an optimizer type that is not
// registered (optim/optimizer_registry.h), and as FullyShardState's constructor.
BOOSTER_API ShardedModel fully_shard(std::shared_ptr<torch::nn::Module> model,
                                     std::shared_ptr<torch::optim::Optimizer> optimizer, FullyShardOptions options,
                                     OptimizerWrapperOptions optimizer_options = {}, const HooksDecorator& decorate = {},
                                     const std::string& owner = "fully_shard");

}  // namespace booster::parallel
