// nccl_backend.cpp — registers "nccl" (c10d::ProcessGroupNCCL) as the CUDA collective backend of
// dist::ProcessGroup (booster/dist/device_backend.h). Compiled into libbooster_cuda.so only, so
// libbooster.so never links LibTorch's CUDA library or NCCL.
//
// Each group gets its own ProcessGroupNCCL over the group's prefixed store; its NCCL communicator
// is made at the group's first CUDA collective (c10d's lazy init) on the current CUDA device, which
// select_device (booster/core/device.h) set before the rendezvous. Collectives run on NCCL's own
// stream and are ordered after the work queued on the caller's current stream (c10d's CUDA events);
// Work::wait() makes the current stream wait for them without blocking the host.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "booster/dist/device_backend.h"

namespace booster::cuda_support {
namespace {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const dist::DeviceBackendRequest& r) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = r.timeout;
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(r.store, r.rank, r.size, options);
  return pg;
}

struct Registration {
  Registration() {
    dist::register_device_backend("nccl", c10::kCUDA, c10d::ProcessGroup::BackendType::NCCL, &make_nccl_backend);
  }
};
const Registration registration;

}  // namespace
}  // namespace booster::cuda_support
