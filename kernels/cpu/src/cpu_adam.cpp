// cpu_adam.cpp — the CPU Adam kernel's entry point: argument checks, ISA detection, the coefficients
// (in double, as LibTorch), and the OpenMP split into one contiguous tile per thread.
#include "booster/kernels/cpu_adam.h"

#include <omp.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>
#include <string>

#include "cpu_adam_impl.h"

namespace booster::kernels::cpu {

namespace {

bool cpu_has(Isa isa) {
#if defined(__x86_64__) && defined(BOOSTER_KERNELS_X86)
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kScalar: return true;
    case Isa::kAvx2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::kAvx512: return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("fma");
  }
  return false;
#else
  return isa == Isa::kScalar;
#endif
}

// The double a LibTorch option would hold for this float: the float's shortest round-trip decimal
// (0.999f -> "0.999" -> 0.999), so 1 - beta and lr * wd are computed as from double options.
double widen(float x) {
  if (!std::isfinite(x)) return x;
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  double d = x;
  if (ec == std::errc()) std::from_chars(buf, end, d);
  return d;
}

detail::Coefficients coefficients(const detail::AdamHyper& cfg) {
  const double lr = cfg.lr, beta1 = cfg.beta1, beta2 = cfg.beta2, eps = cfg.eps, wd = cfg.weight_decay;
  detail::Coefficients c;
  c.use_decay = cfg.adamw_mode && wd != 0;
  c.use_l2 = !cfg.adamw_mode && wd != 0;
  c.decay = static_cast<float>(1 - lr * wd);
  c.l2 = static_cast<float>(wd);
  c.beta1 = static_cast<float>(beta1);
  c.beta2 = static_cast<float>(beta2);
  c.one_minus_beta1 = static_cast<float>(1 - beta1);
  c.one_minus_beta2 = static_cast<float>(1 - beta2);
  double bc1 = 1, bc2 = 1;
  if (cfg.bias_correction) {
    bc1 = 1 - std::pow(beta1, static_cast<double>(cfg.step));
    bc2 = 1 - std::pow(beta2, static_cast<double>(cfg.step));
  }
  c.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  c.neg_step_size = static_cast<float>(-(lr / bc1));
  c.eps = static_cast<float>(eps);
  c.use_div = cfg.div_scale != 1.0f;
  c.div_scale = cfg.div_scale;
  return c;
}

void invalid(const std::string& what) { throw std::invalid_argument("booster::kernels::cpu::adam_step: " + what); }

// Below this many elements one thread does the whole update (a parallel region costs more).
constexpr int64_t kMinElementsPerThread = 1 << 15;
// Tile boundaries are multiples of this many elements (whole 64-byte lines of fp32 and bf16 arrays
// when the arrays are 64-byte aligned).
constexpr int64_t kTileAlign = 64;

}  // namespace

Isa detected_isa() {
  static const Isa best = cpu_has(Isa::kAvx512) ? Isa::kAvx512 : cpu_has(Isa::kAvx2) ? Isa::kAvx2 : Isa::kScalar;
  return best;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "unknown";
}

void adam_step(const AdamConfig& config, int64_t n, float* param, const float* grad_fp32, const uint16_t* grad_bf16,
               float* exp_avg, float* exp_avg_sq, uint16_t* param_bf16_out, Isa isa) {
  detail::AdamHyper h;
  h.lr = widen(config.lr);
  h.beta1 = widen(config.beta1);
  h.beta2 = widen(config.beta2);
  h.eps = widen(config.eps);
  h.weight_decay = widen(config.weight_decay);
  h.adamw_mode = config.adamw_mode;
  h.bias_correction = config.bias_correction;
  h.step = config.step;
  h.div_scale = config.div_scale;
  adam_step(h, n, param, grad_fp32, grad_bf16, exp_avg, exp_avg_sq, param_bf16_out, isa);
}

void adam_step(const AdamConfigDouble& config, int64_t n, float* param, const float* grad_fp32,
               const uint16_t* grad_bf16, float* exp_avg, float* exp_avg_sq, uint16_t* param_bf16_out, Isa isa) {
  if (grad_fp32 && grad_bf16) invalid("both grad_fp32 and grad_bf16 are given; pass exactly one");
  if (n > 0 && !grad_fp32 && !grad_bf16) invalid("neither grad_fp32 nor grad_bf16 is given; pass exactly one");
  if (n < 0) invalid("n = " + std::to_string(n) + " is negative");
  if (isa != Isa::kScalar && isa != Isa::kAvx2 && isa != Isa::kAvx512)
    invalid("isa " + std::to_string(static_cast<int>(isa)) + " is not an Isa value");
  if (!cpu_has(isa))
    invalid(std::string("isa ") + isa_name(isa) + " is not supported by this CPU (best available: " +
            isa_name(detected_isa()) + ")");
  if (config.step < 1) invalid("step = " + std::to_string(config.step) + "; steps are 1-based");
  if (config.div_scale == 0.0f) invalid("div_scale is 0; pass 1 for no unscaling");
  if (n == 0) return;
  if (!param || !exp_avg || !exp_avg_sq) invalid("param, exp_avg and exp_avg_sq must not be null");

  const detail::Coefficients c = coefficients(config);
  const detail::Arrays a{param, grad_fp32, grad_bf16, exp_avg, exp_avg_sq, param_bf16_out};
  auto range = isa == Isa::kAvx512 ? detail::adam_range_avx512
               : isa == Isa::kAvx2 ? detail::adam_range_avx2
                                   : detail::adam_range_scalar;

  int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n / kMinElementsPerThread)));
  if (threads == 1) {
    range(c, a, 0, n);
    return;
  }
  // Contiguous tiles of equal size (rounded to kTileAlign), one per thread.
  const int64_t per = (n + threads - 1) / threads;
  const int64_t tile = (per + kTileAlign - 1) / kTileAlign * kTileAlign;
#pragma omp parallel num_threads(threads)
  {
    const int64_t begin = std::min<int64_t>(n, omp_get_thread_num() * tile);
    const int64_t end = std::min<int64_t>(n, begin + tile);
    if (begin < end) range(c, a, begin, end);
  }
}

}  // namespace booster::kernels::cpu
