// grad_reducer.h — bucketed, overlapped gradient averaging for data parallelism (the DDP reducer).
//
// Algorithm after PyTorch's c10d::Reducer (torch/csrc/distributed/c10d/reducer.cpp) and
// Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020:
//  - parameters are assigned to buckets in reverse registration order (gradients of the last
//    layers are ready first), a new bucket when the dtype changes or the current one reached its cap;
//    the first bucket's cap is first_bucket_bytes (small, to start communicating early);
//  - a post hook on each parameter's gradient accumulator copies the gradient, divided by the world
//    size, into its bucket slice; when a bucket is full its asynchronous allreduce (SUM) is launched
//    while backward continues, buckets always launched in index order so every rank issues the same
//    sequence of collectives;
//  - a callback queued on the autograd engine runs at the end of backward: it waits for every bucket
//    and writes the averaged gradients back into param.grad(), so backward() returns with synced grads.
// The reducer only talks to the network through booster::dist::ProcessGroup. Plugins reuse it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "booster/export.h"

namespace booster {
namespace dist {
class ProcessGroup;
}

struct ReducerOptions {
  int64_t bucket_cap_bytes = 25LL << 20;   // bytes; ColossalAI/PyTorch bucket_cap_mb = 25
  int64_t first_bucket_bytes = 1LL << 20;  // bytes; PyTorch's _DEFAULT_FIRST_BUCKET_BYTES
  // Parameters that got no gradient on this rank by the end of backward contribute zeros (instead of
  // the job hanging); a parameter unused on every rank keeps its gradient untouched (as PyTorch).
  bool find_unused_parameters = false;
  // param.grad() becomes a view into its bucket: no copy in or out, less memory.
  bool gradient_as_bucket_view = false;
};

class BOOSTER_API GradientReducer {
 public:
  // named_params: (name, parameter) of every parameter with requires_grad, in registration order;
  // every rank must pass the same list (same order, shapes, dtypes). Throws std::invalid_argument
  // for an undefined or non-leaf parameter or a non-positive bucket cap.
  GradientReducer(std::vector<std::pair<std::string, torch::Tensor>> named_params,
                  std::shared_ptr<dist::ProcessGroup> group, ReducerOptions options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // false: hooks do nothing (gradients accumulate locally, e.g. inside no_sync); the accumulated
  // gradients are averaged on the first backward after it is set back to true.
  void set_require_grad_sync(bool required);
  bool require_grad_sync() const;

  // Parameter indices (into named_params) of each bucket, bucket 0 first (launched first).
  std::vector<std::vector<size_t>> bucket_indices() const;
  // Bytes of each bucket's flat buffer.
  std::vector<int64_t> bucket_bytes() const;
  // Number of allreduces launched from gradient hooks before backward finished, over the life of
  // the reducer (a measure of overlap; buckets launched by the end-of-backward callback not counted).
  int64_t buckets_launched_during_backward() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace booster
