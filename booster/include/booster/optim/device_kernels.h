// device_kernels.h — the registry of device optimizer kernels: fused multi-tensor Adam/AdamW, scale
// (with a found-inf flag) and L2 norm for the tensors of one device type, and the helpers the
// optimizers and the gradient code build on.
//
// libbooster.so links LibTorch's CPU library only, so it has no device kernels of its own: a device's
// support library registers them when it is loaded. libbooster_cuda.so (booster/device.h)
// registers c10::kCUDA's at load time: booster::kernels::cuda::multi_tensor_adam / _scale / _l2norm
// (booster/kernels/cuda_adam.h; apex's multi_tensor_apply, as ColossalAI's fused optimizer kernels),
// queued on the current CUDA stream of the tensors' device (c10::cuda::getCurrentCUDAStream) with
// that device made current for the call; nothing waits for the stream. Nothing is registered for the
// CPU: CPU tensors take the CPU Adam kernel (booster/optim/cpu_adam.h) and ATen's ops.
//
// Users: FusedAdam (booster/optim/fused_adam.h) and HybridAdam's device parameters (cpu_adam.h), via
// device_adam_step; the loss-scale unscale and inf/nan check (mixed_precision/grad_scaler.h) and the
// optimizer wrapper's gradient norm and clipping (wrappers/optimizer_wrapper.h), via
// group_by_device_kernels, which pick the kernels per device and keep ATen's ops for the rest.
//
// Thread-safety: the registry is guarded by a mutex; a looked-up entry is a shared_ptr, valid however
// the registry changes afterwards.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "booster/export.h"

namespace booster::optim {

// Hyper-parameters of one Adam/AdamW step (the fields and meanings of booster::kernels::cpu::AdamConfig
// and kernels::cuda::AdamConfig, as doubles, which LibTorch's options are):
//  - lr, beta1, beta2, eps, weight_decay: as torch::optim::AdamWOptions; 0 <= beta < 1, the others >= 0;
//  - adamw_mode: true: decoupled decay (p *= 1 - lr * weight_decay before the update, AdamW);
//    false: L2 decay added to the gradient (g += weight_decay * p, torch::optim::Adam);
//  - bias_correction: divide by 1 - beta1^step and 1 - beta2^step;
//  - step: the 1-based number of this step (the step count after it), >= 1;
//  - div_scale: every gradient is divided by it first (a fused loss-scale unscale); finite, > 0.
// The CUDA kernels take the values rounded to float and read each as the double of its shortest
// decimal (kernels/cuda/include/booster/kernels/cuda_adam.h): an option given as a round decimal
// (1e-3, 0.999) acts exactly; a scheduled lr with more digits acts as its nearest float.
struct DeviceAdamConfig {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool adamw_mode = true;
  bool bias_correction = true;
  int64_t step = 1;
  double div_scale = 1.0;
};

// The tensors of one multi-tensor Adam call: four lists of the same length n, entry i one parameter.
//  params, exp_avgs, exp_avg_sqs: float32, contiguous, updated in place;
//  grads: float32 or bfloat16, contiguous, params[i].numel() elements (any shape), read only;
//  params_bf16: empty, or n entries, each undefined (none) or a contiguous bfloat16 tensor of
//  params[i].numel() elements receiving the updated parameter rounded to nearest-even (the compute
//  copy of a bf16 model with fp32 master weights).
// Every tensor is on the same device; no two overlap.
struct DeviceAdamTensors {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  std::vector<at::Tensor> params_bf16;
};

// What l2norm gives: total, a 0-dim float32 tensor on the device, sqrt of the sum of squares of every
// element of every tensor (0 for an empty list or empty tensors; Inf or NaN when an element is, or
// when a sum of squares overflows float); per_tensor, when asked for, a float32 [n] tensor on the
// device with each tensor's norm (else undefined).
struct DeviceNorms {
  at::Tensor total;
  at::Tensor per_tensor;
};

// The kernels of one device type. Each call takes tensors of one device (of that type) and queues its
// work on that device's current stream (CUDA: c10::cuda::getCurrentCUDAStream) without waiting;
// results are device tensors. Errors (std::invalid_argument), raised before anything is queued: lists
// of different lengths, an undefined tensor, a tensor on another device or device type, not
// contiguous, of a dtype other than the ones stated, or of the wrong number of elements; the message
// names the list, the index and what was given. A failing launch is a std::runtime_error.
struct DeviceOptimizerKernels {
  // Shown in messages, e.g. "CUDA multi-tensor kernels (libbooster_cuda.so)".
  std::string name;
  // One Adam or AdamW step of every parameter of `tensors` (DeviceAdamTensors) with `config`; the
  // arithmetic is booster::kernels::cpu::adam_step's, element for element (the CUDA kernels give its
  // exact bits for the same float AdamConfig). noop_flag: undefined, or an int32 tensor of one element
  // on the device: when it is non-zero as the kernel runs, nothing is changed (the overflow skip: pass
  // scale's found_inf). An empty list does nothing.
  std::function<void(const DeviceAdamConfig& config, const DeviceAdamTensors& tensors, const at::Tensor& noop_flag)>
      adam;
  // out[i] = in[i] * scale, computed in float32 and rounded to out[i]'s dtype (round to nearest even),
  // for every i: in[i], out[i] float32 or bfloat16, contiguous, the same number of elements; in[i] may
  // be out[i] itself (an in-place scale) when the dtypes are equal; the factor is rounded to float32
  // (as ATen's t.mul_(scale) for float32 and bfloat16 tensors, which this equals bit for bit).
  // found_inf: undefined, or an int32 tensor of one element on the device, set to 1 when any element
  // of any in[i] is Inf or NaN, never cleared (zero it first); the outputs are written either way.
  std::function<void(const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& out, double scale,
                     const at::Tensor& found_inf)>
      scale;
  // Euclidean norms of `tensors` (float32 or bfloat16, contiguous; DeviceNorms above), as apex's
  // multi_tensor_l2norm: squares summed in float within a chunk of 65536 elements and in double across
  // chunks and tensors, in a fixed order (deterministic). An empty list gives a 0 on the current device
  // of the type.
  std::function<DeviceNorms(const std::vector<at::Tensor>& tensors, bool per_tensor)> l2norm;
};

// Registers `kernels` for tensors of `type`, replacing any earlier entry (the last one wins). Throws
// std::invalid_argument when one of adam / scale / l2norm is empty. Called by a device's support
// library at load time (libbooster_cuda.so for c10::kCUDA); tests register fakes.
BOOSTER_API void register_device_optimizer_kernels(c10::DeviceType type, DeviceOptimizerKernels kernels);
// Removes the entry of `type`, if any.
BOOSTER_API void unregister_device_optimizer_kernels(c10::DeviceType type);

// The kernels of `type`. For c10::kCUDA, first loads CUDA support (booster::load_cuda_support(), which
// registers them). Throws std::runtime_error naming the device type and the fix when there are none:
// CUDA support missing or not loadable (the loader's message: build with the CUDA toolkit,
// -DBOOSTER_WITH_CUDA=ON, or put LibTorch's CUDA libraries on LD_LIBRARY_PATH); another type with
// nothing registered (register_device_optimizer_kernels; for CPU tensors use CPUAdam / HybridAdam).
BOOSTER_API std::shared_ptr<const DeviceOptimizerKernels> device_optimizer_kernels(c10::DeviceType type);
// As device_optimizer_kernels, but null instead of throwing (CUDA support is tried once per process
// when it is not loaded yet). Never throws.
BOOSTER_API std::shared_ptr<const DeviceOptimizerKernels> find_device_optimizer_kernels(c10::DeviceType type);

// The defined tensors of a list grouped by device (in order of first appearance): per device, the
// registered kernels of its type (find_device_optimizer_kernels; null when none, as for the CPU), the
// tensors those kernels take (kernel_tensors: strided, contiguous, float32 or bfloat16) and the rest
// (other), each in the list's order. Without kernels every tensor of the device is in other. This is
// the one place the gradient code chooses between the kernels and ATen's ops.
struct DeviceTensorGroup {
  c10::Device device{c10::kCPU};
  std::shared_ptr<const DeviceOptimizerKernels> kernels;
  std::vector<at::Tensor> kernel_tensors;
  std::vector<at::Tensor> other;
};
BOOSTER_API std::vector<DeviceTensorGroup> group_by_device_kernels(const std::vector<at::Tensor>& tensors);

// One parameter of device_adam_step, with the optimizer state it advances (pointers into the
// optimizer's own ParamState, e.g. &state.step()).
//  param: float32, contiguous, not on the CPU; grad: float32 or bfloat16, param.numel() elements on
//  param's device (a non-contiguous one is copied contiguous); step: steps taken, advanced by one;
//  exp_avg / exp_avg_sq: the moments, param.numel() elements; undefined ones are created as zeros, and
//  ones of another dtype / device / layout (a checkpoint loaded on the CPU) are replaced by float32
//  contiguous copies on param's device, stored back through the pointers.
struct DeviceAdamParam {
  at::Tensor param;
  at::Tensor grad;
  int64_t* step = nullptr;
  at::Tensor* exp_avg = nullptr;
  at::Tensor* exp_avg_sq = nullptr;
};

// One Adam/AdamW step of `params` with the hyper-parameters of `config` (its step is ignored: each
// parameter's own count + 1 is used): one kernels.adam call per device and step count (the counts of
// one group's parameters are equal unless some went without gradients), each taking every parameter
// of that bucket. Throws std::invalid_argument naming `who` and the parameter's index, dtype and
// device for a parameter or gradient that does not fit (a CPU parameter: use CPUAdam / HybridAdam),
// std::runtime_error when a device has no kernels (device_optimizer_kernels). Moments are prepared
// for every parameter before the first launch; a launch that throws leaves its bucket's steps unchanged.
BOOSTER_API void device_adam_step(const DeviceAdamConfig& config, const std::vector<DeviceAdamParam>& params,
                                  const std::string& who);

}  // namespace booster::optim
