// The launch planner of apex's multi_tensor_apply, host-only C++ (compiled by nvcc for the kernels
// and by the host compiler for the tests, which run it without a GPU).
//
// A launch carries, in its kernel parameters, a TensorListMeta: up to kMaxTensors tensor slots
// (kDepth pointers each, e.g. param/grad/m/v) and, per slot, the range of thread blocks that run
// its chunks. Slot s owns blocks [block_end[s-1], block_end[s]) (block_end[-1] = 0); the first of
// them runs chunk first_chunk[s] of the tensor, the next one the chunk after, and so on; a block
// finds its slot by a binary search over block_end (find_block in multi_tensor_functors.h). So a
// launch runs as many blocks as its tensors have chunks (up to kMaxBlocksPerLaunch), and the
// GPU's block scheduler balances them over all SMs.
//
// plan_launches walks the tensors, cuts each into chunks of chunk_size elements and emits a launch
// whenever the tensor table or the block budget is full, or the list is done. A tensor whose chunks
// do not all fit is continued in the next launch (in slot 0, from its first chunk not yet run).
#pragma once

#include <cuda_runtime_api.h>  // CUDART_VERSION only

#include <cstddef>
#include <cstdint>
#include <stdexcept>

namespace booster::kernels::cuda::detail {

// Bytes of kernel parameters a launch may carry: 32764 from CUDA 12.1 on (Volta and newer, a driver
// of CUDA 12.1 or newer), 4096 before. The tables below, plus the functor's own fields (at most
// kFunctorParamBytes), fill it; checked where kernels are launched.
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12010
inline constexpr int kKernelParamBytes = 32764;
#else
inline constexpr int kKernelParamBytes = 4096;
#endif
inline constexpr int kFunctorParamBytes = 128;

// Blocks of one launch: far more than a GPU runs at once, so only a tensor of more than
// 2^20 * chunk_size elements is split by it; block indices stay well inside int32.
inline constexpr int kMaxBlocksPerLaunch = 1 << 20;

// Bytes of one tensor slot: kDepth addresses, sizes, base, first_chunk, block_end, flags.
template <int kDepth>
inline constexpr int kSlotBytes = kDepth * 8 + 8 + 4 + 4 + 4 + 1;
// The header (n_slots, padding) and the alignment padding of the flags array.
inline constexpr int kMetaOverheadBytes = 16;
template <int kDepth>
inline constexpr int kMaxTensorsPerLaunch =
    (kKernelParamBytes - kFunctorParamBytes - kMetaOverheadBytes) / kSlotBytes<kDepth>;

template <int kDepth>
struct TensorListMeta {
  static constexpr int kMaxTensors = kMaxTensorsPerLaunch<kDepth>;
  void* addresses[kDepth][kMaxTensors];  // device pointers, by slot
  int64_t sizes[kMaxTensors];            // elements, by slot
  int32_t base[kMaxTensors];             // per-tensor integer owned by the functor (e.g. an offset)
  int32_t first_chunk[kMaxTensors];      // chunk (within its tensor) of the slot's first block
  int32_t block_end[kMaxTensors];        // one past the slot's last block (an inclusive prefix sum)
  uint8_t flags[kMaxTensors];            // per-tensor bits owned by the functor (e.g. dtypes)
  int32_t n_slots;                       // slots in use, >= 1 in every launch
};
static_assert(sizeof(TensorListMeta<5>) + kFunctorParamBytes <= kKernelParamBytes, "TensorListMeta<5> too large");
static_assert(sizeof(TensorListMeta<2>) + kFunctorParamBytes <= kKernelParamBytes, "TensorListMeta<2> too large");
static_assert(sizeof(TensorListMeta<1>) + kFunctorParamBytes <= kKernelParamBytes, "TensorListMeta<1> too large");

// Optional tighter limits of one plan (the tests use them to split small lists); each is clamped
// to [1, the table's capacity].
struct PlanLimits {
  int max_tensors = 0x7fffffff;
  int max_blocks = kMaxBlocksPerLaunch;
};

// plan_launches(n, chunk_size, meta, numel_of, fill, launch[, limits]):
//   numel_of(t)          -> elements of tensor t (0: skipped)
//   fill(meta, slot, t)  stores tensor t's addresses/sizes/base/flags in `slot` (called again for
//                        slot 0 when tensor t goes on in the next launch)
//   launch(meta, blocks) runs blocks 0..blocks-1 of `meta` (blocks = meta.block_end[n_slots - 1])
// Returns the number of launches.
template <int kDepth, class NumelOf, class Fill, class Launch>
int plan_launches(int64_t n_tensors, int64_t chunk_size, TensorListMeta<kDepth>& meta, NumelOf numel_of,
                  Fill fill, Launch launch, PlanLimits limits = {}) {
  using Meta = TensorListMeta<kDepth>;
  if (chunk_size <= 0) throw std::invalid_argument("multi_tensor_apply: chunk_size must be positive");
  const int max_tensors = limits.max_tensors < 1 ? 1 : limits.max_tensors > Meta::kMaxTensors ? Meta::kMaxTensors
                                                                                               : limits.max_tensors;
  const int max_blocks = limits.max_blocks < 1 ? 1 : limits.max_blocks > kMaxBlocksPerLaunch ? kMaxBlocksPerLaunch
                                                                                             : limits.max_blocks;
  int64_t last = -1;
  for (int64_t t = 0; t < n_tensors; ++t)
    if (numel_of(t) > 0) last = t;
  int launches = 0;
  int slot = 0;
  int blocks = 0;
  for (int64_t t = 0; t <= last; ++t) {
    const int64_t numel = numel_of(t);
    if (numel == 0) continue;
    const int64_t chunks = (numel + chunk_size - 1) / chunk_size;
    if (chunks > INT32_MAX) throw std::invalid_argument("multi_tensor_apply: a tensor has more than 2^31 - 1 chunks");
    int64_t chunk = 0;
    while (chunk < chunks) {
      fill(meta, slot, t);
      const int64_t room = max_blocks - blocks;
      const int64_t take = chunks - chunk < room ? chunks - chunk : room;
      meta.first_chunk[slot] = static_cast<int32_t>(chunk);
      blocks += static_cast<int>(take);
      meta.block_end[slot] = blocks;
      chunk += take;
      ++slot;
      meta.n_slots = slot;
      if (blocks == max_blocks || slot == max_tensors || (chunk == chunks && t == last)) {
        launch(static_cast<const Meta&>(meta), blocks);
        ++launches;
        slot = 0;
        blocks = 0;
      }
    }
  }
  return launches;
}

}  // namespace booster::kernels::cuda::detail
