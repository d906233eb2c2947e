// device_backend.h — the seam where a device's collective backend (NCCL for CUDA) plugs into
// dist::ProcessGroup. Included by backend implementations (libbooster_cuda.so registers "nccl"),
// not by trainers or plugins.
//
// c10d's layering (as torch.distributed's `backend="cpu:gloo,cuda:nccl"`): a c10d::ProcessGroup holds
// one c10d::Backend per device type and routes each collective to the backend of its tensors' device.
// Every booster group has Gloo for CPU tensors; a registered device backend is set beside it for
// its device type when the group is made with that backend name.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "booster/export.h"

namespace booster::dist {

// What a factory gets for one group: the group's store (already under the group's own key prefix),
// this rank in the group, the group's size, the per-collective timeout, the device of this rank
// (e.g. cuda:0), and the parent group's backend of the same name when the group is a sub-group
// (null for the world): a factory may split its communicator from it (ncclCommSplit).
struct DeviceBackendRequest {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{1800000};
  c10::Device device{c10::kCPU};
  c10::intrusive_ptr<c10d::Backend> parent;
};

// Makes the backend of one group. Throws (any std::exception) when it cannot; the process group
// reports it as DistError naming the backend and the group.
using DeviceBackendFactory = std::function<c10::intrusive_ptr<c10d::Backend>(const DeviceBackendRequest&)>;

// Registers `factory` as backend `name` (e.g. "nccl") for tensors of `device_type` (e.g. CUDA), with
// `type` the c10d backend type it reports. Registering a name twice replaces the factory (the last
// one wins). Thread-safe.
BOOSTER_API void register_device_backend(const std::string& name, c10::DeviceType device_type,
                                         c10d::ProcessGroup::BackendType type, DeviceBackendFactory factory);

// The registered backend `name`, or an entry whose factory is empty when none is.
struct DeviceBackendEntry {
  c10::DeviceType device_type = c10::kCPU;
  c10d::ProcessGroup::BackendType type = c10d::ProcessGroup::BackendType::UNDEFINED;
  DeviceBackendFactory factory;
};
BOOSTER_API DeviceBackendEntry find_device_backend(const std::string& name);

}  // namespace booster::dist
