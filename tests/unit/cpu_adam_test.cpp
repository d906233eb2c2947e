// cpu_adam_test.cpp — the CPU Adam kernel (booster/kernels/cpu_adam.h) and CPUAdam / HybridAdam
// (booster/optim/cpu_adam.h) against LibTorch 2.11's torch::optim::AdamW / Adam.
//
// Bound: after several steps the parameters and both moments are within kAdamMaxUlp float32 ulps of
// LibTorch's, on every ISA path this CPU has (each forced), odd sizes, AdamW and Adam, with and
// without weight decay; bias_correction = false and div_scale != 1 against the same ATen operations
// as LibTorch's step with the bias corrections set to 1 / the gradient divided first. Every path,
// thread count and gradient dtype (bf16 against its exact fp32 widening) must give the same bits.
#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>

#include "booster/optim/cpu_adam.h"
#include "common/adam_ulps.h"

namespace kc = booster::kernels::cpu;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

// The kernel's measure and bound against LibTorch: tests/common/adam_ulps.h.
using booster::testing::adam_max_ulp;
using booster::testing::kAdamMaxUlp;

std::vector<kc::Isa> available_isas() {
  std::vector<kc::Isa> v{kc::Isa::kScalar};
  if (kc::detected_isa() != kc::Isa::kScalar) v.push_back(kc::Isa::kAvx2);
  if (kc::detected_isa() == kc::Isa::kAvx512) v.push_back(kc::Isa::kAvx512);
  return v;
}

struct Hyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 0;
  bool adamw = true, bias_correction = true;
};

// LibTorch 2.11's Adam / AdamW step as ATen operations (adam.cpp, adamw.cpp), with the bias
// corrections optional: the reference for what LibTorch has no option for.
void aten_step(at::Tensor& p, at::Tensor g, at::Tensor& m, at::Tensor& v, const Hyper& h, int64_t step) {
  if (h.adamw && h.wd != 0) p.mul_(1 - h.lr * h.wd);
  if (!h.adamw && h.wd != 0) g = g.add(p, h.wd);
  m.mul_(h.beta1).add_(g, 1 - h.beta1);
  v.mul_(h.beta2).addcmul_(g, g, 1 - h.beta2);
  double bc1 = h.bias_correction ? 1 - std::pow(h.beta1, step) : 1.0;
  double bc2 = h.bias_correction ? 1 - std::pow(h.beta2, step) : 1.0;
  auto denom = (v.sqrt() / std::sqrt(bc2)).add_(h.eps);
  p.addcdiv_(m, denom, -h.lr / bc1);
}

kc::AdamConfig config_of(const Hyper& h, int64_t step, float div_scale = 1.0f) {
  kc::AdamConfig c;
  c.lr = static_cast<float>(h.lr);
  c.beta1 = static_cast<float>(h.beta1);
  c.beta2 = static_cast<float>(h.beta2);
  c.eps = static_cast<float>(h.eps);
  c.weight_decay = static_cast<float>(h.wd);
  c.adamw_mode = h.adamw;
  c.bias_correction = h.bias_correction;
  c.step = step;
  c.div_scale = div_scale;
  return c;
}

struct KernelState {
  at::Tensor p, m, v;
  explicit KernelState(const at::Tensor& p0) : p(p0.clone()), m(at::zeros_like(p0)), v(at::zeros_like(p0)) {}
  void step(const kc::AdamConfig& c, const at::Tensor& g, kc::Isa isa, at::Tensor bf16_out = {}) {
    const bool bf16 = g.scalar_type() == at::kBFloat16;
    kc::adam_step(c, p.numel(), p.data_ptr<float>(), bf16 ? nullptr : g.data_ptr<float>(),
                  bf16 ? reinterpret_cast<const uint16_t*>(g.data_ptr<at::BFloat16>()) : nullptr, m.data_ptr<float>(),
                  v.data_ptr<float>(),
                  bf16_out.defined() ? reinterpret_cast<uint16_t*>(bf16_out.data_ptr<at::BFloat16>()) : nullptr, isa);
  }
};

const std::vector<int64_t> kSizes{0, 1, 7, 15, 16, 17, 33, 1000, 65537, 1000003};
constexpr int kSteps = 4;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Kernel against LibTorch, every ISA

TEST(CpuAdamKernel, MatchesTorchAdamWAndAdamOnEveryIsa) {
  struct Case {
    const char* name;
    Hyper h;
  };
  std::vector<Case> cases{{"AdamW wd 0.01", {1e-3, 0.9, 0.999, 1e-8, 0.01, true}},
                          {"AdamW wd 0", {2e-3, 0.9, 0.999, 1e-8, 0.0, true}},
                          {"Adam wd 0.1", {1e-2, 0.8, 0.99, 1e-6, 0.1, false}},
                          {"Adam wd 0", {1e-3, 0.9, 0.999, 1e-8, 0.0, false}}};
  for (kc::Isa isa : available_isas()) {
    int64_t worst_p = 0, worst_m = 0, worst_v = 0;
    for (const auto& cs : cases) {
      for (int64_t n : kSizes) {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(n) + 11);
        auto p0 = at::randn({n}, gen);
        auto torch_p = p0.clone().set_requires_grad(true);
        std::unique_ptr<torch::optim::Optimizer> opt;
        if (cs.h.adamw)
          opt = std::make_unique<torch::optim::AdamW>(std::vector<at::Tensor>{torch_p},
              torch::optim::AdamWOptions(cs.h.lr).betas({cs.h.beta1, cs.h.beta2}).eps(cs.h.eps).weight_decay(cs.h.wd));
        else
          opt = std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{torch_p},
              torch::optim::AdamOptions(cs.h.lr).betas({cs.h.beta1, cs.h.beta2}).eps(cs.h.eps).weight_decay(cs.h.wd));
        KernelState k(p0);
        for (int t = 1; t <= kSteps; ++t) {
          auto g = at::randn({n}, gen) * (t == 2 ? 1e-3 : 1.0);
          torch_p.mutable_grad() = g.clone();
          opt->step();
          k.step(config_of(cs.h, t), g, isa);
        }
        at::Tensor tm, tv;
        if (n > 0) {
          const auto& st = opt->state().begin()->second;
          tm = cs.h.adamw ? static_cast<torch::optim::AdamWParamState&>(*st).exp_avg()
                          : static_cast<torch::optim::AdamParamState&>(*st).exp_avg();
          tv = cs.h.adamw ? static_cast<torch::optim::AdamWParamState&>(*st).exp_avg_sq()
                          : static_cast<torch::optim::AdamParamState&>(*st).exp_avg_sq();
        } else {
          tm = tv = k.m;
        }
        int64_t up = adam_max_ulp(k.p, torch_p.detach()), um = adam_max_ulp(k.m, tm), uv = adam_max_ulp(k.v, tv);
        EXPECT_LE(up, kAdamMaxUlp) << kc::isa_name(isa) << " " << cs.name << " n " << n << " param";
        EXPECT_LE(um, kAdamMaxUlp) << kc::isa_name(isa) << " " << cs.name << " n " << n << " exp_avg";
        EXPECT_LE(uv, kAdamMaxUlp) << kc::isa_name(isa) << " " << cs.name << " n " << n << " exp_avg_sq";
        EXPECT_TRUE(k.p.isfinite().all().item<bool>());
        worst_p = std::max(worst_p, up), worst_m = std::max(worst_m, um), worst_v = std::max(worst_v, uv);
      }
    }
    std::cout << "[ measured ] " << kc::isa_name(isa) << ": max ulp vs LibTorch after " << kSteps
              << " steps: param " << worst_p << ", exp_avg " << worst_m << ", exp_avg_sq " << worst_v << "\n";
  }
}

// bias_correction = false and div_scale != 1: against LibTorch's operations with bc = 1 and the
// gradient divided by div_scale first.
TEST(CpuAdamKernel, BiasCorrectionOffAndDivScaleMatchAtenReference) {
  for (kc::Isa isa : available_isas()) {
    for (bool adamw : {true, false}) {
      for (int64_t n : {int64_t{17}, int64_t{1000003}}) {
        Hyper h{1e-3, 0.9, 0.999, 1e-8, 0.05, adamw, false};
        auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
        auto p0 = at::randn({n}, gen);
        auto rp = p0.clone(), rm = at::zeros_like(p0), rv = at::zeros_like(p0);
        KernelState k(p0), kd(p0);
        Hyper hb = h;
        hb.bias_correction = true;
        auto bp = p0.clone(), bm = at::zeros_like(p0), bv = at::zeros_like(p0);
        const float scale = 1024.0f * 3;  // not a power of two: the division rounds
        for (int t = 1; t <= kSteps; ++t) {
          auto g = at::randn({n}, gen);
          aten_step(rp, g, rm, rv, h, t);
          k.step(config_of(h, t), g, isa);
          aten_step(bp, g / scale, bm, bv, hb, t);
          kd.step(config_of(hb, t, scale), g, isa);
        }
        EXPECT_LE(adam_max_ulp(k.p, rp), kAdamMaxUlp) << kc::isa_name(isa) << " bias_correction off, adamw " << adamw;
        EXPECT_LE(adam_max_ulp(k.v, rv), kAdamMaxUlp) << kc::isa_name(isa) << " bias_correction off, adamw " << adamw;
        EXPECT_LE(adam_max_ulp(kd.p, bp), kAdamMaxUlp) << kc::isa_name(isa) << " div_scale, adamw " << adamw;
        EXPECT_LE(adam_max_ulp(kd.m, bm), kAdamMaxUlp) << kc::isa_name(isa) << " div_scale, adamw " << adamw;
      }
    }
  }
}

// Every path, 1 or 2 threads, gives the same bits; a bf16 gradient equals its fp32 widening, and the
// bf16 output is the updated parameter rounded to nearest-even (as at::Tensor::to(kBFloat16)).
TEST(CpuAdamKernel, PathsThreadsAndBf16AreBitExact) {
  const int threads_before = at::get_num_threads();
  const int64_t n = 1000003;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(9);
  auto p0 = at::randn({n}, gen);
  Hyper h{1e-3, 0.9, 0.999, 1e-8, 0.01, true};
  std::vector<at::Tensor> grads;
  for (int t = 0; t < kSteps; ++t) grads.push_back(at::randn({n}, gen).to(at::kBFloat16));
  KernelState ref(p0);
  for (int t = 1; t <= kSteps; ++t) ref.step(config_of(h, t), grads[t - 1].to(at::kFloat), kc::Isa::kScalar);
  for (kc::Isa isa : available_isas()) {
    for (int threads : {1, 2}) {
      at::set_num_threads(threads);
      KernelState k(p0);
      auto out = at::empty({n}, at::kBFloat16);
      for (int t = 1; t <= kSteps; ++t) k.step(config_of(h, t), grads[t - 1], isa, out);
      EXPECT_TRUE(at::equal(k.p, ref.p)) << kc::isa_name(isa) << " threads " << threads;
      EXPECT_TRUE(at::equal(k.m, ref.m)) << kc::isa_name(isa) << " threads " << threads;
      EXPECT_TRUE(at::equal(k.v, ref.v)) << kc::isa_name(isa) << " threads " << threads;
      EXPECT_TRUE(at::equal(out.view(at::kShort), k.p.to(at::kBFloat16).view(at::kShort)))
          << kc::isa_name(isa) << " threads " << threads;
    }
  }
  at::set_num_threads(threads_before);
  // Rounding edge cases of the bf16 output, and NaN, on every path.
  std::vector<float> values{1.0f, 1.00390625f, 1.0078125f, 1.01171875f, -3.99609375f, 1e-40f, 3.4e38f, -0.0f};
  for (kc::Isa isa : available_isas()) {
    auto p = at::tensor(values).repeat({3});  // 24 elements: a vector body and a tail
    auto zeros = at::zeros_like(p);
    auto m = zeros.clone(), v = zeros.clone();
    auto out = at::empty({p.numel()}, at::kBFloat16);
    kc::AdamConfig c;
    c.lr = 0;  // the parameter stays as it is: the output is its rounding
    kc::adam_step(c, p.numel(), p.data_ptr<float>(), zeros.data_ptr<float>(), nullptr, m.data_ptr<float>(),
                  v.data_ptr<float>(), reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), isa);
    EXPECT_TRUE(at::equal(out.view(at::kShort), p.to(at::kBFloat16).view(at::kShort))) << kc::isa_name(isa);
  }
}

TEST(CpuAdamKernel, RefusesBadArguments) {
  float p = 1, g = 0, m = 0, v = 0;
  uint16_t gb = 0;
  kc::AdamConfig c;
  auto call = [&](const float* gf, const uint16_t* gh, int64_t n, kc::Isa isa) {
    kc::adam_step(c, n, &p, gf, gh, &m, &v, nullptr, isa);
  };
  EXPECT_THAT([&] { call(&g, &gb, 1, kc::Isa::kScalar); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("both grad_fp32 and grad_bf16")));
  EXPECT_THAT([&] { call(nullptr, nullptr, 1, kc::Isa::kScalar); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("neither grad_fp32 nor grad_bf16")));
  EXPECT_THAT([&] { call(&g, nullptr, -1, kc::Isa::kScalar); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("negative")));
  EXPECT_THAT([&] { call(&g, nullptr, 1, static_cast<kc::Isa>(7)); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("not an Isa value")));
  if (kc::detected_isa() != kc::Isa::kAvx512)
    EXPECT_THAT([&] { call(&g, nullptr, 1, kc::Isa::kAvx512); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("not supported by this CPU")));
  c.step = 0;
  EXPECT_THAT([&] { call(&g, nullptr, 1, kc::Isa::kScalar); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("1-based")));
  EXPECT_EQ(p, 1.0f);  // nothing was updated
  EXPECT_STREQ(kc::isa_name(kc::Isa::kAvx2), "avx2");
}

TEST(CpuAdamKernel, EnvironmentVariableForcesThePath) {
  const char* before = std::getenv("BOOSTER_CPU_ADAM_ISA");
  std::string saved = before ? before : "";
  setenv("BOOSTER_CPU_ADAM_ISA", "scalar", 1);
  EXPECT_EQ(booster::optim::cpu_adam_isa(), kc::Isa::kScalar);
  setenv("BOOSTER_CPU_ADAM_ISA", "sse9", 1);
  EXPECT_THAT([] { booster::optim::cpu_adam_isa(); }, ThrowsMessage<std::invalid_argument>(HasSubstr("not one of scalar, avx2")));
  if (kc::detected_isa() != kc::Isa::kAvx512) {
    setenv("BOOSTER_CPU_ADAM_ISA", "avx512", 1);
    EXPECT_THAT([] { booster::optim::cpu_adam_isa(); }, ThrowsMessage<std::invalid_argument>(HasSubstr("supports at most")));
  }
  unsetenv("BOOSTER_CPU_ADAM_ISA");
  EXPECT_EQ(booster::optim::cpu_adam_isa(), kc::detected_isa());
  if (before) setenv("BOOSTER_CPU_ADAM_ISA", saved.c_str(), 1);
}
