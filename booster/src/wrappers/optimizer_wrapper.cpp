// optimizer_wrapper.cpp — backward through the plugin, step, zero_grad, clipping.
#include "booster/wrappers/optimizer_wrapper.h"

#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>

#include "booster/plugin.h"

namespace booster {

OptimizerWrapper::OptimizerWrapper(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                   std::shared_ptr<ModelHooks> hooks)
    : optimizer_(std::move(optimizer)), hooks_(std::move(hooks)) {
  if (!optimizer_) throw std::invalid_argument("booster: OptimizerWrapper needs an optimizer");
}

OptimizerWrapper::~OptimizerWrapper() = default;

void OptimizerWrapper::backward(const torch::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1)
    throw std::invalid_argument("booster: backward() needs a scalar loss (one element), got " +
                                std::string(loss.defined() ? std::to_string(loss.numel()) + " elements" : "undefined"));
  if (!loss.requires_grad())
    throw std::invalid_argument("booster: backward(): the loss does not require grad (computed under NoGradGuard, "
                                "or from a model in eval mode with frozen parameters?)");
  if (hooks_) hooks_->backward(loss);
  else loss.backward();
}

void OptimizerWrapper::step() { optimizer_->step(); }

void OptimizerWrapper::zero_grad() {
  // As torch.optim.Optimizer.zero_grad(set_to_none=False): LibTorch 1.13's C++ zero_grad calls
  // detach_() unconditionally, which fails on gradients that are views (gradient_as_bucket_view).
  at::NoGradGuard no_grad;
  for (const auto& p : parameters()) {
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (g.grad_fn()) p.mutable_grad() = g.detach();
    p.grad().zero_();
  }
}

std::vector<torch::Tensor> OptimizerWrapper::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& g : optimizer_->param_groups())
    for (const auto& p : g.params()) out.push_back(p);
  return out;
}

double OptimizerWrapper::clip_grad_by_norm(double max_norm, double norm_type) {
  if (!(max_norm > 0)) throw std::invalid_argument("booster: clip_grad_by_norm: max_norm must be > 0");
  if (!(norm_type > 0)) throw std::invalid_argument("booster: clip_grad_by_norm: norm_type must be > 0 (2.0 or INFINITY)");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : parameters())
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) return 0.0;
  double total = 0.0;
  if (std::isinf(norm_type)) {
    for (const auto& g : grads) total = std::max(total, g.abs().max().item<double>());
  } else {
    for (const auto& g : grads) total += std::pow(g.to(at::kDouble).norm(norm_type).item<double>(), norm_type);
    total = std::pow(total, 1.0 / norm_type);
  }
  double coef = max_norm / (total + 1e-6);
  if (coef < 1.0)
    for (auto& g : grads) g.mul_(coef);
  return total;
}

void OptimizerWrapper::clip_grad_by_value(double clip_value) {
  if (!(clip_value > 0)) throw std::invalid_argument("booster: clip_grad_by_value: clip_value must be > 0");
  at::NoGradGuard no_grad;
  for (const auto& p : parameters())
    if (p.grad().defined()) p.grad().clamp_(-clip_value, clip_value);
}

}  // namespace booster
