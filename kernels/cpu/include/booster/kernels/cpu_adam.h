// cpu_adam.h — a fused single-pass Adam / AdamW update on the CPU: one read and one write of the
// parameter and the two moments and one read of the gradient per element (28 bytes per parameter for
// fp32 gradients), with AVX-512, AVX2+FMA and scalar paths chosen at run time, OpenMP over tiles.
//
// Algorithm: Adam (Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR 2015) and AdamW
// (Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019), in the order of
// operations of LibTorch 1.13's torch::optim::Adam / AdamW (0 ulps from it; LibTorch 2.11's
// kernels fuse more multiply-adds, and the kernel is within 16 ulps of 2.11's step after 4 steps,
// tests/unit/cpu_adam_test.cpp), the C++ counterpart of ColossalAI's cpu_adam kernel. For element i, with
// t = config.step:
//
//   g  = grad[i] / div_scale                           (skipped when div_scale == 1)
//   AdamW, weight_decay != 0:  p = p * (1 - lr * weight_decay)
//   Adam,  weight_decay != 0:  g = g + weight_decay * p           (L2, fused multiply-add)
//   m  = m * beta1 + (1 - beta1) * g                    (second operation fused multiply-add)
//   v  = v * beta2 + ((1 - beta2) * g) * g              (last operation fused multiply-add, as
//                                                        LibTorch's vectorized addcmul compiles)
//   bc1 = 1 - beta1^t, bc2 = 1 - beta2^t                (in double; both 1 without bias_correction)
//   d  = sqrt(v) / sqrt(bc2) + eps
//   p  = p + ((-(lr / bc1)) * m) / d                    (as ATen's addcdiv: self + value * t1 / t2)
//
// The scalar coefficients (1 - lr * wd, 1 - beta, lr / bc1, sqrt(bc2)) are computed in double and
// rounded to float once, as LibTorch does with its double options. The float hyper-parameters of
// AdamConfig are first widened to double through their shortest decimal representation (0.999f acts
// as the double 0.999), so options given as round decimals produce LibTorch's exact coefficients.
// Everything else is float32 arithmetic with the fused multiply-adds listed above and no other
// contraction; every path (scalar, AVX2, AVX-512, any thread count, any alignment) gives the same bits.
//
// bf16 is handled as raw uint16 bits (the upper half of a float32): a bf16 gradient is widened
// exactly; param_bf16_out receives the updated fp32 parameter rounded to nearest-even (NaN -> 0x7FC0,
// as c10::BFloat16).
//
// Threads: the n elements are cut into contiguous tiles, one per OpenMP thread (omp_get_max_threads(),
// which LibTorch's at::set_num_threads sets; one thread for small n or inside a parallel region).
// Thread-safety: calls on disjoint arrays may run concurrently.
#pragma once

#include <cstdint>

#if defined(_WIN32)
#define BOOSTER_KERNELS_API __declspec(dllexport)
#else
#define BOOSTER_KERNELS_API __attribute__((visibility("default")))
#endif

namespace booster::kernels::cpu {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// The best path the running CPU (and OS) supports: kAvx512 needs AVX-512F, kAvx2 needs AVX2 and FMA.
BOOSTER_KERNELS_API Isa detected_isa();
// "scalar" | "avx2" | "avx512" ("unknown" for a value outside the enum).
BOOSTER_KERNELS_API const char* isa_name(Isa isa);

struct AdamConfig {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.0f;
  bool adamw_mode = true;        // true: decoupled weight decay (AdamW); false: L2 added to the gradient (Adam)
  bool bias_correction = true;
  int64_t step = 1;              // the step number of this update, 1-based
  float div_scale = 1.0f;        // gradients are divided by this first (loss-scale unscale); 1: none
};

// One update of n elements. param, exp_avg, exp_avg_sq: fp32 [n], updated in place. Exactly one of
// grad_fp32 / grad_bf16 is non-null (bf16 given as raw uint16 bits). param_bf16_out: nullptr, or bf16
// [n] receiving the updated param rounded to nearest-even (the compute copy). Throws std::invalid_argument
// for bad arguments (both/neither grad, n < 0, an isa the CPU lacks).
// Also refused (std::invalid_argument): a null param / exp_avg / exp_avg_sq with n > 0, step < 1,
// div_scale == 0. With n == 0 nothing is read or written and the array pointers may all be null
// (an empty tensor's data pointer). Arrays must not overlap.
BOOSTER_KERNELS_API void adam_step(const AdamConfig& config, int64_t n, float* param, const float* grad_fp32,
                                   const uint16_t* grad_bf16, float* exp_avg, float* exp_avg_sq,
                                   uint16_t* param_bf16_out, Isa isa);

// AdamConfig with the hyper-parameters as doubles, used as they are (no rounding to float first):
// LibTorch's optimizer options are doubles, and a scheduled lr rounded to float before lr / (1 -
// beta1^t) would move the step by one float rounding. The per-call coefficients are derived in double
// and rounded once, as adam_step(AdamConfig) does after widening its floats.
struct AdamConfigDouble {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool adamw_mode = true, bias_correction = true;
  int64_t step = 1;
  float div_scale = 1.0f;
};

// adam_step with double hyper-parameters: the same arrays, contract and errors.
BOOSTER_KERNELS_API void adam_step(const AdamConfigDouble& config, int64_t n, float* param, const float* grad_fp32,
                                   const uint16_t* grad_bf16, float* exp_avg, float* exp_avg_sq,
                                   uint16_t* param_bf16_out, Isa isa);

}  // namespace booster::kernels::cpu
