// memory.h — per-rank accounting of model-state memory (ZeRO paper, Rajbhandari et al., SC20,
// section 3.1: parameters, gradients, optimizer states incl. fp32 master weights), plus the
// buffers a plugin keeps for communication. Every plugin reports through the same struct so the
// numbers compare across strategies; Booster::memory_report() assembles and logs it.
//
// Steady state: gradients and optimizer states are counted as they are once the first step ran
// (Adam's moments are created lazily by LibTorch), so the report made at the end of boost() already
// shows what training will hold. With Ψ parameters, N ranks, fp32 and Adam:
//   DDP 16Ψ, ZeRO-1 8Ψ + 8Ψ/N, ZeRO-2 4Ψ + 12Ψ/N bytes (communication buffers excluded).
#pragma once

#include <cstdint>
#include <string>

#include "booster/export.h"

namespace booster {

struct BOOSTER_API MemoryReport {
  int64_t parameters = 0;             // bytes: the model's parameters on this rank (flat buffers incl. padding)
  int64_t gradients = 0;              // bytes: gradients this rank keeps (full or its shard)
  int64_t master_weights = 0;         // bytes: fp32 master copies (0 when the optimizer updates the parameters)
  int64_t optimizer_states = 0;       // bytes: optimizer state tensors (e.g. Adam exp_avg + exp_avg_sq)
  int64_t communication_buffers = 0;  // bytes: buckets that are not also the gradients
  // bytes: freed tensor blocks the host cache holds for reuse (malloc = "cache", core/host_cache.h),
  // process-wide, filled in by Booster::memory_report; resident where they were touched.
  int64_t host_cache_held = 0;

  // parameters + gradients + master_weights + optimizer_states (bytes).
  int64_t model_states() const { return parameters + gradients + master_weights + optimizer_states; }
  // One line, MiB with one decimal: "params 12.3 MiB, grads ..., master ..., optim ..., comm ...,
  // model states ... MiB", and "; host cache holds ... MiB free" when host_cache_held > 0.
  std::string to_string() const;
};

// This process's host memory, read from /proc/self/status (VmRSS, VmHWM) and getrusage (minor
// faults). Bytes; a figure that cannot be read is -1. VmHWM is the peak since the process started
// (or since it was reset through /proc/self/clear_refs).
struct ProcessMemory {
  int64_t rss_bytes = -1;
  int64_t peak_rss_bytes = -1;
  int64_t minor_faults = -1;  // pages faulted in without I/O since the process started: fresh memory touched
};
BOOSTER_API ProcessMemory process_memory();

}  // namespace booster
