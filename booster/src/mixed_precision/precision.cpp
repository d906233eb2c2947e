// precision.cpp — fp32 / bf16 (CPU or CUDA autocast) / fp16 (master weights + dynamic loss scaling).
#include "booster/mixed_precision/precision.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "booster/mixed_precision/grad_scaler.h"

namespace booster::mixed_precision {

MixedPrecision::~MixedPrecision() = default;

// ---------------------------------------------------------------------------------------------
// Autocast

namespace {

// torch.autocast(device, dtype) entered and left on this thread; entering returns the state that
// leaving restores. One pair for every device type (LibTorch 2.x keys autocast by device).
struct AutocastState {
  bool enabled;
  at::ScalarType dtype;
};

AutocastState enter_autocast(at::DeviceType device, at::ScalarType dtype) {
  const AutocastState prev{at::autocast::is_autocast_enabled(device), at::autocast::get_autocast_dtype(device)};
  at::autocast::set_autocast_enabled(device, true);
  at::autocast::set_autocast_dtype(device, dtype);
  at::autocast::increment_nesting();
  return prev;
}

void leave_autocast(at::DeviceType device, const AutocastState& prev) {
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device, prev.enabled);
  at::autocast::set_autocast_dtype(device, prev.dtype);
}

}  // namespace

CpuAutocastGuard::CpuAutocastGuard(at::ScalarType dtype) {
  const AutocastState prev = enter_autocast(at::kCPU, dtype);
  prev_enabled_ = prev.enabled;
  prev_dtype_ = prev.dtype;
}

CpuAutocastGuard::~CpuAutocastGuard() { leave_autocast(at::kCPU, {prev_enabled_, prev_dtype_}); }

namespace {

// CUDA autocast (torch.autocast("cuda", dtype)), as CpuAutocastGuard.
class CudaAutocastGuard {
 public:
  explicit CudaAutocastGuard(at::ScalarType dtype) : prev_(enter_autocast(at::kCUDA, dtype)) {}
  ~CudaAutocastGuard() { leave_autocast(at::kCUDA, prev_); }

 private:
  AutocastState prev_;
};

// Autocast around the user's forward, delegating everything else to the plugin's hooks.
class AutocastHooks : public ModelHooks {
 public:
  AutocastHooks(std::shared_ptr<ModelHooks> inner, at::ScalarType dtype, bool cuda = false)
      : inner_(std::move(inner)), dtype_(dtype), cuda_(cuda) {}
  void pre_forward() override {
    inner_->pre_forward();
    if (cuda_) cuda_guard_ = std::make_unique<CudaAutocastGuard>(dtype_);
    else guard_ = std::make_unique<CpuAutocastGuard>(dtype_);
  }
  void post_forward() override {
    guard_.reset();
    cuda_guard_.reset();
    inner_->post_forward();
  }
  void abort_forward() override {
    guard_.reset();
    cuda_guard_.reset();
    inner_->abort_forward();
  }
  void backward(const torch::Tensor& loss) override { inner_->backward(loss); }
  void set_require_grad_sync(bool required) override { inner_->set_require_grad_sync(required); }
  torch::nn::Module& module() override { return inner_->module(); }
  std::map<std::string, int64_t> stats() const override { return inner_->stats(); }
  int64_t communication_buffer_bytes() const override { return inner_->communication_buffer_bytes(); }

 private:
  std::shared_ptr<ModelHooks> inner_;
  at::ScalarType dtype_;
  bool cuda_;
  std::unique_ptr<CpuAutocastGuard> guard_;
  std::unique_ptr<CudaAutocastGuard> cuda_guard_;
};

class FP32 : public MixedPrecision {
 public:
  std::string name() const override { return "fp32"; }
};

class BF16 : public MixedPrecision {
 public:
  std::string name() const override { return "bf16"; }
  // Autocast of the parameters' device: CPU or CUDA (one device per model).
  void prepare_model(torch::nn::Module& model) const override {
    std::optional<c10::Device> device;
    for (const auto& p : model.parameters()) {
      if (!p.device().is_cpu() && !p.device().is_cuda())
        throw PluginError("booster: mixed_precision = \"bf16\" autocasts on CPU and CUDA; parameter on " +
                          p.device().str());
      if (device && device->type() != p.device().type())
        throw PluginError("booster: mixed_precision = \"bf16\": the model has parameters on " + device->str() +
                          " and on " + p.device().str() + "; move it to one device type");
      device = p.device();
    }
    cuda_ = device && device->is_cuda();
  }
  std::shared_ptr<ModelHooks> wrap_hooks(std::shared_ptr<ModelHooks> inner) const override {
    return std::make_shared<AutocastHooks>(std::move(inner), at::kBFloat16, cuda_);
  }
  Criterion wrap_criterion(Criterion criterion) const override {
    if (!criterion) return criterion;
    return [criterion](const torch::Tensor& out, const torch::Tensor& target) {
      return criterion(out.is_floating_point() ? out.to(at::kFloat) : out, target);
    };
  }

 private:
  mutable bool cuda_ = false;  // set by prepare_model (the MixedPrecision of one Booster, one model device)
};

class FP16 : public MixedPrecision {
 public:
  explicit FP16(DynamicGradScalerOptions o) : scaler_options_(o) {}
  std::string name() const override { return "fp16"; }
  void prepare_model(torch::nn::Module& model) const override {
    for (const auto& p : model.parameters()) {
      if (p.device().is_cpu())
        throw PluginError("booster: mixed_precision = \"fp16\" needs a CUDA device, but the model is on the CPU: "
                          "set booster.device = \"cuda\", or use mixed_precision = \"bf16\" on CPU.");
    }
    cast_floating_point(model, at::kHalf);
  }
  // Ops autocast lists as fp32-only (softmax, norms, losses) run in fp32 on CUDA.
  std::shared_ptr<ModelHooks> wrap_hooks(std::shared_ptr<ModelHooks> inner) const override {
    return std::make_shared<AutocastHooks>(std::move(inner), at::kHalf, /*cuda=*/true);
  }
  // The loss in fp32 (as autocast's fp32 list runs losses): an fp16 output is cast up before the
  // user's criterion, so a float target meets a float input.
  Criterion wrap_criterion(Criterion criterion) const override {
    if (!criterion) return criterion;
    return [criterion](const torch::Tensor& out, const torch::Tensor& target) {
      return criterion(out.is_floating_point() ? out.to(at::kFloat) : out, target);
    };
  }
  OptimizerWrapperOptions optimizer_options() const override {
    OptimizerWrapperOptions o;
    o.scaler = std::make_shared<DynamicGradScaler>(scaler_options_);
    o.master_weights = true;
    return o;
  }

 private:
  DynamicGradScalerOptions scaler_options_;
};

}  // namespace

std::shared_ptr<MixedPrecision> make_mixed_precision(const std::string& name, const Options& section,
                                                     const DynamicGradScalerOptions& scaler_defaults) {
  DynamicGradScalerOptions scaler = DynamicGradScaler::from_options(section, scaler_defaults);
  section.check_unknown();
  try {
    DynamicGradScaler validate(scaler);  // cross-option checks (e.g. initial_scale within [min, max])
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("[mixed_precision]: ") + e.what());
  }
  if (name == "fp32") return std::make_shared<FP32>();
  if (name == "bf16") return std::make_shared<BF16>();
  if (name == "fp16") return std::make_shared<FP16>(scaler);
  throw ConfigError("booster: unknown mixed_precision \"" + name + "\"; use \"fp32\", \"bf16\" or \"fp16\"");
}

at::ScalarType dtype_from_name(const std::string& name) {
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  if (name == "fp8") return at::kFloat8_e4m3fn;
  if (name.empty()) return at::ScalarType::Undefined;
  throw std::invalid_argument("booster: unknown precision name \"" + name +
                              "\" (expected \"fp32\", \"bf16\", \"fp16\" or, for communication, \"fp8\")");
}

std::string communication_dtype_option(const Options& o, const std::vector<std::string>& choices) {
  std::string dtype = o.get_choice("communication_dtype", "", choices);
  const bool fp8 = o.get_bool("fp8_communication", false);
  const std::string section = o.section().empty() ? "" : o.section() + ".";
  if (fp8 && !dtype.empty() && dtype != "fp8")
    throw ConfigError("booster: " + section + "fp8_communication = true (" + o.where("fp8_communication") +
                      ") conflicts with " + section + "communication_dtype = \"" + dtype + "\" (" +
                      o.where("communication_dtype") + "): fp8_communication = true means communication_dtype = "
                      "\"fp8\"; set only one of them");
  if (o.has("fp8_communication") && !fp8 && dtype == "fp8")
    throw ConfigError("booster: " + section + "fp8_communication = false (" + o.where("fp8_communication") +
                      ") conflicts with " + section + "communication_dtype = \"fp8\" (" +
                      o.where("communication_dtype") + "); remove fp8_communication or set it to true");
  return fp8 ? std::string("fp8") : dtype;
}

void cast_floating_point(torch::nn::Module& module, at::ScalarType dtype) {
  if (!at::isFloatingType(dtype))
    throw std::invalid_argument(std::string("booster: cast_floating_point: ") + c10::toString(dtype) +
                                " is not a floating-point type");
  at::NoGradGuard no_grad;
  for (auto& t : module.parameters())
    if (t.is_floating_point() && t.scalar_type() != dtype) t.set_data(t.to(dtype));
  for (auto& t : module.buffers())
    if (t.is_floating_point() && t.scalar_type() != dtype) t.set_data(t.to(dtype));
}

}  // namespace booster::mixed_precision
