// grad_scaler.cpp — ColossalAI's DynamicGradScaler / ConstantGradScaler and the inf/nan check and
// unscale helpers (see grad_scaler.h for the semantics and their source).
#include "booster/mixed_precision/grad_scaler.h"

#include <ATen/ops/aminmax.h>
#include <ATen/ops/view_as_real.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "booster/config.h"
#include "booster/optim/device_kernels.h"

namespace booster::mixed_precision {

namespace {

// Shortest text that reads back as the same double ("65536", "0.5", "1e-05").
std::string num(double v) {
  std::ostringstream os;
  os.precision(17);
  for (int p = 1; p <= 17; ++p) {
    os.str("");
    os.precision(p);
    os << v;
    if (std::strtod(os.str().c_str(), nullptr) == v) break;
  }
  return os.str();
}

[[noreturn]] void invalid(const std::string& who, const std::string& what) {
  throw std::invalid_argument(who + ": " + what);
}

// A loss scale must be a finite, positive float32 value.
void check_scale(const std::string& who, const std::string& name, double v) {
  if (!(std::isfinite(v) && v > 0.0 && v <= static_cast<double>(FLT_MAX) && static_cast<float>(v) > 0.0f)) {
    invalid(who, name + " must be a finite number > 0 that is a positive float32 value (at most " +
                     num(FLT_MAX) + "; the scale is kept in float32 as in ColossalAI), got " + num(v));
  }
}

// float32 product rounded once (the float x float product is exact in double), as a float32
// tensor times a Python scalar in PyTorch (the scalar is converted to float32 first).
float mul_f32(float a, float b) { return static_cast<float>(static_cast<double>(a) * static_cast<double>(b)); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// GradScaler

GradScaler::~GradScaler() = default;

double GradScaler::inv_scale() const {
  // ColossalAI: self._scale.double().reciprocal().float()
  return static_cast<double>(static_cast<float>(1.0 / scale()));
}

// ---------------------------------------------------------------------------------------------
// DynamicGradScaler

DynamicGradScaler::DynamicGradScaler(const DynamicGradScalerOptions& options) : options_(options) {
  const std::string who = "DynamicGradScaler";
  const DynamicGradScalerOptions& o = options_;
  check_scale(who, "initial_scale", o.initial_scale);
  if (!(std::isfinite(o.growth_factor) && o.growth_factor > 1.0 && static_cast<float>(o.growth_factor) > 1.0f &&
        o.growth_factor <= static_cast<double>(FLT_MAX))) {
    invalid(who, "growth_factor must be a finite number > 1 (also when rounded to float32), got " +
                     num(o.growth_factor));
  }
  if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0 && static_cast<float>(o.backoff_factor) > 0.0f &&
        static_cast<float>(o.backoff_factor) < 1.0f)) {
    invalid(who, "backoff_factor must be between 0 and 1, exclusive (also when rounded to float32), got " +
                     num(o.backoff_factor));
  }
  if (o.growth_interval < 1) {
    invalid(who, "growth_interval must be >= 1 (clean steps before the scale grows), got " +
                     std::to_string(o.growth_interval));
  }
  if (o.hysteresis < 0) {
    invalid(who, "hysteresis must be >= 0 (overflows before the scale backs off), got " +
                     std::to_string(o.hysteresis));
  }
  check_scale(who, "min_scale", o.min_scale);
  check_scale(who, "max_scale", o.max_scale);

  scale_ = static_cast<float>(o.initial_scale);
  growth_factor_ = static_cast<float>(o.growth_factor);
  backoff_factor_ = static_cast<float>(o.backoff_factor);
  min_scale_ = static_cast<float>(o.min_scale);
  max_scale_ = static_cast<float>(o.max_scale);

  // ColossalAI's asserts, in float32 like its tensors.
  if (!(min_scale_ <= max_scale_)) {
    invalid(who, "max_scale (" + num(o.max_scale) + ") must be >= min_scale (" + num(o.min_scale) + ")");
  }
  if (!(min_scale_ <= scale_)) {
    invalid(who, "initial_scale (" + num(o.initial_scale) + ") must be >= min_scale (" + num(o.min_scale) + ")");
  }
  if (!(scale_ <= max_scale_)) {
    invalid(who, "initial_scale (" + num(o.initial_scale) + ") must be <= max_scale (" + num(o.max_scale) + ")");
  }
}

DynamicGradScalerOptions DynamicGradScaler::from_options(const booster::Options& section,
                                                         const DynamicGradScalerOptions& d) {
  const double fmax = static_cast<double>(FLT_MAX);
  DynamicGradScalerOptions o;
  o.initial_scale = section.get_double("initial_scale", d.initial_scale, 0.0, fmax);
  o.growth_factor = section.get_double("growth_factor", d.growth_factor, 1.0, fmax);
  o.backoff_factor = section.get_double("backoff_factor", d.backoff_factor, 0.0, 1.0);
  o.growth_interval = section.get_int("growth_interval", d.growth_interval, 1);
  o.hysteresis = section.get_int("hysteresis", d.hysteresis, 0);
  o.min_scale = section.get_double("min_scale", d.min_scale, 0.0, fmax);
  o.max_scale = section.get_double("max_scale", d.max_scale, 0.0, fmax);
  return o;
}

void DynamicGradScaler::update(bool overflow) {
  if (overflow) {
    count_overflow();
    hysteresis_step_ += 1;
    growth_step_ = 0;
    if (hysteresis_step_ >= options_.hysteresis) {
      // _backoff_scale(); the hysteresis counter is not reset here (nor in ColossalAI).
      const float backed_off = mul_f32(scale_, backoff_factor_);
      scale_ = backed_off < min_scale_ ? min_scale_ : backed_off;
    }
  } else {
    growth_step_ += 1;
    if (growth_step_ == options_.growth_interval) {
      growth_step_ = 0;
      hysteresis_step_ = 0;
      // _grow_scale()
      const float grown = mul_f32(scale_, growth_factor_);
      scale_ = grown > max_scale_ ? max_scale_ : grown;
    }
  }
}

ScalerState DynamicGradScaler::state_dict() const {
  ScalerState s;
  s.scale = static_cast<double>(scale_);
  s.growth_step = growth_step_;
  s.hysteresis_step = hysteresis_step_;
  return s;
}

void DynamicGradScaler::load_state_dict(const ScalerState& state) {
  const std::string who = "DynamicGradScaler::load_state_dict";
  check_scale(who, "scale", state.scale);
  if (state.growth_step < 0 || state.growth_step >= options_.growth_interval) {
    invalid(who, "growth_step must be in [0, growth_interval = " + std::to_string(options_.growth_interval) +
                     "), got " + std::to_string(state.growth_step) +
                     " (was the state saved with a larger growth_interval?)");
  }
  if (state.hysteresis_step < 0) {
    invalid(who, "hysteresis_step must be >= 0, got " + std::to_string(state.hysteresis_step));
  }
  scale_ = static_cast<float>(state.scale);
  growth_step_ = state.growth_step;
  hysteresis_step_ = state.hysteresis_step;
}

// ---------------------------------------------------------------------------------------------
// ConstantGradScaler

ConstantGradScaler::ConstantGradScaler(double initial_scale) {
  check_scale("ConstantGradScaler", "initial_scale", initial_scale);
  scale_ = static_cast<float>(initial_scale);
}

void ConstantGradScaler::update(bool overflow) {
  if (overflow) count_overflow();
}

ScalerState ConstantGradScaler::state_dict() const {
  ScalerState s;
  s.scale = static_cast<double>(scale_);
  return s;
}

void ConstantGradScaler::load_state_dict(const ScalerState& state) {
  check_scale("ConstantGradScaler::load_state_dict", "scale", state.scale);
  scale_ = static_cast<float>(state.scale);
}

// ---------------------------------------------------------------------------------------------
// Helpers

namespace {

// The ATen check (grad_scaler.h): one aminmax per tensor, summed per device, one sync per device.
bool aten_has_inf_or_nan(const std::vector<at::Tensor>& grads) {
  // One 0-dim accumulator per device: 0 while everything seen there is finite, nan otherwise.
  std::vector<std::pair<c10::Device, at::Tensor>> per_device;
  for (const at::Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    at::Tensor t = g;
    if (t.is_complex()) {
      t = at::view_as_real(t.is_conj() ? t.resolve_conj() : t);
    } else if (!t.is_floating_point()) {
      continue;  // integers and bools cannot be inf or nan
    }
    at::Tensor mn, mx;
    if (t.scalar_type() == at::kHalf && t.device().is_cpu()) {
      // LibTorch 1.13 has no CPU aminmax kernel for float16; min() and max() do have one.
      mn = t.min();
      mx = t.max();
    } else {
      std::tie(mn, mx) = at::aminmax(t);
    }
    // x * 0 is (+-)0 for finite x and nan for +-inf or nan; 0 and nan survive any dtype conversion.
    at::Tensor flag = mn.mul(0).add_(mx.mul(0)).to(at::kFloat);
    bool found = false;
    for (auto& [device, acc] : per_device) {
      if (device == t.device()) {
        acc.add_(flag);
        found = true;
        break;
      }
    }
    if (!found) per_device.emplace_back(t.device(), flag);
  }
  for (const auto& entry : per_device) {
    if (std::isnan(entry.second.item<float>())) return true;
  }
  return false;
}

}  // namespace

bool has_inf_or_nan(const std::vector<at::Tensor>& grads) {
  // Per device (optim::group_by_device_kernels): the tensors the device's registered kernels take
  // (CUDA float32 / bfloat16) first get one multi-tensor L2 norm, read with one sync: a finite norm
  // proves them finite (an Inf or NaN element makes it Inf or NaN); a non-finite one may also be the
  // float overflow of a sum of squares of large finite values, so those tensors are then checked
  // exactly, by the ATen reductions that check everything else (every CPU tensor: nothing is
  // registered for the CPU).
  std::vector<at::Tensor> exact;
  for (optim::DeviceTensorGroup& group : optim::group_by_device_kernels(grads)) {
    exact.insert(exact.end(), group.other.begin(), group.other.end());
    if (group.kernel_tensors.empty()) continue;
    const float norm = group.kernels->l2norm(group.kernel_tensors, /*per_tensor=*/false).total.item<float>();
    if (!std::isfinite(norm)) exact.insert(exact.end(), group.kernel_tensors.begin(), group.kernel_tensors.end());
  }
  return aten_has_inf_or_nan(exact);
}

void unscale_grads(const std::vector<at::Tensor>& grads, double inv_scale) {
  if (!std::isfinite(inv_scale)) {
    throw std::invalid_argument("unscale_grads: inv_scale must be finite, got " + num(inv_scale));
  }
  if (inv_scale == 1.0) return;
  // Per device: the registered kernels' one multi-tensor scale, in place, for the tensors they take
  // (bit-identical to mul_); t.mul_ for the rest (every CPU tensor).
  for (optim::DeviceTensorGroup& group : optim::group_by_device_kernels(grads)) {
    if (!group.kernel_tensors.empty())
      group.kernels->scale(group.kernel_tensors, group.kernel_tensors, inv_scale, at::Tensor());
    for (at::Tensor& t : group.other) t.mul_(inv_scale);  // shares storage: writes the caller's tensor
  }
}

}  // namespace booster::mixed_precision
