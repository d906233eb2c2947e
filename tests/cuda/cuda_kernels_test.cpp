// booster_cuda_kernel_tests: the CUDA kernels of kernels/cuda (booster/kernels/cuda_adam.h).
//  CudaKernels.*      run the kernels on the GPU on random data of odd sizes, aligned and unaligned,
//                     and compare them with booster::kernels::cpu::adam_step (bit for bit, when that
//                     kernel is built) and with double references; skipped (GTEST_SKIP) when
//                     cudaGetDeviceCount finds no device.
//  CudaKernelsHost.*  need no GPU: the launch planner, the same per-block functors executed on the
//                     host block by block and thread by thread (with small chunks and small launch
//                     limits, so launches split tensors; aligned and unaligned arrays, so both memory
//                     paths run), bit identity of the Adam update with the CPU kernel, bf16 rounding,
//                     argument errors, and the error raised without a device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "booster/kernels/cuda_adam.h"
#include "multi_tensor_functors.h"

#if defined(BOOSTER_TEST_HAVE_CPU_ADAM) && __has_include(<booster/kernels/cpu_adam.h>)
#include "booster/kernels/cpu_adam.h"
#define BOOSTER_TEST_CPU_ADAM 1
#endif

// The host-run kernel bodies must not be contracted into fused multiply-adds (see
// multi_tensor_functors.h): GCC contracts by default only in its GNU modes, and only when the target
// has FMA instructions.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__STRICT_ANSI__) && defined(__FP_FAST_FMAF)
#error "build this test with -std=c++17 (not gnu++17) or without FMA code generation: it checks bit identity"
#endif

namespace kc = booster::kernels::cuda;
namespace kd = booster::kernels::cuda::detail;

namespace {

// ---- host data and references

struct Rng {
  std::mt19937 gen{1234};
  std::vector<float> normal(int64_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(gen);
    return v;
  }
  std::vector<float> uniform(int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = d(gen);
    return v;
  }
};

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = kd::float_to_bf16(v[i]);
  return r;
}

// Scales of the random initial state.
struct AdamInit {
  float param = 1.0f, grad = 0.1f, m = 0.01f, v_max = 1e-3f;
};

// One parameter tensor's full Adam state on the host, plus a double shadow updated by the reference.
// The arrays hold `offset` leading elements that are not part of the tensor, so offset 1..3 makes
// every array of the tensor unaligned (the kernels' scalar path); std::vector's storage is
// 16-byte aligned, so offset 0 gives the vector path.
struct HostAdamTensor {
  std::vector<float> param, grad, m, v;
  std::vector<uint16_t> grad_bf16, out_bf16;
  std::vector<double> param_d, m_d, v_d;
  int64_t offset = 0;
  bool use_bf16_grad = false, write_bf16 = false;

  HostAdamTensor(Rng& rng, int64_t n, bool bf16_grad, bool bf16_out, int64_t offset_ = 0, AdamInit init = {})
      : param(rng.normal(n + offset_, init.param)), grad(rng.normal(n + offset_, init.grad)),
        m(rng.normal(n + offset_, init.m)), v(rng.uniform(n + offset_, 0.0f, init.v_max)), offset(offset_),
        use_bf16_grad(bf16_grad), write_bf16(bf16_out) {
    grad_bf16 = to_bf16(grad);
    out_bf16.assign(bf16_out ? n + offset : 0, 0);
    param_d.assign(param.begin(), param.end());
    m_d.assign(m.begin(), m.end());
    v_d.assign(v.begin(), v.end());
  }
  int64_t numel() const { return static_cast<int64_t>(param.size()) - offset; }
  float grad_at(int64_t i) const { return use_bf16_grad ? kd::bf16_to_float(grad_bf16[i]) : grad[i]; }
  kc::AdamTensor host_view() {
    kc::AdamTensor t;
    t.numel = numel();
    t.param = param.data() + offset;
    if (use_bf16_grad) t.grad_bf16 = grad_bf16.data() + offset; else t.grad_fp32 = grad.data() + offset;
    t.exp_avg = m.data() + offset;
    t.exp_avg_sq = v.data() + offset;
    t.param_bf16_out = write_bf16 ? out_bf16.data() + offset : nullptr;
    return t;
  }
};

// The update rule of the header in double, on the shadow state, with the options read as the
// kernels read them (their shortest decimals: 0.999f as the double 0.999).
void adam_reference(const kc::AdamConfig& c, HostAdamTensor& t) {
  const double b1 = kd::widen(c.beta1), b2 = kd::widen(c.beta2), lr = kd::widen(c.lr), wd = kd::widen(c.weight_decay),
               eps = kd::widen(c.eps);
  const double bc1 = c.bias_correction ? 1.0 - std::pow(b1, double(c.step)) : 1.0;
  const double bc2 = c.bias_correction ? 1.0 - std::pow(b2, double(c.step)) : 1.0;
  for (int64_t i = t.offset; i < static_cast<int64_t>(t.param.size()); ++i) {
    double g = double(t.grad_at(i)) / c.div_scale;
    double& p = t.param_d[i];
    if (c.adamw_mode) p *= 1.0 - lr * wd; else g += wd * p;
    t.m_d[i] = b1 * t.m_d[i] + (1.0 - b1) * g;
    t.v_d[i] = b2 * t.v_d[i] + (1.0 - b2) * g * g;
    p -= (lr / bc1) * t.m_d[i] / (std::sqrt(t.v_d[i]) / std::sqrt(bc2) + eps);
  }
}

#ifdef BOOSTER_TEST_CPU_ADAM
// One step of booster::kernels::cpu::adam_step on t, with the same AdamConfig.
void cpu_adam(const kc::AdamConfig& c, HostAdamTensor& t, booster::kernels::cpu::Isa isa) {
  booster::kernels::cpu::AdamConfig cc;
  cc.lr = c.lr, cc.beta1 = c.beta1, cc.beta2 = c.beta2, cc.eps = c.eps, cc.weight_decay = c.weight_decay;
  cc.adamw_mode = c.adamw_mode, cc.bias_correction = c.bias_correction, cc.step = c.step, cc.div_scale = c.div_scale;
  const kc::AdamTensor v = t.host_view();
  booster::kernels::cpu::adam_step(cc, v.numel, v.param, v.grad_fp32, v.grad_bf16, v.exp_avg, v.exp_avg_sq,
                                   v.param_bf16_out, isa);
}
#endif

// Absolute tolerance of exp_avg against the double reference: beta1 * m and (1 - beta1) * g (about
// 1e-2 here) cancel in Adam's L2 mode, so a few float ulps of them (9.3e-10 each) remain.
constexpr double kMomentAtol = 4e-9;

// |got - want| <= atol + rtol * |want| for every element; reports the worst one.
template <class A, class B>
void expect_close(const A& got, const B& want, double rtol, double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(double(got[i]) - double(want[i])) - (atol + rtol * std::abs(double(want[i])));
    if (err > worst) worst = err, at = i;
  }
  EXPECT_LE(worst, 0.0) << what << ": element " << at << " is " << double(got[at]) << ", expected "
                        << double(want[at]);
}

// Bit-for-bit equality of two arrays; reports the first difference and the number of differences.
template <class T>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0 && differ++ == 0) first = i;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size() << " elements differ, the first at "
                        << first << ": " << double(got[first]) << " instead of " << double(want[first]);
}

std::vector<kc::AdamConfig> adam_configs() {
  std::vector<kc::AdamConfig> configs;
  for (bool adamw : {true, false})
    for (bool bias : {true, false}) {
      kc::AdamConfig c;
      c.lr = 1e-2f;
      c.weight_decay = 0.05f;
      c.adamw_mode = adamw;
      c.bias_correction = bias;
      c.div_scale = adamw ? 1.0f : 1024.0f;
      configs.push_back(c);
    }
  configs.back().weight_decay = 0.0f;
  return configs;
}

// Odd sizes that cross the given chunk size, and an empty tensor.
std::vector<int64_t> odd_sizes(int64_t chunk) { return {1, 7, chunk - 1, 0, chunk + 3, 3 * chunk + 17, 513}; }

// ---- host execution of the functors (the kernels' bodies)

constexpr int kHostThreads = 32;

template <int kDepth, class Functor>
void run_blocks_on_host(const kd::TensorListMeta<kDepth>& meta, int blocks, const Functor& f) {
  for (int b = 0; b < blocks; ++b)
    for (int tid = 0; tid < kHostThreads; ++tid) f(meta, b, tid, kHostThreads);
}

// Small launch limits: a few tensors and blocks per launch, so lists and tensors split.
constexpr kd::PlanLimits kSmallLaunches{5, 7};

void host_adam(const kc::AdamConfig& c, std::vector<kc::AdamTensor> tensors, int64_t chunk, const int* noop,
               kd::PlanLimits limits = kSmallLaunches) {
  kd::check_adam_args(c, tensors);
  const kd::AdamFunctor f = kd::make_adam_functor(c, chunk, noop);
  kd::TensorListMeta<5> meta{};
  kd::plan_launches<5>(
      static_cast<int64_t>(tensors.size()), chunk, meta, [&](int64_t t) { return tensors[t].numel; },
      [&](kd::TensorListMeta<5>& m, int slot, int64_t t) { kd::fill_adam_slot(m, slot, tensors[t]); },
      [&](const kd::TensorListMeta<5>& m, int blocks) { run_blocks_on_host(m, blocks, f); }, limits);
}

void host_scale(float scale, const std::vector<kc::ScaleTensor>& views, int64_t chunk, int* found_inf) {
  kd::check_scale_args(views);
  const kd::ScaleFunctor f{scale, chunk, found_inf};
  kd::TensorListMeta<2> meta{};
  kd::plan_launches<2>(
      static_cast<int64_t>(views.size()), chunk, meta, [&](int64_t t) { return views[t].numel; },
      [&](kd::TensorListMeta<2>& m, int slot, int64_t t) { kd::fill_scale_slot(m, slot, views[t]); },
      [&](const kd::TensorListMeta<2>& m, int blocks) { run_blocks_on_host(m, blocks, f); }, kSmallLaunches);
}

// The chunk partial sums of multi_tensor_l2norm's first pass, run on the host (the block sum adds
// the thread sums in thread order).
std::vector<float> host_l2norm_partials(const std::vector<kc::NormTensor>& views, int64_t chunk,
                                        std::vector<int32_t>* begin_out = nullptr) {
  const float dummy = 0.0f;
  const std::vector<int32_t> begin = kd::check_l2norm_args(views, &dummy, chunk);
  std::vector<float> partials(begin.back(), -1.0f);
  const kd::L2NormFunctor f{chunk, partials.data()};
  kd::TensorListMeta<1> meta{};
  kd::plan_launches<1>(
      static_cast<int64_t>(views.size()), chunk, meta, [&](int64_t t) { return views[t].numel; },
      [&](kd::TensorListMeta<1>& m, int slot, int64_t t) { kd::fill_l2norm_slot(m, slot, views[t], begin[t]); },
      [&](const kd::TensorListMeta<1>& m, int blocks) {
        for (int b = 0; b < blocks; ++b) {
          float sum = 0.0f;
          int64_t index = -1;
          for (int tid = 0; tid < kHostThreads; ++tid) sum += f.thread_sum(m, b, tid, kHostThreads, index);
          partials[index] = sum;
        }
      },
      kSmallLaunches);
  if (begin_out != nullptr) *begin_out = begin;
  return partials;
}

bool cuda_device_available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    *why = std::string("no CUDA device: cudaGetDeviceCount failed: ") + cudaGetErrorName(err) + ": " +
           cudaGetErrorString(err);
    cudaGetLastError();
    return false;
  }
  if (count == 0) {
    *why = "no CUDA device: cudaGetDeviceCount found 0 devices";
    return false;
  }
  return true;
}

}  // namespace

// ================================================================ host tests (no GPU needed)

TEST(CudaKernelsHost, PlannerCoversEveryChunkOnceAndSplitsLaunches) {
  // More tensors than a launch holds, tensors longer than a launch's blocks, empty tensors.
  constexpr int64_t kChunk = 5;
  constexpr kd::PlanLimits kLimits{30, 320};
  std::vector<int64_t> sizes;
  for (int i = 0; i < 100; ++i) sizes.push_back((i * 37) % 23);  // includes zeros
  sizes.push_back(kChunk * kLimits.max_blocks * 2 + 3);            // spans three launches
  sizes.push_back(1);
  sizes.push_back(kChunk * 400);                                   // crosses a launch boundary
  sizes.push_back(0);
  kd::TensorListMeta<5> meta{};
  std::set<std::pair<int64_t, int64_t>> seen;  // (tensor, chunk)
  int total_blocks = 0;
  const int launches = kd::plan_launches<5>(
      static_cast<int64_t>(sizes.size()), kChunk, meta, [&](int64_t t) { return sizes[t]; },
      [&](kd::TensorListMeta<5>& m, int slot, int64_t t) {
        m.addresses[0][slot] = reinterpret_cast<void*>(static_cast<uintptr_t>(t + 1));
        m.sizes[slot] = sizes[t];
      },
      [&](const kd::TensorListMeta<5>& m, int blocks) {
        EXPECT_GT(blocks, 0);
        EXPECT_LE(blocks, kLimits.max_blocks);
        ASSERT_GE(m.n_slots, 1);
        ASSERT_LE(m.n_slots, kLimits.max_tensors);
        EXPECT_EQ(m.block_end[m.n_slots - 1], blocks);
        for (int s = 0; s < m.n_slots; ++s) EXPECT_LT(s == 0 ? 0 : m.block_end[s - 1], m.block_end[s]) << s;
        for (int b = 0; b < blocks; ++b) {
          int slot = -1;
          int64_t begin = -1, end = -1;
          const int64_t chunk = kd::find_block(m, b, kChunk, slot, begin, end);
          ASSERT_GE(slot, 0);
          ASSERT_LT(slot, m.n_slots);
          EXPECT_TRUE(b >= (slot == 0 ? 0 : m.block_end[slot - 1]) && b < m.block_end[slot]) << b;
          const int64_t t = static_cast<int64_t>(reinterpret_cast<uintptr_t>(m.addresses[0][slot])) - 1;
          ASSERT_GE(t, 0);
          EXPECT_EQ(m.sizes[slot], sizes[t]);
          EXPECT_EQ(begin, chunk * kChunk);
          EXPECT_EQ(end, std::min(begin + kChunk, sizes[t]));
          EXPECT_LT(begin, end);
          EXPECT_TRUE(seen.insert({t, chunk}).second) << "chunk run twice: " << t << "/" << chunk;
        }
        total_blocks += blocks;
      },
      kLimits);
  size_t expected = 0;
  for (size_t t = 0; t < sizes.size(); ++t) {
    const int64_t chunks = (sizes[t] + kChunk - 1) / kChunk;
    expected += chunks;
    for (int64_t c = 0; c < chunks; ++c) EXPECT_TRUE(seen.count({int64_t(t), c})) << t << "/" << c;
  }
  EXPECT_EQ(seen.size(), expected);
  EXPECT_EQ(static_cast<size_t>(total_blocks), expected);
  EXPECT_GE(launches, 6);
  EXPECT_EQ(kd::plan_launches<5>(0, kChunk, meta, [](int64_t) { return int64_t{0}; },
                                 [](kd::TensorListMeta<5>&, int, int64_t) {},
                                 [](const kd::TensorListMeta<5>&, int) { FAIL() << "launch of an empty list"; }),
            0);
}

TEST(CudaKernelsHost, PlannerFillsTheWholeTableByDefault) {
  // Without limits a launch takes every chunk of its tensors (up to kMaxBlocksPerLaunch) and up to
  // kMaxTensors tensors: one launch for a long tensor, ceil(n / kMaxTensors) for many small ones.
  constexpr int64_t kChunk = 65536;
  constexpr int kMax = kd::TensorListMeta<5>::kMaxTensors;
  static_assert(kMax >= 30, "at least as many tensors per launch as apex");
  kd::TensorListMeta<5> meta{};
  auto count = [&](const std::vector<int64_t>& sizes, std::vector<int>* blocks) {
    return kd::plan_launches<5>(
        static_cast<int64_t>(sizes.size()), kChunk, meta, [&](int64_t t) { return sizes[t]; },
        [](kd::TensorListMeta<5>&, int, int64_t) {}, [&](const kd::TensorListMeta<5>&, int b) { blocks->push_back(b); });
  };
  std::vector<int> blocks;
  EXPECT_EQ(count({int64_t{1} << 30}, &blocks), 1);  // 1G elements: 16384 chunks, one launch
  EXPECT_EQ(blocks, std::vector<int>{16384});
  blocks.clear();
  EXPECT_EQ(count(std::vector<int64_t>(2 * kMax + 5, 5000), &blocks), 3);
  EXPECT_EQ(blocks, (std::vector<int>{kMax, kMax, 5}));
  blocks.clear();
  EXPECT_EQ(count({kChunk * (kd::kMaxBlocksPerLaunch + int64_t{3})}, &blocks), 2);
  EXPECT_EQ(blocks, (std::vector<int>{kd::kMaxBlocksPerLaunch, 3}));
  EXPECT_LE(sizeof(kd::TensorListMeta<5>) + sizeof(kd::AdamFunctor), static_cast<size_t>(kd::kKernelParamBytes));
  EXPECT_LE(sizeof(kd::TensorListMeta<2>) + sizeof(kd::ScaleFunctor), static_cast<size_t>(kd::kKernelParamBytes));
  EXPECT_LE(sizeof(kd::TensorListMeta<1>) + sizeof(kd::L2NormFunctor), static_cast<size_t>(kd::kKernelParamBytes));
}

TEST(CudaKernelsHost, Bf16RoundsToNearestEven) {
  EXPECT_EQ(kd::float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(kd::float_to_bf16(-2.0f), 0xc000);
  const float tie_down = kd::bf16_to_float(0x3f80) + std::ldexp(1.0f, -8);   // halfway, even below
  const float tie_up = kd::bf16_to_float(0x3f81) + std::ldexp(1.0f, -8);     // halfway, even above
  EXPECT_EQ(kd::float_to_bf16(tie_down), 0x3f80);
  EXPECT_EQ(kd::float_to_bf16(tie_up), 0x3f82);
  EXPECT_EQ(kd::float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(kd::float_to_bf16(-NAN), 0x7fc0);  // as c10::BFloat16
  EXPECT_TRUE(std::isnan(kd::bf16_to_float(kd::float_to_bf16(NAN))));
}

TEST(CudaKernelsHost, AdamFunctorMatchesReferenceAcrossSplitLaunches) {
  // Chunk 64 keeps every chunk aligned; chunk 66 makes every other chunk start unaligned. Offsets
  // 1..3 make whole tensors unaligned. Sizes leave 1-3 elements after the last group of 4.
  for (int64_t chunk : {int64_t{64}, int64_t{66}}) {
    for (const kc::AdamConfig& base : adam_configs()) {
      for (int variant = 0; variant < 2; ++variant) {
        Rng rng;
        std::vector<HostAdamTensor> ts;
        int k = 0;
        for (int64_t n : odd_sizes(chunk)) ts.emplace_back(rng, n, variant == 1, variant == 1, (k++ % 3 == 1) ? k % 4 : 0);
        for (int i = 0; i < 40; ++i) ts.emplace_back(rng, 3 + i, variant == 0, false, i % 5 == 4 ? 2 : 0);
#ifdef BOOSTER_TEST_CPU_ADAM
        std::vector<HostAdamTensor> cpu = ts;
#endif
        for (int64_t step = 1; step <= 3; ++step) {
          kc::AdamConfig c = base;
          c.step = step;
          std::vector<kc::AdamTensor> views;
          for (auto& t : ts) views.push_back(t.host_view());
          host_adam(c, views, chunk, nullptr);
          for (auto& t : ts) adam_reference(c, t);
#ifdef BOOSTER_TEST_CPU_ADAM
          for (auto& t : cpu) cpu_adam(c, t, booster::kernels::cpu::Isa::kScalar);
#endif
        }
        for (size_t i = 0; i < ts.size(); ++i) {
          const std::string what = "chunk " + std::to_string(chunk) + " adamw " + std::to_string(base.adamw_mode) +
                                   " bias " + std::to_string(base.bias_correction) + " variant " +
                                   std::to_string(variant) + " tensor " + std::to_string(i);
          expect_close(ts[i].param, ts[i].param_d, 1e-6, 1e-6, what + " param");
          expect_close(ts[i].m, ts[i].m_d, 1e-5, kMomentAtol, what + " exp_avg");
          expect_close(ts[i].v, ts[i].v_d, 1e-5, 1e-12, what + " exp_avg_sq");
          if (ts[i].write_bf16) {
            for (int64_t e = ts[i].offset; e < static_cast<int64_t>(ts[i].param.size()); ++e)
              ASSERT_EQ(ts[i].out_bf16[e], kd::float_to_bf16(ts[i].param[e])) << what << " element " << e;
          }
#ifdef BOOSTER_TEST_CPU_ADAM
          expect_same_bits(ts[i].param, cpu[i].param, what + " param vs cpu::adam_step");
          expect_same_bits(ts[i].m, cpu[i].m, what + " exp_avg vs cpu::adam_step");
          expect_same_bits(ts[i].v, cpu[i].v, what + " exp_avg_sq vs cpu::adam_step");
          expect_same_bits(ts[i].out_bf16, cpu[i].out_bf16, what + " param_bf16_out vs cpu::adam_step");
#endif
        }
      }
    }
  }
}

TEST(CudaKernelsHost, AdamIsBitIdenticalToCpuKernel) {
#ifndef BOOSTER_TEST_CPU_ADAM
  GTEST_SKIP() << "booster::kernels::cpu::adam_step is not built into this test";
#else
  // Large parameters and tiny gradients: in Adam (L2) mode g + wd * p cancels to a few bits of the
  // gradient, where any difference in rounding (a contracted multiply-add, another order, another
  // coefficient) shows. Options that are not exact binary fractions (3e-4, 0.999, 0.01), so the
  // coefficients must be derived as the CPU kernel derives them.
  struct Case {
    const char* name;
    bool adamw;
    float wd, div_scale;
    bool bf16_grad, bf16_out, bias_correction;
  };
  const Case cases[] = {
      {"adam-l2", false, 0.01f, 1.0f, false, false, true},
      {"adamw", true, 0.1f, 1.0f, false, true, true},
      {"adam-l2 div_scale 3", false, 0.01f, 3.0f, false, false, true},
      {"adamw div_scale 65536", true, 0.01f, 65536.0f, false, false, true},
      {"adam-l2 bf16 grads", false, 0.01f, 1024.0f, true, true, true},
      {"adamw bf16 grads", true, 0.05f, 1.0f, true, false, true},
      {"adam-l2 no bias correction", false, 0.01f, 1.0f, false, false, false},
      {"adamw no decay", true, 0.0f, 1.0f, false, false, true},
  };
  const AdamInit tiny_grads{300.0f, 1e-6f, 1e-7f, 1e-12f};
  // About 6000 such elements (aligned and unaligned tensors, whole groups and tails, several
  // chunks), and 1500 of the default scales, where the parameter's update is not lost in its rounding.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{4099, 0}, {1000, 1}, {517, 0}, {64, 2}, {1, 0}, {333, 3}};
  for (const Case& cs : cases) {
    for (int64_t chunk : {int64_t{64}, int64_t{70}}) {
      Rng rng;
      std::vector<HostAdamTensor> ts;
      for (auto [n, offset] : shapes) ts.emplace_back(rng, n, cs.bf16_grad, cs.bf16_out, offset, tiny_grads);
      ts.emplace_back(rng, 1001, cs.bf16_grad, cs.bf16_out, 0);
      ts.emplace_back(rng, 499, cs.bf16_grad, cs.bf16_out, 1);
      std::vector<HostAdamTensor> cpu = ts;
      for (int64_t step = 1; step <= 4; ++step) {
        kc::AdamConfig c;
        c.lr = 3e-4f;
        c.beta1 = 0.9f;
        c.beta2 = 0.999f;
        c.eps = 1e-8f;
        c.weight_decay = cs.wd;
        c.adamw_mode = cs.adamw;
        c.bias_correction = cs.bias_correction;
        c.div_scale = cs.div_scale;
        c.step = step;
        std::vector<kc::AdamTensor> views;
        for (auto& t : ts) views.push_back(t.host_view());
        host_adam(c, views, chunk, nullptr);
        for (auto& t : cpu) cpu_adam(c, t, booster::kernels::cpu::detected_isa());
      }
      for (size_t i = 0; i < ts.size(); ++i) {
        const std::string what = std::string(cs.name) + " chunk " + std::to_string(chunk) + " tensor " + std::to_string(i);
        expect_same_bits(ts[i].param, cpu[i].param, what + " param");
        expect_same_bits(ts[i].m, cpu[i].m, what + " exp_avg");
        expect_same_bits(ts[i].v, cpu[i].v, what + " exp_avg_sq");
        expect_same_bits(ts[i].out_bf16, cpu[i].out_bf16, what + " param_bf16_out");
      }
    }
  }
#endif
}

TEST(CudaKernelsHost, AdamNoopFlagLeavesEverythingUnchanged) {
  Rng rng;
  HostAdamTensor t(rng, 301, false, true);
  const auto before = t.param;
  const int noop = 1;
  host_adam(kc::AdamConfig{}, {t.host_view()}, 64, &noop);
  EXPECT_EQ(t.param, before);
  EXPECT_TRUE(std::all_of(t.out_bf16.begin(), t.out_bf16.end(), [](uint16_t x) { return x == 0; }));
}

TEST(CudaKernelsHost, ScaleFunctorScalesConvertsAndFlagsNonFinite) {
  // fp32 -> fp32, fp32 -> bf16, bf16 -> fp32 and bf16 -> bf16 in place, each aligned (vector path)
  // and at an odd element offset (scalar path); chunk 66 also starts every other chunk unaligned.
  constexpr int64_t kChunk = 66;
  constexpr int64_t kPad = 4;  // elements before offset 0..3, so a tensor's data starts at kPad - offset
  Rng rng;
  struct Buffers {
    std::vector<float> in_f32, out_f32;
    std::vector<uint16_t> in_bf16, out_bf16;
    kc::DType in, out;
    int64_t offset, n;
  };
  std::vector<Buffers> bufs;
  int k = 0;
  for (int64_t n : odd_sizes(kChunk)) {
    for (int combo = 0; combo < 4; ++combo) {
      Buffers b;
      b.n = n;
      b.offset = (k / 4) % 2 == 1 ? 1 + k % 3 : 0;  // sizes 7, 0 and 215 at offsets 1..3
      ++k;
      b.in = combo & 1 ? kc::DType::kBFloat16 : kc::DType::kFloat32;
      b.out = combo & 2 ? kc::DType::kBFloat16 : kc::DType::kFloat32;
      b.in_f32 = rng.normal(n + kPad, 100.0f);
      b.in_bf16 = to_bf16(b.in_f32);
      b.out_f32.assign(n + kPad, 0.0f);
      b.out_bf16.assign(n + kPad, 0);
      bufs.push_back(std::move(b));
    }
  }
  auto views_of = [&](std::vector<Buffers>& bs) {
    std::vector<kc::ScaleTensor> views;
    for (Buffers& b : bs) {
      const int64_t o = kPad - 4 + b.offset;  // 0 (aligned) .. 3
      kc::ScaleTensor v;
      v.numel = b.n;
      v.in_dtype = b.in, v.out_dtype = b.out;
      v.in = b.in == kc::DType::kBFloat16 ? static_cast<const void*>(b.in_bf16.data() + o)
                                          : static_cast<const void*>(b.in_f32.data() + o);
      if (b.in == kc::DType::kBFloat16 && b.out == kc::DType::kBFloat16) {
        v.out = b.in_bf16.data() + o;  // in place
      } else {
        v.out = b.out == kc::DType::kBFloat16 ? static_cast<void*>(b.out_bf16.data() + o)
                                              : static_cast<void*>(b.out_f32.data() + o);
      }
      views.push_back(v);
    }
    return views;
  };
  const std::vector<Buffers> original = bufs;
  int found_inf = 0;
  const float scale = 1.0f / 1024.0f;
  host_scale(scale, views_of(bufs), kChunk, &found_inf);
  EXPECT_EQ(found_inf, 0);
  for (size_t i = 0; i < bufs.size(); ++i) {
    const Buffers& b = bufs[i];
    const int64_t o = kPad - 4 + b.offset;
    for (int64_t e = 0; e < b.n; ++e) {
      const float x = b.in == kc::DType::kBFloat16 ? kd::bf16_to_float(original[i].in_bf16[o + e]) : b.in_f32[o + e];
      const float want = x * scale;
      if (b.out == kc::DType::kFloat32) {
        ASSERT_EQ(b.out_f32[o + e], want) << "tensor " << i << " element " << e;
      } else {
        const uint16_t got = b.in == kc::DType::kBFloat16 ? b.in_bf16[o + e] : b.out_bf16[o + e];
        ASSERT_EQ(got, kd::float_to_bf16(want)) << "tensor " << i << " element " << e;
      }
    }
  }
  // A non-finite input sets the flag: first element of the aligned fp32 tensor of 513 (vector path),
  // last element of the unaligned fp32 tensor of 215 (scalar path).
  for (size_t which : {size_t{24}, size_t{20}}) {
    std::vector<Buffers> again = original;
    Buffers& b = again[which];
    ASSERT_EQ(b.in, kc::DType::kFloat32);
    ASSERT_EQ(b.offset == 0, which == 24);
    b.in_f32[kPad - 4 + b.offset + (which == 24 ? 0 : b.n - 1)] = which == 24 ? NAN : -INFINITY;
    found_inf = 0;
    host_scale(scale, views_of(again), kChunk, &found_inf);
    EXPECT_EQ(found_inf, 1) << "tensor " << which << " offset " << b.offset;
  }
}

TEST(CudaKernelsHost, L2NormFunctorMatchesDoubleReferenceOnBothPaths) {
  constexpr int64_t kChunk = 66;
  Rng rng;
  std::vector<std::vector<float>> data;
  for (int64_t n : odd_sizes(kChunk)) data.push_back(rng.normal(n + 3, 3.0f));  // 3 spare elements
  const std::vector<uint16_t> bf16 = to_bf16(data[5]);
  // The same values at element offset 0 (vector path) and 1..3 (scalar path): equal partial sums.
  std::vector<std::vector<float>> partials_by_offset;
  for (int64_t offset = 0; offset < 4; ++offset) {
    std::vector<std::vector<float>> shifted = data;
    std::vector<uint16_t> shifted_bf16(bf16.size() + 3);
    for (size_t i = 0; i < data.size(); ++i) {
      std::fill(shifted[i].begin(), shifted[i].end(), -7.0f);
      std::copy(data[i].begin(), data[i].end() - 3, shifted[i].begin() + offset);
    }
    std::copy(bf16.begin(), bf16.end() - 3, shifted_bf16.begin() + offset);
    std::vector<kc::NormTensor> views;
    for (size_t i = 0; i < data.size(); ++i) {
      kc::NormTensor v{static_cast<int64_t>(data[i].size()) - 3, shifted[i].data() + offset, kc::DType::kFloat32};
      if (i == 5) v.data = shifted_bf16.data() + offset, v.dtype = kc::DType::kBFloat16;
      views.push_back(v);
    }
    std::vector<int32_t> begin;
    const std::vector<float> partials = host_l2norm_partials(views, kChunk, &begin);
    double total = 0.0;
    for (size_t i = 0; i < views.size(); ++i) {
      double got = 0.0, want = 0.0;
      for (int32_t c = begin[i]; c < begin[i + 1]; ++c) got += partials[c];
      for (int64_t e = 0; e < views[i].numel; ++e) {
        const double x = i == 5 ? kd::bf16_to_float(bf16[e]) : data[i][e];
        want += x * x;
      }
      EXPECT_NEAR(std::sqrt(got), std::sqrt(want), 1e-5 * std::sqrt(want) + 1e-12) << "tensor " << i;
      total += want;
    }
    EXPECT_GT(total, 0.0);
    partials_by_offset.push_back(partials);
  }
  for (int64_t offset = 1; offset < 4; ++offset)
    expect_same_bits(partials_by_offset[offset], partials_by_offset[0], "partials at offset " + std::to_string(offset));
}

TEST(CudaKernelsHost, BadArgumentsAreRejectedBeforeAnyCudaCall) {
  float x = 0.0f;
  kc::AdamTensor t;
  t.numel = 1, t.param = &x, t.exp_avg = &x, t.exp_avg_sq = &x;
  EXPECT_THROW(kc::multi_tensor_adam(kc::AdamConfig{}, {t}), std::invalid_argument);  // no gradient
  t.grad_fp32 = &x;
  kc::AdamConfig c;
  c.step = 0;
  EXPECT_THROW(kc::multi_tensor_adam(c, {t}), std::invalid_argument);
  c = {}, c.beta2 = 1.0f;
  EXPECT_THROW(kc::multi_tensor_adam(c, {t}), std::invalid_argument);
  c = {}, c.div_scale = 0.0f;
  EXPECT_THROW(kc::multi_tensor_adam(c, {t}), std::invalid_argument);
  t.numel = -1;
  EXPECT_THROW(kc::multi_tensor_adam(kc::AdamConfig{}, {t}), std::invalid_argument);
  kc::ScaleTensor s{3, &x, kc::DType::kFloat32, &x, kc::DType::kBFloat16};
  EXPECT_THROW(kc::multi_tensor_scale(1.0f, {s}), std::invalid_argument);
  EXPECT_THROW(kc::multi_tensor_l2norm({}, nullptr), std::invalid_argument);
  EXPECT_THROW(kc::multi_tensor_l2norm({kc::NormTensor{5, nullptr, kc::DType::kFloat32}}, &x), std::invalid_argument);
}

TEST(CudaKernelsHost, WithoutDeviceCallsRaiseRuntimeErrorNamingCuda) {
  std::string why;
  if (cuda_device_available(&why)) GTEST_SKIP() << "a CUDA device is present; this checks the no-device error";
  float x = 0.0f;
  kc::AdamTensor t;
  t.numel = 1, t.param = &x, t.grad_fp32 = &x, t.exp_avg = &x, t.exp_avg_sq = &x;
  try {
    kc::multi_tensor_adam(kc::AdamConfig{}, {t});
    FAIL() << "no exception without a device";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("booster::kernels::cuda"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("multi_tensor_adam"), std::string::npos) << e.what();
  }
  EXPECT_THROW(kc::multi_tensor_l2norm({}, &x), std::runtime_error);  // the workspace allocation fails
}

// ================================================================ device tests (skipped without a GPU)

namespace {

template <class T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(const std::vector<T>& host) : n_(host.size()) {
    if (n_ == 0) return;
    check(cudaMalloc(&ptr_, n_ * sizeof(T)), "cudaMalloc");
    check(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }
  T* get() const { return ptr_; }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) check(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return host;
  }

 private:
  static void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
  size_t n_;
  T* ptr_ = nullptr;
};

class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!cuda_device_available(&why)) GTEST_SKIP() << why;
  }
  static void sync() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }
};

// Device copies of one HostAdamTensor (its offset included: cudaMalloc's 256-byte alignment plus the
// offset gives the same path as on the host); download() writes the results back into it.
struct DeviceAdamTensor {
  HostAdamTensor& host;
  DeviceBuffer<float> param, grad, m, v;
  DeviceBuffer<uint16_t> grad_bf16, out_bf16;
  explicit DeviceAdamTensor(HostAdamTensor& h)
      : host(h), param(h.param), grad(h.grad), m(h.m), v(h.v), grad_bf16(h.grad_bf16), out_bf16(h.out_bf16) {}
  kc::AdamTensor view() const {
    const int64_t o = host.offset;
    kc::AdamTensor t;
    t.numel = host.numel();
    if (t.numel == 0) return t;
    t.param = param.get() + o;
    if (host.use_bf16_grad) t.grad_bf16 = grad_bf16.get() + o; else t.grad_fp32 = grad.get() + o;
    t.exp_avg = m.get() + o;
    t.exp_avg_sq = v.get() + o;
    t.param_bf16_out = host.write_bf16 ? out_bf16.get() + o : nullptr;
    return t;
  }
  void download() {
    host.param = param.download(), host.m = m.download(), host.v = v.download();
    host.out_bf16 = out_bf16.download();
  }
};

}  // namespace

TEST_F(CudaKernels, AdamMatchesCpuKernelAndDoubleReference) {
  // Aligned tensors (vector path) and tensors at element offsets 1..3 (scalar path), more tensors
  // than one launch holds; the GPU's parameters, moments and bf16 copies equal the CPU kernel's bit
  // for bit.
  constexpr int kMany = kd::TensorListMeta<5>::kMaxTensors + 10;
  for (const kc::AdamConfig& base : adam_configs()) {
    for (int variant = 0; variant < 2; ++variant) {
      Rng rng;
      std::vector<HostAdamTensor> ts;
      int k = 0;
      for (int64_t n : odd_sizes(kc::kChunkSize)) ts.emplace_back(rng, n, variant == 1, variant == 1, (k++ % 3 == 1) ? k % 4 : 0);
      for (int i = 0; i < kMany; ++i) ts.emplace_back(rng, 1 + (i * 7) % 61, variant == 0, variant == 0, i % 4);
#ifdef BOOSTER_TEST_CPU_ADAM
      std::vector<HostAdamTensor> cpu = ts;
#endif
      std::vector<std::unique_ptr<DeviceAdamTensor>> dev;
      for (auto& t : ts) dev.push_back(std::make_unique<DeviceAdamTensor>(t));
      std::vector<kc::AdamTensor> views;
      for (auto& d : dev) views.push_back(d->view());
      for (int64_t step = 1; step <= 3; ++step) {
        kc::AdamConfig c = base;
        c.step = step;
        kc::multi_tensor_adam(c, views);
        for (auto& t : ts) adam_reference(c, t);
#ifdef BOOSTER_TEST_CPU_ADAM
        for (auto& t : cpu) cpu_adam(c, t, booster::kernels::cpu::detected_isa());
#endif
      }
      sync();
      for (auto& d : dev) d->download();
      for (size_t i = 0; i < ts.size(); ++i) {
        const std::string what = "adamw " + std::to_string(base.adamw_mode) + " bias " +
                                 std::to_string(base.bias_correction) + " variant " + std::to_string(variant) +
                                 " tensor " + std::to_string(i) + " offset " + std::to_string(ts[i].offset);
        expect_close(ts[i].param, ts[i].param_d, 1e-6, 1e-6, what + " param");
        expect_close(ts[i].m, ts[i].m_d, 1e-5, kMomentAtol, what + " exp_avg");
        expect_close(ts[i].v, ts[i].v_d, 1e-5, 1e-12, what + " exp_avg_sq");
        if (ts[i].write_bf16) {
          for (int64_t e = ts[i].offset; e < static_cast<int64_t>(ts[i].param.size()); ++e)
            ASSERT_EQ(ts[i].out_bf16[e], kd::float_to_bf16(ts[i].param[e])) << what << " element " << e;
        }
#ifdef BOOSTER_TEST_CPU_ADAM
        expect_same_bits(ts[i].param, cpu[i].param, what + " param vs cpu::adam_step");
        expect_same_bits(ts[i].m, cpu[i].m, what + " exp_avg vs cpu::adam_step");
        expect_same_bits(ts[i].v, cpu[i].v, what + " exp_avg_sq vs cpu::adam_step");
        expect_same_bits(ts[i].out_bf16, cpu[i].out_bf16, what + " param_bf16_out vs cpu::adam_step");
#endif
      }
    }
  }
}

TEST_F(CudaKernels, AdamIsBitIdenticalToCpuKernelWithLargeParamsAndTinyGrads) {
#ifndef BOOSTER_TEST_CPU_ADAM
  GTEST_SKIP() << "booster::kernels::cpu::adam_step is not built into this test";
#else
  // The cancellation case of CudaKernelsHost.AdamIsBitIdenticalToCpuKernel, on the GPU, with
  // tensors of several chunks.
  const AdamInit init{300.0f, 1e-6f, 1e-7f, 1e-12f};
  for (bool adamw : {false, true}) {
    for (bool bf16 : {false, true}) {
      Rng rng;
      std::vector<HostAdamTensor> ts;
      ts.emplace_back(rng, 2 * kc::kChunkSize + 5, bf16, bf16, 0, init);
      ts.emplace_back(rng, kc::kChunkSize + 3, bf16, bf16, 1, init);
      ts.emplace_back(rng, 4001, bf16, false, 0, init);
      std::vector<HostAdamTensor> cpu = ts;
      std::vector<std::unique_ptr<DeviceAdamTensor>> dev;
      for (auto& t : ts) dev.push_back(std::make_unique<DeviceAdamTensor>(t));
      std::vector<kc::AdamTensor> views;
      for (auto& d : dev) views.push_back(d->view());
      for (int64_t step = 1; step <= 4; ++step) {
        kc::AdamConfig c;
        c.lr = 3e-4f;
        c.weight_decay = 0.01f;
        c.adamw_mode = adamw;
        c.div_scale = adamw ? 1.0f : 3.0f;
        c.step = step;
        kc::multi_tensor_adam(c, views);
        for (auto& t : cpu) cpu_adam(c, t, booster::kernels::cpu::detected_isa());
      }
      sync();
      for (auto& d : dev) d->download();
      for (size_t i = 0; i < ts.size(); ++i) {
        const std::string what = std::string(adamw ? "adamw" : "adam-l2") + (bf16 ? " bf16" : " fp32") + " tensor " +
                                 std::to_string(i);
        expect_same_bits(ts[i].param, cpu[i].param, what + " param");
        expect_same_bits(ts[i].m, cpu[i].m, what + " exp_avg");
        expect_same_bits(ts[i].v, cpu[i].v, what + " exp_avg_sq");
        expect_same_bits(ts[i].out_bf16, cpu[i].out_bf16, what + " param_bf16_out");
      }
    }
  }
#endif
}

TEST_F(CudaKernels, AdamNoopFlagSkipsTheStep) {
  Rng rng;
  HostAdamTensor t(rng, kc::kChunkSize + 5, false, false);
  const auto before = t.param;
  DeviceAdamTensor d(t);
  DeviceBuffer<int> flag(std::vector<int>{1});
  kc::multi_tensor_adam(kc::AdamConfig{}, {d.view()}, flag.get());
  sync();
  d.download();
  EXPECT_EQ(t.param, before);
}

TEST_F(CudaKernels, ScaleMatchesHostAndSetsFoundInf) {
  Rng rng;
  std::vector<float> a = rng.normal(3 * kc::kChunkSize + 17, 50.0f), b = rng.normal(1001, 50.0f);
  const std::vector<uint16_t> b_bf16 = to_bf16(b);
  DeviceBuffer<float> da(a), out_a(std::vector<float>(a.size()));
  DeviceBuffer<float> out_b_f32(std::vector<float>(b.size() + 1));  // written at offset 1: unaligned
  DeviceBuffer<uint16_t> db(b_bf16), db_in(b_bf16), out_a_bf16(std::vector<uint16_t>(a.size()));
  DeviceBuffer<int> found(std::vector<int>{0});
  const float scale = 1.0f / 65536.0f;
  kc::multi_tensor_scale(scale,
                         {{int64_t(a.size()), da.get(), kc::DType::kFloat32, out_a.get(), kc::DType::kFloat32},
                          {int64_t(a.size()), da.get(), kc::DType::kFloat32, out_a_bf16.get(), kc::DType::kBFloat16},
                          {int64_t(b.size()), db_in.get(), kc::DType::kBFloat16, out_b_f32.get() + 1, kc::DType::kFloat32},
                          {int64_t(b.size()), db.get(), kc::DType::kBFloat16, db.get(), kc::DType::kBFloat16}},
                         found.get());
  sync();
  const auto ra = out_a.download();
  const auto ra16 = out_a_bf16.download();
  const auto rb32 = out_b_f32.download();
  const auto rb = db.download();
  for (size_t k = 0; k < a.size(); ++k) ASSERT_EQ(ra[k], a[k] * scale) << k;
  for (size_t k = 0; k < a.size(); ++k) ASSERT_EQ(ra16[k], kd::float_to_bf16(a[k] * scale)) << k;
  for (size_t k = 0; k < b.size(); ++k) ASSERT_EQ(rb32[k + 1], kd::bf16_to_float(b_bf16[k]) * scale) << k;
  for (size_t k = 0; k < b.size(); ++k) ASSERT_EQ(rb[k], kd::float_to_bf16(kd::bf16_to_float(b_bf16[k]) * scale)) << k;
  EXPECT_EQ(found.download()[0], 0);
  for (int64_t offset : {0, 1}) {  // an Inf on the vector path, then on the scalar path
    std::vector<float> c = a;
    c[12345] = INFINITY;
    DeviceBuffer<float> dc(c);
    DeviceBuffer<int> flag(std::vector<int>{0});
    kc::multi_tensor_scale(scale, {{int64_t(c.size()) - offset, dc.get() + offset, kc::DType::kFloat32, dc.get() + offset,
                                    kc::DType::kFloat32}},
                           flag.get());
    sync();
    EXPECT_EQ(flag.download()[0], 1) << "offset " << offset;
  }
}

TEST_F(CudaKernels, L2NormMatchesDoubleReference) {
  // More tensors than one launch holds, tensors of several chunks, one at an unaligned offset and one
  // in bf16.
  Rng rng;
  std::vector<std::vector<float>> data;
  const int many = kd::TensorListMeta<1>::kMaxTensors + 100;
  for (int i = 0; i < many; ++i) data.push_back(rng.normal(1 + (i * 97) % 1000, 2.0f));
  data.push_back(rng.normal(kc::kChunkSize * 5 + 3, 0.5f));
  data.push_back(rng.normal(kc::kChunkSize * 2 + 1, 0.5f));  // used at offset 1
  data.push_back(rng.normal(kc::kChunkSize + 7, 0.5f));      // used as bf16
  data.push_back({});
  const size_t unaligned = data.size() - 3, as_bf16 = data.size() - 2;
  const std::vector<uint16_t> bf16 = to_bf16(data[as_bf16]);
  DeviceBuffer<uint16_t> dev_bf16(bf16);
  std::vector<std::unique_ptr<DeviceBuffer<float>>> dev;
  std::vector<kc::NormTensor> views;
  for (size_t i = 0; i < data.size(); ++i) {
    dev.push_back(std::make_unique<DeviceBuffer<float>>(data[i]));
    if (i == unaligned) {
      views.push_back({int64_t(data[i].size()) - 1, dev.back()->get() + 1, kc::DType::kFloat32});
    } else if (i == as_bf16) {
      views.push_back({int64_t(bf16.size()), dev_bf16.get(), kc::DType::kBFloat16});
    } else {
      views.push_back({int64_t(data[i].size()), dev.back()->get(), kc::DType::kFloat32});
    }
  }
  DeviceBuffer<float> total(std::vector<float>{-1.0f}), per(std::vector<float>(data.size(), -1.0f));
  kc::multi_tensor_l2norm(views, total.get(), per.get());
  sync();
  const auto got = per.download();
  double sum = 0.0;
  for (size_t i = 0; i < data.size(); ++i) {
    double s = 0.0;
    for (size_t e = i == unaligned ? 1 : 0; e < data[i].size(); ++e) {
      const double x = i == as_bf16 ? kd::bf16_to_float(bf16[e]) : data[i][e];
      s += x * x;
    }
    sum += s;
    EXPECT_NEAR(got[i], std::sqrt(s), 1e-5 * std::sqrt(s)) << "tensor " << i;
  }
  EXPECT_NEAR(total.download()[0], std::sqrt(sum), 1e-5 * std::sqrt(sum));
  kc::multi_tensor_l2norm({}, total.get());
  sync();
  EXPECT_EQ(total.download()[0], 0.0f);
}
