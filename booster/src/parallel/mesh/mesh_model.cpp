// mesh_model.cpp — a MeshModel's construction, its model hooks (gradient synchronisation after
// backward) and one pipeline iteration (see booster/parallel/mesh_model.h).
#include "booster/parallel/mesh_model.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <set>
#include <stdexcept>

#include "booster/core/grad_reducer.h"
#include "booster/core/replica.h"
#include "booster/nn/tensor_parallel.h"

namespace booster::parallel {

std::shared_ptr<MeshModel> make_mesh_model(std::shared_ptr<torch::nn::Module> module) {
  auto model = std::make_shared<MeshModel>();
  model->module = module;
  model->named_parameters = named_parameters_of(*module, false);
  model->named_buffers = named_buffers_of(*module);
  for (auto* list : {&model->named_parameters, &model->named_buffers})
    for (const auto& [name, t] : *list) {
      model->held[name] = true;
      model->owner_stage[name] = 0;
      model->local_shape[name] = t.sizes().vec();
    }
  return model;
}

void drop_other_stages(const MeshModel& model, torch::optim::Optimizer& optimizer) {
  std::set<const void*> released;
  for (const auto& [name, p] : model.named_parameters)
    if (!model.held.at(name)) released.insert(p.unsafeGetTensorImpl());
  for (auto& group : optimizer.param_groups()) {
    auto& params = group.params();
    params.erase(std::remove_if(params.begin(), params.end(),
                                [&](const at::Tensor& p) { return released.count(p.unsafeGetTensorImpl()) > 0; }),
                 params.end());
  }
}

MeshModelHooks::MeshModelHooks(std::shared_ptr<MeshModel> model, MeshTopology topo, int64_t bucket_bytes,
                               bool dp_reduced_by_zero)
    : model_(std::move(model)), topo_(std::move(topo)), bucket_bytes_(bucket_bytes), dp_reduced_by_zero_(dp_reduced_by_zero) {
  if (dp_reduced_by_zero_ || !topo_.dp_group || topo_.dp_group->size() <= 1) return;
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& [name, p] : model_->named_parameters)
    if (model_->held.at(name) && p.requires_grad()) params.emplace_back(name, p);
  if (params.empty()) return;
  ReducerOptions ro;
  ro.bucket_cap_bytes = bucket_bytes_;
  ro.first_bucket_bytes = std::min(ro.first_bucket_bytes, bucket_bytes_);  // PyTorch's 1 MiB, never above the cap
  ro.find_unused_parameters = true;  // as the allreduce after backward: a missing gradient is no hang
  // A pipeline's synced backward is the schedule's last one, which with several model chunks per rank
  // reaches one chunk only: the others' accumulated gradients join at its end. Buckets in the order
  // the first synced backward readied them (PyTorch's rebuild_buckets; the schedule is the same every
  // step) put the reached chunk's parameters first, so their buckets launch during that backward.
  if (topo_.pp > 1) ro.rebuild_buckets = ro.static_graph = true;
  reducer_ = std::make_unique<GradientReducer>(std::move(params), topo_.dp_group, ro);
}

MeshModelHooks::~MeshModelHooks() = default;

void MeshModelHooks::begin_pipeline_backward() {
  if (reducer_) synced_before_ = reducer_->synced_backwards();
}

void MeshModelHooks::set_grad_sync(bool sync) {
  if (reducer_) reducer_->set_require_grad_sync(sync);
}

void MeshModelHooks::pre_forward() {
  if (topo_.pp > 1)
    throw std::logic_error("hybrid_parallel: the model is split into pp_size = " + std::to_string(topo_.pp) +
                           " pipeline stages, so model.forward cannot run it whole; use booster.execute_pipeline("
                           "inputs, targets, model, criterion, optimizer) for training and execute_pipeline(..., "
                           "nullptr) to evaluate");
}

void MeshModelHooks::backward(const torch::Tensor& loss) {
  if (topo_.pp > 1)
    throw std::logic_error("hybrid_parallel: booster.backward does not work on a pipelined model (pp_size = " +
                           std::to_string(topo_.pp) + "): booster.execute_pipeline runs forward and backward of "
                           "every micro-batch; call it instead of model.forward + booster.backward");
  loss.backward();
  sync_gradients();
}

void MeshModelHooks::sync_gradients() {
  if (topo_.split_gather && !dp_reduced_by_zero_) {
    // Megatron-SP: a tp-replicated parameter (no TensorParallelSpec) got its sequence shard's part.
    // (zero_stage 2 and 3: the optimizer wrappers sum the reduced shards' pieces over tp instead.)
    std::vector<at::Tensor> partial;
    for (const auto& [name, p] : model_->named_parameters)
      if (model_->held.at(name) && p.requires_grad() && p.grad().defined() && !nn::tensor_parallel_spec(p))
        partial.push_back(p.grad());
    allreduce_coalesced(*topo_.tp_group, partial, bucket_bytes_, false);
  }
  // pp_size > 1: the reducer averaged in the last backward of the schedule, unless that backward
  // reached no trainable parameter of this rank (then nothing queued its end-of-backward callback).
  if (reducer_ && topo_.pp > 1 && reducer_->synced_backwards() == synced_before_) reducer_->sync_now();
  if (model_->runner) model_->runner->sum_shared_gradients();
}

std::map<std::string, int64_t> MeshModelHooks::stats() const {
  int64_t held = 0;
  for (const auto& [name, h] : model_->held) held += h;
  std::map<std::string, int64_t> out{{"dp_size", topo_.dp / topo_.sp}, {"pp_size", topo_.pp}, {"tp_size", topo_.tp},
                                     {"sp_size", topo_.split_gather ? topo_.tp : topo_.sp},
                                     {"pp_rank", topo_.pp_rank}, {"tensors_on_stage", held},
                                     {"model_chunks", model_->runner ? model_->runner->chunks() : 1}};
  if (reducer_)
    for (const auto& [key, value] : reducer_->stats()) out[key] = value;
  if (model_->runner) {  // the last pipeline run: compute time of this rank vs wall time (bubble)
    out["pipeline_compute_us"] = static_cast<int64_t>(model_->runner->last_compute_seconds() * 1e6);
    out["pipeline_wall_us"] = static_cast<int64_t>(model_->runner->last_wall_seconds() * 1e6);
    out["pipeline_shm_messages"] = model_->runner->shared_memory_messages();
    out["pipeline_w_fallbacks"] = model_->runner->weight_fallbacks();
  }
  return out;
}

PipelineResult run_mesh_pipeline(MeshModel& model, MeshModelHooks& hooks, const at::Tensor& inputs,
                                 const at::Tensor& targets, const PipelineCriterion& criterion,
                                 const PipelineRunOptions& options) {
  if (!model.runner)
    throw std::logic_error("hybrid_parallel: execute_pipeline needs pp_size > 1 (this model is not pipelined: "
                           "pp_size = 1); train it with model.forward + booster.backward");
  if (!model.sharded) {
    // The dp reducer stays off but in the last backward of the schedule (Megatron's overlap of the
    // gradient reduction with the last micro-batch's backward).
    PipelineRunOptions o = options;
    if (options.train) {
      hooks.begin_pipeline_backward();
      o.set_grad_sync = [&hooks, outer = options.set_grad_sync](bool sync) {
        hooks.set_grad_sync(sync);
        if (outer) outer(sync);
      };
    }
    PipelineResult out = model.runner->run(inputs, targets, criterion, o);
    if (options.train) hooks.sync_gradients();
    return out;
  }
  ShardedRuntime& runtime = *model.sharded;
  const bool sync = runtime.require_grad_sync();
  runtime.set_require_grad_sync(false);
  runtime.hold_gathered(true);
  PipelineResult out;
  try {
    runtime.begin_forward();
    out = model.runner->run(inputs, targets, criterion, options);
    if (!options.train) {
      at::NoGradGuard no_grad;
      runtime.end_forward();  // no backward follows: frees what is gathered
    }
  } catch (...) {
    runtime.hold_gathered(false);
    runtime.abort_forward();
    runtime.set_require_grad_sync(sync);
    throw;
  }
  runtime.set_require_grad_sync(sync);
  if (options.train && sync) {
    hooks.sync_gradients();
    runtime.reduce_accumulated();
  }
  runtime.hold_gathered(false);  // the deferred end of backward frees the gathered stage
  return out;
}

}  // namespace booster::parallel
