// cpu_adam.cpp — CPUAdam / HybridAdam over the CPU Adam kernel (HybridAdam's device parameters over the
// registered device kernels, booster/optim/device_kernels.h), and the kernel step of LibTorch's Adam /
// AdamW (see booster/optim/cpu_adam.h).
#include "booster/optim/cpu_adam.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/serialize/archive.h>

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "booster/optim/device_kernels.h"
#include "booster/optim/optimizer_state.h"

namespace booster::optim {

namespace kc = booster::kernels::cpu;

// ---------------------------------------------------------------------------------------------
// Options and state (serialized like torch::optim::AdamW's)

CPUAdamOptions::CPUAdamOptions(double lr) : lr_(lr) {}

void CPUAdamOptions::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(lr);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(betas);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(eps);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(weight_decay);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(bias_correction);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(adamw_mode);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(amsgrad);
}

void CPUAdamOptions::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, lr);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(betas_t, betas);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, eps);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(double, weight_decay);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, bias_correction);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, adamw_mode);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(bool, amsgrad);
}

double CPUAdamOptions::get_lr() const { return lr(); }
void CPUAdamOptions::set_lr(const double lr) { this->lr(lr); }

void CPUAdamParamState::serialize(torch::serialize::OutputArchive& archive) const {
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(step);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg);
  _TORCH_OPTIM_SERIALIZE_TORCH_ARG(exp_avg_sq);
}

void CPUAdamParamState::serialize(torch::serialize::InputArchive& archive) {
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(int64_t, step);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg);
  _TORCH_OPTIM_DESERIALIZE_TORCH_ARG(torch::Tensor, exp_avg_sq);
}

// ---------------------------------------------------------------------------------------------
// The kernel call on one parameter, for any state type with step / exp_avg / exp_avg_sq

namespace {

std::string describe(const torch::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + " on " + t.device().str() + (t.is_contiguous() ? "" : ", not contiguous");
}

bool is_cpu_fp32_dense(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.layout() == c10::kStrided && t.scalar_type() == at::kFloat &&
         t.is_contiguous();
}

// A moment tensor of the state as the kernel needs it: float32, contiguous, on the CPU, numel of p.
torch::Tensor usable_moment(const torch::Tensor& m, const torch::Tensor& p, const char* who, const char* key) {
  if (!m.defined()) return torch::zeros_like(p, at::MemoryFormat::Contiguous);
  if (m.numel() != p.numel())
    throw std::invalid_argument(std::string("booster: ") + who + ": state '" + key + "' has " +
                                std::to_string(m.numel()) + " elements but its parameter has " +
                                std::to_string(p.numel()));
  return is_cpu_fp32_dense(m) ? m : m.to(p.options(), false, true).contiguous();
}

struct Hyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool bias_correction, adamw_mode;
};

template <class State>
void kernel_update(torch::optim::Optimizer& opt, const torch::Tensor& p, const torch::Tensor& grad, const Hyper& h,
                   double div_scale, const torch::Tensor& bf16_out, const char* who) {
  const OptimizerStateKey key = optimizer_state_key(p);
  auto& states = opt.state();
  auto it = states.find(key);
  if (it == states.end()) {
    auto st = std::make_unique<State>();
    st->step(0);
    it = states.emplace(key, std::move(st)).first;
  }
  auto& st = static_cast<State&>(*it->second);
  torch::Tensor m = usable_moment(st.exp_avg(), p, who, "exp_avg");
  torch::Tensor v = usable_moment(st.exp_avg_sq(), p, who, "exp_avg_sq");
  torch::Tensor g = grad.is_contiguous() ? grad : grad.contiguous();
  kc::AdamConfigDouble c;  // LibTorch's options are doubles: used as they are
  c.lr = h.lr;
  c.beta1 = h.beta1;
  c.beta2 = h.beta2;
  c.eps = h.eps;
  c.weight_decay = h.weight_decay;
  c.adamw_mode = h.adamw_mode;
  c.bias_correction = h.bias_correction;
  c.step = st.step() + 1;
  c.div_scale = static_cast<float>(div_scale);
  const bool bf16 = g.scalar_type() == at::kBFloat16;
  kc::adam_step(c, p.numel(), p.data_ptr<float>(), bf16 ? nullptr : g.data_ptr<float>(),
                bf16 ? reinterpret_cast<const uint16_t*>(g.data_ptr<at::BFloat16>()) : nullptr, m.data_ptr<float>(),
                v.data_ptr<float>(),
                bf16_out.defined() ? reinterpret_cast<uint16_t*>(bf16_out.data_ptr<at::BFloat16>()) : nullptr,
                cpu_adam_isa());
  st.step(c.step);
  st.exp_avg(m);
  st.exp_avg_sq(v);
}

// Throws std::invalid_argument unless grad and bf16_out (when defined) fit param (see the header).
void check_grad_and_out(const std::string& who, const torch::Tensor& param, const torch::Tensor& grad,
                        const torch::Tensor& bf16_out) {
  if (!grad.defined() || grad.layout() != c10::kStrided || !grad.device().is_cpu() ||
      (grad.scalar_type() != at::kFloat && grad.scalar_type() != at::kBFloat16) || grad.numel() != param.numel())
    throw std::invalid_argument("booster: " + who + ": the gradient must be a dense float32 or bfloat16 CPU tensor of " +
                                std::to_string(param.numel()) + " elements, got " +
                                (grad.defined() ? describe(grad) + " with " + std::to_string(grad.numel()) + " elements"
                                                : std::string("an undefined tensor")));
  if (bf16_out.defined() && (bf16_out.scalar_type() != at::kBFloat16 || !bf16_out.device().is_cpu() ||
                             !bf16_out.is_contiguous() || bf16_out.numel() != param.numel()))
    throw std::invalid_argument("booster: " + who + ": param_bf16_out must be a contiguous bfloat16 CPU tensor of " +
                                std::to_string(param.numel()) + " elements, got " + describe(bf16_out));
}

void check_options(const CPUAdamOptions& o, const char* who) {
  auto fail = [&](const std::string& what) { throw std::invalid_argument(std::string("booster: ") + who + ": " + what); };
  if (o.amsgrad())
    fail("amsgrad is not supported by the CPU Adam kernel; use torch::optim::AdamW with "
         "AdamWOptions().amsgrad(true) (LibTorch's step), or set amsgrad(false)");
  if (!(o.lr() >= 0)) fail("lr must be >= 0, got " + std::to_string(o.lr()));
  if (!(o.eps() >= 0)) fail("eps must be >= 0, got " + std::to_string(o.eps()));
  if (!(o.weight_decay() >= 0)) fail("weight_decay must be >= 0, got " + std::to_string(o.weight_decay()));
  auto [b1, b2] = o.betas();
  if (!(b1 >= 0 && b1 < 1) || !(b2 >= 0 && b2 < 1))
    fail("betas must be in [0, 1), got (" + std::to_string(b1) + ", " + std::to_string(b2) + ")");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// CPUAdam

CPUAdam::CPUAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups, CPUAdamOptions defaults)
    : Optimizer(std::move(param_groups), std::make_unique<CPUAdamOptions>(defaults)) {
  check_options(defaults, "CPUAdam");
  for (const auto& group : param_groups_) check_options(static_cast<const CPUAdamOptions&>(group.options()), "CPUAdam");
}

CPUAdam::CPUAdam(std::vector<torch::Tensor> params, CPUAdamOptions defaults)
    : CPUAdam({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

void CPUAdam::check_parameter(const torch::Tensor& p) const {
  if (!is_cpu_fp32_dense(p))
    throw std::invalid_argument(std::string("booster: ") + type_name() +
                                " steps contiguous float32 CPU parameters (the fp32 master weights), got " + describe(p) +
                                "; keep a float32 master copy on the CPU (the booster's mixed precision or ZeRO do), "
                                "or use torch::optim::AdamW for other parameters");
}

void CPUAdam::step_with_options(const torch::Tensor& param, const torch::Tensor& grad, const CPUAdamOptions& o,
                                double div_scale, const torch::Tensor& bf16_out) {
  check_options(o, type_name());
  check_parameter(param);
  const std::string who = type_name();
  check_grad_and_out(who, param, grad, bf16_out);
  if (!(std::isfinite(div_scale) && div_scale > 0))
    throw std::invalid_argument("booster: " + who + ": div_scale must be finite and > 0, got " + std::to_string(div_scale));
  auto [b1, b2] = o.betas();
  Hyper h{o.lr(), b1, b2, o.eps(), o.weight_decay(), o.bias_correction(), o.adamw_mode()};
  kernel_update<CPUAdamParamState>(*this, param, grad, h, div_scale, bf16_out, type_name());
}

torch::Tensor CPUAdam::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const CPUAdamOptions&>(group.options());
    for (auto& p : group.params())
      if (p.grad().defined()) step_with_options(p, p.grad(), options, 1.0, {});
  }
  return loss;
}

void CPUAdam::step_parameter(const torch::Tensor& param, const torch::Tensor& grad, double div_scale,
                             const torch::Tensor& param_bf16_out) {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_)
    for (auto& p : group.params())
      if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl())
        return step_with_options(p, grad, static_cast<const CPUAdamOptions&>(group.options()), div_scale,
                                 param_bf16_out);
  throw std::invalid_argument(std::string("booster: ") + type_name() +
                              "::step_parameter: the tensor is not a parameter of this optimizer (pass the very tensor "
                              "held in its param groups)");
}

void CPUAdam::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<CPUAdamParamState, CPUAdamOptions>(archive, *this);
}

void CPUAdam::load(torch::serialize::InputArchive& archive) {
  torch::optim::serialize<CPUAdamParamState, CPUAdamOptions>(archive, *this);
}

// ---------------------------------------------------------------------------------------------
// HybridAdam

torch::Tensor HybridAdam::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const CPUAdamOptions&>(group.options());
    // Device parameters first: their one multi-tensor launch per device is queued (asynchronous), and
    // the CPU kernel then runs while the device works. New states join the optimizer only once the
    // device step went through.
    std::vector<DeviceAdamParam> device;
    std::vector<std::pair<OptimizerStateKey, std::unique_ptr<CPUAdamParamState>>> fresh;
    for (auto& p : group.params()) {
      if (!p.grad().defined() || p.device().is_cpu()) continue;
      CPUAdamParamState* st = nullptr;
      auto it = state_.find(optimizer_state_key(p));
      if (it != state_.end()) {
        st = static_cast<CPUAdamParamState*>(it->second.get());
      } else {
        fresh.emplace_back(optimizer_state_key(p), std::make_unique<CPUAdamParamState>());
        st = fresh.back().second.get();
      }
      device.push_back(DeviceAdamParam{p, p.grad(), &st->step(), &st->exp_avg(), &st->exp_avg_sq()});
    }
    if (!device.empty()) {
      check_options(o, "HybridAdam");
      DeviceAdamConfig c;
      c.lr = o.lr();
      c.beta1 = std::get<0>(o.betas());
      c.beta2 = std::get<1>(o.betas());
      c.eps = o.eps();
      c.weight_decay = o.weight_decay();
      c.adamw_mode = o.adamw_mode();
      c.bias_correction = o.bias_correction();
      device_adam_step(c, device, "HybridAdam");
      for (auto& [key, st] : fresh) state_[key] = std::move(st);
    }
    for (auto& p : group.params())
      if (p.grad().defined() && p.device().is_cpu()) step_with_options(p, p.grad(), o, 1.0, {});
  }
  return loss;
}

// ---------------------------------------------------------------------------------------------
// Free functions

kernels::cpu::Isa cpu_adam_isa() {
  const char* env = std::getenv("BOOSTER_CPU_ADAM_ISA");
  if (!env || !*env) return kc::detected_isa();
  const std::string s(env);
  kc::Isa isa;
  if (s == "scalar") isa = kc::Isa::kScalar;
  else if (s == "avx2") isa = kc::Isa::kAvx2;
  else if (s == "avx512") isa = kc::Isa::kAvx512;
  else
    throw std::invalid_argument("booster: BOOSTER_CPU_ADAM_ISA=" + s + " is not one of scalar, avx2, avx512 (unset it "
                                "to use the best path of this CPU, " + kc::isa_name(kc::detected_isa()) + ")");
  if (static_cast<int>(isa) > static_cast<int>(kc::detected_isa()))
    throw std::invalid_argument("booster: BOOSTER_CPU_ADAM_ISA=" + s + ", but this CPU supports at most " +
                                kc::isa_name(kc::detected_isa()) + "; unset it or choose a lower path");
  return isa;
}

namespace {

// The kernel's hyper-parameters from LibTorch's Adam / AdamW options (bias correction always on).
template <class Options>
Hyper torch_hyper(const Options& o, bool adamw_mode) {
  return Hyper{o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(), o.weight_decay(), true, adamw_mode};
}

template <class Options, class State>
bool step_torch_adam(torch::optim::Optimizer& opt, bool adamw_mode) {
  for (const auto& group : opt.param_groups()) {
    if (static_cast<const Options&>(group.options()).amsgrad()) return false;
    for (const auto& p : group.params())
      if (p.grad().defined() && (!is_cpu_fp32_dense(p) || p.grad().layout() != c10::kStrided ||
                                 !p.grad().device().is_cpu() || p.grad().scalar_type() != at::kFloat ||
                                 p.grad().numel() != p.numel()))
        return false;
  }
  torch::NoGradGuard no_grad;
  const char* who = adamw_mode ? "AdamW" : "Adam";
  for (auto& group : opt.param_groups()) {
    const Hyper h = torch_hyper(static_cast<const Options&>(group.options()), adamw_mode);
    for (auto& p : group.params())
      if (p.grad().defined()) kernel_update<State>(opt, p, p.grad(), h, 1.0, {}, who);
  }
  return true;
}

template <class Options, class State>
bool step_torch_adam_parameter(torch::optim::Optimizer& opt, bool adamw_mode, const torch::Tensor& param,
                               const torch::Tensor& grad, const torch::Tensor& bf16_out) {
  const char* who = adamw_mode ? "AdamW" : "Adam";
  for (auto& group : opt.param_groups())
    for (auto& p : group.params()) {
      if (p.unsafeGetTensorImpl() != param.unsafeGetTensorImpl()) continue;
      const auto& o = static_cast<const Options&>(group.options());
      if (o.amsgrad() || !is_cpu_fp32_dense(p)) return false;
      check_grad_and_out(who, p, grad, bf16_out);
      torch::NoGradGuard no_grad;
      kernel_update<State>(opt, p, grad, torch_hyper(o, adamw_mode), 1.0, bf16_out, who);
      return true;
    }
  throw std::invalid_argument(std::string("booster: step_parameter_with_cpu_adam_kernel: the tensor is not a parameter "
                                          "of this ") + who + " (pass the very tensor held in its param groups)");
}

}  // namespace

bool step_parameter_with_cpu_adam_kernel(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                                         const torch::Tensor& grad, const torch::Tensor& param_bf16_out) {
  if (auto* o = dynamic_cast<CPUAdam*>(&optimizer)) {  // CPUAdam and HybridAdam
    if (!is_cpu_fp32_dense(param)) return false;
    o->step_parameter(param, grad, 1.0, param_bf16_out);
    return true;
  }
  if (typeid(optimizer) == typeid(torch::optim::AdamW))
    return step_torch_adam_parameter<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
        optimizer, true, param, grad, param_bf16_out);
  if (typeid(optimizer) == typeid(torch::optim::Adam))
    return step_torch_adam_parameter<torch::optim::AdamOptions, torch::optim::AdamParamState>(
        optimizer, false, param, grad, param_bf16_out);
  return false;
}

bool step_with_cpu_adam_kernel(torch::optim::Optimizer& optimizer) {
  if (auto* o = dynamic_cast<CPUAdam*>(&optimizer)) {  // CPUAdam and HybridAdam
    o->step();
    return true;
  }
  if (typeid(optimizer) == typeid(torch::optim::AdamW))
    return step_torch_adam<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(optimizer, true);
  if (typeid(optimizer) == typeid(torch::optim::Adam))
    return step_torch_adam<torch::optim::AdamOptions, torch::optim::AdamParamState>(optimizer, false);
  return false;
}

}  // namespace booster::optim
