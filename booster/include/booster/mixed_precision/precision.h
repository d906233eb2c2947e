// precision.h — the pluggable precision components chosen by `[booster] mixed_precision`:
//   "fp32": nothing changes.
//   "bf16": forward under CPU autocast to bfloat16 (at::autocast, as torch.autocast("cpu",
//           dtype=torch.bfloat16)); weights, gradients and optimizer state stay float32 (they are
//           the master weights); the boosted criterion computes the loss in float32; no loss scaling.
//   "fp16": model weights in float16, float32 master weights in the optimizer wrapper, dynamic loss
//           scaling (ColossalAI's FP16 naive AMP). Needs a CUDA device: LibTorch 1.13 has no fp16
//           GEMM/conv/layernorm kernels on CPU, so boost() refuses a CPU model with a clear error.
// ColossalAI reference: colossalai/booster/mixed_precision/*.py.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>

#include "booster/config.h"
#include "booster/export.h"
#include "booster/plugin.h"
#include "booster/wrappers/optimizer_wrapper.h"

namespace booster::mixed_precision {

class BOOSTER_API MixedPrecision {
 public:
  virtual ~MixedPrecision();
  virtual std::string name() const = 0;
  // At boost(), before the plugin configures the model: checks the device, may cast the weights.
  // Throws PluginError when the precision cannot run on the model's device.
  virtual void prepare_model(torch::nn::Module& model) const { (void)model; }
  // Wraps the plugin's hooks (e.g. autocast around forward). Default: unchanged.
  virtual std::shared_ptr<ModelHooks> wrap_hooks(std::shared_ptr<ModelHooks> inner) const { return inner; }
  // Wraps the criterion (e.g. float32 loss on low-precision outputs). Default: unchanged.
  virtual Criterion wrap_criterion(Criterion criterion) const { return criterion; }
  // Options for the optimizer wrapper (a fresh scaler for fp16). Default: no scaler.
  virtual OptimizerWrapperOptions optimizer_options() const { return {}; }
};

// The component for `name` ("fp32", "bf16", "fp16"). `section` is [mixed_precision]: the fp16 loss
// scaler options (initial_scale = 2^16, min_scale = 1, growth_factor = 2, backoff_factor = 0.5,
// growth_interval = 1000, hysteresis = 2, max_scale = 2^32) are read and validated whatever the
// precision, then section.check_unknown(). `scaler_defaults` replaces those defaults (a plugin with
// ColossalAI's initial_scale = 2^32). Throws ConfigError for an unknown name or bad option.
BOOSTER_API std::shared_ptr<MixedPrecision> make_mixed_precision(
    const std::string& name, const Options& section,
    const mixed_precision::DynamicGradScalerOptions& scaler_defaults = {});

// Casts the module's floating-point parameters and buffers to `dtype` in place (Tensor::set_data:
// identities, names and requires_grad kept); integer and bool tensors (BatchNorm's
// num_batches_tracked) keep their dtype. This is Python's Module.to(dtype); LibTorch's C++
// Module::to(dtype) casts integer buffers too, which would make a step counter a bf16 that stops
// counting at 256. `dtype` must be a floating-point type (std::invalid_argument otherwise).
BOOSTER_API void cast_floating_point(torch::nn::Module& module, at::ScalarType dtype);

// The dtype a precision name stands for in configs: "fp32" -> Float, "bf16" -> BFloat16, "fp16" ->
// Half, "fp8" -> Float8_e4m3fn (communication only: dist/fp8.h); "" (unset) -> Undefined. Throws
// std::invalid_argument for any other name.
BOOSTER_API at::ScalarType dtype_from_name(const std::string& name);

// A plugin's wire dtype from its table `o`: `communication_dtype` (one of `choices`, default "")
// and ColossalAI's alias `fp8_communication` (bool, default false; true means communication_dtype =
// "fp8"). Returns the name ("" when neither is set). Throws ConfigError naming both options and the
// fix when they disagree: fp8_communication = true with communication_dtype set to another dtype,
// or fp8_communication = false (set explicitly) with communication_dtype = "fp8".
BOOSTER_API std::string communication_dtype_option(const Options& o, const std::vector<std::string>& choices);

// RAII: CPU autocast to `dtype` on this thread while alive (restores the previous state).
class BOOSTER_API CpuAutocastGuard {
 public:
  explicit CpuAutocastGuard(at::ScalarType dtype);
  ~CpuAutocastGuard();
  CpuAutocastGuard(const CpuAutocastGuard&) = delete;
  CpuAutocastGuard& operator=(const CpuAutocastGuard&) = delete;

 private:
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
};

}  // namespace booster::mixed_precision
