// bench_optimizer_step — time of one optimizer step on a flat float32 parameter of N elements:
// LibTorch's torch::optim::AdamW and Booster's CPUAdam (the fused SIMD kernel, booster/optim/
// cpu_adam.h, same hyper-parameters), against the bytes-moved bound: an fp32 Adam step must read param, grad, exp_avg,
// exp_avg_sq (16 bytes/param) and write param, exp_avg, exp_avg_sq (12 bytes/param) = 28 bytes/param.
// The bound is measured, not computed from a datasheet: a memcpy (at::Tensor::copy_) of 14 bytes/param
// reads 14 and writes 14 bytes/param, i.e. moves exactly the same 28 bytes/param, in the same process
// with the same number of intra-op threads. A copy into a separate destination also reads each
// destination line before writing it (write-allocate), so it moves ~42 bytes/param through DRAM;
// an Adam step updates param, exp_avg and exp_avg_sq in place and moves 28. So the program also
// times an in-place pass over the same bytes (at::Tensor::mul_ on 14 bytes/param: read 14, write 14
// in place), the tighter bound. LibTorch's AdamW makes several passes over memory; the kernel one.
//
//   bench_optimizer_step --numels 10000000,100000000 --threads 1,2 --reps 5 [--sample_numel 30000000]
//                        --out results.json
//
// Correctness: two steps of each optimizer (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01)
// are checked against a hand-written AdamW (in double) on the first and last 100k elements, and the
// two optimizers' parameters against each other in float32 ulps of max(|p|, 1e-3) over the whole
// tensor (at most 16: the kernel's bound against LibTorch 2.11, tests/unit/cpu_adam_test.cpp); the program
// exits non-zero on a mismatch. Timing: AdamW steps, CPUAdam steps, copies and in-place passes are
// interleaved (rotating order); a sample is the mean of back-to-back steps (or copies) worth ~30M parameters;
// every sample goes to --out.
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>

#include "bench_common.h"
#include "booster/optim/cpu_adam.h"

using namespace booster::bench;

namespace {

constexpr double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWd = 0.01;

// Reference AdamW (decoupled weight decay, bias-corrected), in double, for `steps` steps with a
// constant gradient: PyTorch's formula p = p*(1 - lr*wd) - lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps).
torch::Tensor reference_adamw(torch::Tensor p, const torch::Tensor& g, int steps) {
  p = p.to(torch::kDouble);
  auto gd = g.to(torch::kDouble);
  auto m = torch::zeros_like(p), v = torch::zeros_like(p);
  for (int t = 1; t <= steps; ++t) {
    p = p * (1 - kLr * kWd);
    m = m * kBeta1 + gd * (1 - kBeta1);
    v = v * kBeta2 + gd * gd * (1 - kBeta2);
    double bc1 = 1 - std::pow(kBeta1, t), bc2 = 1 - std::pow(kBeta2, t);
    p = p - (kLr / bc1) * m / (v.sqrt() / std::sqrt(bc2) + kEps);
  }
  return p;
}

int run(const Args& a) {
  int reps = static_cast<int>(a.integer("reps", 5));
  std::vector<int64_t> thread_counts = a.integers("threads", "1,2");
  std::vector<std::string> results;
  torch::manual_seed(42);

  for (int64_t n : a.integers("numels", "10000000,100000000")) {
    torch::NoGradGuard no_grad;
    auto param = torch::randn({n}).set_requires_grad(true);
    param.mutable_grad() = torch::randn({n});
    torch::optim::AdamW adamw({param}, torch::optim::AdamWOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(kWd));
    // CPUAdam on a copy of the parameter with the same gradient tensor.
    auto ours = param.detach().clone().set_requires_grad(true);
    ours.mutable_grad() = param.grad();
    booster::optim::CPUAdam cpu_adam({ours},
                                     booster::optim::CPUAdamOptions(kLr).betas({kBeta1, kBeta2}).eps(kEps).weight_decay(kWd));

    // Correctness: two steps vs the reference on both ends of the parameter, and the two optimizers
    // against each other everywhere.
    int64_t k = std::min<int64_t>(n / 2, 100000);
    auto ends = [&](const torch::Tensor& t) { return torch::cat({t.narrow(0, 0, k), t.narrow(0, n - k, k)}); };
    auto p0 = ends(param).clone(), g = ends(param.grad()).clone();
    at::set_num_threads(static_cast<int>(thread_counts.front()));
    for (int s = 0; s < 2; ++s) {
      adamw.step();
      cpu_adam.step();
    }
    auto expected = reference_adamw(p0, g, 2);
    // Relative to |p| + 1: float32 rounding of p (|p| up to ~5) is a few 1e-7 absolute; the update
    // itself is ~1e-3 per step, so a wrong formula is far above the tolerance.
    auto rel_err = [&](const torch::Tensor& p) {
      return ((ends(p).to(torch::kDouble) - expected).abs() / (expected.abs() + 1)).max().item<double>();
    };
    double err = rel_err(param), err_ours = rel_err(ours);
    // |AdamW - CPUAdam| in float32 ulps of max(|p|, 1e-3) (an element near zero is measured at the
    // scale of its update, as in the unit tests).
    auto scale = at::clamp_min(param.detach().abs(), 1e-3).to(torch::kDouble) * std::ldexp(1.0, -23);
    int64_t ulp = static_cast<int64_t>(std::ceil(
        ((param.detach().to(torch::kDouble) - ours.detach().to(torch::kDouble)).abs() / scale).max().item<double>()));
    if (!(err < 1e-6) || !(err_ours < 1e-6) || ulp > 16) {
      std::cerr << "bench_optimizer_step: on " << n << " parameters after 2 steps, AdamW differs from the reference "
                << "formula by (relative) " << err << ", CPUAdam by " << err_ours << ", and CPUAdam from AdamW by "
                << ulp << " ulp (limits 1e-6, 1e-6, 16)\n";
      return 3;
    }

    // The same 28 bytes/param through memcpy: 14 bytes/param read + 14 written (3.5 floats/param).
    int64_t copy_floats = n * 7 / 2;
    auto src = torch::rand({copy_floats}), dst = torch::empty({copy_floats}), inplace = torch::rand({copy_floats});
    int iters = static_cast<int>(std::max<int64_t>(1, a.integer("sample_numel", 30000000) / n));

    for (int64_t threads : thread_counts) {
      at::set_num_threads(static_cast<int>(threads));
      adamw.step();  // warm-up (also faults in dst on the copy below)
      cpu_adam.step();
      dst.copy_(src);
      inplace.mul_(1.0f);
      std::vector<double> t_step, t_ours, t_copy, t_inplace;
      auto sample = [&](const std::function<void()>& fn, std::vector<double>& out) {
        double t0 = now_s();
        for (int i = 0; i < iters; ++i) fn();
        out.push_back((now_s() - t0) / iters);
      };
      std::vector<std::function<void()>> order{[&] { sample([&] { adamw.step(); }, t_step); },
                                               [&] { sample([&] { cpu_adam.step(); }, t_ours); },
                                               [&] { sample([&] { dst.copy_(src); }, t_copy); },
                                               [&] { sample([&] { inplace.mul_(1.0f); }, t_inplace); }};
      for (int r = 0; r < reps; ++r)
        for (int j = 0; j < 4; ++j) order[(r + j) % 4]();
      results.push_back(json_obj({{"numel", json_int(n)}, {"threads", json_int(at::get_num_threads())},
                                  {"step_s", json_list(t_step)}, {"cpu_adam_s", json_list(t_ours)},
                                  {"copy_s", json_list(t_copy)}, {"inplace_s", json_list(t_inplace)},
                                  {"copy_bytes", json_int(copy_floats * 4)},
                                  {"check_max_rel_err", json_num(err)}, {"cpu_adam_max_rel_err", json_num(err_ours)},
                                  {"cpu_adam_max_ulp_vs_adamw", json_int(ulp)},
                                  {"cpu_adam_isa", json_str(booster::kernels::cpu::isa_name(booster::optim::cpu_adam_isa()))}}));
    }
    if (!torch::isfinite(param).all().item<bool>() || !torch::isfinite(ours).all().item<bool>()) {
      std::cerr << "bench_optimizer_step: a parameter became non-finite\n";
      return 3;
    }
  }
  if (a.has("out")) write_file(a.str("out", ""), json_obj({{"results", json_arr(results)}}));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return booster::bench::guarded_main("bench_optimizer_step", [&] { return run(Args(argc, argv)); });
}
