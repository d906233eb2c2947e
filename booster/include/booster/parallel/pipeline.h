// pipeline.h — pipeline parallelism as a function over a mesh: a nn::PipelineModule's layers split
// into stages over the mesh's pipeline dimension, and the executor that runs a schedule
// (pipeline_schedule.h: GPipe, 1F1B, interleaved 1F1B, ZB-V) on this rank's stage with point-to-
// point activations and gradients. Usable without a plugin (the C++ counterpart of torchtitan's
// pipelining over a device mesh):
//     booster::dist::ProcessMesh mesh(world, {{"dp", 2}, {"pp", 2}});
//     auto stage = booster::parallel::pipeline(model, mesh, "pp", {});   // model: a PipelineModule
//     auto out = stage->run(inputs, targets, criterion, {4});            // 4 micro-batches
//     stage->sum_shared_gradients();   // a tied embedding's gradients over its stages
//     // ...average the gradients over dp as the data-parallel layout does, then optimizer->step()
// The hybrid_parallel plugin composes it with tensor parallelism, ZeRO and fully_shard.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "booster/dist/process_mesh.h"
#include "booster/export.h"
#include "booster/parallel/pipeline_schedule.h"

namespace booster::parallel {

// criterion(output of the last stage for one micro-batch, its targets) -> a scalar loss; the same
// type as booster::Criterion.
using PipelineCriterion = std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>;

// What one run returns (ColossalAI's {"loss", "outputs"}); values on the last stage only.
struct PipelineResult {
  at::Tensor loss;     // mean of the micro-batch losses (float32 scalar, detached); with return_loss
  at::Tensor outputs;  // every micro-batch's last-stage output along dim 0 (detached); with return_outputs
  bool is_last_stage = true;
};

// ColossalAI's HybridParallelPlugin names and defaults.
struct PipelineOptions {
  std::string pp_style = "1f1b";        // "1f1b" | "interleaved" | "zbv" | "gpipe"
  int num_model_chunks = 1;             // virtual stages per rank (interleaved; zbv needs 2)
  std::string pp_partition = "uniform"; // "uniform" (by layers) | "parameters" (balanced)
  bool enable_metadata_cache = true;    // micro-batch 0's shapes cached across runs of one shape
};

struct PipelineRunOptions {
  int microbatches = 1;
  bool train = true;  // false: forward only, under no-grad
  bool return_loss = true;
  bool return_outputs = false;
  // Called with false before every backward but the last one of this rank, and with true before the
  // last (a data-parallel gradient synchronisation can follow the last).
  std::function<void(bool)> set_grad_sync;
};

// A parameter held by more than one pipeline stage (a tied embedding): its gradients are summed
// across them.
struct SharedParameter {
  std::string name;
  at::Tensor param;
  std::vector<int> stages;                    // the pp stages holding it, ascending
  std::shared_ptr<dist::ProcessGroup> group;  // this rank's peers on those stages (same other coordinates)
};

class PipelineRunner;

// This rank's stage of a pipelined model.
class BOOSTER_API PipelineStage {
 public:
  ~PipelineStage();
  // Runs one iteration (forward and, when training, backward of every micro-batch) on this rank's
  // chunks: inputs and targets split along dim 0 into options.microbatches equal parts
  // (std::invalid_argument naming the sizes otherwise); stage 0 reads inputs, the last stage targets;
  // loss per micro-batch criterion(output, target) / microbatches. Collective over the pp group.
  // Message transport, shape caching and shared-memory rings: pipeline_stage.cpp's PipelineRunner.
  PipelineResult run(const at::Tensor& inputs, const at::Tensor& targets, const PipelineCriterion& criterion,
                     const PipelineRunOptions& options);
  // Sums the gradient of every shared parameter over its stages (one allreduce per parameter; a
  // parameter without a gradient counts as zeros and gets one). Collective over those groups.
  void sum_shared_gradients();

  // Per parameter and buffer name of the whole model: the first stage holding it (checkpoints write
  // it from there), and whether this rank's stage holds it (the others' tensors are released to 0
  // elements).
  const std::map<std::string, int>& owner_stage() const { return owner_stage_; }
  const std::map<std::string, bool>& held() const { return held_; }
  const std::vector<SharedParameter>& shared() const { return shared_; }
  // Whether this rank runs the last virtual stage (the loss).
  bool is_last_stage() const;
  int chunks() const;
  // The last run's compute and wall time of this rank (seconds), messages through shared-memory
  // rings and zbv's W passes that ran as a whole backward, over all runs.
  double last_compute_seconds() const;
  double last_wall_seconds() const;
  int64_t shared_memory_messages() const;
  int64_t weight_fallbacks() const;

 private:
  friend BOOSTER_API std::unique_ptr<PipelineStage> pipeline(torch::nn::Module&, const dist::ProcessMesh&,
                                                             const std::string&, const PipelineOptions&);
  PipelineStage();
  std::unique_ptr<PipelineRunner> runner_;
  std::map<std::string, int> owner_stage_;
  std::map<std::string, bool> held_;
  std::vector<SharedParameter> shared_;
};

// Splits `model` (a nn::PipelineModule: its pipeline_layers()) into mesh.size(pp_dim) *
// options.num_model_chunks contiguous stages by options.pp_partition (partition_layers), places
// them on the pp ranks by options.pp_style (stage_rank), and releases the parameters and buffers of
// the other ranks' stages (set to 0 elements: the model keeps its structure and names). Parameters
// used on several stages get one group per stage set (world splits, in registration order).
// Collective over the mesh's world. Throws std::invalid_argument when the model is not a
// PipelineModule, a pipeline layer has no forward, fewer layers than stages, a parameter or buffer
// belongs to no layer (named), or options name an unknown style or an invalid chunk count.
BOOSTER_API std::unique_ptr<PipelineStage> pipeline(torch::nn::Module& model, const dist::ProcessMesh& mesh,
                                                    const std::string& pp_dim, const PipelineOptions& options);

}  // namespace booster::parallel
