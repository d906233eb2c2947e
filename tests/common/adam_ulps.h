// adam_ulps.h — the measure and bound by which the CPU Adam kernel (and CPUAdam / HybridAdam) is
// compared with LibTorch's torch::optim::Adam / AdamW in the unit tests.
//
// LibTorch 2.11's vectorised CPU kernels fuse multiply-adds (add_ with alpha and addcmul_ round once:
// its AdamW moments equal an fma-ordered loop bit for bit), where the kernel rounds each operation as
// 1.13 did (0 ulps then). Measured against 2.11 after 4-6 steps, on the kernel's every ISA: parameters
// 13, exp_avg 14, exp_avg_sq 2 ulps of max(|x|, kAdamUlpFloor) on Intel AVX-512 / AVX2 machines; on an
// AMD EPYC (avx512_bf16) machine LibTorch's Adam with L2 weight decay 0.1 differs more over 10^6
// elements: parameters 30, exp_avg 113, exp_avg_sq 3 (the folded gradient g + wd·p rounds once there
// and twice in the kernel, and the tail of a million elements holds moments that nearly cancel); the
// Gemini bf16 loop 32. A wrong formula is off by orders of magnitude more (10^5 and beyond).
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>

namespace booster::testing {

constexpr int64_t kAdamMaxUlp = 128;
constexpr double kAdamUlpFloor = 1e-3;

// max |a - b| in float32 ulps of max(|b|, kAdamUlpFloor): an element that an update leaves near zero
// is measured against the scale of the update, not against its own tiny magnitude. 0 iff a == b.
inline int64_t adam_max_ulp(const at::Tensor& a, const at::Tensor& b) {
  if (a.numel() == 0) return 0;
  auto scale = at::clamp_min(b.abs(), kAdamUlpFloor).to(at::kDouble) * std::ldexp(1.0, -23);
  return static_cast<int64_t>(std::ceil(((a.to(at::kDouble) - b.to(at::kDouble)).abs() / scale).max().item<double>()));
}

}  // namespace booster::testing
