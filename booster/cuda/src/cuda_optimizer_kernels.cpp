// cuda_optimizer_kernels.cpp — registers the CUDA multi-tensor kernels (booster/kernels/cuda_adam.h:
// multi_tensor_adam, multi_tensor_scale, multi_tensor_l2norm) as c10::kCUDA's device optimizer kernels
// (booster/optim/device_kernels.h, whose header states the contract). Compiled into libbooster_cuda.so
// only, so libbooster.so never links LibTorch's CUDA library.
//
// Each call checks every tensor (defined, CUDA, on the device of the call's first tensor, strided and
// contiguous, its dtype, its number of elements) and throws std::invalid_argument naming the list, the
// index and what it got before anything is queued; then it makes that device current (CUDAGuard) and
// queues the kernels on its current stream (c10::cuda::getCurrentCUDAStream), without waiting.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "booster/kernels/cuda_adam.h"
#include "booster/optim/device_kernels.h"

namespace booster::cuda_support {
namespace optimizer_kernels_detail {

namespace kcu = booster::kernels::cuda;

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw std::invalid_argument(std::string("booster: CUDA optimizer kernels: ") + op + ": " + what);
}

std::string describe(const at::Tensor& t) {
  if (!t.defined()) return "an undefined tensor";
  return std::string(c10::toString(t.scalar_type())) + " on " + t.device().str() +
         (t.layout() != c10::kStrided ? " (not strided)" : (t.is_contiguous() ? "" : " (not contiguous)")) + " with " +
         std::to_string(t.numel()) + " elements";
}

enum Allowed : unsigned { kF32 = 1, kBF16 = 2 };

const char* allowed_text(unsigned allowed) {
  return allowed == kF32 ? "float32" : allowed == kBF16 ? "bfloat16" : "float32 or bfloat16";
}

// Checks entry `i` of list `list` and returns its kernel dtype. numel < 0: any number of elements.
kcu::DType check(const char* op, const at::Tensor& t, const char* list, size_t i, const c10::Device& device,
                 unsigned allowed, int64_t numel) {
  const std::string where = std::string(list) + "[" + std::to_string(i) + "]";
  if (!t.defined()) fail(op, where + " is undefined");
  if (!t.is_cuda())
    fail(op, where + " is " + describe(t) + "; these are the CUDA kernels (CPU tensors: booster::optim::HybridAdam / "
                                            "CPUAdam and ATen's ops)");
  if (t.device() != device)
    fail(op, where + " is on " + t.device().str() + " but the call's first tensor is on " + device.str() +
                 " (one call per device)");
  if (t.layout() != c10::kStrided || !t.is_contiguous())
    fail(op, where + " is " + describe(t) + "; the kernels take contiguous tensors (call .contiguous())");
  const bool f32 = t.scalar_type() == at::kFloat, bf16 = t.scalar_type() == at::kBFloat16;
  if (!((f32 && (allowed & kF32)) || (bf16 && (allowed & kBF16))))
    fail(op, where + " is " + describe(t) + "; it must be " + allowed_text(allowed));
  if (numel >= 0 && t.numel() != numel)
    fail(op, where + " has " + std::to_string(t.numel()) + " elements, expected " + std::to_string(numel));
  return f32 ? kcu::DType::kFloat32 : kcu::DType::kBFloat16;
}

// The device of a call: its first tensor's, which must be a CUDA tensor.
c10::Device call_device(const char* op, const at::Tensor& first, const char* list) {
  if (!first.defined()) fail(op, std::string(list) + "[0] is undefined");
  if (!first.is_cuda())
    fail(op, std::string(list) + "[0] is " + describe(first) +
                 "; these are the CUDA kernels (CPU tensors: booster::optim::HybridAdam / CPUAdam and ATen's ops)");
  return first.device();
}

// An optional int32 flag of one element on `device` (found_inf, noop_flag); null when undefined.
int* flag_pointer(const char* op, const at::Tensor& flag, const char* name, const c10::Device& device) {
  if (!flag.defined()) return nullptr;
  if (flag.device() != device || flag.scalar_type() != at::kInt || flag.numel() != 1 ||
      flag.layout() != c10::kStrided)
    fail(op, std::string(name) + " must be an int32 tensor of one element on " + device.str() + ", got " +
                 describe(flag));
  return flag.data_ptr<int>();
}

kcu::Stream current_stream(const c10::Device& device) {
  return c10::cuda::getCurrentCUDAStream(device.index()).stream();
}

void adam(const optim::DeviceAdamConfig& c, const optim::DeviceAdamTensors& t, const at::Tensor& noop_flag) {
  const char* op = "adam";
  const size_t n = t.params.size();
  if (t.grads.size() != n || t.exp_avgs.size() != n || t.exp_avg_sqs.size() != n ||
      (!t.params_bf16.empty() && t.params_bf16.size() != n))
    fail(op, "the lists differ in length: params " + std::to_string(n) + ", grads " + std::to_string(t.grads.size()) +
                 ", exp_avgs " + std::to_string(t.exp_avgs.size()) + ", exp_avg_sqs " +
                 std::to_string(t.exp_avg_sqs.size()) + ", params_bf16 " + std::to_string(t.params_bf16.size()) +
                 " (empty or as many as params)");
  if (n == 0) return;
  const c10::Device device = call_device(op, t.params[0], "params");
  std::vector<kcu::AdamTensor> tensors(n);
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = t.params[i];
    check(op, p, "params", i, device, kF32, -1);
    const int64_t numel = p.numel();
    const kcu::DType g = check(op, t.grads[i], "grads", i, device, kF32 | kBF16, numel);
    check(op, t.exp_avgs[i], "exp_avgs", i, device, kF32, numel);
    check(op, t.exp_avg_sqs[i], "exp_avg_sqs", i, device, kF32, numel);
    const bool out = !t.params_bf16.empty() && t.params_bf16[i].defined();
    if (out) check(op, t.params_bf16[i], "params_bf16", i, device, kBF16, numel);
    kcu::AdamTensor& a = tensors[i];
    a.numel = numel;
    if (numel == 0) continue;
    a.param = p.data_ptr<float>();
    if (g == kcu::DType::kFloat32) a.grad_fp32 = t.grads[i].data_ptr<float>();
    else a.grad_bf16 = static_cast<const uint16_t*>(t.grads[i].data_ptr());
    a.exp_avg = t.exp_avgs[i].data_ptr<float>();
    a.exp_avg_sq = t.exp_avg_sqs[i].data_ptr<float>();
    if (out) a.param_bf16_out = static_cast<uint16_t*>(t.params_bf16[i].data_ptr());
    const void* grad = g == kcu::DType::kFloat32 ? static_cast<const void*>(a.grad_fp32) : a.grad_bf16;
    if (a.param == a.exp_avg || a.param == a.exp_avg_sq || a.exp_avg == a.exp_avg_sq || grad == a.param ||
        grad == a.exp_avg || grad == a.exp_avg_sq)
      fail(op, "entry " + std::to_string(i) + ": the parameter, its gradient and its two moments must be distinct "
                                              "tensors (they share memory)");
  }
  const int* noop = flag_pointer(op, noop_flag, "noop_flag", device);
  kcu::AdamConfig k;
  k.lr = static_cast<float>(c.lr);
  k.beta1 = static_cast<float>(c.beta1);
  k.beta2 = static_cast<float>(c.beta2);
  k.eps = static_cast<float>(c.eps);
  k.weight_decay = static_cast<float>(c.weight_decay);
  k.adamw_mode = c.adamw_mode;
  k.bias_correction = c.bias_correction;
  k.step = c.step;
  k.div_scale = static_cast<float>(c.div_scale);
  c10::cuda::CUDAGuard guard(device);
  kcu::multi_tensor_adam(k, tensors, noop, current_stream(device));
}

void scale(const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& out, double factor,
           const at::Tensor& found_inf) {
  const char* op = "scale";
  const size_t n = in.size();
  if (out.size() != n)
    fail(op, "in has " + std::to_string(n) + " tensors and out " + std::to_string(out.size()) + " (one out per in)");
  if (n == 0) return;
  const c10::Device device = call_device(op, in[0], "in");
  std::vector<kcu::ScaleTensor> tensors(n);
  for (size_t i = 0; i < n; ++i) {
    kcu::ScaleTensor& s = tensors[i];
    s.in_dtype = check(op, in[i], "in", i, device, kF32 | kBF16, -1);
    s.numel = in[i].numel();
    s.out_dtype = check(op, out[i], "out", i, device, kF32 | kBF16, s.numel);
    if (s.numel == 0) continue;
    s.in = in[i].data_ptr();
    s.out = out[i].data_ptr();
    if (s.in == s.out && s.in_dtype != s.out_dtype)
      fail(op, "entry " + std::to_string(i) + ": in and out are the same memory with different dtypes (" +
                   describe(in[i]) + " -> " + describe(out[i]) + "); an in-place scale keeps the dtype");
  }
  int* flag = flag_pointer(op, found_inf, "found_inf", device);
  c10::cuda::CUDAGuard guard(device);
  kcu::multi_tensor_scale(static_cast<float>(factor), tensors, flag, current_stream(device));
}

optim::DeviceNorms l2norm(const std::vector<at::Tensor>& in, bool per_tensor) {
  const char* op = "l2norm";
  optim::DeviceNorms r;
  if (in.empty()) {
    const auto options = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, c10::cuda::current_device());
    r.total = at::zeros({}, options);
    if (per_tensor) r.per_tensor = at::zeros({0}, options);
    return r;
  }
  const c10::Device device = call_device(op, in[0], "tensors");
  std::vector<kcu::NormTensor> tensors(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    kcu::NormTensor& t = tensors[i];
    t.dtype = check(op, in[i], "tensors", i, device, kF32 | kBF16, -1);
    t.numel = in[i].numel();
    if (t.numel > 0) t.data = in[i].data_ptr();
  }
  c10::cuda::CUDAGuard guard(device);
  const auto options = at::TensorOptions().dtype(at::kFloat).device(device);
  r.total = at::empty({}, options);
  if (per_tensor) r.per_tensor = at::empty({static_cast<int64_t>(in.size())}, options);
  kcu::multi_tensor_l2norm(tensors, r.total.data_ptr<float>(), per_tensor ? r.per_tensor.data_ptr<float>() : nullptr,
                           current_stream(device));
  return r;
}

struct OptimizerKernelsRegistration {
  OptimizerKernelsRegistration() {
    optim::DeviceOptimizerKernels k;
    k.name = "CUDA multi-tensor kernels (libbooster_cuda.so)";
    k.adam = &adam;
    k.scale = &scale;
    k.l2norm = &l2norm;
    optim::register_device_optimizer_kernels(c10::kCUDA, std::move(k));
  }
};
const OptimizerKernelsRegistration optimizer_kernels_registration;

}  // namespace optimizer_kernels_detail
}  // namespace booster::cuda_support
