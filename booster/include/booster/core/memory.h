// memory.h — per-rank accounting of model-state memory (ZeRO paper, Rajbhandari et al., SC20,
// section 3.1: parameters, gradients, optimizer states incl. fp32 master weights), plus the
// buffers a plugin keeps for communication. Every plugin reports through the same struct so the
// numbers compare across strategies; Booster::memory_report() assembles and logs it.
//
// Steady state: gradients and optimizer states are counted as they are once the first step ran
// (Adam's moments are created lazily by LibTorch), so the report made at the end of boost() already
// shows what training will hold. With Ψ parameters, N ranks, fp32 and Adam:
//   DDP 16Ψ, ZeRO-1 8Ψ + 8Ψ/N, ZeRO-2 4Ψ + 12Ψ/N bytes (communication buffers excluded).
//
// Where it lives ([booster] device = "cuda"): each figure is split into the part in the device's
// memory (CUDA tensors, the *_on_device fields) and the rest, in host memory. ZeRO's cpu_offload, for
// instance, keeps parameters and gradients on the GPU and the master weights and optimizer states in
// pinned host memory. On a CPU device everything is host memory: the *_on_device fields stay 0 and
// the line (to_string) is the CPU one. Booster::memory_report also fills in the device's caching
// allocator figures (device.h's device_memory), which count every live tensor of the process on
// that device, not only the model states.
#pragma once

#include <cstdint>
#include <string>

#include "booster/export.h"

namespace at {
class Tensor;
}

namespace booster {

// Bytes of tensors by place: all of them, those on an accelerator, those in pinned host memory.
struct BOOSTER_API PlacedBytes {
  int64_t total = 0;
  int64_t on_device = 0;
  int64_t pinned = 0;
  // Adds numel x element size of `t` (undefined: nothing) to total, and to on_device when it is not
  // on the CPU, else to pinned when check_pinned and it is pinned (look it up only on an accelerator
  // run: on a CPU run nothing is pinned and the lookup would load the accelerator's hooks).
  void add(const at::Tensor& t, bool check_pinned);
};

struct BOOSTER_API MemoryReport {
  int64_t parameters = 0;             // bytes: the model's parameters on this rank (flat buffers incl. padding)
  int64_t gradients = 0;              // bytes: gradients this rank keeps (full or its shard)
  int64_t master_weights = 0;         // bytes: fp32 master copies (0 when the optimizer updates the parameters)
  int64_t optimizer_states = 0;       // bytes: optimizer state tensors (e.g. Adam exp_avg + exp_avg_sq)
  int64_t communication_buffers = 0;  // bytes: buckets that are not also the gradients
  // bytes: freed tensor blocks the host cache holds for reuse (malloc = "cache", core/host_cache.h),
  // process-wide, filled in by Booster::memory_report; resident where they were touched.
  int64_t host_cache_held = 0;

  // ---- Where the figures above live (bytes of each in device memory; the rest is host memory).
  int64_t parameters_on_device = 0;
  int64_t gradients_on_device = 0;
  int64_t master_weights_on_device = 0;
  int64_t optimizer_states_on_device = 0;
  int64_t communication_buffers_on_device = 0;
  // Of the model states in host memory, the bytes in page-locked (pinned) memory: what copies to and
  // from the device asynchronously (ZeRO cpu_offload on a GPU: the master slices and their states).
  int64_t pinned_host_bytes = 0;
  // true when the *_on_device split is filled in: every report built from visits
  // (MemoryReportBuilder: OptimizerWrapper::memory_report, Booster::memory_report) is; a report
  // assembled by hand may leave it false.
  bool located = false;

  // ---- The device (filled in by Booster::memory_report for the Booster's device).
  std::string device = "cpu";         // "cpu", "cuda:0", ...
  // LibTorch's caching allocator on that device (bytes; 0 on a CPU device): live tensors, memory held
  // from the driver, and their peaks since the process started (or reset_device_peak).
  int64_t device_allocated = 0;
  int64_t device_reserved = 0;
  int64_t device_peak_allocated = 0;
  int64_t device_peak_reserved = 0;

  // parameters + gradients + master_weights + optimizer_states (bytes).
  int64_t model_states() const { return parameters + gradients + master_weights + optimizer_states; }
  // Their parts in device memory and in host memory (on_device + on_host = model_states()).
  int64_t model_states_on_device() const {
    return parameters_on_device + gradients_on_device + master_weights_on_device + optimizer_states_on_device;
  }
  int64_t model_states_on_host() const { return model_states() - model_states_on_device(); }
  // Whether `device` names an accelerator (anything but "cpu" or "").
  bool on_accelerator() const { return !device.empty() && device != "cpu"; }
  // One line, MiB with one decimal: "params 12.3 MiB, grads ..., master ..., optim ..., comm ...,
  // model states ... MiB", and "; host cache holds ... MiB free" when host_cache_held > 0. On an
  // accelerator it goes on with where the model states are and the device's allocator:
  // "; on cuda:0: params ..., grads ..., master weights ..., optimizer states ..., communication
  // buffers ...; model states ... MiB; on the host: model states ... MiB (... MiB pinned); cuda:0
  // allocator: allocated ... MiB (peak ...), reserved ... MiB (peak ...)".
  std::string to_string() const;
};

// The model-state figures of a MemoryReport.
enum class MemoryCategory { kParameters, kGradients, kMasterWeights, kOptimizerStates, kCommunicationBuffers };

// Receives the memory a component holds, category by category (the Visitor pattern, Gamma et al.):
// the optimizer wrappers (OptimizerWrapper::visit_memory), the model hooks and the Booster describe
// their tensors to it, each placed (PlacedBytes), and what is built from the visits is the
// visitor's business (MemoryReportBuilder sums a MemoryReport).
class BOOSTER_API MemoryVisitor {
 public:
  virtual ~MemoryVisitor();
  // `bytes` of `category`: total, the part in device memory, the part in pinned host memory.
  virtual void visit(MemoryCategory category, const PlacedBytes& bytes) = 0;
  // One tensor (undefined: nothing): PlacedBytes::add(t, check_pinned).
  void visit(MemoryCategory category, const at::Tensor& t, bool check_pinned);
  // `bytes` not yet allocated (planned), placed on a device when `on_device`, else in host memory
  // (pinned when `pinned`).
  void visit_planned(MemoryCategory category, int64_t bytes, bool on_device, bool pinned = false);
};

// Sums the visits into a MemoryReport: each category's total and its *_on_device part, the pinned
// parts of the model states into pinned_host_bytes, and located = true (every figure was placed by its producer).
class BOOSTER_API MemoryReportBuilder : public MemoryVisitor {
 public:
  MemoryReportBuilder() { report_.located = true; }
  void visit(MemoryCategory category, const PlacedBytes& bytes) override;
  using MemoryVisitor::visit;
  const MemoryReport& report() const { return report_; }
  MemoryReport& report() { return report_; }

 private:
  MemoryReport report_;
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
