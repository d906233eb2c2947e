// mesh_model.h — a model parallelized over a (dp, pp, sp, tp) mesh (ColossalAI's HybridParallelPlugin
// layout, torchtitan's 3-D parallelism): the mesh's groups, which parameters and buffers this rank's
// pipeline stage holds, the parameters shared by several stages (a tied embedding), the pipeline
// stage and, under ZeRO-3, the sharded runtime. What the mesh's optimizer wrappers
// (mesh_optimizer.h) and checkpoint IO (mesh_checkpoint_io.h) read; the hybrid_parallel plugin
// fills it in from its options.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "booster/dist/process_mesh.h"
#include "booster/export.h"
#include "booster/parallel/sharded_runtime.h"
#include "booster/parallel/pipeline.h"
#include "booster/wrappers/model_hooks.h"

namespace booster {
class GradientReducer;
}

namespace booster::parallel {

// The mesh ColossalAI's HybridParallelPlugin builds: dims ("dp", "pp", "sp", "tp"), tp fastest; sp
// is sequence_parallelism_mode = "all_to_all"'s group (size 1 otherwise).
struct MeshTopology {
  std::shared_ptr<dist::ProcessMesh> mesh;
  // dp / dp_rank / dp_group: the replicas that average gradients: the mesh's dp x sp (sp replicas
  // hold the same parameters). data_group: the mesh's dp dim alone (ranks reading different data).
  int dp = 1, pp = 1, tp = 1, sp = 1;
  int dp_rank = 0, pp_rank = 0, tp_rank = 0, sp_rank = 0;
  bool split_gather = false;  // sequence_parallelism_mode = "split_gather" (sequence sharded over tp)
  std::shared_ptr<dist::ProcessGroup> dp_group, pp_group, tp_group, sp_group, data_group;  // never null
};

struct MeshModel {
  std::shared_ptr<torch::nn::Module> module;
  // Every parameter and buffer of the full model, registration order (names as in the dense
  // model); tensors of other stages are released (0 elements) when pp > 1.
  std::vector<std::pair<std::string, at::Tensor>> named_parameters, named_buffers;
  // name -> the pp stage that writes it in checkpoints (the first stage holding it); -1 for none.
  std::map<std::string, int> owner_stage;
  // name -> true when this rank's stage holds it (its tensor is live).
  std::map<std::string, bool> held;
  // name -> shape and dtype on a holding rank (tp shard shape), as before the release.
  std::map<std::string, std::vector<int64_t>> local_shape;
  std::vector<SharedParameter> shared;
  std::unique_ptr<PipelineStage> runner;  // pp > 1: this rank's stage (booster/parallel/pipeline.h)
  // zero_stage = 3: the runtime whose FlatParameters hold the parameters (their tensors are views of
  // gathered storage, valid only while gathered); null otherwise.
  std::shared_ptr<ShardedRuntime> sharded;
};

// The models a plugin boosted (the checkpoint IO finds a model's or an optimizer's state here).
struct MeshModelRegistry {
  std::map<const torch::nn::Module*, std::weak_ptr<MeshModel>> states;
  std::shared_ptr<MeshModel> find(const torch::nn::Module& module) const {
    auto it = states.find(&module);
    return it == states.end() ? nullptr : it->second.lock();
  }
  // The state whose model holds `param` (an optimizer's parameter); null when none.
  std::shared_ptr<MeshModel> find_by_parameter(const at::Tensor& param) const {
    for (const auto& [m, weak] : states)
      if (auto s = weak.lock())
        for (const auto& [name, p] : s->named_parameters)
          if (p.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return s;
    return nullptr;
  }
};

// A MeshModel of `module` before any split: every parameter (trainable or frozen) and buffer with
// its dotted name, held on this rank, owned by stage 0, its local shape its current one.
BOOSTER_API std::shared_ptr<MeshModel> make_mesh_model(std::shared_ptr<torch::nn::Module> module);

// Removes from `optimizer`'s parameter groups the parameters of other pipeline stages (released:
// not held here), so the optimizer keeps this stage's parameters only. Local.
BOOSTER_API void drop_other_stages(const MeshModel& model, torch::optim::Optimizer& optimizer);

// The model hooks of a MeshModel whose gradients are synchronised after backward (zero_stage 0-2,
// and zero_stage 3 with pp > 1, where run_mesh_pipeline drives the runtime):
//  - pre_forward / backward refuse a pipelined model (pp > 1: std::logic_error naming
//    booster.execute_pipeline);
//  - backward(loss) runs loss.backward() and sync_gradients();
//  - the dp average overlapped with backward: unless dp_reduced_by_zero, the held trainable
//    parameters are averaged over dp by a GradientReducer (core/grad_reducer.h: DDP's buckets of
//    bucket_bytes, the first at most 1 MiB, each allreduced as soon as its gradients are ready;
//    unused parameters count as zeros), which ends within loss.backward(); with pp_size > 1 it is
//    off (set_grad_sync(false)) but in the last backward of this rank in the schedule, whose
//    buckets carry every gradient accumulated over the micro-batches (Megatron overlaps the
//    reduction with the last micro-batch's backward the same way); the buckets are rebuilt once in
//    the order the first such backward readied the parameters (with several model chunks per rank it
//    reaches one chunk: the other chunks' buckets go last and launch at its end);
//  - sync_gradients(): under split_gather (unless dp_reduced_by_zero) the tp-replicated parameters'
//    gradients (no TensorParallelSpec: partial sums over the rank's sequence shard) are summed over
//    tp (the sum over tp and the average over dp commute); with pp > 1, when the schedule's last
//    backward reached no trainable parameter of this rank (no reducer callback ran), the reducer
//    averages the accumulated gradients here (GradientReducer::sync_now); ZeRO-2's reducer and the
//    ZeRO-3 runtime reduce over dp themselves (dp_reduced_by_zero); the parameters shared by several pipeline stages get their
//    stages' sum (PipelineStage::sum_shared_gradients). Collective over tp, dp and pp in that order;
//    coalesced in buffers of bucket_bytes (bytes).
//  - stats(): dp_size, pp_size, tp_size, sp_size, pp_rank, tensors_on_stage, model_chunks, with the
//    reducer its buckets and buckets_launched_during_backward, and with pp > 1 the last pipeline
//    run's pipeline_compute_us / pipeline_wall_us, pipeline_shm_messages and pipeline_w_fallbacks.
class BOOSTER_API MeshModelHooks : public ModelHooks {
 public:
  MeshModelHooks(std::shared_ptr<MeshModel> model, MeshTopology topo, int64_t bucket_bytes, bool dp_reduced_by_zero);
  ~MeshModelHooks() override;
  torch::nn::Module& module() override { return *model_->module; }
  void pre_forward() override;
  void backward(const torch::Tensor& loss) override;
  void sync_gradients();
  // run_mesh_pipeline's part (pp_size > 1): begin_pipeline_backward before the schedule;
  // set_grad_sync is PipelineRunOptions::set_grad_sync (the reducer on for the last backward only).
  void begin_pipeline_backward();
  void set_grad_sync(bool sync);
  std::map<std::string, int64_t> stats() const override;
  const std::shared_ptr<MeshModel>& model() const { return model_; }

 private:
  std::shared_ptr<MeshModel> model_;
  MeshTopology topo_;
  int64_t bucket_bytes_;
  bool dp_reduced_by_zero_;
  std::unique_ptr<GradientReducer> reducer_;  // the overlapped dp average
  int64_t synced_before_ = 0;                 // reducer's synced passes before the pipeline run
};

// Runs one pipeline iteration of a pipelined MeshModel (model.runner set) over `inputs` / `targets`
// (the data-parallel rank's batch; options.microbatches micro-batches, PipelineStage::run's
// shapes and rules). Training (options.train) ends with hooks.sync_gradients(). Under zero_stage 3
// (model.sharded set) the stage's FlatParameters stay gathered for the whole schedule, the
// micro-batches' gradients accumulate unreduced, and after the schedule the shared parameters are
// summed over their stages and everything is reduce-scattered over dp once (inside no_sync: kept
// local). Throws std::logic_error when the model is not pipelined; what PipelineStage::run throws
// (the runtime is released first).
BOOSTER_API PipelineResult run_mesh_pipeline(MeshModel& model, MeshModelHooks& hooks, const at::Tensor& inputs,
                                             const at::Tensor& targets, const PipelineCriterion& criterion,
                                             const PipelineRunOptions& options);

}  // namespace booster::parallel
