// sharded_runtime.h — the one runtime of every ZeRO-3 layout: a model's parameters live in
// FlatParameters (core/flat_param.h) sharded over a group, gathered around the shard units
// (booster::nn::Unit) that use them and freed again, their gradients reduce-scattered into the
// shards once every gradient of a FlatParameter has arrived. PyTorch FSDP's runtime
// (torch/distributed/fsdp/_runtime_utils.py: pre/post forward, pre/post backward, the final
// callback) and ColossalAI's GeminiDDP share this shape; what differs is a layout policy:
//   - which FlatParameters exist (fully_shard: one per (unit, optimizer group, dtype); Gemini: chunks
//     of a searched size, possibly shared by several units),
//   - when a gathered FlatParameter is freed and what is prefetched,
//   - where its pieces live (Gemini's placement and offload tiers).
// A policy derives from ShardedRuntime, builds its FlatParameters with set_flats(), and implements
// the schedule hooks (the on_* functions below); the runtime does the bookkeeping common to all:
//
//   units          units()[0] is the root (the parameters outside every Unit, unit == nullptr), then
//                  every nn::Unit of the model in pre-order (nn::collect_named_units)
//   flats          flats()[f]: the FlatParameter, its optimizer parameter group (-1: frozen), the
//                  units with parameters in it
//   forward        begin_forward (model pre-forward): a new iteration unless a backward is pending;
//                  pre_forward(u) counts the unit's calls and records the order of first calls
//   backward       every trainable parameter's AccumulateGrad post hook marks its gradient arrived;
//                  when all of a FlatParameter's have, on_gradients_ready(f) (the policy reduces and
//                  frees); a second gradient in the same pass is left to the end of backward. A
//                  reduce-scatter stays in flight until the next one is issued or backward ends
//                  (FSDP2's: it overlaps the next unit's backward); then on_reduced(f)
//   end            an autograd-engine final callback reduces what is left (FlatParameters some of
//                  whose parameters got no gradient — they count as zeros — or got more after
//                  their reduction), clears the bookkeeping, then on_finish_backward()
//   no_sync        set_require_grad_sync(false): reduce() only marks the FlatParameter done
//
// Every rank runs the same units in the same order (FSDP's own requirement): collectives are
// matched by order. Not thread-safe: one training thread drives a runtime.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <unordered_map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "booster/checkpoint/flat_checkpoint_io.h"
#include "booster/core/flat_param.h"
#include "booster/export.h"
#include "booster/nn/unit.h"
#include "booster/parallel/hooks_decorator.h"
#include "booster/wrappers/model_hooks.h"
#include "booster/wrappers/optimizer_wrapper.h"

namespace torch::autograd {
struct Node;
}

namespace booster::parallel {

using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// One FlatParameter the runtime schedules.
struct ShardedFlat {
  std::unique_ptr<FlatParameter> flat;
  int group = -1;             // the optimizer parameter group of its parameters; -1: frozen parameters
  std::vector<size_t> units;  // indices of the units with parameters in it (set by set_flats)
  // Backward bookkeeping (the runtime's).
  std::vector<char> arrived;  // per parameter: its gradient arrived in this pass
  size_t arrived_count = 0;
  bool reduced = false;       // reduce() ran for it in this pass
};

class BOOSTER_API ShardedRuntime : public nn::UnitHooks, public std::enable_shared_from_this<ShardedRuntime> {
 public:
  ~ShardedRuntime() override;  // removes the gradient-accumulator hooks it installed
  ShardedRuntime(const ShardedRuntime&) = delete;
  ShardedRuntime& operator=(const ShardedRuntime&) = delete;

  // Installs this runtime as every unit's hooks and a post hook on the gradient accumulator of each
  // parameter of a trainable FlatParameter (the parameter tensors stay the same when a policy
  // rebuilds its FlatParameters, so the hooks do too); then on_install(). Call once, after
  // construction, through a shared_ptr. Throws std::invalid_argument naming a trainable parameter
  // without a gradient accumulator.
  void install();

  // nn::UnitHooks. Throw std::logic_error for a Unit that was not in the model at construction.
  void pre_forward(nn::UnitBase& unit) final;
  void post_forward(nn::UnitBase& unit) final;
  void pre_backward(nn::UnitBase& unit) final;
  void post_backward(nn::UnitBase& unit) final;

  // Around the whole model's forward (the model hooks). end_forward with grad mode on leaves a
  // backward pending; with it off (evaluation) frees what on_forward_without_backward() frees and
  // ends the iteration. abort_forward (the forward threw) frees everything.
  void begin_forward();
  void end_forward();
  void abort_forward();
  // Frees every gathered FlatParameter (after an optimizer step, before a checkpoint, on abort).
  virtual void release_all();

  // false inside Booster::no_sync: gradients accumulate unreduced in the parameters' .grad.
  void set_require_grad_sync(bool required) { require_sync_ = required; }
  bool require_grad_sync() const { return require_sync_; }

  // For schedules that interleave the forwards and backwards of several micro-batches (a pipeline
  // stage: torchtitan keeps FSDP's parameters gathered across them, reshard_after_forward = False):
  // while held, the end of a backward pass does its bookkeeping but not the policy's
  // on_finish_backward (which frees what is gathered); hold_gathered(false) runs it once if a pass
  // ended meanwhile. Not re-entrant.
  void hold_gathered(bool hold);
  // Reduces now, outside a backward pass, every trainable FlatParameter whose parameters hold
  // gradients accumulated under no_sync (FlatParameter::reduce_gradients, whatever
  // require_grad_sync says; counted as reduce-scatters): a pipeline stage accumulates its
  // micro-batches' gradients unreduced and reduces their sum once. Collective over every
  // FlatParameter's group, in flats() order.
  void reduce_accumulated();

  torch::nn::Module& module() { return *model_; }
  std::vector<ShardedFlat>& flats() { return flats_; }
  const std::vector<ShardedFlat>& flats() const { return flats_; }
  // all_gathers (prefetches included), prefetches, reduce_scatters, reduce_scatters_overlapped (those
  // still in flight when the next was issued: they ran during a later unit's backward),
  // max_gathered_bytes (as noted by note_gathered_bytes), units; policies add theirs.
  virtual std::map<std::string, int64_t> stats() const;

  // What a model checkpoint reads and writes (ShardedCheckpointIO), in flats() order, after
  // release_all(). Default: each FlatParameter's gather_full() and local_shard() in its shard dtype.
  virtual std::vector<checkpoint::FlatSource> checkpoint_sources();
  // After a model checkpoint was loaded into the sources' shards (refresh copies made from them).
  virtual void after_checkpoint_load() {}

 protected:
  // Collects the units and the optimizer group of every parameter of `model`. `owner` names the
  // plugin or function in error messages ("torch_fsdp", "gemini"). `optimizer` may be null (every
  // trainable parameter is then in group 0). Throws std::invalid_argument naming the parameter for an
  // optimizer parameter the model does not own and for a trainable parameter missing from the
  // optimizer; as nn::collect_named_units (nested units, a parameter shared by two units).
  ShardedRuntime(torch::nn::Module& model, torch::optim::Optimizer* optimizer, std::string owner);

  // The optimizer group of parameter p: -1 when it does not require grad, 0 without an optimizer.
  int group_of(const at::Tensor& p) const;
  // BatchNorm parameters: they keep full precision under a compute-dtype policy (PyTorch FSDP's
  // MixedPrecision._module_classes_to_ignore default: batch_norm takes bf16 inputs with fp32 weights).
  bool keeps_full_precision(const at::Tensor& p) const { return full_precision_.count(p.unsafeGetTensorImpl()) > 0; }
  // Replaces the FlatParameters (their `flat` and `group` filled in) and indexes them: which units
  // use each, which FlatParameters each unit uses, where each parameter is. Every parameter of the
  // model must be in exactly one FlatParameter (std::logic_error otherwise).
  void set_flats(std::vector<ShardedFlat> flats);
  size_t unit_index(nn::UnitBase& unit) const;

  // Gathers flat f for use now: when it is sharded and no prefetch is in flight, before_gather(f)
  // then an all-gather (counted); waits for a prefetch in flight. True when it started one.
  bool gather(size_t f);
  // Starts the all-gather of f when it is sharded and none is in flight (before_prefetch(f) first);
  // counted as an all-gather and a prefetch. True when it started one.
  bool prefetch(size_t f);
  // Under grad sync: finishes the reduction in flight (on_reduced), then starts f's
  // (FlatParameter::reduce_gradients_async, counted as a reduce-scatter); f's local_grad() is
  // complete at its on_reduced(f), at the latest when backward ends. Always: marks f reduced in this
  // pass and clears its arrivals.
  void reduce(size_t f);
  // Completes the reduction in flight, if any (FlatParameter::finish_reduce, then on_reduced).
  void finish_reductions();
  // Bytes of gathered FlatParameter storage now (a prefetch in flight holds its storage already).
  int64_t gathered_bytes() const;
  void note_gathered_bytes();

  // The layout policy. Unit indices are into units_; flat indices into flats_.
  virtual void on_install() {}
  virtual void on_begin_iteration() {}       // begin_forward, when no backward is pending
  virtual void on_begin_forward() = 0;       // every begin_forward: gather the root's FlatParameters
  virtual void on_pre_forward(size_t u) = 0;
  virtual void on_post_forward(size_t u) = 0;
  virtual void on_forward_without_backward() = 0;  // end_forward in evaluation: free what is gathered
  virtual void on_end_iteration() {}         // after an evaluation forward that ended an iteration
  virtual void on_abort_forward() { release_all(); }
  virtual void on_backward_start() {}        // the first hook of a backward pass; may throw
  virtual void on_pre_backward(size_t u) = 0;
  virtual void on_post_backward(size_t u) { (void)u; }
  virtual void on_gradients_ready(size_t f) = 0;  // every trainable parameter of f got its gradient
  virtual void on_reduced(size_t f) { (void)f; }  // f's local_grad() holds this pass's reduction
  virtual void on_finish_backward() = 0;     // after the final callback's reductions
  // Before gather() / prefetch() start an all-gather of f (make room, bring the shard in).
  virtual void before_gather(size_t f) { (void)f; }
  virtual void before_prefetch(size_t f) { (void)f; }

  std::string owner_;
  torch::nn::Module* model_;  // owned by the model hooks (the units hold this runtime: no cycle)
  std::vector<nn::UnitBase*> units_;       // [0] == nullptr: the root
  std::vector<std::string> unit_paths_;    // dotted module paths; "" for the root
  std::vector<NamedParameters> unit_params_;
  std::vector<ShardedFlat> flats_;
  std::vector<std::vector<size_t>> unit_flats_;  // per unit: its FlatParameters, in first-use order
  std::vector<int> forward_calls_;               // per unit, in this iteration
  std::vector<size_t> forward_order_, previous_forward_order_;  // units by first forward call
  bool require_sync_ = true, in_backward_ = false, pending_backward_ = false;
  bool hold_ = false, finish_deferred_ = false;
  std::optional<size_t> reducing_;  // the FlatParameter whose reduce-scatter is in flight
  int64_t all_gathers_ = 0, prefetches_ = 0, reduce_scatters_ = 0, max_gathered_bytes_ = 0;
  int64_t reduce_scatters_overlapped_ = 0;  // finished by the next reduce(), not by the end of backward

 private:
  struct Location {
    size_t flat;
    size_t param;
  };
  void on_grad_accumulated(const void* param);
  void arm_final_callback();
  void finish_backward();

  std::map<const void*, int> group_of_;
  std::set<const void*> full_precision_;
  std::map<const nn::UnitBase*, size_t> unit_index_;
  std::unordered_map<const void*, Location> where_;  // looked up for every gradient
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
};

// The model hooks of a sharded model: begin_forward / end_forward / abort_forward around the user's
// forward, no_sync, and the runtime's stats.
class BOOSTER_API ShardedModelHooks : public ModelHooks {
 public:
  ShardedModelHooks(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<ShardedRuntime> runtime);
  torch::nn::Module& module() override { return *model_; }
  void pre_forward() override { runtime_->begin_forward(); }
  void post_forward() override { runtime_->end_forward(); }
  void abort_forward() override { runtime_->abort_forward(); }
  void set_require_grad_sync(bool required) override { runtime_->set_require_grad_sync(required); }
  std::map<std::string, int64_t> stats() const override { return runtime_->stats(); }

 private:
  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<ShardedRuntime> runtime_;
};

// The model checkpoint of a sharded model (checkpoint::FlatCheckpointIO over the runtime's
// checkpoint_sources()). Throws checkpoint::CheckpointError from save_model / load_model when the
// model given is not the runtime's (or the runtime is gone).
class BOOSTER_API ShardedCheckpointIO : public checkpoint::FlatCheckpointIO {
 public:
  ShardedCheckpointIO(std::shared_ptr<dist::ProcessGroup> world, std::weak_ptr<ShardedRuntime> runtime, std::string owner);

 protected:
  std::vector<FlatSource> flat_sources(torch::nn::Module& model) override;
  void after_load(torch::nn::Module& model) override;

 private:
  std::shared_ptr<ShardedRuntime> runtime_for(torch::nn::Module& model) const;
  std::weak_ptr<ShardedRuntime> runtime_;
  std::string owner_;
};

// The pieces a sharded model runs with.
struct ShardedModel {
  std::shared_ptr<ShardedRuntime> runtime;
  std::shared_ptr<ModelHooks> hooks;            // for ModelWrapper and Booster::backward
  std::shared_ptr<OptimizerWrapper> optimizer;  // null when no optimizer was given
  std::shared_ptr<checkpoint::CheckpointIO> checkpoint_io;
};
// Makes the layout's optimizer wrapper over the (decorated) model hooks.
using ShardOptimizerFactory =
    std::function<std::shared_ptr<OptimizerWrapper>(std::shared_ptr<ModelHooks> hooks, OptimizerWrapperOptions options)>;

// Installs `runtime` (ShardedRuntime::install) and assembles the pieces around it: the model hooks
// (decorated when `decorate` is set), the checkpoint IO over `world`, and, with a factory, the
// optimizer wrapper (options.group = world) with the model's parameter names set (checkpoints key
// the optimizer state by them). Throws what install() and the factory throw.
BOOSTER_API ShardedModel make_sharded_model(std::shared_ptr<torch::nn::Module> model,
                                            std::shared_ptr<ShardedRuntime> runtime,
                                            std::shared_ptr<dist::ProcessGroup> world, const std::string& owner,
                                            const HooksDecorator& decorate = {},
                                            const ShardOptimizerFactory& make_optimizer = {},
                                            OptimizerWrapperOptions options = {});

}  // namespace booster::parallel
