// cpu_adam.h — CPUAdam and HybridAdam: torch::optim::Optimizer subclasses whose step is the fused
// SIMD kernel of kernels/cpu (booster/kernels/cpu_adam.h), ColossalAI's CPUAdam / HybridAdam in C++.
//
// Algorithm: Adam (Kingma & Ba, ICLR 2015) or, with adamw_mode (the default), AdamW with decoupled
// weight decay (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019), in the
// order of operations of LibTorch 1.13's torch::optim::AdamW / Adam; the kernel header states the
// formula and its rounding. The double options reach the kernel as doubles (no float rounding of a
// scheduled lr). A CPUAdam step equals LibTorch 2.11's torch::optim::AdamW (adamw_mode) or Adam to
// within 16 float32 ulps of max(|x|, 1e-3) (4 measured over 6 steps; tests/unit/cpu_adam_*test.cpp,
// per ISA).
//
// Options (ColossalAI's names and defaults): lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0,
// bias_correction true, adamw_mode true. amsgrad is not implemented: amsgrad(true) is refused.
// Per-parameter state: "step" (int64, steps taken), "exp_avg", "exp_avg_sq" (float32, the
// parameter's shape): PyTorch's keys, so an AdamW state maps 1:1. Both types are registered in the
// optimizer registry (optim/optimizer_registry.h) as "CPUAdam" and "HybridAdam", so ZeRO, FSDP and
// checkpoints take them like AdamW; options JSON: lr, betas, eps, weight_decay, bias_correction,
// adamw_mode (the last two optional on load).
//
// Parameters: float32, on the CPU, contiguous (a flat master slice or any dense tensor); gradients
// float32 or bfloat16 of the same number of elements. Anything else is a std::invalid_argument
// naming the parameter's dtype/device and what to do. HybridAdam also steps device (CUDA) parameters
// (below); FusedAdam (booster/optim/fused_adam.h) is the optimizer for device parameters only.
//
// ISA: the kernel path is cpu_adam_isa(): $BOOSTER_CPU_ADAM_ISA (scalar | avx2 | avx512) if set,
// else the best the CPU has. Threads: the kernel's OpenMP threads (at::set_num_threads).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "booster/export.h"
#include "booster/kernels/cpu_adam.h"

namespace booster::optim {

struct BOOSTER_API CPUAdamOptions : public torch::optim::OptimizerCloneableOptions<CPUAdamOptions> {
  CPUAdamOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): as torch::optim::AdamWOptions
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, bias_correction) = true;
  TORCH_ARG(bool, adamw_mode) = true;  // true: decoupled weight decay (AdamW); false: L2 (Adam)
  TORCH_ARG(bool, amsgrad) = false;    // must stay false: refused by the optimizers

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

struct BOOSTER_API CPUAdamParamState : public torch::optim::OptimizerCloneableParamState<CPUAdamParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class BOOSTER_API CPUAdam : public torch::optim::Optimizer {
 public:
  // Throws std::invalid_argument for lr < 0, eps < 0, weight_decay < 0, a beta outside [0, 1), or
  // amsgrad in the defaults or any group (naming the fix: torch::optim::AdamW for amsgrad).
  explicit CPUAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups, CPUAdamOptions defaults = {});
  explicit CPUAdam(std::vector<torch::Tensor> params, CPUAdamOptions defaults = {});

  // Steps every parameter that has a gradient (fp32 or bf16 .grad()). Returns the closure's loss.
  // Throws std::invalid_argument for a parameter that is not a contiguous float32 CPU tensor.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // One update of `param` (a parameter of one of this optimizer's groups, whose options apply) with an
  // explicit gradient: float32 or bfloat16, param.numel() elements, on the CPU; divided by div_scale
  // first (a loss scale; 1: none). param_bf16_out: undefined, or a contiguous bfloat16 CPU tensor of
  // param.numel() elements that receives the updated parameter rounded to nearest-even (the compute
  // copy of a bf16 model with an fp32 master). Creates the state on the first call, advances "step".
  // Throws std::invalid_argument for a parameter not in the optimizer, wrong dtype / device / size,
  // or div_scale not finite and > 0.
  void step_parameter(const torch::Tensor& param, const torch::Tensor& grad, double div_scale = 1.0,
                      const torch::Tensor& param_bf16_out = {});

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 protected:
  // The name in error messages ("CPUAdam", "HybridAdam").
  virtual const char* type_name() const { return "CPUAdam"; }
  void check_parameter(const torch::Tensor& param) const;
  void step_with_options(const torch::Tensor& param, const torch::Tensor& grad, const CPUAdamOptions& options,
                         double div_scale, const torch::Tensor& param_bf16_out);
};

// ColossalAI's HybridAdam: CPU float32 parameters step through the CPU kernel (as CPUAdam); device
// (CUDA) float32 parameters through the registered device kernels (booster/optim/device_kernels.h:
// CUDA's are libbooster_cuda.so's multi-tensor Adam, loaded on demand), one multi-tensor launch per
// parameter group and device, queued on the device's current stream before the group's CPU parameters
// step (so both run at once). The state of a device parameter lives on its device; the arithmetic is
// the CPU kernel's, bit for bit when the options are round decimals (the CUDA kernel takes the options
// rounded to float, see DeviceAdamConfig). step_parameter and step_parameter_with_cpu_adam_kernel stay
// CPU only.
class BOOSTER_API HybridAdam : public CPUAdam {
 public:
  using CPUAdam::CPUAdam;
  // Device parameters first, then CPU ones, per group. Throws as CPUAdam::step for a CPU parameter,
  // std::invalid_argument for a device parameter or gradient that does not fit (float32 contiguous
  // parameter; float32 / bfloat16 gradient of its size on its device), std::runtime_error when the
  // device has no kernels (CUDA support not built or not loadable; the message names the fix).
  torch::Tensor step(LossClosure closure = nullptr) override;

 protected:
  const char* type_name() const override { return "HybridAdam"; }
};

// The kernel path CPUAdam uses: $BOOSTER_CPU_ADAM_ISA if set (throws std::invalid_argument for a
// value other than scalar / avx2 / avx512, or one the CPU lacks), else kernels::cpu::detected_isa().
BOOSTER_API kernels::cpu::Isa cpu_adam_isa();

// Steps `optimizer` through the kernel, on its own param groups and state, if it is a CPUAdam,
// HybridAdam, or a torch::optim::Adam / AdamW with amsgrad off in every group, whose parameters with
// gradients are all contiguous float32 CPU tensors with float32 gradients; the state stays the
// optimizer's own type (AdamParamState / AdamWParamState), so schedulers, checkpoints and the
// registry see no difference. Returns false, having changed nothing, for any other optimizer (the
// caller then calls optimizer.step()). Used by ZeRO's cpu_offload.
BOOSTER_API bool step_with_cpu_adam_kernel(torch::optim::Optimizer& optimizer);

// One kernel update of `param` alone, with an explicit gradient and, optionally, the compute copy
// written in the same pass (the fused step of a bf16 model with float32 master weights: the bf16
// gradient is read as it is and the bf16 parameter written while the master is in cache, instead of a
// float32 copy of the gradient before the step and a cast of the master after it).
//   param: a parameter of one of the optimizer's groups (the very tensor), contiguous float32 on the
//          CPU; grad: float32 or bfloat16, param.numel() elements, on the CPU; param_bf16_out:
//          undefined, or a contiguous bfloat16 CPU tensor of param.numel() elements that receives the
//          updated parameter rounded to nearest-even (what Tensor::copy_ of the float32 value gives).
// The update is the one step_with_cpu_adam_kernel makes with grad.to(float32) as param's gradient
// (bit for bit), on the optimizer's own state; param.grad() is neither read nor changed.
// Returns false, having changed nothing, when the optimizer is none of CPUAdam / HybridAdam /
// torch::optim::Adam / AdamW, or param's group has amsgrad, or param is not contiguous float32 on
// the CPU (the caller then steps it another way). Throws std::invalid_argument when param is not in
// the optimizer, or grad / param_bf16_out do not match the shapes and dtypes above.
BOOSTER_API bool step_parameter_with_cpu_adam_kernel(torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                                                     const torch::Tensor& grad,
                                                     const torch::Tensor& param_bf16_out = {});

}  // namespace booster::optim
