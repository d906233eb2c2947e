// mesh_model.h — a model parallelized over a (dp, pp, sp, tp) mesh (ColossalAI's HybridParallelPlugin
// layout, torchtitan's 3-D parallelism): the mesh's groups, which parameters and buffers this rank's
// pipeline stage holds, the parameters shared by several stages (a tied embedding), the pipeline
// stage and, under ZeRO-3, the sharded runtime. What the mesh's optimizer wrappers
// (mesh_optimizer.h) and checkpoint IO (mesh_checkpoint_io.h) read; the hybrid_parallel plugin
// fills it in from its options.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "booster/dist/process_mesh.h"
#include "booster/parallel/sharded_runtime.h"
#include "booster/parallel/pipeline.h"

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

}  // namespace booster::parallel
