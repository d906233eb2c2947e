// flat_checkpoint_io.h — model checkpoints of a model whose parameters live in FlatParameters
// (core/flat_param.h) sharded over a group, without undoing the sharding: the base of the sharded
// runtime's CheckpointIO (parallel/sharded_runtime.h).
//  - save_model streams: for one FlatParameter at a time every rank of its group all-gathers the
//    full-precision values (the source's gather_full), rank 0 hands its parameters to the streamed HF
//    writer (checkpoint/state_dict_io.h save_state_dict_streamed) and drops them before the next, so
//    no rank holds the whole model: rank 0's peak is one gathered FlatParameter plus what the writer
//    buffers (one tensor for safetensors, one shard file's tensors, as compact copies, for .bin).
//    The files are the HF layout of the default CheckpointIO with the parameters' own names; tensors
//    are in source order, then the buffers (replicated).
//  - load_model reads the checkpoint one file at a time and copies into each rank's shard (the
//    source's shard tensor) the part of every parameter that lies in it (FlatLayout::piece): no
//    communication, nothing gathered; validation, dtype conversion and errors are the default
//    CheckpointIO's (load_targets); then after_load().
//  - Optimizer and LR scheduler: the default CheckpointIO's.
// All calls are collective over the world (every rank of every source's group takes part).
#pragma once

#include <functional>
#include <vector>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/core/flat_param.h"

namespace booster::checkpoint {

// One FlatParameter as a checkpoint sees it.
struct FlatSource {
  FlatParameter* flat = nullptr;
  at::ScalarType dtype = at::ScalarType::Undefined;  // the dtype saved and loaded (full precision)
  // Collective over flat's group: [padded_numel] values in `dtype` (a new tensor).
  std::function<at::Tensor()> gather_full;
  // This rank's shard to load into: [shard_numel], `dtype`, in memory while load_model runs.
  std::function<at::Tensor()> shard;
};

class BOOSTER_API FlatCheckpointIO : public CheckpointIO {
 public:
  using CheckpointIO::CheckpointIO;
  void save_model(torch::nn::Module& model, const std::string& path, const ModelSaveOptions& options) override;
  using CheckpointIO::load_model;
  void load_model(torch::nn::Module& model, const std::string& path, const ModelLoadOptions& options) override;

 protected:
  using FlatSource = checkpoint::FlatSource;
  // The model's sources, in save order, with the model made ready (gathered parameters freed).
  // Throws CheckpointError when `model` is not the model the plugin boosted.
  virtual std::vector<FlatSource> flat_sources(torch::nn::Module& model) = 0;
  // After a successful load_model (e.g. refresh the compute copies from the loaded shards).
  virtual void after_load(torch::nn::Module& model) { (void)model; }
};

}  // namespace booster::checkpoint
