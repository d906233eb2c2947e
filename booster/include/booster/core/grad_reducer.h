// grad_reducer.h — bucketed, overlapped gradient averaging for data parallelism (the DDP reducer).
//
// Algorithm after PyTorch's c10d::Reducer (torch/csrc/distributed/c10d/reducer.cpp) and
// Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020:
//  - parameters are assigned to buckets in reverse registration order (gradients of the last
//    layers are ready first), a new bucket when the dtype changes or the current one reached its cap;
//    the first bucket's cap is first_bucket_bytes (small, to start communicating early); with
//    rebuild_buckets they are assigned again, once, in the order their gradients became ready in
//    the first synced backward (PyTorch's Reducer::rebuild_buckets);
//  - a post hook on each parameter's gradient accumulator copies the gradient, divided by the world
//    size, into its bucket slice; when a bucket is full its asynchronous allreduce (SUM) is launched
//    while backward continues, buckets always launched in index order so every rank issues the same
//    sequence of collectives;
//  - a callback queued on the autograd engine runs at the end of backward: it waits for every bucket
//    and writes the averaged gradients back into param.grad(), so backward() returns with synced grads.
// How a full bucket is reduced is a strategy (BucketReduction): the default allreduces it (DDP);
// ZeRO reduce-scatters it along the shards (after DeepSpeed's stage-2 `average_tensor`), and at
// stage 2 releases param.grad() as soon as it was copied into the bucket.
// The reducer only talks to the network through booster::dist::ProcessGroup. Plugins reuse it.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "booster/export.h"

namespace booster {
namespace dist {
class ProcessGroup;
}

// One bucket as the strategy sees it.
struct BucketView {
  std::vector<size_t> params;    // parameter indices (into named_params), ascending
  std::vector<int64_t> offsets;  // element offset of each parameter in `flat`
  at::Tensor flat;               // [numel] gradients of `params`, divided by the world size; dtype:
                                 // ReducerOptions::communication_dtype or the parameters' dtype
};

// How a bucket is reduced (strategy). launch() is called once per synced backward for each bucket,
// in bucket order, identically on every rank; finish() after all buckets were launched, in the same
// order, at the end of backward. Implementations issue collectives only through dist::ProcessGroup.
class BOOSTER_API BucketReduction {
 public:
  virtual ~BucketReduction();
  // Starts the asynchronous reduction of bucket `index`.
  virtual void launch(size_t index, BucketView& bucket) = 0;
  // Waits for it (rethrows dist::DistError) and consumes the result.
  virtual void finish(size_t index, BucketView& bucket) = 0;
  // true: after finish() `flat` holds the averaged gradients and the reducer writes them back into
  // param.grad() (DDP); buckets persist. false: param.grad() is released as soon as it was copied
  // into its bucket and the strategy keeps what it needs in finish() (ZeRO-2); buckets are then
  // transient: allocated when their first gradient arrives, released after finish(), and finish()
  // may run during backward (at most two buckets in flight).
  virtual bool writes_back() const = 0;
};

// The default strategy: SUM-allreduce of the whole bucket (its values were divided by world size);
// fp8 = true: dist::fp8_allreduce (float8 e4m3 on the wire, one scale per bucket per rank,
// dist/fp8.h) instead of ProcessGroup::allreduce.
BOOSTER_API std::shared_ptr<BucketReduction> make_allreduce_reduction(std::shared_ptr<dist::ProcessGroup> group,
                                                                      bool fp8 = false);

// Whether a communication dtype means "float8 e4m3 on the wire" (at::kFloat8_e4m3fn): buckets then
// stay in the parameters' dtype and the reduction strategy quantizes them (dist/fp8.h).
inline bool is_fp8_wire(at::ScalarType t) { return t == at::kFloat8_e4m3fn; }

struct ReducerOptions {
  int64_t bucket_cap_bytes = 25LL << 20;   // bytes; ColossalAI/PyTorch bucket_cap_mb = 25
  int64_t first_bucket_bytes = 1LL << 20;  // bytes; PyTorch's _DEFAULT_FIRST_BUCKET_BYTES
  // Parameters that got no gradient on this rank by the end of backward contribute zeros (instead of
  // the job hanging); a parameter unused on every rank keeps its gradient untouched (as PyTorch).
  bool find_unused_parameters = false;
  // param.grad() becomes a view into its bucket: no copy in or out, less memory.
  bool gradient_as_bucket_view = false;
  // false: hooks only copy gradients into buckets; every bucket is launched at the end of backward
  // (ColossalAI's overlap_communication = false).
  bool overlap_communication = true;
  // Bucket dtype on the wire (e.g. at::kBFloat16 to halve the bytes); undefined (kUndefined) = the
  // parameters' dtype. Must equal the parameters' dtype with gradient_as_bucket_view, except
  // at::kFloat8_e4m3fn: the buckets keep the parameters' dtype and the default strategy sends them
  // as fp8 with one scale per bucket per rank (dist::fp8_allreduce; a quarter of fp32's bytes);
  // a custom `reduction` must honour it itself (ZeRO's does).
  at::ScalarType communication_dtype = at::ScalarType::Undefined;
  // Optional key per parameter (size = number of parameters): a new bucket starts where the key
  // changes (ZeRO: the optimizer's parameter group), as it does where the dtype changes.
  std::vector<int64_t> bucket_key;
  // null: make_allreduce_reduction(group).
  std::shared_ptr<BucketReduction> reduction;
  // PyTorch's rebuild_buckets: record the order in which gradients become ready in the first synced
  // backward and, at its end, assign the buckets again in that order (rank 0's order, broadcast, so
  // every rank launches the same buckets; parameters that got no gradient go last), once. Skipped
  // with find_unused_parameters (the order may change between iterations) unless static_graph.
  bool rebuild_buckets = false;
  // The graph is the same in every iteration (PyTorch's static_graph): allows the rebuild with
  // find_unused_parameters.
  bool static_graph = false;
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

  // Averages now, outside backward, what a synced backward would have: every parameter with an
  // accumulated .grad() contributes it, the others count as at the end of backward (zeros with
  // find_unused_parameters), and the averages are written back. For a synced pass in which no gradient hook ran, so no end-of-backward callback was queued
  // (a pipeline whose last backward on this rank reached no trainable parameter). A parameter whose
  // gradient arrived since the last synced pass, inside no_sync or not, counts as used (PyTorch's
  // local_used_map_). Collective over the group. Throws std::logic_error during a synced backward or
  // with require_grad_sync() false; std::runtime_error as the end of backward does (a parameter
  // without gradient when find_unused_parameters is false).
  void sync_now();
  // Synced passes finished (end-of-backward callbacks and sync_now calls) over the reducer's life.
  int64_t synced_backwards() const;

  // Parameter indices (into named_params) of each bucket (ascending within a bucket), bucket 0
  // first (launched first; it holds the last-registered parameters, or after a rebuild the first
  // ready ones).
  std::vector<std::vector<size_t>> bucket_indices() const;
  // Bytes of each bucket's flat buffer (communication buffers; with gradient_as_bucket_view they are
  // also the gradients).
  std::vector<int64_t> bucket_bytes() const;
  // Bytes of bucket memory held at most: all buckets for strategies that write back (they persist);
  // for the others (ZeRO-2) the largest few, since at most two launched buckets are unfinished
  // while the next one fills.
  int64_t resident_bucket_bytes() const;
  // Number of allreduces launched from gradient hooks before backward finished, over the life of
  // the reducer (a measure of overlap; buckets launched by the end-of-backward callback not counted).
  int64_t buckets_launched_during_backward() const;
  // The counters plugins report through ModelHooks::stats(): {"buckets": bucket count,
  // "buckets_launched_during_backward": as above, "buckets_rebuilt": 1 once rebuilt in ready order}.
  std::map<std::string, int64_t> stats() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace booster
