// cpu_byte_counter.h — live bytes of CPU tensor memory, for Gemini's "auto" placement (the CPU
// counterpart of torch.cuda.memory_allocated, which ColossalAI's memory tracer samples): a CPU
// allocator that forwards every allocation to the allocator it replaces and counts the bytes alive.
// Installed once per process (c10::SetCPUAllocator) the first time it is asked for, never removed
// (tensors it allocated may outlive any plugin); the overhead is one atomic add per allocation.
#pragma once

#include <cstdint>

namespace booster::plugins::gemini {

// Installs the counter if it is not installed yet. Thread-safe.
void install_cpu_byte_counter();
// Bytes allocated through the counter and not yet freed (0 before install).
int64_t counted_cpu_bytes();

}  // namespace booster::plugins::gemini
