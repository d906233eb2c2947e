// fused_adam.cpp — FusedAdam over the registered device Adam kernels (see booster/optim/fused_adam.h),
// and its entry "FusedAdam" in the optimizer registry.
#include "booster/optim/fused_adam.h"

#include <torch/serialize/archive.h>

#include <cmath>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "booster/optim/device_kernels.h"
#include "booster/optim/optimizer_state.h"

namespace booster::optim {

// ---------------------------------------------------------------------------------------------
// Options and state (serialized as torch::optim::AdamW's)

FusedAdamOptions::FusedAdamOptions(double lr) : lr_(lr) {}

void FusedAdamOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(amsgrad);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(bias_correction);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adamw_mode);
}

void FusedAdamOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  // Optional: an AdamW archive has amsgrad but neither of the other two.
  c10::IValue v;
  if (archive.try_read("amsgrad", v)) amsgrad(v.toBool());
  if (archive.try_read("bias_correction", v)) bias_correction(v.toBool());
  if (archive.try_read("adamw_mode", v)) adamw_mode(v.toBool());
}

double FusedAdamOptions::get_lr() const { return lr(); }
void FusedAdamOptions::set_lr(const double lr) { this->lr(lr); }

void FusedAdamParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void FusedAdamParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

// ---------------------------------------------------------------------------------------------
// FusedAdam

// Named, not anonymous: libbooster is a unity build (cpu_adam.cpp has helpers of the same names).
namespace fused_adam_detail {

void check_fused_options(const FusedAdamOptions& o) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("booster: FusedAdam: " + what); };
  if (o.amsgrad())
    fail("amsgrad is not supported by the fused Adam kernel (nor by ColossalAI's FusedAdam); use "
         "torch::optim::AdamW with AdamWOptions().amsgrad(true), or set amsgrad(false)");
  if (!(o.lr() >= 0)) fail("lr must be >= 0, got " + std::to_string(o.lr()));
  if (!(o.eps() >= 0)) fail("eps must be >= 0, got " + std::to_string(o.eps()));
  if (!(o.weight_decay() >= 0)) fail("weight_decay must be >= 0, got " + std::to_string(o.weight_decay()));
  auto [b1, b2] = o.betas();
  if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
    fail("betas must be in [0, 1), got (" + std::to_string(b1) + ", " + std::to_string(b2) + ")");
}

void refuse_cpu_parameter(const torch::Tensor& p) {
  if (p.defined() && p.device().is_cpu())
    throw std::invalid_argument(
        "booster: FusedAdam steps device (CUDA) parameters with the fused multi-tensor kernel, and a parameter is "
        "a " + std::string(c10::toString(p.scalar_type())) + " CPU tensor; use booster::optim::HybridAdam (CPU and "
        "CUDA parameters) or booster::optim::CPUAdam (CPU parameters) for parameters on the CPU (e.g. ZeRO "
        "cpu_offload), or move the model to the GPU first");
}

}  // namespace fused_adam_detail

FusedAdam::FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups, FusedAdamOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<FusedAdamOptions>(defaults)) {
  fused_adam_detail::check_fused_options(defaults);
  for (const auto& group : param_groups_) {
    fused_adam_detail::check_fused_options(static_cast<const FusedAdamOptions&>(group.options()));
    for (const auto& p : group.params()) fused_adam_detail::refuse_cpu_parameter(p);
  }
}

FusedAdam::FusedAdam(std::vector<torch::Tensor> params, FusedAdamOptions defaults)
    : FusedAdam({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

torch::Tensor FusedAdam::step(LossClosure closure) { return step_with_div_scale(1.0, std::move(closure)); }

torch::Tensor FusedAdam::step_with_div_scale(double div_scale, LossClosure closure) {
  if (!(std::isfinite(div_scale) && div_scale > 0))
    throw std::invalid_argument("booster: FusedAdam: div_scale must be finite and > 0, got " +
                                std::to_string(div_scale));
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  // Check every group before changing anything.
  for (const auto& group : param_groups_) {
    fused_adam_detail::check_fused_options(static_cast<const FusedAdamOptions&>(group.options()));
    for (const auto& p : group.params())
      if (p.grad().defined()) fused_adam_detail::refuse_cpu_parameter(p);
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const FusedAdamOptions&>(group.options());
    DeviceAdamConfig c;
    c.lr = o.lr();
    c.beta1 = std::get<0>(o.betas());
    c.beta2 = std::get<1>(o.betas());
    c.eps = o.eps();
    c.weight_decay = o.weight_decay();
    c.adamw_mode = o.adamw_mode();
    c.bias_correction = o.bias_correction();
    c.div_scale = div_scale;
    std::vector<DeviceAdamParam> params;
    // New states join the optimizer only once the step went through (a refused gradient adds none).
    std::vector<std::pair<OptimizerStateKey, std::unique_ptr<FusedAdamParamState>>> fresh;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      FusedAdamParamState* st = nullptr;
      auto it = state_.find(optimizer_state_key(p));
      if (it != state_.end()) {
        st = static_cast<FusedAdamParamState*>(it->second.get());
      } else {
        fresh.emplace_back(optimizer_state_key(p), std::make_unique<FusedAdamParamState>());
        st = fresh.back().second.get();
      }
      params.push_back(DeviceAdamParam{p, p.grad(), &st->step(), &st->exp_avg(), &st->exp_avg_sq()});
    }
    if (params.empty()) continue;
    device_adam_step(c, params, "FusedAdam");
    for (auto& [key, st] : fresh) state_[key] = std::move(st);
  }
  return loss;
}

void FusedAdam::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<FusedAdamParamState, FusedAdamOptions>(archive, *this);
}

void FusedAdam::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<FusedAdamParamState, FusedAdamOptions>(archive, *this);
}

}  // namespace booster::optim
