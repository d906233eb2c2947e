// host_allocator.h — how host (CPU) memory is allocated in a training process: [booster] malloc.
//
// A training step frees its activations, gradients, buckets and gathered shards and allocates the
// same sizes again in the next step. Memory given back to the system in between is faulted in again
// (one minor page fault per 4 KiB page, zero-filled by the kernel); memory kept costs resident
// memory. The modes (measured on the main job and the memory benchmark, docs/architecture.md):
//   "cache"  (every plugin's default) LibTorch's CPU tensors of 1 MiB and more come from the host
//            cache (core/host_cache.h): freed blocks are kept by size class and handed out again, at
//            most `cache_limit_bytes` of them held free, the least recently freed unmapped first.
//            Resident memory is the live tensors + at most the limit. glibc serves everything else
//            with M_MMAP_THRESHOLD = 1 MiB (large non-tensor blocks are mapped and returned) and
//            M_TRIM_THRESHOLD = 32 MiB (the heap of small blocks keeps up to 32 MiB free at its top).
//            The default limit is default_host_cache_limit(): max(48 MiB, 0.15 x the model states
//            per rank), set by the Booster at boost(); [booster] malloc_cache_mb sets it.
//   "retain" glibc keeps freed memory for reuse: M_MMAP_THRESHOLD = 32 MiB (glibc's maximum for its
//            dynamic threshold; larger blocks are still mapped and unmapped), M_TRIM_THRESHOLD = 2 GiB
//            (mallopt's largest: the heap top is never trimmed). As fast as "cache"; resident memory
//            stays at the heap's peak, and long-lived and per-step blocks fragment the heap.
//   "return" M_MMAP_THRESHOLD = M_TRIM_THRESHOLD = 1 MiB: blocks of 1 MiB or more get mappings of
//            their own and go back to the system when freed, so resident memory follows the live
//            tensors, and every step faults them in again (slowest).
//   "system" glibc's defaults (its dynamic mmap threshold rises to 32 MiB after the first large free).
// A value the user set in glibc's environment (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
// MALLOC_TOP_PAD_) is kept. With another allocator preloaded (LD_PRELOAD naming jemalloc, mimalloc
// or tcmalloc) nothing is changed, the tensor cache included: that allocator serves the tensors.
#pragma once

#include <cstdint>
#include <string>

#include "booster/export.h"

namespace booster {

// The "cache" mode's default bound on held free bytes: the floor covers a small model's per-step
// activations (the Fashion-MNIST CNN at batch 64 fp32 re-faults below it), the fraction a large
// model's per-step gradient and communication buffers while keeping resident memory at rest within
// 1.25x of the model states (the memory benchmark).
constexpr int64_t kHostCacheFloorBytes = int64_t{48} << 20;
constexpr double kHostCacheModelStateFraction = 0.15;

// max(kHostCacheFloorBytes, kHostCacheModelStateFraction x model_state_bytes), in bytes.
// model_state_bytes: MemoryReport::model_states() per rank (a negative value counts as 0).
BOOSTER_API int64_t default_host_cache_limit(int64_t model_state_bytes);

// mode: "cache", "retain", "return" or "system"; the Booster passes [booster] malloc, or the plugin's
// traits().default_malloc when the config does not set it. cache_limit_bytes: the "cache" mode's bound on
// held free bytes (ignored by the other modes; a later call with "cache" changes it).
// Applies to the whole process (mallopt, c10::SetCPUAllocator); call it before the model is built.
// Returns one line saying what was set and what was left to the environment, for the log.
// Throws std::invalid_argument for another mode, or a negative cache_limit_bytes with "cache".
BOOSTER_API std::string configure_host_allocator(const std::string& mode,
                                                 int64_t cache_limit_bytes = kHostCacheFloorBytes);

}  // namespace booster
