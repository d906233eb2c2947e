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
// (e.g. cuda:0), and for a sub-group the parent group's backend of the same name (null for the world)
// and split_color: a non-negative int that every member of this sub-group passes and that identifies
// its member set (a hash of the members' world ranks, as torch.distributed's _process_group_color),
// -1 for the world. A factory may split the sub-group's communicator from the parent's with that
// color (ncclCommSplit); the parent's ranks that get no backend from the same new_group / split call
// (not members, or members of a one-rank group) then call the backend's non-member hook, so a split
// that is collective over the parent sees every parent rank, in the same order of calls.
struct DeviceBackendRequest {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{1800000};
  c10::Device device{c10::kCPU};
  c10::intrusive_ptr<c10d::Backend> parent;
  int split_color = -1;
};

// Makes the backend of one group. Throws (any std::exception) when it cannot; the process group
// reports it as DistError naming the backend and the group.
using DeviceBackendFactory = std::function<c10::intrusive_ptr<c10d::Backend>(const DeviceBackendRequest&)>;
// Called on a parent group's rank that gets no backend from a new_group / split call (see
// DeviceBackendRequest): request.parent is the parent's backend, request.rank / size / device this
// rank's in the parent, split_color -1, store null. Throws as a factory does.
using DeviceBackendNonMember = std::function<void(const DeviceBackendRequest&)>;

// Registers `factory` as backend `name` (e.g. "nccl") for tensors of `device_type` (e.g. CUDA), with
// `type` the c10d backend type it reports, and `non_member` (may be empty) for the ranks of a
// parent group left out of a sub-group. Registering a name twice replaces the entry (the last one
// wins). A registered name is accepted as RendezvousOptions::backend (Gloo stays beside it for CPU
// tensors). Thread-safe.
BOOSTER_API void register_device_backend(const std::string& name, c10::DeviceType device_type,
                                         c10d::ProcessGroup::BackendType type, DeviceBackendFactory factory,
                                         DeviceBackendNonMember non_member = {});

// The registered backend `name`, or an entry whose factory is empty when none is.
struct DeviceBackendEntry {
  c10::DeviceType device_type = c10::kCPU;
  c10d::ProcessGroup::BackendType type = c10d::ProcessGroup::BackendType::UNDEFINED;
  DeviceBackendFactory factory;
  DeviceBackendNonMember non_member;
};
BOOSTER_API DeviceBackendEntry find_device_backend(const std::string& name);

}  // namespace booster::dist
