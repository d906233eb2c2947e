// fp8.h — compressed communication: float8 e4m3 quantization with one scale per tensor per rank,
// and the collectives built on it. Every fp8 wire path of the SDK goes through this file: the
// gradient buckets of DDP / ZeRO-1/2 (core/grad_reducer.h, wrappers/zero_optimizer.h) and the
// parameter all-gathers of FSDP / ZeRO-3 (core/flat_param.h).
//
// Format: float8 e4m3fn ("FP8 Formats for Deep Learning", Micikevicius et al. 2022): 4 exponent
// bits, 3 mantissa bits, largest finite value 448, no infinity. Scaling as ColossalAI's
// fp8_communication (colossalai/quantization/fp8.py): each rank scales its own piece by
// scale = amax / 448 (amax: the largest |x| of the piece), so its largest value lands on 448; every
// rank sends its scale with its payload, and receivers dequantize each rank's piece with that
// rank's scale and sum in float32 (Gloo and NCCL cannot sum fp8). The same idea as ZeRO++'s
// quantized weights and gradients (Wang et al., "ZeRO++: Extremely Efficient Collective
// Communication for Giant Model Training", 2023), with per-piece instead of per-block scales.
//
// Precision: a value |x| >= 2^-6 * scale (e4m3's smallest normal, scaled) is rounded to nearest
// with relative error at most 2^-4 (3 mantissa bits); below it the step is 2^-9 * scale
// (subnormals), so |dequantize(quantize(x)) - x| <= 2^-4 * |x| + 2^-10 * scale for every finite x.
// Zeros stay exactly zero; an all-zero piece has scale 1. Non-finite values: the scale is taken
// over the finite values only, and +-inf and NaN become NaN on the wire (e4m3fn has no infinity),
// so a receiver sees NaN where any rank had a non-finite value (overflow checks such as the fp16
// loss scaler's still fire).
//
// Wire layout of one piece of n elements: n bytes of e4m3 payload, then the 4 bytes of its float32
// scale (fp8_wire_bytes(n) = n + 4 bytes). Pieces travel as uint8 tensors (Gloo has no float8).
//
// Devices: the tensors may live on any device the collectives of dist::ProcessGroup accept (CPU,
// CUDA with NCCL or staged through host memory). On the CPU, the scale, quantization and
// dequantization are single parallel passes (at::parallel_for) with c10's e4m3fn conversions (the
// bits of Tensor::to); on other devices they are ATen ops on the tensors' device, without a host
// synchronisation.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "booster/dist/process_group.h"
#include "booster/export.h"

namespace booster::dist {

// Largest finite float8 e4m3fn value.
constexpr double kFp8E4M3Max = 448.0;

// Bytes one piece of `numel` elements takes on the wire: payload plus its float32 scale.
constexpr int64_t fp8_wire_bytes(int64_t numel) { return numel + 4; }

// The scale of `x` (any floating dtype, any shape, any device): a float32 tensor of one element on
// x's device, amax / 448 over x's finite values; 1 when they are all zero (or x has none).
BOOSTER_API at::Tensor fp8_scale(const at::Tensor& x);

// x / scale rounded to float8 e4m3fn (same shape and device as x; scale: a float32 tensor of one
// element, e.g. fp8_scale(x)); values beyond +-448 after scaling saturate to +-448, non-finite
// values become NaN. Throws std::invalid_argument for a non-floating x.
BOOSTER_API at::Tensor quantize_fp8(const at::Tensor& x, const at::Tensor& scale);

// q (float8 e4m3fn) * scale in `dtype` (a floating dtype), same shape and device as q.
BOOSTER_API at::Tensor dequantize_fp8(const at::Tensor& q, const at::Tensor& scale, at::ScalarType dtype);

// Writes x (flattened, numel n) into `wire` (uint8, contiguous, fp8_wire_bytes(n) bytes, x's
// device) in the wire layout above, with x's own scale. Throws std::invalid_argument on a size
// or dtype mismatch.
BOOSTER_API void pack_fp8(const at::Tensor& x, at::Tensor wire);
// The values of one packed piece (`wire`: uint8, fp8_wire_bytes(n) bytes) as a flat [n] tensor of
// `dtype`.
BOOSTER_API at::Tensor unpack_fp8(const at::Tensor& wire, at::ScalarType dtype);

// ---- Collectives. Each has the contract of the ProcessGroup collective it replaces, with fp8 on
// the wire; every rank calls them in the same order, and waits for them in the same order (the
// all-gather half of fp8_allreduce is posted from wait()). The group must outlive the Work.
// Tensors: contiguous, a floating dtype (float32, bfloat16, float16), the same numel and dtype on
// every rank. Throws DistError for a non-floating or non-contiguous tensor or bad counts.

// SUM allreduce in place. Reduce-scatter of even ranges (fp8_reduce_scatter_in_place), each rank
// quantizes its reduced range again with a new scale, then an all-gather of the fp8 ranges; after
// wait() every rank holds the same bits (this rank's range too is the dequantized fp8). Bytes sent
// per rank: about 2 (N-1)/N n + 8 (N-1) for n elements, a quarter of a float32 ring allreduce.
// Error per element: at most 2^-4 (sum over ranks of |x_r|) + 2^-4 |sum| + 2^-10 (sum of scales
// + the result's scale) (quantized once on each rank, once after the sum). is_completed() is false
// until wait() returned (the second half is posted by wait()).
BOOSTER_API Work fp8_allreduce(ProcessGroup& group, at::Tensor& tensor);

// As ProcessGroup::reduce_scatter_in_place with ReduceOp::SUM: `buffer` is quantized with this
// rank's scale and each rank's range is sent to it as fp8 (one all_to_all_single of uint8); after
// wait() this rank's range holds the float32 sum, in rank order, of its own exact values and the
// other ranks' dequantized ranges, cast to buffer's dtype; the other ranges are unchanged.
// Error per element: at most 2^-4 (sum over the other ranks of |x_r|) + 2^-10 (sum of their scales).
BOOSTER_API Work fp8_reduce_scatter_in_place(ProcessGroup& group, at::Tensor& buffer, const std::vector<int64_t>& counts);

// As ProcessGroup::all_gather_into_tensor: every rank's `input` (numel n, its own scale) is
// quantized and all-gathered as fp8 (uint8 pieces of fp8_wire_bytes(n)); after wait() `output`
// (numel size() * n, its own floating dtype, which may differ from input's) holds every rank's
// dequantized piece in rank order, this rank's included (all ranks hold the same bits). `input`
// may be this rank's chunk of `output`. Error per element: 2^-4 |x| + 2^-10 scale of its rank.
BOOSTER_API Work fp8_all_gather_into_tensor(ProcessGroup& group, at::Tensor& output, const at::Tensor& input);

}  // namespace booster::dist
