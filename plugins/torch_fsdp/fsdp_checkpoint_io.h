// fsdp_checkpoint_io.h — checkpoints of an FSDP model without undoing its sharding.
//  - save_model streams: for one FlatParameter at a time every rank of the shard group all-gathers it
//    in full precision (FlatParameter::gather_full), rank 0 hands its parameters to the streamed HF
//    writer (checkpoint/state_dict_io.h save_state_dict_streamed) and drops it before the next, so
//    no rank holds the whole model: rank 0's peak is one gathered FlatParameter plus what the writer
//    buffers (one tensor for safetensors, one shard file's tensors, as compact copies, for .bin). Buffers follow (replicated).
//    The files are the HF layout of the default CheckpointIO, names unchanged; tensors are in unit
//    order (the root unit first), then buffers.
//  - load_model reads the checkpoint one file at a time and copies into each rank's own shard
//    the part of every parameter that lies in it (FlatLayout::piece): no communication, no gathered
//    unit; validation, dtype conversion and errors are the default CheckpointIO's (load_targets).
//  - Optimizer and LR scheduler: the default CheckpointIO's (sharded optimizer format by default:
//    FsdpOptimizer's local_state_pieces / load_state_ranges; the gathered format loads too).
// All calls are collective over the world.
#pragma once

#include "booster/checkpoint/checkpoint_io.h"
#include "fsdp_state.h"

namespace booster::plugins::fsdp {

class FsdpCheckpointIO : public checkpoint::CheckpointIO {
 public:
  FsdpCheckpointIO(std::shared_ptr<dist::ProcessGroup> world, std::weak_ptr<FsdpState> state);

  // `model` must be the model boosted by this plugin (checkpoint::CheckpointError otherwise).
  void save_model(torch::nn::Module& model, const std::string& path, const checkpoint::ModelSaveOptions& options) override;
  void load_model(torch::nn::Module& model, const std::string& path, bool strict = true) override;

 private:
  std::shared_ptr<FsdpState> state_for(torch::nn::Module& model) const;
  std::weak_ptr<FsdpState> state_;
};

}  // namespace booster::plugins::fsdp
