// host_cache.h — a caching allocator for LibTorch's CPU tensors (the host-memory policy "cache").
//
// A training step frees its activations, gradients, buckets and gathered shards and allocates the
// same sizes again in the next step. When freed memory goes back to the system, every step faults
// those pages in again (a minor page fault per 4 KiB page, each zero-filled by the kernel); when it
// is kept in glibc's heap, it stays resident at the heap's peak and fragments among long-lived
// blocks. The cache takes the idea of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator)
// to the host, with a bound:
//   - Tensor storage of kMinBytes (1 MiB) and more gets a mapping of its own (mmap), rounded up to a
//     size class (8 classes per power of two, at least one 4 KiB page). Smaller storage goes to the
//     CPU allocator that was installed before (LibTorch's default, i.e. glibc).
//   - A freed block is kept in its size class and handed out again for a request of the same class:
//     its pages are already resident, so the next step does not fault them in again.
//   - The free blocks held never exceed the limit (bytes): when a free would pass it, the blocks freed
//     longest ago are unmapped first (least recently used). trim_host_cache() unmaps them on demand.
//   - Pages of a class's rounding that a tensor never touches are never resident: rounding costs
//     address space, not memory.
//   - Huge pages (on by default, where the kernel's transparent huge pages are "always" or
//     "madvise"): blocks of 2 MiB and more are 2 MiB-aligned and the whole 2 MiB pages within the
//     request that mapped them are marked MADV_HUGEPAGE (the rest keeps 4 KiB pages), so a block
//     mapped again after the limit unmapped it faults in 2 MiB per fault instead of 4 KiB. Measured
//     on the 20M-parameter MLP under torch_fsdp: 88k minor faults per step and 178 samples/s with 4 KiB
//     pages, 0.5k and 297 samples/s with huge pages, at the same resident memory
//     (docs/architecture.md).
// Resident memory is therefore the live tensors + at most `limit` bytes of free blocks + glibc's heap
// of small blocks. The held free bytes are reported (host_cache_stats, Booster::memory_report), not
// hidden.
//
// install_host_cache() sets the process-wide CPU allocator (c10::SetCPUAllocator) once; later calls
// only change the limit. Storage allocated before stays with its own allocator (a DataPtr carries
// its deleter), and the cache is never destroyed, so storage it served may outlive any Booster.
// Thread-safe (one mutex; only blocks of 1 MiB and more take it).
#pragma once

#include <cstdint>
#include <string>

#include "booster/export.h"

namespace booster {

struct HostCacheStats {
  bool installed = false;
  bool huge_pages = false;       // new blocks of 2 MiB and more are mapped with MADV_HUGEPAGE
  int64_t limit_bytes = 0;       // the bound on held free bytes
  int64_t held_bytes = 0;        // free blocks kept for reuse now (resident only where touched)
  int64_t peak_held_bytes = 0;   // the most held at once since install
  int64_t in_use_bytes = 0;      // blocks handed out and not yet freed (size-class bytes)
  int64_t peak_in_use_bytes = 0;
  int64_t hits = 0;              // requests served from a held block
  int64_t misses = 0;            // requests that mapped a new block
  int64_t released_bytes = 0;    // bytes unmapped (limit, trims), in all
};

// Smallest storage the cache serves; smaller requests go to the previous CPU allocator.
constexpr int64_t kHostCacheMinBytes = int64_t{1} << 20;

// Installs the cache as LibTorch's CPU allocator (first call) and sets its bound on held free bytes.
// limit_bytes >= 0; 0 keeps nothing (every freed block is unmapped at once). Lowering the limit
// unmaps the least recently freed blocks above it. huge_pages: map new blocks of 2 MiB and more with
// MADV_HUGEPAGE (ignored where transparent_huge_pages_mode() is neither "always" nor "madvise");
// false maps them with MADV_NOHUGEPAGE (4 KiB pages also where the mode is "always").
// Throws std::invalid_argument for a negative limit.
BOOSTER_API void install_host_cache(int64_t limit_bytes, bool huge_pages = true);

// The kernel's transparent huge page mode (/sys/kernel/mm/transparent_hugepage/enabled): "always",
// "madvise", "never", or "unavailable" when it cannot be read.
BOOSTER_API std::string transparent_huge_pages_mode();

// Unmaps held free blocks, least recently freed first, until at most keep_bytes are held; returns
// the bytes unmapped. Does nothing (returns 0) when the cache is not installed.
BOOSTER_API int64_t trim_host_cache(int64_t keep_bytes = 0);

// The counters above, read under the cache's lock.
BOOSTER_API HostCacheStats host_cache_stats();

// The size class a request of `bytes` (>= kHostCacheMinBytes) is rounded up to: a multiple of
// 2^(floor(log2 bytes) - 3), i.e. 8 classes per power of two, so at most 12.5% is rounding.
BOOSTER_API int64_t host_cache_size_class(int64_t bytes);

}  // namespace booster
