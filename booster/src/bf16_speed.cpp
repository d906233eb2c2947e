// bf16_speed.cpp — see bf16_speed.h.
#include "bf16_speed.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <limits>
#include <string>

#include "booster/logging.h"

namespace booster::mixed_precision {

namespace {

double best_seconds(const at::Tensor& a, const at::Tensor& b) {
  double best = std::numeric_limits<double>::infinity();
  at::Tensor out = at::matmul(a, b);  // warm-up (and the output's allocation)
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    at::matmul_out(out, a, b);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

double bf16_matmul_slowdown() {
  try {
    at::NoGradGuard no_grad;
    const at::Tensor a = at::rand({256, 256}), b = at::rand({256, 256});
    const double fp32 = best_seconds(a, b);
    const double bf16 = best_seconds(a.to(at::kBFloat16), b.to(at::kBFloat16));
    return fp32 > 0 ? bf16 / fp32 : 0.0;
  } catch (const std::exception&) {
    return 0.0;
  }
}

bool warn_if_bf16_is_slow(double slowdown, double threshold) {
  static std::atomic<bool> warned{false};
  if (!(slowdown > threshold)) return warned.load();
  if (warned.exchange(true)) return true;
  char ratio[32];
  std::snprintf(ratio, sizeof(ratio), "%.1f", slowdown);
  log::warn(std::string("booster: the model computes in bf16, but on this CPU a bf16 matrix product takes ") + ratio +
            "x the time of a float32 one (LibTorch has fast bf16 kernels only with AVX-512): training will be "
            "slower than in fp32. Set the precision to \"fp32\" ([booster] mixed_precision, or the plugin's "
            "precision / mixed_precision.param_dtype) unless you need bf16's memory saving.");
  return true;
}

}  // namespace booster::mixed_precision
