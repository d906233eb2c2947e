// pipeline.cpp — pipeline(): splitting a PipelineModule into stages over a mesh, and PipelineStage
// over the executor (see booster/parallel/pipeline.h).
#include "booster/parallel/pipeline.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "booster/dist/process_group.h"
#include "booster/logging.h"
#include "booster/nn/pipeline.h"
#include "pipeline_stage.h"

namespace booster::parallel {

namespace {

// The parameters and buffers (by TensorImpl) a module list uses.
std::set<const void*> tensors_of(const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  std::set<const void*> out;
  for (const auto& m : modules) {
    if (!m) continue;
    for (const auto& p : m->parameters(true)) out.insert(p.unsafeGetTensorImpl());
    for (const auto& b : m->buffers(true)) out.insert(b.unsafeGetTensorImpl());
  }
  return out;
}

}  // namespace

PipelineStage::PipelineStage() = default;
PipelineStage::~PipelineStage() = default;

PipelineResult PipelineStage::run(const at::Tensor& inputs, const at::Tensor& targets, const PipelineCriterion& criterion,
                                  const PipelineRunOptions& options) {
  return runner_->run(inputs, targets, criterion, options);
}

void PipelineStage::sum_shared_gradients() {
  at::NoGradGuard no_grad;
  for (const auto& s : shared_) {
    if (!s.param.grad().defined()) s.param.mutable_grad() = at::zeros_like(s.param);
    if (s.group->size() > 1) s.group->allreduce(s.param.mutable_grad(), dist::ReduceOp::SUM).wait();
  }
}

bool PipelineStage::is_last_stage() const { return runner_->is_last_stage(); }
int PipelineStage::chunks() const { return runner_->chunks(); }
double PipelineStage::last_compute_seconds() const { return runner_->last_compute_seconds(); }
double PipelineStage::last_wall_seconds() const { return runner_->last_wall_seconds(); }
int64_t PipelineStage::shared_memory_messages() const { return runner_->shared_memory_messages(); }
int64_t PipelineStage::weight_fallbacks() const { return runner_->weight_fallbacks(); }

std::unique_ptr<PipelineStage> pipeline(torch::nn::Module& model, const dist::ProcessMesh& mesh, const std::string& pp_dim,
                                        const PipelineOptions& options) {
  auto* pm = dynamic_cast<nn::PipelineModule*>(&model);
  if (!pm)
    throw std::invalid_argument("pipeline: the model does not derive from booster::nn::PipelineModule "
                                "(booster/nn/pipeline.h), so it has no pipeline_layers() to split; implement "
                                "pipeline_layers() or do not pipeline it");
  const int pp = mesh.size(pp_dim), pp_rank = mesh.coordinate(pp_dim);
  const ScheduleKind kind = schedule_kind_from_name(options.pp_style, options.num_model_chunks);
  std::vector<nn::PipelineLayer> layers = pm->pipeline_layers();
  const int stages = pp * options.num_model_chunks;
  std::vector<std::set<const void*>> layer_tensors;
  std::vector<int64_t> weights;
  for (const auto& l : layers) {
    if (!l.forward) throw std::invalid_argument("pipeline layer \"" + l.name + "\" has no forward function");
    layer_tensors.push_back(tensors_of(l.modules));
    weights.push_back(std::max<int64_t>(nn::layer_parameter_count(l), 1));
  }
  const auto ranges =
      partition_layers(static_cast<int>(layers.size()), stages, options.pp_partition == "parameters", weights);
  // Virtual stage v runs on pp rank stage_rank(kind, pp, v); a tensor's stages are the pp ranks of
  // the layers using it.
  std::map<const void*, std::set<int>> stages_of;
  for (int v = 0; v < stages; ++v)
    for (int i = ranges[v].first; i < ranges[v].second; ++i)
      for (const void* t : layer_tensors[i]) stages_of[t].insert(stage_rank(kind, pp, v));
  auto named_parameters = model.named_parameters(true);
  auto named_buffers = model.named_buffers(true);
  std::vector<std::string> orphans;
  for (const auto* list : {&named_parameters, &named_buffers})
    for (const auto& item : *list)
      if (!stages_of.count(item.value().unsafeGetTensorImpl())) orphans.push_back(item.key());
  if (!orphans.empty()) {
    std::string names;
    for (size_t i = 0; i < orphans.size() && i < 5; ++i) names += (i ? ", " : "") + orphans[i];
    throw std::invalid_argument(std::to_string(orphans.size()) + " tensor(s) of the model belong to no pipeline layer (" +
                                names + "); list the module that holds them in a PipelineLayer's modules");
  }
  // Parameters on several stages: one group per distinct stage set, made by one world split each, in
  // an order every rank agrees on (first appearance in registration order). A rank's colour is the
  // world rank of its coordinates with the pp coordinate 0: its peers differ in pp only.
  std::vector<std::set<int>> stage_sets;
  for (const auto& item : named_parameters) {
    const auto& s = stages_of.at(item.value().unsafeGetTensorImpl());
    if (s.size() > 1 && std::find(stage_sets.begin(), stage_sets.end(), s) == stage_sets.end()) stage_sets.push_back(s);
  }
  std::vector<int> base = mesh.coordinates();
  for (size_t d = 0; d < mesh.dims().size(); ++d)
    if (mesh.dims()[d].name == pp_dim) base[d] = 0;
  const int peers_colour = mesh.rank_of(base);
  std::vector<std::shared_ptr<dist::ProcessGroup>> set_groups;
  for (const auto& s : stage_sets)
    set_groups.push_back(mesh.world()->split(s.count(pp_rank) > 0 ? peers_colour : -1, pp_rank));
  auto stage = std::unique_ptr<PipelineStage>(new PipelineStage());
  at::NoGradGuard no_grad;
  for (auto* list : {&named_parameters, &named_buffers}) {
    for (auto& item : *list) {
      at::Tensor& t = item.value();
      const auto& s = stages_of.at(t.unsafeGetTensorImpl());
      stage->owner_stage_[item.key()] = *s.begin();
      const bool held = s.count(pp_rank) > 0;
      stage->held_[item.key()] = held;
      if (list == &named_parameters && s.size() > 1 && held) {
        const size_t k = std::find(stage_sets.begin(), stage_sets.end(), s) - stage_sets.begin();
        stage->shared_.push_back({item.key(), t, std::vector<int>(s.begin(), s.end()), set_groups[k]});
      }
      if (!held) t.set_data(at::empty({0}, t.options()));  // another stage's: released
    }
  }
  std::vector<std::pair<int, int>> mine;
  for (int c = 0; c < options.num_model_chunks; ++c) mine.push_back(ranges[chunk_stage(kind, pp, pp_rank, c)]);
  stage->runner_ = std::make_unique<PipelineRunner>(std::move(layers), mine, mesh.group(pp_dim), kind,
                                                    options.enable_metadata_cache);
  if (mesh.world()->rank() == 0) {
    std::string listing;
    for (int v = 0; v < stages; ++v)
      listing += (v ? ", " : "") + std::to_string(v) + ": layers " + std::to_string(ranges[v].first) + "-" +
                 std::to_string(ranges[v].second - 1) + " on pp rank " + std::to_string(stage_rank(kind, pp, v));
    log::info("pipeline: " + std::to_string(stages) + " stages (" + listing + ")");
  }
  return stage;
}

}  // namespace booster::parallel
