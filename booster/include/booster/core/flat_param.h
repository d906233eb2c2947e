// flat_param.h — one shard unit's parameters as a FlatParameter sharded across a group: the
// mechanism of ZeRO-3 (Rajbhandari et al., SC20) as PyTorch FSDP implements it (its
// FlatParameter / FlatParamHandle: flatten, pad to a multiple of the group size, keep one shard,
// all-gather before use, free after). FSDP uses it per unit; Gemini's chunks and the hybrid
// plugin's ZeRO over dp reuse it.
//
// Invariants:
//  - The unit's parameters (one dtype, one device) are laid out back to back in one flat buffer of
//    layout().padded_numel elements (FlatLayout, padded so every rank of the group gets
//    shard_numel elements). Each parameter is a view of its slice of that buffer (Tensor::set_data:
//    identity, name, requires_grad and autograd metadata are kept), in every state.
//  - SHARDED (the resting state): the flat buffer's storage has no memory (0 bytes, no data pointer:
//    the C++ counterpart of FSDP's `_free_storage`, storage.resize_(0)); a parameter must not be
//    read then (its storage has no memory: the owner unshards before every use). Only
//    local_shard() ([shard_numel], owned) holds this rank's values.
//  - UNSHARDED: the storage is reallocated (padded_numel * element size bytes) and filled by an
//    all-gather of every rank's local shard, so every parameter view has its full value. Tensors that
//    autograd saved during forward are views of the same storage, so resharding after forward and
//    unsharding before backward gives the same gradients as never freeing (tested).
//  - Gradients: after backward in the UNSHARDED state, reduce_gradients() packs every parameter's
//    .grad() into a flat buffer, reduce-scatters it with AVG over the group and accumulates this
//    rank's part into local_grad() ([shard_numel], the shard's gradient); the parameters' .grad()
//    are released.
// Not thread-safe. Collective calls (unshard, reduce_gradients) must be made by every rank of the
// group in the same order.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "booster/core/flat_layout.h"
#include "booster/export.h"

namespace booster {
namespace dist {
class ProcessGroup;
}

class BOOSTER_API FlatParameter {
 public:
  enum class State { kSharded, kUnsharded };

  // params: (name, parameter) of one unit, registration order; all the same dtype and device,
  // non-empty list, no tensor twice. Their current values become the content (every rank must pass
  // identical values: the plugin broadcasts them first). Leaves the FlatParameter SHARDED.
  // Throws std::invalid_argument for an empty list, mixed dtypes/devices, a repeated tensor, or a
  // null group.
  FlatParameter(std::vector<std::pair<std::string, at::Tensor>> params, std::shared_ptr<dist::ProcessGroup> group);
  ~FlatParameter();
  FlatParameter(const FlatParameter&) = delete;
  FlatParameter& operator=(const FlatParameter&) = delete;

  State state() const { return state_; }
  const FlatLayout& layout() const { return layout_; }
  const std::vector<std::pair<std::string, at::Tensor>>& params() const { return params_; }
  dist::ProcessGroup& group() const { return *group_; }

  // This rank's shard of the flat parameter: [shard_numel], the parameters' dtype; the optimizer
  // steps this tensor. Elements past the unpadded numel are padding (kept at zero by the caller).
  at::Tensor& local_shard() { return local_shard_; }
  // The shard's gradient: [shard_numel], undefined until the first reduce_gradients().
  at::Tensor& local_grad() { return local_grad_; }

  // SHARDED -> UNSHARDED: allocates the flat storage and all-gathers the local shards into it
  // (collective over the group). No-op when already UNSHARDED.
  void unshard();
  // UNSHARDED -> SHARDED: frees the flat storage (0 bytes). The local shard is not updated from the
  // full buffer (parameters are read-only between unshard and reshard; updates go to local_shard()).
  // No-op when already SHARDED.
  void reshard();
  // Bytes the flat storage holds now: padded_numel * element size when UNSHARDED, 0 when SHARDED.
  int64_t unsharded_storage_bytes() const;

  // Collective; requires UNSHARDED. Averages the parameters' gradients over the group and adds this
  // rank's shard of the average into local_grad() (created as zeros on first use); parameters
  // without a gradient contribute zeros. Releases every parameter's .grad(). The reduction is a
  // reduce-scatter with AVG of a [padded_numel] buffer in the parameters' dtype.
  // Throws std::logic_error when SHARDED.
  void reduce_gradients();

 private:
  void allocate_storage();
  void free_storage();

  std::vector<std::pair<std::string, at::Tensor>> params_;
  std::shared_ptr<dist::ProcessGroup> group_;
  FlatLayout layout_;
  at::Tensor full_;         // [padded_numel]; the parameters are views of it
  at::Tensor local_shard_;  // [shard_numel], owned
  at::Tensor local_grad_;   // [shard_numel]
  State state_ = State::kUnsharded;
};

}  // namespace booster
