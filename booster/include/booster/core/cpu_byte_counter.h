// cpu_byte_counter.h — live bytes of CPU tensor memory (the CPU counterpart of
// torch.cuda.memory_allocated / max_memory_allocated, which ColossalAI's memory tracer samples): a
// CPU allocator that forwards every allocation to the allocator it replaces and counts the bytes
// alive and their high-water mark. Users: Gemini's "auto" placement (non-model memory during the
// warm-up iteration) and the memory estimate (estimate.h: activations of one forward/backward).
// Installed once per process (c10::SetCPUAllocator) the first time it is asked for, never removed
// (tensors it allocated may outlive any plugin); the overhead is two relaxed atomics per allocation.
#pragma once

#include <cstdint>

#include "booster/export.h"

namespace c10 {
struct Allocator;
}  // namespace c10

namespace booster {

// Installs the counter if it is not installed yet. Thread-safe. Tensors allocated before it are not
// counted (neither their allocation nor their free).
BOOSTER_API void install_cpu_byte_counter();
// true once the counter is installed and counting (false when the CPU allocator could not be wrapped).
BOOSTER_API bool cpu_byte_counter_installed();
// Bytes allocated through the counter and not yet freed (0 before install).
BOOSTER_API int64_t counted_cpu_bytes();
// The most counted_cpu_bytes() has been since the last reset_peak_cpu_bytes() (or the install).
BOOSTER_API int64_t peak_cpu_bytes();
// Sets the peak to the current live bytes.
BOOSTER_API void reset_peak_cpu_bytes();

// The allocator the counter forwards to (null when it is not installed), and its replacement by
// `inner` (not null, not the counter): an allocator installed after the counter goes under it this
// way (the host cache, core/host_cache.h), since c10 keeps the counter (priority 255) as LibTorch's
// CPU allocator. Each block records the deleter of the allocator that served it, so blocks served
// before the replacement are freed by their own allocator. Not thread-safe against a concurrent
// replacement (allocations may go on).
BOOSTER_API c10::Allocator* cpu_byte_counter_inner();
BOOSTER_API void set_cpu_byte_counter_inner(c10::Allocator* inner);

}  // namespace booster
