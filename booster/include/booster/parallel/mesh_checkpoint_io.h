// mesh_checkpoint_io.h — checkpoints of a model parallelized over a (dp, pp, sp, tp) mesh
// (mesh_model.h; the hybrid_parallel plugin's), in the layout of every other plugin (HF safetensors with the dense parameter names; the optimizer keyed by full parameter
// name), so a checkpoint saved at one (dp, pp, tp) shape loads at any other and into any plugin.
//
// Model (src/parallel/mesh/mesh_checkpoint_io.cpp):
//  - save_model writes every parameter and buffer under its dense name in its full dense shape and
//    the model's dtype: a tensor-parallel shard (nn::TensorParallelSpec) is all-gathered over its tp
//    group along spec.dim, one tensor at a time, and its vocabulary padding (entries >= full_size)
//    is dropped. Each pipeline stage's writer (the rank with dp = 0, tp = 0 on that stage; a stage
//    here is a pp rank, so under zbv the writer holds both of its V's virtual stages) writes the
//    tensors whose owner_stage is its stage (a parameter shared by several stages: the first),
//    split by ModelSaveOptions::shard / size_per_shard_mb with huggingface_hub's rule; the files of
//    all stages are numbered as ONE checkpoint (stage 0's first): model-0000i-of-0000N.safetensors
//    (pytorch_model*.bin with use_safetensors = false) and rank 0 writes the index
//    (model.safetensors.index.json: metadata.total_size and weight_map over every file). When there
//    is one file in all (pp = 1 and no sharding) it is model.safetensors without an index: with
//    pp = 1 the directory is byte for byte what the default CheckpointIO writes. Names carry
//    options.prefix. All or nothing over the world: the files are written into one temporary
//    directory that rank 0 swaps in only when every rank succeeded; any failure makes every rank
//    throw the same CheckpointError and leaves `path` unchanged.
//  - load_model validates and loads with CheckpointIO::load_targets: one target per tensor of the
//    full model in its full dense shape; a held tensor copies this rank's tp slice (padding rows are
//    zero-filled), a tensor of another stage (released here) only takes part in the checks (strict
//    mode still sees its name and shape). Any checkpoint of this model's dense form loads (torch_ddp,
//    low_level_zero, torch_fsdp, another mesh shape). Errors: load_targets' (one CheckpointError
//    naming every bad tensor, nothing changed). Local: no communication.
//
// Optimizer (src/parallel/mesh/mesh_checkpoint_io_optimizer.cpp): the sharded format (checkpoint/sharded_state.h)
// keyed by full parameter name with full shapes, so it loads into any plugin at any world size:
//  - save_optimizer: every element of every state tensor is written exactly once, translated from
//    this rank's tp shard to the full tensor's flattened coordinates (a shard split along dim > 0
//    maps to one range per contiguous block; padding is never written): zero_stage 0 by dp rank 0,
//    zero_stage 1 and 2 by every dp rank for its ZeRO slice; a tp-replicated parameter (no spec) by tp
//    rank 0 only, a shared parameter by its owner stage only. optimizer_groups.json lists the FULL
//    model's parameter names per group (the stages' lists all-gathered and merged in the model's
//    registration order) and every parameter's scalars ("step"). OptimizerFormat::kGathered (and
//    kAuto with use_safetensors = false, which would mean gathered .bin files) is refused with a
//    CheckpointError pointing to `booster ckpt consolidate`. Collective over the world.
//  - load_optimizer reads either format (sharded from any plugin and shape, gathered from DDP) and
//    loads, for each of this rank's parameters, only the full-coordinate ranges it keeps (its tp
//    shard, and for zero_stage 1 and 2 its slice pieces), converted to the optimizer's dtype. Everything is
//    validated first (optimizer type, group count, each of this rank's parameters in the right
//    group, every named parameter one of the model's, full shapes, dtypes, coverage); then the
//    state, group options and loss-scaler state are replaced. Errors: CheckpointError naming the
//    file and the tensor; nothing changed then. Local: no communication.
// The model / optimizer must be registered in the registry given to the constructor (CheckpointError
// otherwise).
#pragma once

#include <memory>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/export.h"
#include "booster/parallel/mesh_model.h"

namespace booster::parallel {

class BOOSTER_API MeshCheckpointIO : public checkpoint::CheckpointIO {
 public:
  MeshCheckpointIO(std::shared_ptr<dist::ProcessGroup> world, MeshTopology topo, std::shared_ptr<MeshModelRegistry> registry);

  void save_model(torch::nn::Module& model, const std::string& path, const checkpoint::ModelSaveOptions& options) override;
  using CheckpointIO::load_model;
  void load_model(torch::nn::Module& model, const std::string& path, const checkpoint::ModelLoadOptions& options) override;
  void save_optimizer(checkpoint::CheckpointableOptimizer& optimizer, const std::string& path,
                      const checkpoint::OptimizerSaveOptions& options) override;
  void load_optimizer(checkpoint::CheckpointableOptimizer& optimizer, const std::string& path) override;

 private:
  std::shared_ptr<MeshModel> state_of(torch::nn::Module& model) const;
  std::shared_ptr<MeshModel> state_of(checkpoint::CheckpointableOptimizer& optimizer) const;

  MeshTopology topo_;
  std::shared_ptr<MeshModelRegistry> registry_;
};

}  // namespace booster::parallel
