// Fused multi-tensor optimizer kernels for NVIDIA GPUs: Adam/AdamW, scale (with a found-inf flag) and
// L2 norm, each applied to a whole list of tensors with few kernel launches.
//
// Algorithm: apex's multi_tensor_apply, as used by ColossalAI's fused optimizer kernels
// (multi_tensor_adam, multi_tensor_scale, multi_tensor_l2norm): every tensor is cut into chunks of
// kChunkSize elements, one thread block per chunk, and the table of a launch's tensors (their
// pointers and the range of blocks running each one's chunks) travels in the kernel's parameters, so
// one launch covers many tensors and all their chunks. Within a chunk each thread moves groups of 4
// elements with one 16-byte (fp32) or 8-byte (bf16) access per array when every array of the tensor
// is so aligned at the chunk's start, else element by element; the results do not depend on it.
// Adam is Kingma & Ba; AdamW's decoupled weight decay is Loshchilov & Hutter; the arithmetic is
// LibTorch 1.13's torch::optim::Adam and torch::optim::AdamW, as in booster::kernels::cpu::adam_step.
//
// Bit identity: multi_tensor_adam gives exactly the bits of booster::kernels::cpu::adam_step
// (cpu_adam.h) for the same AdamConfig, in the parameters, both moments and the bf16 copy, on every
// element, aligned or not. Both derive the same float coefficients (the float options widened to
// double through their shortest decimal, double arithmetic, one rounding to float each) and apply
// the same sequence of IEEE float operations per element, in the same order, with the same fused
// multiply-adds and no other contraction (explicit round-to-nearest intrinsics on the GPU,
// -ffp-contract=off on the CPU).
//
// Requirements: a GPU of compute capability 7.0 or newer. Built with CUDA 12.1 or newer, a launch
// carries up to 32 KiB of kernel parameters (up to 534 Adam tensors per launch), which needs a driver
// of CUDA 12.1 or newer; built with an older CUDA, 4 KiB (64 Adam tensors per launch).
//
// Plain CUDA: no LibTorch, and no CUDA headers are needed to include this file. All tensor pointers
// are device pointers (or managed memory) of contiguous arrays on the current device; tensors of one
// call must not overlap, except where a function allows in-place use. Work is queued on `stream`
// (nullptr: the legacy default stream); no function waits for it, so inputs and outputs must stay
// valid until the stream has run the work. Element counts are numbers of elements (int64_t).
//
// Errors: std::invalid_argument for bad arguments, raised before anything is queued;
// std::runtime_error when a CUDA runtime call or a kernel launch fails (no device, out of memory, ...),
// whose message names the call, the source location and the CUDA error string. Errors of a kernel
// that already ran asynchronously surface, as usual in CUDA, at a later synchronisation.
#pragma once

#include <cstdint>
#include <vector>

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace booster::kernels::cuda {

/// A CUDA stream (the same type as cudaStream_t). nullptr is the legacy default stream.
using Stream = CUstream_st*;

/// Elements per chunk (one thread block each) in every multi-tensor launch: apex's 2048 * 32.
inline constexpr int64_t kChunkSize = 65536;

/// Element types of the scale and L2-norm tensors. bf16 values are raw uint16_t bit patterns
/// (bfloat16: the upper 16 bits of an IEEE float); conversions to bf16 round to nearest even, a NaN
/// becomes the quiet NaN 0x7FC0 (as c10::BFloat16 and the CPU Adam kernel).
enum class DType : int { kFloat32 = 0, kBFloat16 = 1 };

/// Hyper-parameters of one Adam/AdamW step: the fields, defaults and meanings of
/// booster::kernels::cpu::AdamConfig. The float options act as the doubles of their shortest decimal
/// representation (0.999f as 0.999), as LibTorch's double options and the CPU kernel.
///  - lr, beta1, beta2, eps, weight_decay: as torch::optim::AdamWOptions / AdamOptions;
///    0 <= beta1, beta2 < 1; lr, eps, weight_decay finite and >= 0.
///  - adamw_mode: true: decoupled decay (p *= 1 - lr * weight_decay, before the update);
///    false: L2 decay added to the gradient (g += weight_decay * p), as torch::optim::Adam.
///  - bias_correction: divide by 1 - beta1^step and 1 - beta2^step (computed in double on the host).
///  - step: the 1-based number of this step (>= 1), i.e. the optimizer's step count after it.
///  - div_scale: every gradient is divided by it first (a fused loss-scale unscale); finite, > 0.
struct AdamConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool adamw_mode = true;
  bool bias_correction = true;
  int64_t step = 1;
  float div_scale = 1.0f;
};

/// One parameter tensor of multi_tensor_adam, numel elements in each array.
///  param, exp_avg, exp_avg_sq: fp32, read and written. Exactly one of grad_fp32 / grad_bf16: the
///  gradient (read only). param_bf16_out: optional (nullptr: none); receives the updated parameter
///  rounded to bf16. A tensor with numel == 0 may have null pointers and is skipped.
struct AdamTensor {
  int64_t numel = 0;
  float* param = nullptr;
  const float* grad_fp32 = nullptr;
  const uint16_t* grad_bf16 = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  uint16_t* param_bf16_out = nullptr;
};

/// One Adam or AdamW step on every tensor of the list; per element, in float, each operation rounded
/// to nearest, fma(a, b, c) = a * b + c rounded once (the operations of cpu::adam_step):
///   g = grad / div_scale                                 (skipped when div_scale == 1)
///   AdamW, wd != 0: p = p * (1 - lr*wd)                 Adam, wd != 0: g = fma(p, wd, g)
///   m = fma(g, 1 - beta1, m * beta1);   v = fma((1 - beta2) * g, g, v * beta2)
///   d = sqrt(v) / sqrt(bc2) + eps;      p = p + (-(lr / bc1) * m) / d
/// with bc1 = 1 - beta1^step, bc2 = 1 - beta2^step (both 1 without bias_correction); the
/// coefficients 1 - lr*wd, 1 - beta, sqrt(bc2) and -(lr / bc1) computed in double, rounded to float.
/// Launches: one per up to 534 tensors (64 when built with CUDA before 12.1), each running every
/// chunk of its tensors; more only past 2^20 chunks.
/// noop_flag: optional device int; when it is non-zero as the kernel runs, nothing is changed (the
/// overflow skip: pass the found_inf of multi_tensor_scale). The step count is the caller's
/// (config.step). Throws std::invalid_argument for a bad config (see AdamConfig), a negative numel,
/// null param/exp_avg/exp_avg_sq of a non-empty tensor, or not exactly one gradient pointer.
void multi_tensor_adam(const AdamConfig& config, const std::vector<AdamTensor>& tensors,
                       const int* noop_flag = nullptr, Stream stream = nullptr);

/// One tensor of multi_tensor_scale: numel elements read from `in` (in_dtype) and written to `out`
/// (out_dtype). in == out with equal dtypes is allowed (an in-place scale).
struct ScaleTensor {
  int64_t numel = 0;
  const void* in = nullptr;
  DType in_dtype = DType::kFloat32;
  void* out = nullptr;
  DType out_dtype = DType::kFloat32;
};

/// out = in * scale (in float, then converted to out_dtype) for every tensor of the list.
/// found_inf: optional device int; set to 1 when any input element is Inf or NaN, never cleared
/// (zero it before a series of calls). The outputs are written either way, as apex's
/// multi_tensor_scale. Unscaling gradients by a loss scale S is scale = 1 / S. Throws
/// std::invalid_argument for a negative numel, null in/out of a non-empty tensor, or in == out with
/// different dtypes.
void multi_tensor_scale(float scale, const std::vector<ScaleTensor>& tensors, int* found_inf = nullptr,
                        Stream stream = nullptr);

/// One tensor of multi_tensor_l2norm: numel elements of dtype at data.
struct NormTensor {
  int64_t numel = 0;
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
};

/// Euclidean norms, as apex's multi_tensor_l2norm: total_norm[0] (device float) = sqrt(sum over all
/// tensors of the sum of squares); per_tensor_norms (optional, device float[tensors.size()]) gets
/// each tensor's norm. An empty list or empty tensors give 0. Squares are summed in float within a
/// chunk and in double across chunks and tensors, in a fixed order, so the result is deterministic;
/// an Inf or NaN element (or a float overflow of a chunk's sum) gives an Inf or NaN norm. The result
/// does not depend on the arrays' alignment. Uses a stream-ordered workspace of 4 bytes per chunk + 8
/// per tensor, from a memory pool of this library's own (one per device, created on first use and
/// kept: it holds on to the largest workspace in use at once, so later calls map no memory).
/// Throws std::invalid_argument for a null total_norm, a negative numel, or null data of a
/// non-empty tensor.
void multi_tensor_l2norm(const std::vector<NormTensor>& tensors, float* total_norm,
                         float* per_tensor_norms = nullptr, Stream stream = nullptr);

}  // namespace booster::kernels::cuda
