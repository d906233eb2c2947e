// optimizer_wrapper.h — the boosted optimizer, split along its jobs: it is the stepper (backward
// through the plugin's hooks; step = clip, update, copy fp32 master weights back; zero_grad,
// gradient clipping), decorated by the loss scaler when there is one (mixed_precision/
// loss_scaling.h: scaled loss, inf/nan agreed across ranks, skip on overflow, unscale); it
// implements the checkpoint capability (checkpoint/checkpointable_optimizer.h) and describes its
// memory to a visitor (core/memory.h). Plugins that shard optimizer state (ZeRO, Gemini, FSDP)
// derive from it and override the protected hooks.
//
// Semantics follow ColossalAI's MixedPrecisionOptimizer (colossalai/amp/naive_amp/
// mixed_precision_optimizer.py) and torch.nn.utils.clip_grad_norm_.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "booster/checkpoint/checkpointable_optimizer.h"
#include "booster/core/memory.h"
#include "booster/export.h"
#include "booster/mixed_precision/grad_scaler.h"
#include "booster/mixed_precision/loss_scaling.h"

namespace booster {
class ModelHooks;
struct FlatLayout;
namespace dist {
class ProcessGroup;
}

struct OptimizerWrapperOptions {
  // Loss scaler (fp16). null: no loss scaling (fp32, bf16).
  std::shared_ptr<mixed_precision::GradScaler> scaler;
  // The group whose ranks must agree on "overflow" (the whole job). null: this process only.
  std::shared_ptr<dist::ProcessGroup> group;
  // > 0: step() clips gradients to this global norm (ColossalAI's max_norm). 0: no clipping.
  double max_norm = 0.0;
  double norm_type = 2.0;  // 2.0 (L2) or INFINITY
  // Parameters not in float32 (fp16/bf16 model weights) get float32 master copies that the optimizer
  // updates; step() copies them back (rounded) into the model. Ignored for float32 parameters.
  bool master_weights = true;
};

class BOOSTER_API OptimizerWrapper : public checkpoint::CheckpointableOptimizer {
 public:
  // `hooks` (may be null) receives backward(); without it backward is loss.backward().
  // With master_weights, the optimizer's non-fp32 parameters are replaced by fp32 copies in its
  // param groups (the model keeps its own tensors). Throws std::invalid_argument for a null optimizer,
  // max_norm < 0, or norm_type <= 0; for LBFGS (its step needs a closure; not supported).
  OptimizerWrapper(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                   OptimizerWrapperOptions options = {});
  // For sharded wrappers that build their own master slices: as above but the optimizer's param
  // groups are left untouched (master_parameters() == parameters()) whatever master_weights says.
  struct NoMasterCopies {};
  OptimizerWrapper(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                   OptimizerWrapperOptions options, NoMasterCopies);
  virtual ~OptimizerWrapper();

  // Backward of a scalar loss (one element) through the plugin's hooks, multiplied by the loss scale
  // when a scaler is active. Throws std::invalid_argument when the loss is not a scalar or does not
  // require grad.
  virtual void backward(const torch::Tensor& loss);
  // One optimizer step: unscale (if not done by clip_grad_by_norm), check inf/nan on every rank of
  // the group (MAX allreduce), and on overflow skip the update, zero the gradients, back the scaler
  // off and count the skip; otherwise clip (max_norm), update, copy master weights back and let the
  // scaler grow. Returns false when the step was skipped.
  virtual bool step();
  // Zeroes gradients in place (torch.optim's set_to_none=False; works on bucket views).
  virtual void zero_grad();
  // Unscales (once per step) and scales gradients so their global norm is at most max_norm; returns
  // the total norm before clipping (float64), over all ranks and shards: the number single-process
  // training on the full batch would compute. Norm of torch.nn.utils.clip_grad_norm_ (coef =
  // max_norm / (total + 1e-6), applied when < 1). A non-finite norm clips nothing (step() will skip).
  // norm_type: 2.0 or INFINITY (any p > 0 works). Throws std::invalid_argument for max_norm <= 0 or
  // norm_type <= 0.
  virtual double clip_grad_by_norm(double max_norm, double norm_type = 2.0);
  // Unscales (once per step) then clamps every gradient element into [-clip_value, clip_value].
  // Throws std::invalid_argument for clip_value <= 0.
  virtual void clip_grad_by_value(double clip_value);

  // The global gradient norm of the last clip (explicit or by max_norm); NaN before any. After
  // step() clipped on a device (clip_on_device) the norm is read from there here, which waits for
  // that step's gradients (one host synchronisation, on the first call after the step).
  double last_grad_norm() const;
  // The current loss scale (1.0 without a scaler).
  double loss_scale() const;
  // Steps skipped on an overflow (always 0 without a loss scaler).
  int64_t skipped_steps() const;
  const OptimizerWrapperOptions& options() const { return options_; }

  // ---- checkpoint::CheckpointableOptimizer (contracts in checkpoint/checkpointable_optimizer.h).
  bool has_loss_scaler() const override { return static_cast<bool>(options_.scaler); }
  OptimizerWrapperState state_dict() const override;
  void load_state_dict(const OptimizerWrapperState& state) override;
  torch::optim::Optimizer& optimizer() override { return *optimizer_; }
  std::vector<torch::Tensor> parameters() const override;
  // The fp32 master copy or the parameter, aligned with parameters().
  const std::vector<torch::Tensor>& master_parameters() const override { return master_params_; }
  // Set by Booster::boost (empty otherwise).
  const std::vector<std::string>& parameter_names() const override { return param_names_; }
  // Fixed at construction (parameters() lists group 0's first).
  const std::vector<size_t>& param_group_sizes() const override { return group_sizes_; }
  // Default (replicated state): the wrapped optimizer's state by parameter, local.
  std::vector<ParamOptimState> gather_param_states() override;
  // Default (replicated state, DDP): rank 0 of options().group, or the only process when there is no
  // group, returns every state tensor whole (offset 0); other ranks return none.
  std::vector<checkpoint::StatePiece> local_state_pieces() override;
  std::vector<std::map<std::string, int64_t>> local_state_scalars() override;
  // Default false (replicated).
  bool state_is_sharded() const override { return false; }
  // Default: whole tensors. A sharded wrapper's slice takes the largest of its parameters' scalars
  // (a DDP checkpoint's step counts may differ per parameter).
  void load_state_ranges(const std::vector<ParamStateSource>& sources, const StateRangeReader& read) override;

  const std::shared_ptr<torch::optim::Optimizer>& optimizer_ptr() const { return optimizer_; }
  // Sets parameter_names(). Checkpoints key optimizer state by these names. Throws
  // std::invalid_argument on a size mismatch with parameters().
  void set_parameter_names(std::vector<std::string> names);
  // Replaces the optimizer's whole state with `states` (aligned with parameters(); each tensor shaped
  // like its parameter; converted to the master dtype and device). Local (no communication): every
  // rank passes the full states and a sharded wrapper keeps its slice. The caller validates shapes.
  // It is load_state_ranges over these tensors. Throws std::invalid_argument when states.size()
  // differs from parameters().size().
  void load_param_states(const std::vector<ParamOptimState>& states);
  // The model's weights changed outside step() (load_model): refresh the fp32 master copies from
  // them. No-op without master copies.
  virtual void sync_master_from_model();
  // Describes to `visitor` (core/memory.h) the steady-state memory this wrapper accounts for, each
  // part placed where it lives: gradients, master weights, optimizer states (actual tensors once
  // stepped, else planned from the optimizer type and options), communication buffers it owns, and
  // parameters only where the wrapper holds them instead of the module (a shard). Default: the
  // parameters' gradients (planned for those without one yet) with the parameters, master copies
  // and the optimizer's states where they are.
  virtual void visit_memory(MemoryVisitor& visitor) const;
  // The visits summed (MemoryReportBuilder).
  MemoryReport memory_report() const;

 protected:
  // Gradients this rank contributes to the global norm and the overflow check. Default: the model
  // parameters' gradients (replicated: identical on every data-parallel rank).
  virtual std::vector<torch::Tensor> local_gradients() const;
  // The group over which gradient norms are summed (sharded plugins); null when gradients are
  // replicated, as after DDP's allreduce.
  virtual dist::ProcessGroup* norm_group() const { return nullptr; }
  // The gradients (or parts of them) this rank counts in the global norm, which sums them over
  // norm_group(): each element of the model's gradient must be counted on exactly one rank of that
  // group. Default: local_gradients() (sharded: every rank its own part; replicated: no group).
  // The hybrid plugin counts a tensor-parallel-replicated parameter on tp rank 0 only. Clipping still
  // scales every one of local_gradients().
  virtual std::vector<torch::Tensor> norm_gradients() const { return local_gradients(); }

  // read(param, key, offset, length), checked: a defined 1-D tensor of `length` elements (else
  // std::invalid_argument naming the parameter index, the key and the range).
  static at::Tensor read_state_range(const StateRangeReader& read, size_t param, const std::string& key,
                                     int64_t offset, int64_t length);
  // For sharded wrappers (ZeRO, FSDP). One flat slice: rank `rank`'s shard of `layout`, whose tensor
  // j is parameters()[indices[j]], with optimizer state `slice` (tensors of [shard_numel] elements).
  // Its pieces for local_state_pieces: per state tensor and parameter, the elements of
  // layout.piece(j, rank) as a view of the slice's tensor (zero-length when it holds none).
  std::vector<checkpoint::StatePiece> slice_state_pieces(const ParamOptimState& slice, const FlatLayout& layout,
                                                         int rank, const std::vector<size_t>& indices) const;
  // Its state in full shape for gather_param_states (collective over `group`, the layout's ranks):
  // each state tensor is all-gathered (a group of one: taken as is) and out[indices[j]] gets the
  // view of parameter j, shaped like it, and the slice's scalars.
  void gather_slice_state(const ParamOptimState& slice, const FlatLayout& layout, dist::ProcessGroup& group,
                          const std::vector<size_t>& indices, std::vector<ParamOptimState>& out) const;
  // Its new state for load_state_ranges: the union of the parameters' tensor keys, the largest of
  // their scalars; each tensor [shard_numel] with `options`, zeros (padding, parameters without the
  // key) where no piece is read. empty() when none of the parameters has state.
  static ParamOptimState read_slice_state(const std::vector<ParamStateSource>& sources, const StateRangeReader& read,
                                          const FlatLayout& layout, int rank, const std::vector<size_t>& indices,
                                          const at::TensorOptions& options);
  // parameter_names()[i]; std::invalid_argument when the names are not set (not made by boost()).
  const std::string& checkpoint_name(size_t i) const;
  // Unscales the gradients once per step (no-op without scaler or when already done).
  void unscale_once();
  // step() with `update(wrapped optimizer)` in place of the wrapped optimizer's step() (everything
  // else as step(): overflow skip, clipping, master copies). ZeRO's cpu_offload passes the CPU Adam
  // kernel (optim/cpu_adam.h).
  bool step_with(const std::function<void(torch::optim::Optimizer&)>& update);
  // The stepper's part of a step, which the loss scaler decorates: divide the gradients by
  // 1 / inv_scale while clipping them to max_norm (or just divide), widen them into the fp32 master
  // copies, update(wrapped optimizer), copy the masters back into the model.
  void clip_and_update(double inv_scale, const std::function<void(torch::optim::Optimizer&)>& update);
  // Global norm of local_gradients() (see clip_grad_by_norm).
  double global_grad_norm(double norm_type);
  // step()'s unscale + clip when every gradient (norm_gradients() and local_gradients()) is on one
  // non-CPU device: the norm, its reduction over norm_group() and the coefficient stay on the device
  // (detail::clip_coefficient, detail::scale_gradients), so the step queues its work without a host
  // synchronisation, as torch.nn.utils.clip_grad_norm_ on CUDA. Same arithmetic as
  // clip_grad_by_norm's host path. Returns false, having done nothing, when the gradients are on the
  // CPU or on several devices (the caller then takes the host path).
  bool clip_on_device(double max_norm, double norm_type, double inv_scale);

  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::shared_ptr<ModelHooks> hooks_;
  OptimizerWrapperOptions options_;
  std::vector<torch::Tensor> model_params_;  // model tensors, aligned with master_params_
  std::vector<torch::Tensor> master_params_; // what the optimizer updates (== model tensor if fp32)
  std::vector<std::string> param_names_;
  std::vector<size_t> group_sizes_;
  bool unscaled_ = false;
  mutable double last_grad_norm_;
  mutable at::Tensor last_grad_norm_device_;  // step()'s norm on its device until last_grad_norm() reads it
  // The loss scaler decorating step() (mixed_precision/loss_scaling.h); null without a scaler.
  std::unique_ptr<mixed_precision::LossScaling> loss_scaling_;
};

namespace detail {
// The clip coefficient of clip_grad_by_norm, computed on total's device without a host
// synchronisation: total is the unscaled global norm (0-dim float64); returns a 0-dim float64 tensor
// on its device, inv_scale x (max_norm / (total + 1e-6)) where that quotient is < 1, else inv_scale
// (also for a non-finite total, and for max_norm <= 0: unscale only). The same float64 operations as
// the host path, so the same bits (torch.nn.utils.clip_grad_norm_'s rule, coef applied when < 1).
BOOSTER_API at::Tensor clip_coefficient(const at::Tensor& total, double inv_scale, double max_norm);
// Multiplies every gradient in place by coef (0-dim float64, any device): float32 tensors by
// torch._foreach_mul_ with coef rounded to float32 (the bits of mul_ by that double scalar and of the
// CUDA multi-tensor scale), float64 by coef, bfloat16 / float16 as the product in float32 (coef
// rounded to float32) rounded once to their dtype (the CUDA multi-tensor scale's bits; LibTorch's
// CPU mul_ by a double scalar can differ from it by an ulp). Queues work only.
BOOSTER_API void scale_gradients(const std::vector<at::Tensor>& grads, const at::Tensor& coef);
}  // namespace detail

}  // namespace booster
