// device_offload.h — internal: host memory beside an accelerator for ZeRO's cpu_offload.
//
// DeviceOffload moves tensors between the device and pinned (page-locked) host memory with ATen's
// device-agnostic stream API (c10::Stream, c10::Event, at::accelerator), so libbooster needs no CUDA
// header and links no CUDA library:
//   download: device -> pinned host, non-blocking copies on a side stream of the device (ordered
//             after the work queued so far on the current stream), then one synchronize of that
//             stream: the CPU step that follows sees every gradient;
//   upload:   pinned host -> device, non-blocking copies on the current stream (ordered before the
//             all-gather that follows); an event marks their end, and wait_uploads() blocks on it
//             before the host tensors are written again.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace booster::detail {

// A 1-D tensor of `numel` elements of `dtype` in pinned host memory (the accelerator's host allocator).
at::Tensor pinned_empty(int64_t numel, at::ScalarType dtype);

// Replaces every state tensor of the optimizer's state for `param` that is in ordinary host memory by
// a pinned copy (same values, same state type through the registry). No-op without state.
void pin_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param);

class DeviceOffload {
 public:
  // `device`: the accelerator the model lives on (not the CPU).
  explicit DeviceOffload(c10::Device device);
  DeviceOffload(const DeviceOffload&) = delete;
  DeviceOffload& operator=(const DeviceOffload&) = delete;

  const c10::Device& device() const { return device_; }
  // Each device tensor copied into a new pinned host tensor of its dtype (dtypes[i]), in order;
  // returns when every copy has arrived.
  std::vector<at::Tensor> download(const std::vector<at::Tensor>& device_tensors,
                                   const std::vector<at::ScalarType>& dtypes);
  // dst.copy_(src, non_blocking) for each (device dst, pinned host src) on the current stream, then
  // records the upload event.
  void upload(const std::vector<std::pair<at::Tensor, at::Tensor>>& dst_src);
  // Blocks until the last upload's copies are done (the host sources may be written again).
  void wait_uploads();

 private:
  c10::Device device_;
  c10::Stream side_;        // downloads
  c10::Event ready_;        // the current stream's work before a download
  c10::Event uploaded_;     // the end of the last upload
  bool upload_pending_ = false;
};

}  // namespace booster::detail
