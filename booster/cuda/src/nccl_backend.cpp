// nccl_backend.cpp — registers "nccl" (c10d::ProcessGroupNCCL) as the CUDA collective backend of
// dist::ProcessGroup (booster/dist/device_backend.h). Compiled into libbooster_cuda.so only, so
// libbooster.so never links LibTorch's CUDA library or NCCL.
//
// Each group gets its own ProcessGroupNCCL over the group's prefixed store, bound to the current CUDA
// device (select_device, booster/device.h, set it before the rendezvous); its NCCL communicator
// is made when the group is (eager init), a sub-group's split from its parent's (ncclCommSplit). Collectives run on NCCL's own
// stream and are ordered after the work queued on the caller's current stream (c10d's CUDA events);
// Work::wait() makes the current stream wait for them without blocking the host.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstdlib>
#include <optional>
#include <mutex>
#include <vector>

#include "booster/dist/device_backend.h"

namespace booster::cuda_support {
namespace {

// Every NCCL backend made in this process (weak: a group's owner frees it). At exit, before the CUDA
// runtime unloads, the live ones are shut down (c10d's destroy_process_group) and then kept alive
// for good: ProcessGroupNCCL's destructor switches CUDA devices, and run from a static destructor
// after the runtime unloaded it throws ("driver shutting down") and aborts the process.
std::mutex backends_mutex;
std::vector<c10::weak_intrusive_ptr<c10d::ProcessGroupNCCL>>& backends() {
  static auto* list = new std::vector<c10::weak_intrusive_ptr<c10d::ProcessGroupNCCL>>();  // never destroyed
  return *list;
}

void shut_down_backends() {
  std::vector<c10::intrusive_ptr<c10d::ProcessGroupNCCL>> live;
  {
    std::lock_guard<std::mutex> lock(backends_mutex);
    for (auto& w : backends())
      if (auto p = w.lock()) live.push_back(std::move(p));
    backends().clear();
  }
  for (auto& pg : live) {
    try {
      pg->shutdown();
    } catch (const std::exception&) {
      // exiting anyway: a communicator that cannot be shut down is left to the driver
    }
    (void)pg.release();  // one reference never dropped: the destructor never runs
  }
}

// The parent's ProcessGroupNCCL when its communicator on `device` exists (it was connected eagerly
// on that device, as every group here is), else null: only then can a sub-group split from it.
c10::intrusive_ptr<c10d::ProcessGroupNCCL> splittable_parent(const dist::DeviceBackendRequest& r) {
  auto parent = c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupNCCL>(r.parent);
  if (!parent || !r.device.is_cuda() || parent->getBoundDeviceId() != std::optional<at::Device>(r.device)) return {};
  return parent;
}

// Every group's communicator is made here, eagerly, on the rank's device (torch.distributed's
// init_process_group(device_id=...) / eager_connect_single_device), so that a sub-group's is split
// from its parent's with ncclCommSplit (c10d's split_from / split_color) at the same point of the
// program on every rank of the parent: members here, the others in nccl_non_member. Where the parent
// has no communicator on this device (not bound to it) the sub-group's is made by ncclCommInitRank.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const dist::DeviceBackendRequest& r) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = r.timeout;
  if (auto parent = splittable_parent(r); parent && r.split_color >= 0) {
    options->split_from = parent;
    options->split_color = r.split_color;
  }
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(r.store, r.rank, r.size, options);
  if (r.device.is_cuda()) {
    pg->setBoundDeviceId(r.device);
    pg->eagerConnectSingleDevice(r.device);
  }
  std::lock_guard<std::mutex> lock(backends_mutex);
  // Registered after the CUDA runtime started (the backend's constructor initialised it), so it runs
  // before the runtime's own exit handlers.
  static const bool registered = (std::atexit(&shut_down_backends), true);
  (void)registered;
  backends().emplace_back(pg);
  return pg;
}

// A parent rank left out of a sub-group takes part in the parent's ncclCommSplit with
// NCCL_SPLIT_NOCOLOR (c10d's performNocolorSplit), as torch.distributed.new_group does.
void nccl_non_member(const dist::DeviceBackendRequest& r) {
  if (auto parent = splittable_parent(r)) parent->performNocolorSplit(r.device);
}

struct Registration {
  Registration() {
    dist::register_device_backend("nccl", c10::kCUDA, c10d::ProcessGroup::BackendType::NCCL, &make_nccl_backend,
                                  &nccl_non_member);
  }
};
const Registration registration;

}  // namespace
}  // namespace booster::cuda_support
