// process_group_device.cpp — the device backend beside Gloo (NCCL for CUDA tensors) and host staging
// for device tensors on groups without one (contracts in process_group_impl.h).
//
// Two ranks sharing one GPU cannot use NCCL (it runs one rank per GPU), so they reduce CUDA tensors
// over Gloo. Gloo's collectives accept CUDA tensors, but its point-to-point does not (writev on device
// memory fails), and every emulation here is built from point-to-point, so such collectives run on
// host copies instead, one code path for all of them.
#include <ATen/ATen.h>
#include <ATen/DeviceAccelerator.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <memory>
#include <string>
#include <vector>

#include "booster/device.h"
#include "booster/dist/device_backend.h"
#include "booster/dist/process_group.h"
#include "process_group_impl.h"

namespace booster::dist::detail {

namespace {
c10::Device backend_device(const DeviceBackendEntry& entry) {
  return entry.device_type == c10::kCUDA && cuda_device_count() > 0
             ? c10::Device(c10::kCUDA, at::accelerator::getDeviceIndex())
             : c10::Device(entry.device_type);
}
}  // namespace

void attach_device_backend(ProcessGroup::Impl& group, const c10::intrusive_ptr<c10d::Store>& store,
                           const c10::intrusive_ptr<c10d::ProcessGroup>& parent, std::chrono::milliseconds timeout,
                           int split_color) {
  const std::string& name = group.device_backend;
  DeviceBackendEntry entry = find_device_backend(name);
  if (!entry.factory && name == "nccl") {
    try {
      load_cuda_support();
    } catch (const std::exception& e) {
      throw DistError("booster: backend \"nccl\" needs CUDA support: " + std::string(e.what()));
    }
    entry = find_device_backend(name);
  }
  if (!entry.factory)
    throw DistError("booster: backend \"" + name + "\" is not registered (no library registered it with "
                    "booster::dist::register_device_backend); use backend = \"gloo\"");
  DeviceBackendRequest request;
  request.store = c10::make_intrusive<c10d::PrefixStore>("device/", store);
  request.rank = group.rank;
  request.size = group.size;
  request.timeout = timeout;
  request.device = backend_device(entry);
  request.split_color = parent ? split_color : -1;
  if (parent) {
    try {
      request.parent = parent->getBackend(entry.device_type);
    } catch (const std::exception&) {
      request.parent.reset();  // the parent has none for this device (cannot happen for a sub-group of ours)
    }
  }
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = entry.factory(request);
  } catch (const std::exception& e) {
    throw DistError("booster: backend \"" + name + "\": creating it for a group of " + std::to_string(group.size) +
                    " rank(s), as its rank " + std::to_string(group.rank) + ", failed: " + e.what());
  }
  group.pg->setBackend(entry.device_type, entry.type, backend);
  group.device_type = entry.device_type;
}

void device_backend_non_member(const ProcessGroup::Impl& parent) {
  if (parent.device_backend.empty() || !parent.pg) return;
  const DeviceBackendEntry entry = find_device_backend(parent.device_backend);
  if (!entry.non_member) return;
  DeviceBackendRequest request;
  request.rank = parent.rank;
  request.size = parent.size;
  request.timeout = std::chrono::milliseconds(static_cast<int64_t>(parent.timeout_s * 1000));
  request.device = backend_device(entry);
  try {
    request.parent = parent.pg->getBackend(entry.device_type);
  } catch (const std::exception&) {
    return;  // the parent has no backend for this device: nothing to take part in
  }
  try {
    entry.non_member(request);
  } catch (const std::exception& e) {
    throw DistError("booster: backend \"" + parent.device_backend + "\": taking part, as rank " +
                    std::to_string(parent.rank) + " of its parent group of " + std::to_string(parent.size) +
                    ", in making a sub-group it is not in failed: " + e.what());
  }
}

bool on_device_backend(const ProcessGroup::Impl& group, const at::Tensor& t) {
  return !group.device_backend.empty() && t.defined() && t.device().type() == group.device_type && group.pg;
}

bool needs_staging(const ProcessGroup::Impl& group, const at::Tensor& t) {
  return t.defined() && !t.device().is_cpu() && !on_device_backend(group, t) && group.pg && group.size > 1;
}

Work staged(const std::vector<at::Tensor>& tensors, const std::vector<bool>& write_back,
            const std::function<Work(std::vector<at::Tensor>&)>& run) {
  auto host = std::make_shared<std::vector<at::Tensor>>();
  host->reserve(tensors.size());
  for (const auto& t : tensors) host->push_back(t.to(at::kCPU, /*non_blocking=*/false, /*copy=*/true));
  auto inner = std::make_shared<Work>(run(*host));
  auto impl = std::make_shared<Work::Impl>();
  impl->what = "staged collective";
  impl->ready = [inner]() { return inner->is_completed(); };
  impl->finish = [inner, host, tensors, write_back]() mutable {
    inner->wait();
    for (size_t i = 0; i < tensors.size(); ++i)
      if (write_back[i]) tensors[i].copy_((*host)[i]);
  };
  return Work(impl);
}

}  // namespace booster::dist::detail

namespace booster::dist::detail {

c10d::ReduceOp device_reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::SUM: return c10d::ReduceOp::SUM;
    case ReduceOp::AVG: return c10d::ReduceOp::AVG;
    case ReduceOp::MAX: return c10d::ReduceOp::MAX;
    case ReduceOp::MIN: return c10d::ReduceOp::MIN;
    case ReduceOp::PRODUCT: return c10d::ReduceOp::PRODUCT;
  }
  return c10d::ReduceOp::SUM;
}

}  // namespace booster::dist::detail
