// loss_scaling.h — the loss scaler as a decorator of an optimizer step (ColossalAI's
// MixedPrecisionOptimizer with its FP16MixedPrecisionMixin: colossalai/amp/naive_amp/
// mixed_precision_optimizer.py, mixed_precision_mixin/fp16.py).
//
// The stepper (wrappers/optimizer_wrapper.h) knows how to clip and update; LossScaling wraps that
// step with what loss scaling adds around it: the loss is multiplied by the scale before backward,
// the gradients' overflow is agreed over the group before the step, an overflowing step is skipped
// (the scale backs off, the skip is counted) and a clean one runs with the inverse scale to divide
// the gradients by, after which the scale may grow. Without a scaler (fp32, bf16) the stepper runs
// undecorated.
//
// Not thread-safe; one per optimizer, like its GradScaler.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "booster/export.h"
#include "booster/mixed_precision/grad_scaler.h"

namespace booster {
namespace dist {
class ProcessGroup;
}

namespace mixed_precision {

class BOOSTER_API LossScaling {
 public:
  // `scaler` must not be null (std::invalid_argument). `group`: the ranks that must agree on an
  // overflow (the whole job; a skipped step must be skipped everywhere); null: this process only.
  LossScaling(std::shared_ptr<GradScaler> scaler, std::shared_ptr<dist::ProcessGroup> group);

  // loss x scale() (a new tensor of loss's shape, dtype and device; autograd records it).
  at::Tensor scale_loss(const at::Tensor& loss) const;
  double scale() const { return scaler_->scale(); }

  // The decorated step. `grads`: this rank's gradients (any dtypes and devices), checked for inf /
  // NaN; the result is MAX-allreduced over the group (collective: every rank of the group calls
  // this once per step). On an overflow anywhere: on_skip() runs (the caller drops the gradients),
  // the scaler backs off, skipped_steps() grows, and false is returned. Otherwise
  // step(inv_scale) runs — inv_scale = 1 / scale() when the gradients are still scaled
  // (`unscaled` false), 1 when the caller already divided them — the scaler counts a clean step,
  // and true is returned. Exceptions from step / on_skip propagate (the scaler is then unchanged).
  bool step(const std::vector<at::Tensor>& grads, bool unscaled, const std::function<void(double)>& step,
            const std::function<void()>& on_skip);

  int64_t skipped_steps() const { return skipped_steps_; }
  // The scaler's state and the skip count (checkpoints).
  ScalerState scaler_state() const { return scaler_->state_dict(); }
  void load(const ScalerState& state, int64_t skipped_steps);
  const std::shared_ptr<GradScaler>& scaler() const { return scaler_; }

 private:
  std::shared_ptr<GradScaler> scaler_;
  std::shared_ptr<dist::ProcessGroup> group_;
  int64_t skipped_steps_ = 0;
};

}  // namespace mixed_precision
}  // namespace booster
