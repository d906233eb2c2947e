// shard_optimizer.h — the optimizer wrapper of a sharded runtime (sharded_runtime.h): the user's
// optimizer steps one tensor per trainable FlatParameter — its "stepped" tensor: the local shard
// under fully_shard (torch_fsdp), the float32 master shard under Gemini — as PyTorch FSDP's optimizer
// sees the sharded FlatParameters. Any elementwise optimizer registered in
// optim/optimizer_registry.h works unchanged and its state exists only for the shard.
//
// What it does for every layout, so a layout adds only its step and placement:
//  - binding: the optimizer's param group g holds the stepped tensors of the shards of group g, in
//    shard order; the group options are kept; parameters() still lists the model's parameters
//    (checkpoint names). State the optimizer had before binding (Adagrad creates its sums eagerly,
//    or a state loaded earlier) is re-cut into the shards.
//  - checkpoints: gathered (gather_param_states: every rank of a shard's group takes part) or
//    sharded (local_state_pieces: this rank's pieces of each state tensor, FlatLayout::piece, nothing
//    gathered); either loads through load_state_ranges, which reads only this rank's ranges. The
//    state of a shard the optimizer never stepped (its FlatParameter got no gradient) is absent on
//    every rank of its group alike.
// Errors: std::invalid_argument for an optimizer type that is not registered (construction), and
// for load_state_ranges given another number of sources than parameters().
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "booster/core/flat_param.h"
#include "booster/dist/process_group.h"
#include "booster/export.h"
#include "booster/wrappers/optimizer_wrapper.h"

namespace booster::parallel {

class BOOSTER_API ShardOptimizer : public OptimizerWrapper {
 public:
  std::vector<ParamOptimState> gather_param_states() override;
  std::vector<checkpoint::StatePiece> local_state_pieces() override;
  std::vector<std::map<std::string, int64_t>> local_state_scalars() override;
  void load_state_ranges(const std::vector<ParamStateSource>& sources, const StateRangeReader& read) override;
  void sync_master_from_model() override {}  // the shards are the weights (the checkpoint IO loads them)
  // The shard group has more than one rank.
  bool state_is_sharded() const override { return shard_group_->size() > 1; }

  // One trainable FlatParameter as the optimizer sees it.
  struct Shard {
    FlatParameter* flat = nullptr;
    at::Tensor stepped;               // [shard_numel]: the tensor in the optimizer's param group
    std::vector<size_t> param_index;  // index in parameters() of each of flat's parameters
    size_t flat_index = 0;            // its index in the runtime's flats()
  };
  const std::vector<Shard>& shards() const { return shards_; }

 protected:
  // Checks that the optimizer type is registered and keeps the state it already has for rebinding.
  // shard_group: the group the FlatParameters shard over (the gradient norm sums over it).
  // Throws std::invalid_argument without a shard group.
  ShardOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                 OptimizerWrapperOptions options, std::shared_ptr<dist::ProcessGroup> shard_group);
  // The shards' reduced gradients (FlatParameter::local_grad) that are defined.
  std::vector<torch::Tensor> local_gradients() const override;
  // The shard group when it has more than one rank: every element is counted once.
  dist::ProcessGroup* norm_group() const override { return shard_group_->size() > 1 ? shard_group_.get() : nullptr; }
  // Makes the optimizer's param groups the shards' stepped tensors. groups[k]: the optimizer
  // parameter group of shards[k]. The first call also re-cuts the state the optimizer had at
  // construction into the shards.
  void bind_shards(std::vector<Shard> shards, const std::vector<int>& groups);
  // Index in parameters() of a model parameter (std::out_of_range for a tensor that is not one).
  size_t param_index_of(const at::Tensor& p) const { return index_of_.at(p.unsafeGetTensorImpl()); }

  // Before the checkpoint functions read or write state: bind the current shards; with
  // `need_tensors`, bring every state tensor into memory (Gemini's offload tier).
  virtual void prepare_state_access(bool need_tensors) { (void)need_tensors; }
  // Whether this rank writes shard s's pieces (replicated shards: one replica only).
  virtual bool saves_pieces(const Shard& s) const { (void)s; return true; }
  // After load_state_ranges replaced the state.
  virtual void after_state_load() {}

  std::vector<Shard> shards_;

 private:
  std::shared_ptr<dist::ProcessGroup> shard_group_;
  std::map<const void*, size_t> index_of_;   // model parameter -> index in parameters()
  std::vector<ParamOptimState> existing_;    // the state at construction, until the first binding
  bool had_state_ = false, bound_ = false;
};

}  // namespace booster::parallel
