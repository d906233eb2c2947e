// cpu_adam_impl.h — private to the CPU Adam kernel: the per-call coefficients, the one-element update every path must reproduce bit for
// bit, and the per-ISA loops (one translation unit each, compiled with its own -m flags and
// -ffp-contract=off, so the only fused multiply-adds are the explicit ones).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "booster/kernels/cpu_adam.h"

namespace booster::kernels::cpu::detail {

// The double hyper-parameters (cpu_adam.h's AdamConfigDouble) every path derives its coefficients from.
using AdamHyper = AdamConfigDouble;

// Float coefficients of one update, derived once per call (cpu_adam.cpp, in double as LibTorch).
struct Coefficients {
  float decay = 1.0f;        // AdamW: 1 - lr * wd
  float l2 = 0.0f;           // Adam: wd
  float beta1 = 0.9f, one_minus_beta1 = 0.1f;
  float beta2 = 0.999f, one_minus_beta2 = 0.001f;
  float sqrt_bc2 = 1.0f;     // sqrt(1 - beta2^t)
  float neg_step_size = 0.0f;  // -(lr / (1 - beta1^t))
  float eps = 1e-8f;
  float div_scale = 1.0f;
  bool use_decay = false, use_l2 = false, use_div = false;
};

// The arrays of one call; exactly one gradient pointer is non-null, param_bf16 may be null.
struct Arrays {
  float* param;
  const float* grad;
  const uint16_t* grad_bf16;
  float* exp_avg;
  float* exp_avg_sq;
  uint16_t* param_bf16;
};

inline float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest-even; NaN -> 0x7FC0 (c10::BFloat16's round_to_nearest_even).
inline uint16_t float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The update of element i (the header's formula). The vector paths compute exactly this.
inline void adam_element(const Coefficients& c, const Arrays& a, int64_t i) {
  float g = a.grad ? a.grad[i] : bf16_to_float(a.grad_bf16[i]);
  float p = a.param[i];
  if (c.use_div) g = g / c.div_scale;
  if (c.use_decay) p = p * c.decay;
  if (c.use_l2) g = std::fma(p, c.l2, g);
  float m = std::fma(g, c.one_minus_beta1, a.exp_avg[i] * c.beta1);
  float v = std::fma(c.one_minus_beta2 * g, g, a.exp_avg_sq[i] * c.beta2);
  float d = std::sqrt(v) / c.sqrt_bc2 + c.eps;
  p = p + (c.neg_step_size * m) / d;
  a.exp_avg[i] = m;
  a.exp_avg_sq[i] = v;
  a.param[i] = p;
  if (a.param_bf16) a.param_bf16[i] = float_to_bf16(p);
}

// Elements [begin, end) of one call. Each is defined in its own translation unit; the AVX ones are
// called only when the CPU has the instructions.
void adam_range_scalar(const Coefficients& c, const Arrays& a, int64_t begin, int64_t end);
void adam_range_avx2(const Coefficients& c, const Arrays& a, int64_t begin, int64_t end);
void adam_range_avx512(const Coefficients& c, const Arrays& a, int64_t begin, int64_t end);

}  // namespace booster::kernels::cpu::detail
