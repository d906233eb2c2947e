// process_group_impl.h — private to libbooster: the state behind dist::ProcessGroup and dist::Work,
// shared by process_group.cpp (rendezvous, sub-groups, collectives) and process_group_p2p.cpp
// (point-to-point).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "booster/dist/process_group.h"
#include "gloo_backend.h"
#include "health.h"

namespace booster::dist {

struct Work::Impl {
  c10::intrusive_ptr<c10d::Work> work;  // null for a work that finished synchronously
  std::function<void()> finish;         // runs once after the backend work completed
  std::function<bool()> ready;          // a work made of parts: whether all of them completed
                                        // (null: the backend work's state decides)
  std::string what;                     // "allreduce of 1048576 float elements" for errors
  bool done = false;
  std::shared_ptr<detail::Health> health;  // names unresponsive ranks when the work fails
  bool world = false;                      // the work is on the world group
};

struct ProcessGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;  // the world's store; sub-groups share it
  std::shared_ptr<const detail::GlooTransport> gloo;  // the transport sub-groups share
  c10::intrusive_ptr<c10d::ProcessGroup> pg;  // Gloo for CPU tensors; null for a sub-group of one rank
  int rank = 0;
  int size = 1;
  std::string backend;
  double timeout_s = 1800;
  // Whether the backend's own AVG / bf16 are used; for Gloo both are emulated (process_group.h).
  bool native_avg = false;
  bool native_bf16 = false;
  // The device backend beside Gloo ("nccl" for CUDA tensors; "" when none): collectives on tensors
  // of device_type go to it natively (AVG and bf16 included); tensors of that device on a group
  // without one are staged through host memory (detail::staged).
  std::string device_backend;
  c10::DeviceType device_type = c10::kCPU;
  // Store keys of the sub-groups made from this group start with key_prefix + "/"; each
  // new_group/split call takes the next id, on every rank, so the prefixes agree across ranks.
  std::string key_prefix = "booster_groups";
  int64_t next_child_id = 0;
  std::vector<int> ranks_in_parent;
  std::vector<int> global_ranks;
  std::shared_ptr<detail::Health> health;  // the world's heartbeats (null for one rank)
  bool world = false;                      // this is the world group (its collectives are counted)
  int64_t allreduce_sequence = 0;          // bf16 allreduces issued (tags of their all-gather halves)
};

namespace detail {

// "allreduce of 1048576 float elements": the start of an error message.
std::string describe(const char* op, const at::Tensor& t);
// A Work over the backend's work `w` (null: finished synchronously); `finish` runs once after it.
// `group` (the issuing group; null for point-to-point) counts it for the health check and lets a
// failure name the ranks that did not answer.
Work make_work(c10::intrusive_ptr<c10d::Work> w, std::function<void()> finish, std::string what,
               const ProcessGroup::Impl* group = nullptr);

// One Gloo send (send = true) or recv of `tensor` with rank `peer` of `pg` on `wire_tag`; the Work
// keeps the tensor alive. DistError naming `what` when Gloo refuses it.
Work post_p2p(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, bool send, const at::Tensor& tensor, int peer,
              int wire_tag, std::string what);
// bf16 allreduce of `tensor` (contiguous) on `group`: reduce-scatter then all-gather of even
// ranges, both pairwise (process_group_scatter.cpp).
Work allreduce_by_halves(ProcessGroup::Impl& group, at::Tensor& tensor, ReduceOp op, std::string what);

// process_group_device.cpp: the device backend and host staging.
// Sets the device backend named group.device_backend (registered in booster/dist/device_backend.h;
// "nccl" loads CUDA support first) beside Gloo on group.pg, connected through `store` (the group's
// own prefix). `parent`: the parent group's pg for a sub-group, null for the world. Throws DistError
// naming the backend when it is not registered or its factory fails. split_color: the
// DeviceBackendRequest's (-1 for the world).
void attach_device_backend(ProcessGroup::Impl& group, const c10::intrusive_ptr<c10d::Store>& store,
                           const c10::intrusive_ptr<c10d::ProcessGroup>& parent, std::chrono::milliseconds timeout,
                           int split_color = -1);
// On a rank of `parent` that gets no device backend from a new_group / split call: the registered
// backend's non-member hook (DeviceBackendNonMember), if the parent has a device backend and the
// entry a hook. Throws DistError naming the backend when the hook fails.
void device_backend_non_member(const ProcessGroup::Impl& parent);
// Whether a collective on `t` goes to the group's device backend (t on its device type).
bool on_device_backend(const ProcessGroup::Impl& group, const at::Tensor& t);
// Whether `t` lives on a device whose collectives this group has no backend for (a CUDA tensor on a
// Gloo-only group): the collective runs on host copies.
bool needs_staging(const ProcessGroup::Impl& group, const at::Tensor& t);
// A collective over host copies of `tensors` (device tensors): `run` gets the copies (made on the
// caller's stream, synchronously) and issues the collective on them; waiting for the returned Work
// waits for it, then copies back the tensors whose write_back flag is set.
// The c10d op of `op` on a device backend (NCCL has AVG natively).
c10d::ReduceOp device_reduce_op(ReduceOp op);
Work staged(const std::vector<at::Tensor>& tensors, const std::vector<bool>& write_back,
            const std::function<Work(std::vector<at::Tensor>&)>& run);

}  // namespace detail
}  // namespace booster::dist
