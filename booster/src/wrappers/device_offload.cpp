// device_offload.cpp — pinned host memory and side-stream copies for ZeRO's cpu_offload on an
// accelerator (see device_offload.h).
#include "device_offload.h"

#include <ATen/DeviceAccelerator.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <stdexcept>

#include "booster/optim/optimizer_registry.h"
#include "booster/optim/optimizer_state.h"

namespace booster::detail {

at::Tensor pinned_empty(int64_t numel, at::ScalarType dtype) {
  return at::empty({numel}, at::TensorOptions().dtype(dtype).pinned_memory(true));
}

void pin_optimizer_state(torch::optim::Optimizer& optimizer, const at::Tensor& param) {
  auto& state = optimizer.state();
  auto it = state.find(optimizer_state_key(param));
  if (it == state.end()) return;
  const OptimizerTypeInfo& info = optimizer_type_info(optimizer);
  ParamOptimState s = info.extract_state(*it->second);
  bool changed = false;
  for (auto& [name, t] : s.tensors) {
    if (!t.device().is_cpu() || t.is_pinned()) continue;
    t = t.pin_memory();  // a pinned copy
    changed = true;
  }
  if (changed) it->second = info.make_state(s);
}

namespace {
c10::Stream side_stream(const c10::Device& device) {
  if (device.is_cpu()) throw std::invalid_argument("booster: DeviceOffload needs an accelerator device, got cpu");
  c10::impl::VirtualGuardImpl impl(device.type());
  return impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
}
}  // namespace

DeviceOffload::DeviceOffload(c10::Device device)
    : device_(device), side_(side_stream(device)), ready_(device.type()), uploaded_(device.type()) {}

std::vector<at::Tensor> DeviceOffload::download(const std::vector<at::Tensor>& device_tensors,
                                                const std::vector<at::ScalarType>& dtypes) {
  std::vector<at::Tensor> host;
  host.reserve(device_tensors.size());
  // The side stream starts after what the current stream has queued (the gradients' reductions).
  ready_.record(at::accelerator::getCurrentStream(device_.index()));
  ready_.block(side_);
  {
    c10::StreamGuard on_side(side_);
    for (size_t i = 0; i < device_tensors.size(); ++i) {
      at::Tensor h = pinned_empty(device_tensors[i].numel(), dtypes.at(i));
      h.copy_(device_tensors[i].reshape({-1}), /*non_blocking=*/true);
      host.push_back(std::move(h));
    }
  }
  // One wait for every copy. The device tensors (and the temporaries of a dtype conversion, made on
  // the side stream) are then free to be reused.
  side_.synchronize();
  return host;
}

void DeviceOffload::upload(const std::vector<std::pair<at::Tensor, at::Tensor>>& dst_src) {
  for (const auto& [dst, src] : dst_src) dst.copy_(src, /*non_blocking=*/true);
  uploaded_.record(at::accelerator::getCurrentStream(device_.index()));
  upload_pending_ = true;
}

void DeviceOffload::wait_uploads() {
  if (!upload_pending_) return;
  uploaded_.synchronize();
  upload_pending_ = false;
}

}  // namespace booster::detail
