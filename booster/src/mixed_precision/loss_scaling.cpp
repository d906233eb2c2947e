// loss_scaling.cpp — see loss_scaling.h.
#include "booster/mixed_precision/loss_scaling.h"

#include <ATen/ATen.h>

#include <stdexcept>

#include "booster/dist/process_group.h"

namespace booster::mixed_precision {

LossScaling::LossScaling(std::shared_ptr<GradScaler> scaler, std::shared_ptr<dist::ProcessGroup> group)
    : scaler_(std::move(scaler)), group_(std::move(group)) {
  if (!scaler_) throw std::invalid_argument("booster: LossScaling needs a loss scaler (got null)");
}

at::Tensor LossScaling::scale_loss(const at::Tensor& loss) const { return loss * scaler_->scale(); }

bool LossScaling::step(const std::vector<at::Tensor>& grads, bool unscaled, const std::function<void(double)>& step,
                       const std::function<void()>& on_skip) {
  double overflow = has_inf_or_nan(grads) ? 1.0 : 0.0;
  if (group_ && group_->size() > 1) overflow = group_->allreduce_scalar(overflow, dist::ReduceOp::MAX);
  if (overflow > 0) {
    on_skip();
    scaler_->update(true);
    ++skipped_steps_;
    return false;
  }
  step(unscaled ? 1.0 : 1.0 / scaler_->scale());
  scaler_->update(false);
  return true;
}

void LossScaling::load(const ScalerState& state, int64_t skipped_steps) {
  scaler_->load_state_dict(state);
  skipped_steps_ = skipped_steps;
}

}  // namespace booster::mixed_precision
