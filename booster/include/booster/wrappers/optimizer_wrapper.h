// optimizer_wrapper.h — the boosted optimizer: backward through the plugin (with loss scaling),
// step (unscale, inf/nan check agreed across ranks, skip on overflow, clip, update, copy fp32 master
// weights back), zero_grad, gradient clipping, state. Plugins that shard optimizer state (ZeRO,
// Gemini, FSDP) derive from it and override the protected hooks.
//
// Semantics follow ColossalAI's MixedPrecisionOptimizer (colossalai/amp/naive_amp/
// mixed_precision_optimizer.py) and torch.nn.utils.clip_grad_norm_.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "booster/core/memory.h"
#include "booster/export.h"
#include "booster/mixed_precision/grad_scaler.h"
#include "booster/wrappers/optimizer_state.h"

namespace booster {
class ModelHooks;
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

// Serializable wrapper state (the wrapped optimizer's own state is saved by the checkpoint module).
struct OptimizerWrapperState {
  std::optional<mixed_precision::ScalerState> scaler;
  int64_t skipped_steps = 0;
};

class BOOSTER_API OptimizerWrapper {
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

  // The global gradient norm of the last clip (explicit or by max_norm); NaN before any.
  double last_grad_norm() const { return last_grad_norm_; }
  // The current loss scale (1.0 without a scaler).
  double loss_scale() const;
  int64_t skipped_steps() const { return skipped_steps_; }
  const OptimizerWrapperOptions& options() const { return options_; }

  OptimizerWrapperState state_dict() const;
  // Restores scaler state and the skip count. Throws std::invalid_argument when the state has scaler
  // state and this wrapper has no scaler, or the reverse.
  void load_state_dict(const OptimizerWrapperState& state);

  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const std::shared_ptr<torch::optim::Optimizer>& optimizer_ptr() const { return optimizer_; }
  // The model's parameters, in the optimizer's group order (not the master copies).
  std::vector<torch::Tensor> parameters() const;
  // What the optimizer updates, aligned with parameters(): the fp32 master copy or the parameter.
  const std::vector<torch::Tensor>& master_parameters() const { return master_params_; }
  // Dotted parameter names aligned with parameters() (set by Booster::boost; empty otherwise).
  // Checkpoints key optimizer state by these names. Throws std::invalid_argument on a size mismatch.
  void set_parameter_names(std::vector<std::string> names);
  const std::vector<std::string>& parameter_names() const { return param_names_; }
  // How many of parameters() belong to each of the optimizer's parameter groups, in group order
  // (parameters() lists group 0's first). Fixed at construction.
  const std::vector<size_t>& param_group_sizes() const { return group_sizes_; }

  // ---- State in full shape, by parameter (checkpointing; see checkpoint/checkpoint_io.h).
  // The optimizer state of each of parameters(), tensors shaped like the parameter (the master
  // dtype, float32 with master weights). Empty for a parameter without state (not stepped yet,
  // frozen). Collective for sharded wrappers (ZeRO gathers its slices): every rank calls it.
  // Throws std::invalid_argument for an optimizer type optimizer_state.h does not know.
  virtual std::vector<ParamOptimState> gather_param_states();
  // Replaces the optimizer's whole state with `states` (aligned with parameters(); each tensor shaped
  // like its parameter; converted to the master dtype and device). Local (no communication): every
  // rank passes the full states and a sharded wrapper keeps its slice. The caller validates shapes.
  virtual void load_param_states(const std::vector<ParamOptimState>& states);
  // The model's weights changed outside step() (load_model): refresh the fp32 master copies from
  // them. No-op without master copies.
  virtual void sync_master_from_model();
  // Steady-state bytes this wrapper accounts for (see core/memory.h): gradients, master weights,
  // optimizer states (actual tensors once stepped, else planned from the optimizer type and options),
  // communication buffers it owns. `parameters` is left 0 (Booster counts the module's).
  virtual MemoryReport memory_report() const;

 protected:
  // Gradients this rank contributes to the global norm and the overflow check. Default: the model
  // parameters' gradients (replicated: identical on every data-parallel rank).
  virtual std::vector<torch::Tensor> local_gradients() const;
  // The group over which gradient norms are summed (sharded plugins); null when gradients are
  // replicated, as after DDP's allreduce.
  virtual dist::ProcessGroup* norm_group() const { return nullptr; }

  // Unscales the gradients once per step (no-op without scaler or when already done).
  void unscale_once();
  // Global norm of local_gradients() (see clip_grad_by_norm).
  double global_grad_norm(double norm_type);

  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::shared_ptr<ModelHooks> hooks_;
  OptimizerWrapperOptions options_;
  std::vector<torch::Tensor> model_params_;  // model tensors, aligned with master_params_
  std::vector<torch::Tensor> master_params_; // what the optimizer updates (== model tensor if fp32)
  std::vector<std::string> param_names_;
  std::vector<size_t> group_sizes_;
  bool unscaled_ = false;
  double last_grad_norm_;
  int64_t skipped_steps_ = 0;
};

}  // namespace booster
