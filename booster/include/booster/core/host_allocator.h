// host_allocator.h — how host (CPU) memory is allocated in a training process.
//
// LibTorch's CPU tensors come from glibc malloc. By default glibc returns freed memory to the
// system (it trims the heap top above M_TRIM_THRESHOLD and unmaps allocations above a dynamic
// M_MMAP_THRESHOLD), so a training loop that frees its activations and gradients every step
// faults the same pages in again on the next step: on the Fashion-MNIST CNN, 6,000-7,400 minor
// page faults per step and 1.3x lower throughput than with retention (docs/benchmarks.md, DDP
// throughput). "retain" keeps freed memory for reuse, as PyTorch's caching allocators do on GPUs:
//   M_MMAP_THRESHOLD = 32 MiB   allocations below it come from the heap (glibc's own maximum for
//                               its dynamic threshold; larger ones are still mapped and unmapped)
//   M_TRIM_THRESHOLD = 2 GiB    (mallopt's largest value) the heap top is trimmed only when that
//                               much is free at it: resident memory stays at the heap's peak
//                               instead of rising and falling every step
// A value the user set in glibc's environment (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
// MALLOC_TOP_PAD_) is kept, and with another allocator preloaded (LD_PRELOAD naming jemalloc,
// mimalloc or tcmalloc) nothing is changed. The cost is resident memory: the heap keeps its peak,
// and with the mmap threshold fixed from the start long-lived and per-step blocks share the heap, so
// freed memory inside it stays resident (ZeRO-2 bf16 on 4 ranks: 534 MiB above baseline after the
// steps instead of 290, memory benchmark).
// glibc's defaults ("system") do not return everything either: after the first large free glibc
// raises its dynamic mmap threshold (up to 32 MiB), so later blocks below it (shards, collective
// buffers, optimizer temporaries of a few to 25 MiB) come from the heap, where freed memory stays
// resident. "return" fixes the threshold low instead:
//   M_MMAP_THRESHOLD = 1 MiB    a block of 1 MiB or more that the heap has no room for is mapped on
//                               its own and unmapped when freed (fixing it also freezes the dynamic
//                               adjustment)
//   M_TRIM_THRESHOLD = 1 MiB    the heap top is trimmed once 1 MiB is free at it, so the heap stays
//                               small and large blocks keep getting mappings of their own
// so resident memory follows the live tensors (ZeRO-2 bf16 on 4 ranks: peak 458 MiB above baseline
// instead of 699 with glibc's defaults)
// at the cost of faulting such blocks in again when they are reallocated. So the default is the
// plugin's (Plugin::default_malloc): "retain" for DDP and hybrid parallelism, "return" for the
// sharding plugins (ZeRO, FSDP, Gemini), whose point is memory and whose estimates
// (core/memory_estimate.h) count live tensors.
#pragma once

#include <string>

#include "booster/export.h"

namespace booster {

// mode: "retain", "return" or "system" (glibc's defaults, nothing changed); the Booster passes [booster] malloc,
// or the plugin's default_malloc() when the config does not set it.
// Applies to the whole process (mallopt); call it before the model is built. Returns one line saying
// what was set and what was left to the environment, for the log. Throws std::invalid_argument for
// another mode.
BOOSTER_API std::string configure_host_allocator(const std::string& mode);

}  // namespace booster
