// zero_optimizer.h — ZeRO stage 1 and 2 (Rajbhandari et al., "ZeRO: Memory Optimizations Toward
// Training Trillion Parameter Models", SC20): the optimizer wrapper that shards optimizer states
// (stage 1) and gradients (stage 2) across the data-parallel ranks. The mechanism lives in the core
// so the LowLevelZero plugin, Gemini, FSDP and the hybrid plugin share it.
//
// Layout (core/flat_layout.h, as DeepSpeed's stage_1_and_2.py): the trainable parameters of each
// optimizer parameter group are packed into one flat buffer of the model dtype, padded to a multiple
// of the world size N; the model's parameters become views of it. Rank r owns the r-th contiguous
// 1/N of every group: its master slice (fp32 copy when the model is bf16/fp16 with master_weights, or
// with cpu_offload; else a view of the flat buffer) is the only tensor the wrapped optimizer sees,
// one per group, so any registered elementwise optimizer (optim/optimizer_registry.h) runs unchanged
// and its states exist only for the slice. Groups keep their own hyper-parameters.
//
// Gradients (core/grad_reducer.h, bucketed and overlapped with backward, buckets never span groups):
//   each bucket is reduce-scattered in place (dist::ProcessGroup::reduce_scatter_in_place, one
//   collective per bucket, (N-1)/N of it sent per rank): its range inside rank r's shard is averaged
//   on r (DeepSpeed's average_tensor).
//   stage 1: the buckets are the parameters' .grad() (as DDP with gradient_as_bucket_view) and
//            persist; after backward, param.grad() holds the averaged gradient in this rank's shard
//            and this rank's own (unreduced) contribution elsewhere; step() copies the shard out;
//            no_sync works.
//   stage 2: the averaged range is added into r's gradient shard; param.grad() is released as soon
//            as it is in a bucket, so a rank never holds more than its shard plus the buckets in
//            flight.
// step(): overflow check and global-norm clipping over all shards (the base wrapper with
// local_gradients() = the slices' gradients and norm_group() = the world), the wrapped optimizer's
// step on the slices, copy-back into the flat buffer (rounded to the model dtype), all-gather of the
// updated slices into every rank's flat buffer.
//
// Differences from single-process training: a trainable parameter that got no gradient in a step
// (unused) is updated with a zero gradient (Adam's moments decay), as in ColossalAI and DeepSpeed.
// Parameters with requires_grad = false are left out (never updated).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "booster/core/flat_layout.h"
#include "booster/wrappers/optimizer_wrapper.h"

namespace booster {
class GradientReducer;
namespace detail {
class DeviceOffload;
}

struct ZeroOptions {
  int stage = 1;                                  // 1: shard optimizer states; 2: and gradients
  int64_t reduce_bucket_elements = 12LL << 20;    // elements per gradient bucket (ColossalAI
                                                  // reduce_bucket_size_in_m = 12 -> 12 * 2^20)
  bool overlap_communication = true;              // launch bucket reductions from backward hooks
  // Wire dtype of the gradient buckets; Undefined = param dtype. at::kFloat8_e4m3fn: buckets keep the
  // parameters' dtype and each bucket's reduce-scatter sends float8 e4m3 with one scale per bucket
  // per rank (dist::fp8_reduce_scatter_in_place, ColossalAI's fp8_communication).
  at::ScalarType communication_dtype = at::ScalarType::Undefined;
  // Master slice, optimizer states and the step live in host memory. The step of an Adam, AdamW
  // (amsgrad off), CPUAdam or HybridAdam runs through the CPU Adam kernel (optim/cpu_adam.h,
  // step_with_cpu_adam_kernel) on the optimizer's own options and state; other optimizers use their
  // own step. With the model on an accelerator (CUDA) the master slices and the optimizer states are
  // in pinned host memory (the states are moved there after the step that creates them, and after a
  // load); step() copies the gradient slices device -> host with non-blocking copies on a side stream
  // of the device and one synchronize before the CPU step, and the updated slices host -> device
  // with non-blocking copies ahead of the all-gather (src/wrappers/device_offload.h). On the CPU
  // nothing is pinned and nothing is copied (the slices are host tensors already).
  bool cpu_offload = false;
};

class BOOSTER_API ZeroOptimizer : public OptimizerWrapper {
 public:
  // optimizer: holds the model's parameters (several groups allowed; all trainable parameters of a
  // group must share dtype and device). Every rank must pass the same model and optimizer layout;
  // the parameters must already be identical on every rank (the plugin broadcasts them).
  // options.group is the data-parallel group (the overflow flag and the norm are reduced over it).
  // Throws std::invalid_argument for stage not 1 or 2, reduce_bucket_elements < 1, a group with mixed
  // dtypes, a parameter that requires grad but is not in the optimizer (its gradient would never be
  // synchronised), or an optimizer type that is not registered (optim/optimizer_registry.h).
  // named_model_parameters: every parameter of the model with its dotted name (for the check above
  // and for error messages).
  ZeroOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                OptimizerWrapperOptions options, ZeroOptions zero,
                const std::vector<std::pair<std::string, torch::Tensor>>& named_model_parameters);
  ~ZeroOptimizer() override;

  void backward(const torch::Tensor& loss) override;
  bool step() override;
  void zero_grad() override;
  double clip_grad_by_norm(double max_norm, double norm_type = 2.0) override;
  void clip_grad_by_value(double clip_value) override;

  std::vector<ParamOptimState> gather_param_states() override;
  // Checkpoints without gathering: the pieces of this rank's master slices (per group, state tensor
  // and parameter, FlatLayout::piece(j, rank), the padding left out); on load each rank reads just
  // the ranges of its slices at this world size. options.group must be the world the checkpoint is
  // saved over (the plugin's case).
  std::vector<checkpoint::StatePiece> local_state_pieces() override;
  std::vector<std::map<std::string, int64_t>> local_state_scalars() override;
  bool state_is_sharded() const override;  // the group has more than one rank
  void load_state_ranges(const std::vector<ParamStateSource>& sources, const StateRangeReader& read) override;
  void sync_master_from_model() override;
  // Located (core/memory.h): the parameters' gradients, buckets and (without cpu_offload) the master
  // slices and states where the model is; with cpu_offload the master slices and states in host
  // memory, counted as pinned on an accelerator (planned states too: they are pinned once created).
  void visit_memory(MemoryVisitor& visitor) const override;

  // Stage 1 only: false inside no_sync (gradients accumulate locally). Throws std::logic_error in
  // stage 2 (each backward reduces into the gradient shard; use stage 1 for no_sync).
  void set_require_grad_sync(bool required);

  int stage() const { return zero_.stage; }
  const ZeroOptions& zero_options() const { return zero_; }
  // Per optimizer parameter group: the flat layout, this rank's master slice (what the optimizer
  // updates; float32 [shard_numel] with master weights) and the flat model buffer [padded_numel].
  size_t num_groups() const { return groups_.size(); }
  const FlatLayout& layout(size_t group) const;
  const at::Tensor& master_slice(size_t group) const;
  const at::Tensor& flat_parameters(size_t group) const;
  // parameters() index of each tensor of layout(group) (tensor j of the layout is
  // parameters()[layout_parameters(group)[j]]; frozen parameters are in no layout).
  const std::vector<size_t>& layout_parameters(size_t group) const;
  const GradientReducer& reducer() const { return *reducer_; }
  // cpu_offload with the model on an accelerator: the master slices and states are in pinned host memory.
  bool offloads_from_device() const { return offload_ != nullptr; }

  struct Group;

 protected:
  std::vector<torch::Tensor> local_gradients() const override;
  dist::ProcessGroup* norm_group() const override;
  // Called once per step when this step's gradient slices have been placed in the master slices'
  // .grad() (float32 [shard_numel] with master weights; before the overflow check, clipping and the
  // update); a derived wrapper may change them in place. Nothing by default.
  virtual void on_gradients_prepared() {}

 private:
  void prepare_slice_grads();
  void pin_offloaded_states();  // offload_: the optimizer's states of the master slices into pinned memory

  ZeroOptions zero_;
  std::vector<std::shared_ptr<Group>> groups_;
  std::vector<int64_t> param_group_;  // per parameters() index: its group, -1 when frozen
  std::vector<int64_t> param_local_;  // per parameters() index: index inside its group's layout
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<detail::DeviceOffload> offload_;  // cpu_offload with the model on an accelerator
  bool grads_prepared_ = false;
  bool grads_are_buckets_ = false;  // stage 1 with the parameters' dtype on the wire: .grad() are bucket views
};

}  // namespace booster
