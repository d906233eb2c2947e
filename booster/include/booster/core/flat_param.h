// flat_param.h — one shard unit's parameters as a FlatParameter sharded across a group: the
// mechanism of ZeRO-3 (Rajbhandari et al., SC20) as PyTorch FSDP implements it (its
// FlatParameter / FlatParamHandle: flatten, pad to a multiple of the group size, keep one shard,
// all-gather before use, free after). FSDP uses it per unit; Gemini's chunks and the hybrid
// plugin's ZeRO over dp reuse it.
//
// Invariants:
//  - The unit's parameters (one dtype, one device) are laid out back to back in one flat buffer of
//    layout().padded_numel elements (FlatLayout, padded so every rank of the shard group gets
//    shard_numel elements). Each parameter is a view of its slice of that buffer (Tensor::set_data:
//    identity, name, requires_grad and autograd metadata are kept), in every state. The buffer's
//    dtype is the compute dtype (options.compute_dtype, FSDP's MixedPrecision.param_dtype; default
//    the parameters' own dtype), so the parameters have that dtype from construction on.
//  - local_shard() ([shard_numel], the parameters' ORIGINAL dtype: full precision, owned) holds this
//    rank's values at every moment; the optimizer updates it. Its owner may move it to another device
//    (Gemini keeps an offloaded shard in host memory beside a CUDA buffer): unshard_async() queues its
//    copy to the flat buffer's device (non_blocking: from pinned memory the host does not wait, as
//    FSDP2's offloaded all-gather inputs), so the shard must not be written on the host before
//    wait_shard_reads(); gather_full() copies it blocking; local_grad() stays on the flat buffer's
//    device unless its owner moves it.
//  - SHARDED (the resting state): the flat buffer's storage has no memory (0 bytes, no data pointer:
//    the C++ counterpart of FSDP's `_free_storage`, storage.resize_(0)); a parameter must not be
//    read then (the owner unshards before every use).
//  - UNSHARDED: the storage is reallocated (padded_numel * compute element size bytes) and filled by
//    an all-gather of every rank's local shard, cast to the compute dtype, so every parameter view
//    has its full value. Tensors that autograd saved during forward are views of the same storage,
//    so resharding after forward and unsharding before backward gives the same gradients as never
//    freeing (tested).
//  - A shard group of ONE rank with the compute dtype equal to the parameters' dtype (FSDP's
//    NO_SHARD), unless options.keep_shard_apart: local_shard() is the flat buffer itself; it is never freed, unshard() and reshard()
//    change nothing and the state stays UNSHARDED.
//  - Gradients: reduce_gradients() packs every parameter's .grad() into a flat buffer of the reduce
//    dtype, reduce-scatters it with AVG over the shard group, averages the shard over the replicate
//    group when there is one (HYBRID_SHARD, NO_SHARD: FSDP's allreduce across replicas), and adds it
//    to local_grad() ([shard_numel], local_shard()'s dtype); the parameters' .grad() are released.
// Not thread-safe. Collective calls (unshard, reduce_gradients, gather_full) must be made by every
// rank of the groups in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "booster/core/flat_layout.h"
#include "booster/dist/process_group.h"
#include "booster/export.h"

namespace booster {

class StreamEvent;  // booster/device.h

struct FlatParameterOptions {
  // dtype of the gathered parameters the forward and backward see (FSDP MixedPrecision.param_dtype);
  // Undefined: the parameters' own dtype.
  at::ScalarType compute_dtype = at::ScalarType::Undefined;
  // dtype of the gradient reduction (FSDP MixedPrecision.reduce_dtype); Undefined: compute dtype.
  at::ScalarType reduce_dtype = at::ScalarType::Undefined;
  // Ranks holding the same shard (HYBRID_SHARD's replicas, NO_SHARD's whole world): shard gradients
  // are averaged over it after the reduce-scatter. null or one rank: none.
  std::shared_ptr<dist::ProcessGroup> replicate_group;
  // Float8 e4m3 on the wire (ColossalAI's fp8_communication, dist/fp8.h): unshard quantizes the
  // local shard (cast to the compute dtype first) with its own scale and all-gathers fp8 + scales
  // (dist::fp8_all_gather_into_tensor), so the gathered parameters are the shards rounded to e4m3
  // (relative error <= 2^-4, see fp8.h) while local_shard() keeps full precision; reduce_gradients
  // reduce-scatters the flat gradient (divided by the group size first) with
  // dist::fp8_reduce_scatter_in_place. The replicate group's allreduce and gather_full (checkpoints)
  // stay exact. No effect on a shard group of one rank.
  bool fp8_communication = false;
  // Keep local_shard() a tensor of its own even for a shard group of one rank with the compute dtype
  // equal to the parameters' (no NO_SHARD aliasing): its owner may then move the shard to another
  // device (FSDP's cpu_offload), and the flat buffer is freed and gathered as for a sharded one.
  bool keep_shard_apart = false;
};

class BOOSTER_API FlatParameter {
 public:
  enum class State { kSharded, kUnsharded };

  // params: (name, parameter) of one unit, registration order; all the same floating dtype and
  // device, non-empty list, no tensor twice. Their current values become the content (every rank
  // of the shard group must pass identical values: the plugin broadcasts or verifies them first).
  // Leaves the FlatParameter SHARDED (UNSHARDED in the NO_SHARD case above).
  // Throws std::invalid_argument for an empty list, mixed dtypes/devices, a repeated tensor, a null
  // group, or a non-floating compute/reduce dtype.
  FlatParameter(std::vector<std::pair<std::string, at::Tensor>> params, std::shared_ptr<dist::ProcessGroup> group,
                FlatParameterOptions options = {});
  ~FlatParameter();
  FlatParameter(const FlatParameter&) = delete;
  FlatParameter& operator=(const FlatParameter&) = delete;

  State state() const { return state_; }
  const FlatLayout& layout() const { return layout_; }
  const std::vector<std::pair<std::string, at::Tensor>>& params() const { return params_; }
  dist::ProcessGroup& group() const { return *group_; }
  const std::shared_ptr<dist::ProcessGroup>& replicate_group() const { return options_.replicate_group; }
  at::ScalarType compute_dtype() const { return options_.compute_dtype; }
  // The parameters' original dtype: local_shard()'s, gather_full()'s.
  at::ScalarType shard_dtype() const { return local_shard_.scalar_type(); }
  // true in the NO_SHARD case (local_shard() is the flat buffer; never freed).
  bool is_aliased() const { return aliased_; }

  // This rank's shard of the flat parameter: [shard_numel], the parameters' original dtype; the
  // optimizer steps this tensor. Elements past the unpadded numel are padding (they get zero
  // gradients, so elementwise optimizers keep them at zero). A shard kept in host memory beside an
  // accelerator buffer: call wait_shard_reads() before writing it.
  at::Tensor& local_shard() { return local_shard_; }
  // Blocks until the device has read every queued copy of a host local shard (a StreamEvent
  // recorded after the last unshard_async() that copied it); returns at once when none is queued
  // (the shard and the buffer on one device, or a CPU buffer). load_full() calls it.
  void wait_shard_reads();
  // The shard's gradient: [shard_numel], local_shard()'s dtype; undefined until the first
  // reduce_gradients() (and after the owner resets it).
  at::Tensor& local_grad() { return local_grad_; }

  // SHARDED -> UNSHARDED: allocates the flat storage and all-gathers the local shards into it
  // (collective over the shard group), or completes an unshard_async() in flight. No-op when
  // UNSHARDED.
  void unshard();
  // Starts the all-gather of unshard() and returns without waiting (prefetching): the storage is
  // allocated now, the values arrive by the next unshard(), which must be called before any use.
  // No-op when UNSHARDED or already in flight. Collective like unshard().
  void unshard_async();
  // true between unshard_async() and the unshard() that completes it.
  bool unshard_in_flight() const { return pending_.has_value(); }
  // UNSHARDED -> SHARDED: frees the flat storage (0 bytes), waiting first for an all-gather in
  // flight. The local shard is not updated from the full buffer (parameters are read-only between
  // unshard and reshard; updates go to local_shard()). No-op when SHARDED or aliased.
  void reshard();
  // Bytes the flat storage holds now: padded_numel * compute element size when UNSHARDED, 0 when
  // SHARDED.
  int64_t unsharded_storage_bytes() const;

  // Collective over the shard group, then the replicate group. Averages the parameters' gradients
  // over both and adds this rank's shard of the average into local_grad() (created as zeros on first
  // use); parameters without a gradient contribute zeros. Releases every parameter's .grad(). Works
  // in either state (it reads only the .grad() tensors). reduce_gradients_async() then
  // finish_reduce().
  void reduce_gradients();
  // The first half: packs the gradients into a flat buffer of the reduce dtype ([padded_numel]; the
  // .grad() are released) and starts its reduce-scatter without waiting for it, so it runs while the
  // caller goes on (FSDP2 keeps one reduce-scatter in flight until the next is issued). The packed
  // buffer stays alive until finish_reduce(). fp8_communication reduces at once. Finishes a
  // reduction in flight first.
  void reduce_gradients_async();
  // The second half: waits for the reduce-scatter (dist::Work::wait: on an accelerator the current
  // stream waits, not the host), averages the shard over the replicate group and adds it into
  // local_grad(). No-op when none is in flight. Rethrows the collective's dist::DistError.
  void finish_reduce();
  bool reduce_in_flight() const { return reducing_.has_value(); }

  // Collective over the shard group: the whole flat parameter in full precision, [padded_numel],
  // shard_dtype(), a new tensor on the flat buffer's device (the unit's values for a checkpoint).
  // Any state.
  at::Tensor gather_full();
  // Local: takes this rank's shard of `flat` ([padded_numel] or [numel], any floating dtype: cast)
  // into local_shard(), and into the gathered buffer when UNSHARDED. Throws std::invalid_argument
  // for another numel.
  void load_full(const at::Tensor& flat);

 private:
  void allocate_storage();
  void free_storage();
  void finish_pending();

  struct Pending {
    dist::Work work;
    at::Tensor input;  // the cast local shard the all-gather reads (kept alive until done)
  };

  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::shared_ptr<dist::ProcessGroup> group_;
  FlatParameterOptions options_;
  FlatLayout layout_;
  at::Tensor full_;         // [padded_numel], compute dtype; the parameters are views of it
  at::Tensor local_shard_;  // [shard_numel], original dtype, owned (or full_ when aliased)
  at::Tensor local_grad_;   // [shard_numel]
  std::optional<Pending> pending_;
  struct Reducing {
    dist::Work work;       // the reduce-scatter (empty: done already)
    at::Tensor flat_grad;  // its input, alive until it is done
    at::Tensor shard_grad;  // [shard_numel], reduce dtype: its output
  };
  std::optional<Reducing> reducing_;
  std::unique_ptr<StreamEvent> shard_read_;  // after the last queued host-to-device shard copy
  bool aliased_ = false;
  State state_ = State::kUnsharded;
};

}  // namespace booster
