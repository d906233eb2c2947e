// fused_adam.h — FusedAdam: ColossalAI's FusedAdam (colossalai.nn.optimizer.FusedAdam) in C++, a
// torch::optim::Optimizer for device (CUDA) parameters whose step runs the registered multi-tensor
// Adam kernel (booster/optim/device_kernels.h): one launch per parameter group and device covers every
// parameter of the group (apex's multi_tensor_apply), instead of LibTorch's several kernels per
// parameter.
//
// Algorithm: Adam (Kingma & Ba, ICLR 2015) or, with adamw_mode (the default, as ColossalAI's), AdamW
// with decoupled weight decay (Loshchilov & Hutter, ICLR 2019); per element the arithmetic of
// booster::kernels::cpu::adam_step (the order of operations of LibTorch 1.13's torch::optim::AdamW /
// Adam; the CUDA kernel gives exactly its bits for the same float AdamConfig). Against LibTorch 2.11's
// AdamW on the same device it differs by float rounding only (LibTorch 2.11 fuses other multiply-adds;
// tests/gpu/gpu_optim_test.cpp states the bound). The options are doubles; the CUDA kernel takes them
// rounded to float (see DeviceAdamConfig): round decimals act exactly.
//
// Options (ColossalAI's names and defaults): lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0,
// bias_correction true, adamw_mode true; amsgrad is not implemented (amsgrad(true) is refused, as
// ColossalAI's FusedAdam refuses it). ColossalAI's set_grad_none is LibTorch's zero_grad(set_to_none).
//
// Parameters: float32, contiguous, on a device with registered kernels (CUDA: libbooster_cuda.so,
// loaded on the first step); gradients float32 or bfloat16 with the parameter's number of elements, on
// its device. A CPU parameter is refused (std::invalid_argument, at construction and at step) naming
// HybridAdam / CPUAdam (booster/optim/cpu_adam.h), which step CPU parameters.
//
// State per parameter: "step" (int64, steps taken), "exp_avg", "exp_avg_sq" (float32, the parameter's
// shape, on its device): torch::optim::AdamW's keys. save() writes AdamW's archive layout and load()
// reads one (an AdamW archive's groups load as adamw_mode = true, bias_correction = true), so
// checkpoints interchange both ways with torch::optim::AdamW (amsgrad off). Registered in the optimizer
// registry (optim/optimizer_registry.h) as "FusedAdam" with CPUAdam's option JSON (lr, betas, eps,
// weight_decay, bias_correction, adamw_mode; the last two optional on load), so ZeRO, FSDP and the
// checkpoint IO take it like AdamW.
//
// Streams: each launch is queued on the current CUDA stream of the parameters' device; step() does
// not synchronize. Thread-safety: as any torch::optim::Optimizer (none).
#pragma once

#include <torch/optim/optimizer.h>
#include <torch/optim/serialize.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "booster/export.h"

namespace booster::optim {

struct BOOSTER_API FusedAdamOptions : public torch::optim::OptimizerCloneableOptions<FusedAdamOptions> {
  FusedAdamOptions(double lr = 1e-3);  // NOLINT(google-explicit-constructor): as torch::optim::AdamWOptions
  TORCH_ARG(double, lr) = 1e-3;
  typedef std::tuple<double, double> betas_t;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, bias_correction) = true;
  TORCH_ARG(bool, adamw_mode) = true;  // true: decoupled weight decay (AdamW); false: L2 (Adam)
  TORCH_ARG(bool, amsgrad) = false;    // must stay false: refused

 public:
  // Writes AdamWOptions' keys (lr, betas, eps, weight_decay, amsgrad) and bias_correction, adamw_mode.
  void serialize(torch::serialize::OutputArchive& archive) const override;
  // Reads them; bias_correction, adamw_mode and amsgrad are optional (an AdamW archive has no
  // bias_correction / adamw_mode: they stay true).
  void serialize(torch::serialize::InputArchive& archive) override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

struct BOOSTER_API FusedAdamParamState : public torch::optim::OptimizerCloneableParamState<FusedAdamParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class BOOSTER_API FusedAdam : public torch::optim::Optimizer {
 public:
  // Throws std::invalid_argument for lr < 0, eps < 0, weight_decay < 0, a beta outside [0, 1), amsgrad
  // in the defaults or a group (the fix: torch::optim::AdamW with amsgrad), or a CPU parameter (the
  // fix: HybridAdam or CPUAdam).
  explicit FusedAdam(std::vector<torch::optim::OptimizerParamGroup> param_groups, FusedAdamOptions defaults = {});
  explicit FusedAdam(std::vector<torch::Tensor> params, FusedAdamOptions defaults = {});

  // Steps every parameter with a gradient: per group, one multi-tensor launch per device (and per
  // step count, should the group's parameters have taken different numbers of steps). Returns the
  // closure's loss. Throws std::invalid_argument for a parameter or gradient that does not fit (a CPU
  // parameter or bad options of any group: checked before anything changes; dtype, layout, size:
  // checked per group before its launch, so that group and later ones are unchanged),
  // std::runtime_error when the device has no kernels (CUDA support not built or not loadable; the
  // message names the fix).
  torch::Tensor step(LossClosure closure = nullptr) override;

  // ColossalAI's step(div_scale=...): as step(), with every gradient divided by div_scale first (a
  // loss scale fused into the update; finite, > 0).
  torch::Tensor step_with_div_scale(double div_scale, LossClosure closure = nullptr);

  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
};

}  // namespace booster::optim
