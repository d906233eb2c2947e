// device.h — where a rank's tensors live ([booster] device, ColossalAI's Booster(device=...)), and
// the CUDA support library.
//
// libbooster.so links LibTorch's CPU library only, so a CPU run loads no CUDA library. CUDA support
// is libbooster_cuda.so, built beside libbooster.so when the CUDA toolkit is found (BOOSTER_WITH_CUDA):
// loading it loads LibTorch's CUDA library (which registers the CUDA device and its allocator with
// ATen), registers the "nccl" collective backend (booster/dist/device_backend.h) and the CUDA
// optimizer kernels. It is loaded on demand, once, and never unloaded.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>

#include "booster/export.h"

namespace booster {

// Loads libbooster_cuda.so (once per process; later calls return at once). Looked for at
// $BOOSTER_CUDA_LIBRARY if set, else beside libbooster.so. Throws std::runtime_error naming the
// file and the loader's message when it is missing (a build without the CUDA toolkit: configure
// with -DBOOSTER_WITH_CUDA=ON) or cannot be loaded (LibTorch's CUDA libraries not found: put
// LibTorch's lib directory on LD_LIBRARY_PATH).
BOOSTER_API void load_cuda_support();

// Whether load_cuda_support() succeeded in this process.
BOOSTER_API bool cuda_support_loaded();

// The number of CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies). Loads CUDA support;
// 0 when it cannot be loaded or the driver reports no device (never throws).
BOOSTER_API int cuda_device_count();

// The device of this rank for [booster] device = `name`:
//   "cpu"  -> cpu;
//   "cuda" -> cuda:(local_rank % cuda_device_count()), made the current CUDA device. Ranks of one node
//             share a GPU when local_world_size > device count; with backend "nccl" that is refused
//             (NCCL runs one rank per GPU), as is a local_rank beyond the visible devices.
// `backend` is the collective backend ("gloo" | "nccl"). Throws std::invalid_argument naming the
// problem and the fix: an unknown name; "cuda" without CUDA support or without a visible device;
// "nccl" with "cpu"; local_rank or local_world_size out of range for nccl.
BOOSTER_API c10::Device select_device(const std::string& name, int local_rank, int local_world_size,
                                      const std::string& backend);

// Device memory of `device` from LibTorch's caching allocator (bytes): allocated and reserved now,
// their peaks since the process started (or reset_device_peak), and the device's free and total
// memory from the driver. All zero for a CPU device.
struct DeviceMemory {
  int64_t allocated = 0;
  int64_t reserved = 0;
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
  int64_t free = 0;
  int64_t total = 0;
};
BOOSTER_API DeviceMemory device_memory(const c10::Device& device);
BOOSTER_API void reset_device_peak(const c10::Device& device);

// `t` (any dtype and shape) copied into page-locked host memory (the accelerator's host allocator),
// synchronously on the current stream: an accelerator's host tier (FSDP's cpu_offload, Gemini's
// offload tier), whose copies to and from the device need pinned memory. A CPU tensor (or an
// undefined one) is returned as it is. Throws c10::Error when pinned memory cannot be allocated or
// the copy fails.
BOOSTER_API at::Tensor pinned_host_copy(const at::Tensor& t);

// pinned_host_copy without waiting: the copy is queued on the current stream of t's device and the
// returned host tensor must not be read (or its owner must not free it by hand) before a
// StreamEvent recorded after this call has been synchronized. FSDP2 offloads its reduced gradients
// this way (a non_blocking copy to pinned memory plus an event the optimizer step waits on). A CPU
// (or undefined) tensor is returned as it is. Throws c10::Error as pinned_host_copy.
BOOSTER_API at::Tensor pinned_host_copy_async(const at::Tensor& t);

// A marker in the current stream of an accelerator (a CUDA event, c10::Event): it is reached once
// every kernel and copy queued on that stream before record() has finished. PyTorch FSDP's rate
// limiter (FullyShardedDataParallel(limit_all_gathers=True): an event recorded after each free,
// the host synchronizing the oldest before issuing a third all-gather) and the completion of
// asynchronous host copies are built on it. On the CPU, work is done when its call returns: an
// event of a CPU device is complete at once and record/synchronize do nothing. Not thread-safe.
class BOOSTER_API StreamEvent {
 public:
  // An event of `device` not yet recorded (complete). A CUDA device needs CUDA support loaded
  // (load_cuda_support); throws c10::Error otherwise, or for a device type without events.
  explicit StreamEvent(c10::Device device);
  ~StreamEvent();
  StreamEvent(StreamEvent&&) noexcept;
  StreamEvent& operator=(StreamEvent&&) noexcept;
  // Marks the work queued on the device's current stream so far (a new version of the event).
  void record();
  // Blocks the calling thread until the recorded work has finished; at once when never recorded.
  void synchronize() const;
  // Whether the recorded work has finished (never blocks).
  bool query() const;
  const c10::Device& device() const { return device_; }

 private:
  c10::Device device_;
  struct Impl;
  std::unique_ptr<Impl> impl_;  // null on the CPU
};

}  // namespace booster
