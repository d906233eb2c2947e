// Per-block bodies of the multi-tensor kernels, as __host__ __device__ code: the CUDA kernels call
// them with (blockIdx.x, threadIdx.x, blockDim.x), and the tests call the same code on the host,
// block by block and thread by thread, to check the planner, both memory paths and the arithmetic
// without a GPU.
//
// Memory paths of a block (its chunk: elements [begin, end) of one tensor):
//  - vector path, when every array of the slot is aligned at the chunk's start to 4 elements
//    (16 bytes for fp32, 8 for bf16): thread tid of nthreads handles the groups of 4 consecutive
//    elements at begin + 4 * (tid + k * nthreads), k = 0, 1, ..., with one 16-byte (fp32) or 8-byte
//    (bf16) load or store per array and group, kIlp groups in flight per loop trip; the 0-3 elements
//    after the last whole group go through the scalar loop.
//  - scalar path otherwise: thread tid handles elements begin + tid, begin + tid + nthreads, ...
// Consecutive threads touch consecutive addresses in both. Adam and scale are elementwise, so both
// paths give the same bits; the L2 norm sums in the vector path's order on both paths (its
// unaligned path loads the same groups element by element), so its result does not depend on
// alignment either.
//
// Arithmetic: every float operation of the device branch is an explicit round-to-nearest intrinsic
// (__fmul_rn, __fadd_rn, __fdiv_rn, __fsqrt_rn, __fmaf_rn), which nvcc never contracts or
// reorders; the host branch uses plain operators, std::sqrt and std::fma, and must be compiled
// without contraction (GCC: ISO -std=c++17, or -ffp-contract=off). So host and device compute the
// same IEEE operations in the same order.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "booster/kernels/cuda_adam.h"
#include "multi_tensor_apply.h"

#if defined(__CUDACC__)
#define BOOSTER_HD __host__ __device__ __forceinline__
#else
#define BOOSTER_HD inline
#endif
#if defined(__CUDA_ARCH__)
#define BOOSTER_UNROLL _Pragma("unroll")
#else
#define BOOSTER_UNROLL
#endif

namespace booster::kernels::cuda::detail {

inline constexpr int kThreadsPerBlock = 512;

// ---- float arithmetic, each operation rounded to nearest even and never fused with another.

BOOSTER_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
BOOSTER_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
BOOSTER_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
BOOSTER_HD float sqrt_rn(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
// a * b + c with one rounding.
BOOSTER_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

BOOSTER_HD bool is_finite(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

// ---- bf16 (raw uint16_t bits: the upper half of a float).

BOOSTER_HD float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

BOOSTER_HD float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// Round to nearest even; NaN -> 0x7FC0. The rule of c10::BFloat16 and of the CPU Adam kernel.
BOOSTER_HD uint16_t float_to_bf16(float f) {
#if defined(__CUDA_ARCH__)
  uint32_t bits = __float_as_uint(f);
#else
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
#endif
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Loads element i of an fp32 (bf16 == false) or bf16 array.
BOOSTER_HD float load(const void* p, bool bf16, int64_t i) {
  return bf16 ? bf16_to_float(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// ---- groups of 4 elements: one 16-byte (fp32) or 8-byte (bf16) access; p must be aligned to it.

BOOSTER_HD bool aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

BOOSTER_HD void load4(const float* p, float x[4]) {
#if defined(__CUDA_ARCH__)
  const float4 q = *reinterpret_cast<const float4*>(p);
  x[0] = q.x, x[1] = q.y, x[2] = q.z, x[3] = q.w;
#else
  std::memcpy(x, p, 4 * sizeof(float));
#endif
}

BOOSTER_HD void store4(float* p, const float x[4]) {
#if defined(__CUDA_ARCH__)
  __stwb(reinterpret_cast<float4*>(p), make_float4(x[0], x[1], x[2], x[3]));
#else
  std::memcpy(p, x, 4 * sizeof(float));
#endif
}

BOOSTER_HD void load4(const uint16_t* p, float x[4]) {
#if defined(__CUDA_ARCH__)
  const uint2 q = *reinterpret_cast<const uint2*>(p);  // little-endian: element 0 is q.x's low half
  x[0] = bits_to_float(q.x << 16), x[1] = bits_to_float(q.x & 0xffff0000u);
  x[2] = bits_to_float(q.y << 16), x[3] = bits_to_float(q.y & 0xffff0000u);
#else
  uint16_t h[4];
  std::memcpy(h, p, sizeof h);
  for (int k = 0; k < 4; ++k) x[k] = bf16_to_float(h[k]);
#endif
}

BOOSTER_HD void store4(uint16_t* p, const float x[4]) {
#if defined(__CUDA_ARCH__)
  uint2 q;
  q.x = static_cast<uint32_t>(float_to_bf16(x[0])) | (static_cast<uint32_t>(float_to_bf16(x[1])) << 16);
  q.y = static_cast<uint32_t>(float_to_bf16(x[2])) | (static_cast<uint32_t>(float_to_bf16(x[3])) << 16);
  __stwb(reinterpret_cast<uint2*>(p), q);
#else
  uint16_t h[4];
  for (int k = 0; k < 4; ++k) h[k] = float_to_bf16(x[k]);
  std::memcpy(p, h, sizeof h);
#endif
}

// Group load of an fp32 (bf16 == false) or bf16 array at element i.
BOOSTER_HD void load4(const void* p, bool bf16, int64_t i, float x[4]) {
  if (bf16) {
    load4(static_cast<const uint16_t*>(p) + i, x);
  } else {
    load4(static_cast<const float*>(p) + i, x);
  }
}

// Whether element `begin` of an fp32 / bf16 array starts an aligned group.
BOOSTER_HD bool group_aligned(const void* p, bool bf16, int64_t begin) {
  return bf16 ? aligned(static_cast<const uint16_t*>(p) + begin, 8) : aligned(static_cast<const float*>(p) + begin, 16);
}

// ---- the chunk of a block

// The slot and the elements [begin, end) of the chunk run by `block`: the slot s with
// block_end[s-1] <= block < block_end[s] (a binary search), its chunk first_chunk[s] + the block's
// rank within the slot, begin = chunk * chunk_size within the tensor. Returns the chunk.
template <int kDepth>
BOOSTER_HD int64_t find_block(const TensorListMeta<kDepth>& meta, int block, int64_t chunk_size, int& slot,
                              int64_t& begin, int64_t& end) {
  int lo = 0, hi = meta.n_slots - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (block < meta.block_end[mid]) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  slot = lo;
  const int first_block = lo == 0 ? 0 : meta.block_end[lo - 1];
  const int64_t chunk = static_cast<int64_t>(meta.first_chunk[lo]) + (block - first_block);
  begin = chunk * chunk_size;
  end = begin + chunk_size < meta.sizes[lo] ? begin + chunk_size : meta.sizes[lo];
  return chunk;
}

// ---- Adam / AdamW. addresses: param, grad, exp_avg, exp_avg_sq, param_bf16_out (may be null).
inline constexpr uint8_t kGradBf16 = 1;
inline constexpr uint8_t kWriteBf16 = 2;

// Which optional operations of the update run (AdamFunctor::ops).
inline constexpr uint32_t kOpDiv = 1;    // div_scale != 1
inline constexpr uint32_t kOpDecay = 2;  // AdamW with weight_decay != 0
inline constexpr uint32_t kOpL2 = 4;     // Adam with weight_decay != 0

struct AdamFunctor {
  static constexpr int kIlp = 1;  // groups of 4 elements in flight per thread (x 4 arrays)

  // booster::kernels::cpu's per-call coefficients, computed the same way (make_adam_functor).
  float decay;          // AdamW: 1 - lr * wd
  float l2;             // Adam: wd
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float sqrt_bc2;       // sqrt(1 - beta2^t)
  float neg_step_size;  // -(lr / (1 - beta1^t))
  float eps;
  float div_scale;
  uint32_t ops;         // kOpDiv | kOpDecay | kOpL2
  int64_t chunk_size;
  const int* noop_flag;  // optional

  // One element: the operations of booster::kernels::cpu's adam_element, in its order.
  BOOSTER_HD void update(float& p, float g, float& m, float& v) const {
    if (ops & kOpDiv) g = div_rn(g, div_scale);
    if (ops & kOpDecay) p = mul_rn(p, decay);
    if (ops & kOpL2) g = fma_rn(p, l2, g);
    m = fma_rn(g, one_minus_beta1, mul_rn(m, beta1));
    v = fma_rn(mul_rn(one_minus_beta2, g), g, mul_rn(v, beta2));
    const float d = add_rn(div_rn(sqrt_rn(v), sqrt_bc2), eps);
    p = add_rn(p, div_rn(mul_rn(neg_step_size, m), d));
  }

  BOOSTER_HD void operator()(const TensorListMeta<5>& meta, int block, int tid, int nthreads) const {
    if (noop_flag != nullptr && *noop_flag != 0) return;
    int slot;
    int64_t begin, end;
    find_block(meta, block, chunk_size, slot, begin, end);
    float* param = static_cast<float*>(meta.addresses[0][slot]);
    const void* grad = meta.addresses[1][slot];
    float* exp_avg = static_cast<float*>(meta.addresses[2][slot]);
    float* exp_avg_sq = static_cast<float*>(meta.addresses[3][slot]);
    uint16_t* out_bf16 = static_cast<uint16_t*>(meta.addresses[4][slot]);
    const bool grad_bf16 = (meta.flags[slot] & kGradBf16) != 0;
    const bool write_bf16 = (meta.flags[slot] & kWriteBf16) != 0;

    int64_t scalar_begin = begin;
    if (aligned(param + begin, 16) && aligned(exp_avg + begin, 16) && aligned(exp_avg_sq + begin, 16) &&
        group_aligned(grad, grad_bf16, begin) && (!write_bf16 || aligned(out_bf16 + begin, 8))) {
      const int64_t vec_end = begin + ((end - begin) & ~int64_t{3});
      const int64_t stride = int64_t{4} * nthreads;
      for (int64_t i = begin + int64_t{4} * tid; i < vec_end; i += stride * kIlp) {
        float p[kIlp][4] = {}, g[kIlp][4] = {}, m[kIlp][4] = {}, v[kIlp][4] = {};
        BOOSTER_UNROLL
        for (int u = 0; u < kIlp; ++u) {
          const int64_t j = i + u * stride;
          if (j < vec_end) {
            load4(param + j, p[u]);
            load4(grad, grad_bf16, j, g[u]);
            load4(exp_avg + j, m[u]);
            load4(exp_avg_sq + j, v[u]);
          }
        }
        BOOSTER_UNROLL
        for (int u = 0; u < kIlp; ++u) {
          const int64_t j = i + u * stride;
          if (j < vec_end) {
            BOOSTER_UNROLL
            for (int k = 0; k < 4; ++k) update(p[u][k], g[u][k], m[u][k], v[u][k]);
            store4(param + j, p[u]);
            store4(exp_avg + j, m[u]);
            store4(exp_avg_sq + j, v[u]);
            if (write_bf16) store4(out_bf16 + j, p[u]);
          }
        }
      }
      scalar_begin = vec_end;
    }
    for (int64_t i = scalar_begin + tid; i < end; i += nthreads) {
      float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
      update(p, load(grad, grad_bf16, i), m, v);
      param[i] = p;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      if (write_bf16) out_bf16[i] = float_to_bf16(p);
    }
  }
};

// ---- scale. addresses: in, out. flags: bit 0 in is bf16, bit 1 out is bf16.
inline constexpr uint8_t kInBf16 = 1;
inline constexpr uint8_t kOutBf16 = 2;

struct ScaleFunctor {
  static constexpr int kIlp = 4;  // groups of 4 elements in flight per thread

  float scale;
  int64_t chunk_size;
  int* found_inf;  // optional

  BOOSTER_HD void operator()(const TensorListMeta<2>& meta, int block, int tid, int nthreads) const {
    int slot;
    int64_t begin, end;
    find_block(meta, block, chunk_size, slot, begin, end);
    const void* in = meta.addresses[0][slot];
    void* out = meta.addresses[1][slot];
    const bool in_bf16 = (meta.flags[slot] & kInBf16) != 0;
    const bool out_bf16 = (meta.flags[slot] & kOutBf16) != 0;
    bool finite = true;
    int64_t scalar_begin = begin;
    if (group_aligned(in, in_bf16, begin) && group_aligned(out, out_bf16, begin)) {
      const int64_t vec_end = begin + ((end - begin) & ~int64_t{3});
      const int64_t stride = int64_t{4} * nthreads;
      for (int64_t i = begin + int64_t{4} * tid; i < vec_end; i += stride * kIlp) {
        float x[kIlp][4] = {};
        BOOSTER_UNROLL
        for (int u = 0; u < kIlp; ++u) {
          const int64_t j = i + u * stride;
          if (j < vec_end) load4(in, in_bf16, j, x[u]);
        }
        BOOSTER_UNROLL
        for (int u = 0; u < kIlp; ++u) {
          const int64_t j = i + u * stride;
          if (j < vec_end) {
            BOOSTER_UNROLL
            for (int k = 0; k < 4; ++k) {
              finite &= is_finite(x[u][k]);
              x[u][k] = mul_rn(x[u][k], scale);
            }
            if (out_bf16) {
              store4(static_cast<uint16_t*>(out) + j, x[u]);
            } else {
              store4(static_cast<float*>(out) + j, x[u]);
            }
          }
        }
      }
      scalar_begin = vec_end;
    }
    for (int64_t i = scalar_begin + tid; i < end; i += nthreads) {
      const float x = load(in, in_bf16, i);
      finite = finite && is_finite(x);
      const float y = mul_rn(x, scale);
      if (out_bf16) {
        static_cast<uint16_t*>(out)[i] = float_to_bf16(y);
      } else {
        static_cast<float*>(out)[i] = y;
      }
    }
    if (!finite && found_inf != nullptr) *found_inf = 1;
  }
};

// ---- L2 norm, first pass. addresses: data. flags: bit 0 bf16. base: the tensor's first index in
// the chunk partials array. thread_sum is one thread's sum of squares over its elements of the chunk;
// the kernel adds the block's thread sums and stores partials[base + chunk].
struct L2NormFunctor {
  static constexpr int kIlp = 4;  // groups of 4 elements in flight per thread

  int64_t chunk_size;
  float* partials;

  // Lane k of every group is added into acc[k] (fused multiply-add), groups in order of k above;
  // the result is (acc[0] + acc[1]) + (acc[2] + acc[3]). The unaligned path loads the same groups
  // element by element, so both paths give the same bits.
  BOOSTER_HD float thread_sum(const TensorListMeta<1>& meta, int block, int tid, int nthreads,
                              int64_t& partial_index) const {
    int slot;
    int64_t begin, end;
    const int64_t chunk = find_block(meta, block, chunk_size, slot, begin, end);
    partial_index = static_cast<int64_t>(meta.base[slot]) + chunk;
    const void* data = meta.addresses[0][slot];
    const bool bf16 = (meta.flags[slot] & kInBf16) != 0;
    const bool vec = group_aligned(data, bf16, begin);
    const int64_t stride = int64_t{4} * nthreads;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t i = begin + int64_t{4} * tid; i < end; i += stride * kIlp) {
      float x[kIlp][4] = {};
      BOOSTER_UNROLL
      for (int u = 0; u < kIlp; ++u) {
        const int64_t j = i + u * stride;
        if (vec && j + 4 <= end) {
          load4(data, bf16, j, x[u]);
        } else {
          BOOSTER_UNROLL
          for (int k = 0; k < 4; ++k) x[u][k] = j + k < end ? load(data, bf16, j + k) : 0.0f;
        }
      }
      BOOSTER_UNROLL
      for (int u = 0; u < kIlp; ++u) {
        BOOSTER_UNROLL
        for (int k = 0; k < 4; ++k) acc[k] = fma_rn(x[u][k], x[u][k], acc[k]);
      }
    }
    return add_rn(add_rn(acc[0], acc[1]), add_rn(acc[2], acc[3]));
  }
};

// ---- Host side: argument checks, the functors' constants, and how a tensor fills a slot.

inline void check_adam_args(const AdamConfig& c, const std::vector<AdamTensor>& tensors) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("multi_tensor_adam: " + what); };
  if (!(c.lr >= 0.0f) || !std::isfinite(c.lr)) bad("lr must be finite and >= 0, got " + std::to_string(c.lr));
  if (!(c.beta1 >= 0.0f && c.beta1 < 1.0f)) bad("beta1 must be in [0, 1), got " + std::to_string(c.beta1));
  if (!(c.beta2 >= 0.0f && c.beta2 < 1.0f)) bad("beta2 must be in [0, 1), got " + std::to_string(c.beta2));
  if (!(c.eps >= 0.0f) || !std::isfinite(c.eps)) bad("eps must be finite and >= 0, got " + std::to_string(c.eps));
  if (!(c.weight_decay >= 0.0f) || !std::isfinite(c.weight_decay))
    bad("weight_decay must be finite and >= 0, got " + std::to_string(c.weight_decay));
  if (c.step < 1) bad("step must be >= 1 (the 1-based number of this step), got " + std::to_string(c.step));
  if (!(c.div_scale > 0.0f) || !std::isfinite(c.div_scale))
    bad("div_scale must be finite and > 0, got " + std::to_string(c.div_scale));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamTensor& t = tensors[i];
    const std::string where = "tensor " + std::to_string(i) + ": ";
    if (t.numel < 0) bad(where + "numel is negative");
    if (t.numel == 0) continue;
    if (t.param == nullptr || t.exp_avg == nullptr || t.exp_avg_sq == nullptr)
      bad(where + "param, exp_avg and exp_avg_sq must not be null");
    if ((t.grad_fp32 == nullptr) == (t.grad_bf16 == nullptr))
      bad(where + "exactly one of grad_fp32 and grad_bf16 must be given");
  }
}

// The double a LibTorch option would hold for this float: its shortest round-trip decimal
// (0.999f -> "0.999" -> 0.999). booster::kernels::cpu::adam_step reads its float options so.
inline double widen(float x) {
  if (!std::isfinite(x)) return x;
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x);
  double d = x;
  if (ec == std::errc()) std::from_chars(buf, end, d);
  return d;
}

// The per-step constants: the float coefficients of booster::kernels::cpu::adam_step for the same
// AdamConfig, computed by the same expressions (widened options, double arithmetic, one rounding
// to float each), so both kernels apply the same numbers.
inline AdamFunctor make_adam_functor(const AdamConfig& cfg, int64_t chunk_size, const int* noop_flag) {
  const double lr = widen(cfg.lr), beta1 = widen(cfg.beta1), beta2 = widen(cfg.beta2), eps = widen(cfg.eps),
               wd = widen(cfg.weight_decay);
  AdamFunctor f{};
  f.ops = (cfg.adamw_mode && wd != 0 ? kOpDecay : 0u) | (!cfg.adamw_mode && wd != 0 ? kOpL2 : 0u) |
          (cfg.div_scale != 1.0f ? kOpDiv : 0u);
  f.decay = static_cast<float>(1 - lr * wd);
  f.l2 = static_cast<float>(wd);
  f.beta1 = static_cast<float>(beta1);
  f.beta2 = static_cast<float>(beta2);
  f.one_minus_beta1 = static_cast<float>(1 - beta1);
  f.one_minus_beta2 = static_cast<float>(1 - beta2);
  double bc1 = 1, bc2 = 1;
  if (cfg.bias_correction) {
    bc1 = 1 - std::pow(beta1, static_cast<double>(cfg.step));
    bc2 = 1 - std::pow(beta2, static_cast<double>(cfg.step));
  }
  f.sqrt_bc2 = static_cast<float>(std::sqrt(bc2));
  f.neg_step_size = static_cast<float>(-(lr / bc1));
  f.eps = static_cast<float>(eps);
  f.div_scale = cfg.div_scale;
  f.chunk_size = chunk_size;
  f.noop_flag = noop_flag;
  return f;
}

inline void fill_adam_slot(TensorListMeta<5>& m, int slot, const AdamTensor& x) {
  const bool grad_bf16 = x.grad_bf16 != nullptr;
  m.addresses[0][slot] = x.param;
  m.addresses[1][slot] = grad_bf16 ? static_cast<void*>(const_cast<uint16_t*>(x.grad_bf16))
                                   : static_cast<void*>(const_cast<float*>(x.grad_fp32));
  m.addresses[2][slot] = x.exp_avg;
  m.addresses[3][slot] = x.exp_avg_sq;
  m.addresses[4][slot] = x.param_bf16_out;
  m.sizes[slot] = x.numel;
  m.base[slot] = 0;
  m.flags[slot] = static_cast<uint8_t>((grad_bf16 ? kGradBf16 : 0) | (x.param_bf16_out != nullptr ? kWriteBf16 : 0));
}

inline void check_scale_args(const std::vector<ScaleTensor>& tensors) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const ScaleTensor& t = tensors[i];
    const std::string where = "multi_tensor_scale: tensor " + std::to_string(i) + ": ";
    if (t.numel < 0) throw std::invalid_argument(where + "numel is negative");
    for (DType d : {t.in_dtype, t.out_dtype})
      if (d != DType::kFloat32 && d != DType::kBFloat16) throw std::invalid_argument(where + "unknown dtype");
    if (t.numel == 0) continue;
    if (t.in == nullptr || t.out == nullptr) throw std::invalid_argument(where + "in and out must not be null");
    if (t.in == t.out && t.in_dtype != t.out_dtype)
      throw std::invalid_argument(where + "an in-place scale (in == out) needs in_dtype == out_dtype");
  }
}

inline void fill_scale_slot(TensorListMeta<2>& m, int slot, const ScaleTensor& x) {
  m.addresses[0][slot] = const_cast<void*>(x.in);
  m.addresses[1][slot] = x.out;
  m.sizes[slot] = x.numel;
  m.base[slot] = 0;
  m.flags[slot] = static_cast<uint8_t>((x.in_dtype == DType::kBFloat16 ? kInBf16 : 0) |
                                       (x.out_dtype == DType::kBFloat16 ? kOutBf16 : 0));
}

// Checks the arguments and returns each tensor's first index in the chunk partials array
// (tensors.size() + 1 entries; the last is the number of chunks).
inline std::vector<int32_t> check_l2norm_args(const std::vector<NormTensor>& tensors, const float* total_norm,
                                              int64_t chunk_size) {
  if (total_norm == nullptr) throw std::invalid_argument("multi_tensor_l2norm: total_norm must not be null");
  std::vector<int32_t> chunk_begin(tensors.size() + 1, 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const NormTensor& t = tensors[i];
    const std::string where = "multi_tensor_l2norm: tensor " + std::to_string(i) + ": ";
    if (t.numel < 0) throw std::invalid_argument(where + "numel is negative");
    if (t.numel > 0 && t.data == nullptr) throw std::invalid_argument(where + "data must not be null");
    if (t.dtype != DType::kFloat32 && t.dtype != DType::kBFloat16) throw std::invalid_argument(where + "unknown dtype");
    const int64_t end = chunk_begin[i] + (t.numel + chunk_size - 1) / chunk_size;
    if (end > INT32_MAX) throw std::invalid_argument("multi_tensor_l2norm: more than 2^31 - 1 chunks in all");
    chunk_begin[i + 1] = static_cast<int32_t>(end);
  }
  return chunk_begin;
}

inline void fill_l2norm_slot(TensorListMeta<1>& m, int slot, const NormTensor& x, int32_t chunk_begin) {
  m.addresses[0][slot] = const_cast<void*>(x.data);
  m.sizes[slot] = x.numel;
  m.base[slot] = chunk_begin;
  m.flags[slot] = x.dtype == DType::kBFloat16 ? kInBf16 : 0;
}

}  // namespace booster::kernels::cuda::detail
