// optimizer_wrapper.h — the boosted optimizer: backward through the plugin, step, zero_grad,
// gradient clipping. Plugins that shard optimizer state (ZeRO, Gemini, FSDP) derive from it.
#pragma once

#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "booster/export.h"

namespace booster {
class ModelHooks;

class BOOSTER_API OptimizerWrapper {
 public:
  // `hooks` (may be null) receives backward(); without it backward is loss.backward().
  OptimizerWrapper(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks);
  virtual ~OptimizerWrapper();

  // Backward of a scalar loss (0-dim tensor) through the plugin's hooks. Throws std::invalid_argument
  // when the loss is not a scalar or does not require grad.
  virtual void backward(const torch::Tensor& loss);
  // optimizer.step() (the wrapped optimizer's update rule).
  virtual void step();
  // Zeroes gradients of every parameter in the optimizer in place (torch.optim's set_to_none=False);
  // works on gradients that are bucket views (gradient_as_bucket_view).
  virtual void zero_grad();
  // Scales gradients so their global norm is at most max_norm; returns the total norm before
  // clipping (float64). norm_type: 2.0 for L2 or INFINITY for the max norm. Gradients must already
  // be synchronised (true after Booster::backward with data-parallel plugins). Formula of
  // torch.nn.utils.clip_grad_norm_: coef = max_norm / (total + 1e-6), applied when coef < 1.
  // Throws std::invalid_argument for max_norm <= 0 or norm_type <= 0.
  virtual double clip_grad_by_norm(double max_norm, double norm_type = 2.0);
  // Clamps every gradient element into [-clip_value, clip_value]. Throws for clip_value <= 0.
  virtual void clip_grad_by_value(double clip_value);

  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const std::shared_ptr<torch::optim::Optimizer>& optimizer_ptr() const { return optimizer_; }
  // Every parameter of every group.
  std::vector<torch::Tensor> parameters() const;

 protected:
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::shared_ptr<ModelHooks> hooks_;
};

}  // namespace booster
