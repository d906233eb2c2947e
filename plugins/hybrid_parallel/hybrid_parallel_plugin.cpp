// hybrid_parallel_plugin.cpp — ColossalAI's HybridParallelPlugin in C++: its options (names,
// defaults and rules) and their composition on one (dp, pp, sp, tp) mesh, tp fastest: tensor
// parallelism (booster/nn/tensor_parallel.h layers over the mesh's tp group: a model built with the
// Booster's context, or built dense and sharded by [plugin.tp_plan] through parallel::parallelize),
// pipeline parallelism (parallel::pipeline: 1F1B / interleaved / ZB-V schedules, execute_pipeline),
// sequence parallelism (split_gather over tp, all_to_all over sp; booster/nn/sequence_parallel.h)
// and data parallelism over dp: zero_stage 0 and 1 average the gradients after backward
// (parallel::MeshModelHooks) and zero_stage 1 shards the optimizer states with the core's
// ZeroOptimizer; zero_stage 2 (pp_size = 1) is the core's ZeRO-2 over dp; zero_stage 3 is
// parallel::fully_shard's runtime over dp (FSDP x TP x PP). The model's description, optimizer
// wrappers and checkpoints are the mesh-parallel model's (booster/parallel/mesh_model.h,
// mesh_optimizer.h, mesh_checkpoint_io.h).
#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <set>

#include "booster/core/replica.h"
#include "booster/dist/process_group.h"
#include "booster/dist/process_mesh.h"
#include "booster/logging.h"
#include "booster/mixed_precision/precision.h"
#include "booster/nn/pipeline.h"
#include "booster/optim/optimizer_state.h"
#include "booster/parallel/fully_shard.h"
#include "booster/parallel/mesh_checkpoint_io.h"
#include "booster/parallel/mesh_model.h"
#include "booster/parallel/mesh_optimizer.h"
#include "booster/parallel/parallelize.h"
#include "booster/plugin.h"
#include "hybrid_estimate.h"

namespace booster::hybrid {

using parallel::MeshCheckpointIO;
using parallel::MeshFsdpOptimizer;
using parallel::MeshModel;
using parallel::MeshModelHooks;
using parallel::MeshModelRegistry;
using parallel::MeshOptimizer;
using parallel::MeshTopology;
using parallel::MeshZeroOptimizer;
using parallel::NormFilter;

// ---------------------------------------------------------------------------------------------
// Options ([plugin] table): names and defaults of ColossalAI's HybridParallelPlugin

struct HybridOptions {
  int tp_size = 1, pp_size = 1;
  int zero_stage = 0;                     // 0 | 1 | 2 | 3 (2 and 3: pp_size = 1 only)
  std::string precision = "fp16";         // "fp16" (CUDA only) | "bf16" | "fp32"
  std::string pp_style = "1f1b";          // "1f1b" | "interleaved" | "zbv" (| "gpipe", the reference order)
  int num_model_chunks = 1;
  bool enable_metadata_cache = true;      // pipeline: micro-batch 0's shapes cached across iterations
  int64_t num_microbatches = 0;           // 0 = unset
  int64_t microbatch_size = 0;            // 0 = unset
  std::string pp_partition = "uniform";   // "uniform" (by layers) | "parameters" (balanced)
  double ddp_bucket_cap_mb = 25;
  double zero_bucket_size_in_m = 12;
  double max_norm = 0.0;
  double norm_type = 2.0;
  int64_t make_vocab_size_divisible_by = 64;
  // Sequence parallelism (ColossalAI's names): enable_sequence_parallelism, sequence_parallelism_mode
  // ("split_gather" | "all_to_all"; default "all_to_all" when enabled), sp_size (all_to_all's group;
  // split_gather shards over tp). sp_size here is the size of the sp mesh dim (1 for split_gather).
  bool enable_sequence_parallelism = false;
  std::string sequence_parallelism_mode;  // "" when disabled
  int sp_size = 1;
  // [plugin.tp_plan]: module path pattern -> style, applied by parallel::parallelize at boost() to a
  // model built dense (torchtitan's parallelize plan); empty: the model is built with the context.
  parallel::ParallelizePlan tp_plan;
  std::shared_ptr<mixed_precision::MixedPrecision> mixed;
};

// [plugin.tp_plan] "pattern" = "style": colwise, colwise_gather_output, rowwise, rowwise_split_input
// (a full input split first) or vocab_parallel (parallel/parallelize.h's styles).
static parallel::ParallelizePlan parse_tp_plan(const Options& o) {
  parallel::ParallelizePlan plan;
  if (!o.has("tp_plan")) return plan;
  const Options table = o.table("tp_plan");
  static const std::map<std::string, parallel::ParallelStyle> styles{
      {"colwise", parallel::colwise()}, {"colwise_gather_output", parallel::colwise(true)},
      {"rowwise", parallel::rowwise()}, {"rowwise_split_input", parallel::rowwise(false)},
      {"vocab_parallel", parallel::vocab_parallel()}};
  std::vector<std::string> names;
  for (const auto& [name, style] : styles) names.push_back(name);
  for (const auto& pattern : table.keys())
    plan.emplace_back(pattern, styles.at(table.get_choice(pattern, "colwise", names)));
  if (plan.empty())
    throw PluginError("hybrid_parallel: " + o.where("tp_plan") + ": [plugin.tp_plan] is empty; list \"pattern\" = "
                      "\"style\" entries (e.g. \"h.*.fc\" = \"colwise\") or remove the table");
  return plan;
}

// The sequence-parallel options' rules (ColossalAI's HybridParallelPlugin, with its warnings made
// errors: a setting is never ignored).
static void parse_sequence_parallel_options(const Options& o, HybridOptions& t) {
  const std::string where = "hybrid_parallel: ";
  t.enable_sequence_parallelism = o.get_bool("enable_sequence_parallelism", false);
  const bool has_mode = o.has("sequence_parallelism_mode");
  const std::string mode = o.get_choice("sequence_parallelism_mode", "all_to_all", {"split_gather", "all_to_all"});
  const bool has_sp = o.has("sp_size");
  const int sp = static_cast<int>(o.get_int("sp_size", 1, 1, 1 << 20));
  if (!t.enable_sequence_parallelism) {
    if (has_mode)
      throw PluginError(where + "sequence_parallelism_mode = \"" + mode + "\" is set but enable_sequence_parallelism is "
                        "false; set plugin.enable_sequence_parallelism = true, or remove sequence_parallelism_mode");
    if (has_sp && sp != 1)
      throw PluginError(where + "sp_size = " + std::to_string(sp) + " is set but enable_sequence_parallelism is false "
                        "(ColossalAI's rule); set plugin.enable_sequence_parallelism = true with sequence_parallelism_mode "
                        "= \"all_to_all\", or remove sp_size");
    return;
  }
  t.sequence_parallelism_mode = mode;
  if (mode == "split_gather") {
    if (t.tp_size < 2)
      throw PluginError(where + "sequence_parallelism_mode = \"split_gather\" shards the sequence over the tensor-parallel "
                        "group, so it needs tp_size > 1 (tp_size = " + std::to_string(t.tp_size) + "); set plugin.tp_size "
                        ">= 2, or use sequence_parallelism_mode = \"all_to_all\" with sp_size");
    if (has_sp && sp != t.tp_size)
      throw PluginError(where + "sp_size = " + std::to_string(sp) + " with sequence_parallelism_mode = \"split_gather\": "
                        "split_gather's sequence-parallel size is tp_size = " + std::to_string(t.tp_size) +
                        " (ColossalAI's rule); remove sp_size or set it to " + std::to_string(t.tp_size));
    t.sp_size = 1;
  } else {
    t.sp_size = sp;
  }
}

static HybridOptions parse_options(const Options& o, int world_size) {
  HybridOptions t;
  t.tp_size = static_cast<int>(o.get_int("tp_size", 1, 1, 1 << 20));
  t.pp_size = static_cast<int>(o.get_int("pp_size", 1, 1, 1 << 20));
  t.zero_stage = static_cast<int>(o.get_int("zero_stage", 0, 0, 3));
  t.precision = o.get_choice("precision", t.precision, {"fp16", "bf16", "fp32"});
  t.pp_style = o.get_choice("pp_style", t.pp_style, {"1f1b", "interleaved", "zbv", "gpipe"});
  t.num_model_chunks = static_cast<int>(o.get_int("num_model_chunks", 1, 1, 1024));
  t.enable_metadata_cache = o.get_bool("enable_metadata_cache", t.enable_metadata_cache);
  t.num_microbatches = o.get_int("num_microbatches", 0, 0);
  t.microbatch_size = o.get_int("microbatch_size", 0, 0);
  t.pp_partition = o.get_choice("pp_partition", t.pp_partition, {"uniform", "parameters"});
  t.ddp_bucket_cap_mb = o.get_double("ddp_bucket_cap_mb", t.ddp_bucket_cap_mb, 1e-6, 1e6);
  t.zero_bucket_size_in_m = o.get_double("zero_bucket_size_in_m", t.zero_bucket_size_in_m, 1e-6, 1e6);
  t.max_norm = o.get_double("max_norm", t.max_norm, 0.0);
  t.norm_type = o.get_double("norm_type", t.norm_type, 1e-9, INFINITY);
  t.make_vocab_size_divisible_by = o.get_int("make_vocab_size_divisible_by", 64, 1, 1 << 20);
  // ColossalAI's fp8_communication (and communication_dtype) are not implemented on the tp, pp and
  // dp paths of this plugin: refused instead of ignored.
  const std::string wire = mixed_precision::communication_dtype_option(o, {"", "fp32", "bf16", "fp16", "fp8"});
  if (!wire.empty())
    throw PluginError("hybrid_parallel: " + std::string(o.get_bool("fp8_communication", false) ? "fp8_communication = true"
                                                                                 : "communication_dtype = \"" + wire + "\"") +
                      " is not supported by this plugin (its tensor-parallel, pipeline and data-parallel "
                      "collectives send the compute dtype). Remove it; set precision = \"bf16\" for bf16 on the "
                      "wire, or use plugin = \"torch_ddp\", \"low_level_zero\", \"torch_fsdp\" or \"gemini\" "
                      "with communication_dtype = \"fp8\"");
  parse_sequence_parallel_options(o, t);
  t.tp_plan = parse_tp_plan(o);
  mixed_precision::DynamicGradScalerOptions scaler_defaults;
  scaler_defaults.initial_scale = 65536.0;  // HybridParallelPlugin's initial_scale = 2^16
  t.mixed = mixed_precision::make_mixed_precision(t.precision, o, scaler_defaults);  // + check_unknown
  const std::string where = "hybrid_parallel: ";
  if (t.precision == "fp16" && !torch::cuda::is_available())
    throw PluginError(where + "precision = \"fp16\" (ColossalAI's default) needs a CUDA device, and this machine "
                      "has none: LibTorch has no fp16 kernels for most CPU ops. Set plugin.precision = \"bf16\" "
                      "(bf16 weights, fp32 master weights) or \"fp32\".");
  if (t.zero_stage == 2 && t.pp_size > 1)
    throw PluginError(where + "zero_stage = 2 needs pp_size = 1 (ColossalAI's rule: sharded gradients would be "
                      "reduce-scattered once per micro-batch of the pipeline), and pp_size = " +
                      std::to_string(t.pp_size) + ". Use zero_stage = 1 with pipelines, or set pp_size = 1");
  if (world_size % (t.tp_size * t.pp_size) != 0)
    throw PluginError(where + "tp_size * pp_size = " + std::to_string(t.tp_size) + " * " + std::to_string(t.pp_size) +
                      " = " + std::to_string(t.tp_size * t.pp_size) + " does not divide the world size " +
                      std::to_string(world_size) + "; the data-parallel size is world / (tp_size * pp_size). Choose "
                      "sizes whose product divides " + std::to_string(world_size) + " (or launch more ranks)");
  if (t.pp_style == "zbv" && t.num_model_chunks != 2)
    throw PluginError(where + "pp_style = \"zbv\" needs num_model_chunks = 2 (the V placement: every pp rank holds "
                      "exactly 2 model chunks), got num_model_chunks = " + std::to_string(t.num_model_chunks) +
                      "; set plugin.num_model_chunks = 2");
  if (t.pp_style == "zbv" && t.pp_size < 2)
    throw PluginError(where + "pp_style = \"zbv\" needs pp_size > 1 (it is a pipeline schedule), got pp_size = " +
                      std::to_string(t.pp_size) + "; set plugin.pp_size >= 2 or drop pp_style");
  if (world_size % (t.tp_size * t.pp_size * t.sp_size) != 0)
    throw PluginError(where + "tp_size * pp_size * sp_size = " + std::to_string(t.tp_size * t.pp_size * t.sp_size) +
                      " does not divide the world size " + std::to_string(world_size) + "; the data-parallel size is "
                      "world / (tp_size * pp_size * sp_size). Choose an sp_size that fits (or launch more ranks)");
  if (t.enable_sequence_parallelism && t.pp_size > 1)
    throw PluginError(where + "enable_sequence_parallelism with pp_size = " + std::to_string(t.pp_size) +
                      " is not supported: sequence parallelism runs with tp / dp only here. Set pp_size = 1 or "
                      "enable_sequence_parallelism = false");
  if (t.num_model_chunks > 1 && t.pp_style != "interleaved" && t.pp_style != "zbv")
    throw PluginError(where + "num_model_chunks = " + std::to_string(t.num_model_chunks) +
                      " needs pp_style = \"interleaved\" (or \"zbv\" with num_model_chunks = 2)");
  if (t.pp_style == "interleaved" && t.num_model_chunks < 2)
    throw PluginError(where + "pp_style = \"interleaved\" needs num_model_chunks >= 2 (ColossalAI's rule)");
  if (t.pp_size > 1 && t.num_microbatches == 0 && t.microbatch_size == 0)
    throw PluginError(where + "pp_size = " + std::to_string(t.pp_size) + " needs num_microbatches or "
                      "microbatch_size (ColossalAI's rule): set plugin.num_microbatches (>= pp_size for 1f1b)");
  if (t.num_microbatches > 0 && t.microbatch_size > 0)
    throw PluginError(where + "set one of num_microbatches and microbatch_size, not both");
  // zbv runs any number of micro-batches (PyTorch's ScheduleZBVZeroBubble rule; the bubble is smallest
  // from 2 * pp_size - 1 on); 1f1b and interleaved need one per stage.
  if (t.pp_size > 1 && t.pp_style != "gpipe" && t.pp_style != "zbv" && t.num_microbatches > 0 &&
      t.num_microbatches < t.pp_size)
    throw PluginError(where + "num_microbatches = " + std::to_string(t.num_microbatches) + " < pp_size = " +
                      std::to_string(t.pp_size) + ": the " + t.pp_style + " schedule needs at least one micro-batch "
                      "per stage; raise num_microbatches or lower pp_size");
  return t;
}

// ---------------------------------------------------------------------------------------------
// Plugin

class HybridParallelPlugin : public Plugin {
 public:
  explicit HybridParallelPlugin(const PluginContext& ctx)
      : Plugin(ctx), options_(parse_options(ctx.options, ctx.world->size())) {
    MeshTopology& t = topo_;
    t.tp = options_.tp_size;
    t.pp = options_.pp_size;
    t.sp = options_.sp_size;
    t.split_gather = options_.sequence_parallelism_mode == "split_gather";
    const int data = world()->size() / (t.tp * t.pp * t.sp);  // the data-parallel size proper
    t.mesh = std::make_shared<dist::ProcessMesh>(world(), std::vector<dist::ProcessMesh::Dim>{
                                                              {"dp", data}, {"pp", t.pp}, {"sp", t.sp}, {"tp", t.tp}});
    t.pp_rank = t.mesh->coordinate("pp");
    t.tp_rank = t.mesh->coordinate("tp");
    t.sp_rank = t.mesh->coordinate("sp");
    t.pp_group = t.mesh->group("pp");
    t.tp_group = t.mesh->group("tp");
    t.sp_group = t.mesh->group("sp");
    t.data_group = t.mesh->group("dp");
    // all_to_all: the sp replicas hold the same parameters, so gradient averaging, ZeRO, replica
    // sync and checkpoints treat dp x sp as the data-parallel dimension.
    t.dp_group = t.sp > 1 ? t.mesh->group({"dp", "sp"}) : t.data_group;
    t.dp = t.dp_group->size();
    t.dp_rank = t.dp_group->rank();
    if (world()->rank() == 0)
      log::info("hybrid_parallel: mesh dp " + std::to_string(data) + " x pp " + std::to_string(t.pp) +
                (t.sp > 1 ? " x sp " + std::to_string(t.sp) : std::string()) + " x tp " + std::to_string(t.tp) +
                ", precision " + options_.precision + ", zero_stage " + std::to_string(options_.zero_stage) +
                (t.pp > 1 ? ", pp_style " + options_.pp_style : "") +
                (options_.enable_sequence_parallelism ? ", sequence_parallelism_mode " + options_.sequence_parallelism_mode
                                                      : std::string()));
  }

  // CUDA: tensor-parallel collectives and the dp reduction on NCCL, or over Gloo staged through host
  // memory (ranks sharing a GPU); pipeline messages by send/recv of device tensors.
  PluginTraits traits() const override {
    PluginTraits t;
    t.precisions = {"fp16", "bf16", "fp32"};
    t.devices = {"cpu", "cuda"};
    t.controls_precision = true;
    return t;
  }

  // hybrid_estimate.h's rows, with this plugin's default zero_bucket_size_in_m (in elements).
  std::vector<MemoryEstimate> estimate_memory(const EstimateRequest& r) const override {
    return hybrid_estimate_memory(r, static_cast<int64_t>(HybridOptions{}.zero_bucket_size_in_m * (1 << 20)));
  }
  std::vector<ShadowedSetting> shadowed_settings() const override {
    return {{"booster.mixed_precision", "plugin.precision", shadowed_value(options_.precision)},
            {"mixed_precision", "the plugin's loss-scaler options (plugin.initial_scale, ...)", ""},
            {"booster.max_norm", "plugin.max_norm", shadowed_value(options_.max_norm)},
            {"booster.norm_type", "plugin.norm_type", shadowed_value(options_.norm_type)}};
  }
  nn::TensorParallelContext tensor_parallel_context() const override {
    nn::TensorParallelContext c;
    if (topo_.tp > 1) c.group = topo_.tp_group;
    c.make_vocab_size_divisible_by = options_.make_vocab_size_divisible_by;
    if (options_.sequence_parallelism_mode == "split_gather") c.sequence_parallel = nn::SequenceParallelMode::kSplitGather;
    if (options_.sequence_parallelism_mode == "all_to_all") {
      c.sequence_parallel = nn::SequenceParallelMode::kAllToAll;
      if (topo_.sp > 1) c.sp_group = topo_.sp_group;
    }
    return c;
  }
  // The sp ranks of one data-parallel replica read the same batch (each keeps its sequence shard).
  std::shared_ptr<dist::ProcessGroup> data_parallel_group() const override { return topo_.data_group; }
  Criterion wrap_criterion(Criterion criterion) const override {
    return options_.mixed->wrap_criterion(std::move(criterion));
  }
  std::shared_ptr<checkpoint::CheckpointIO> checkpoint_io() override {
    return std::make_shared<MeshCheckpointIO>(world(), topo_, registry_);
  }

  Configured configure(std::shared_ptr<torch::nn::Module> model,
                       std::shared_ptr<torch::optim::Optimizer> optimizer) override;
  PipelineOutput execute_pipeline(ModelHooks& hooks, const torch::Tensor& inputs, const torch::Tensor& targets,
                                  const Criterion& criterion, OptimizerWrapper* optimizer, bool return_loss,
                                  bool return_outputs) override;

 private:
  void split_into_stages(MeshModel& state);
  void apply_tp_plan(torch::nn::Module& model, const torch::optim::Optimizer* optimizer) const;
  // zero_stage = 3: parallel::fully_shard's runtime over the dp group of this rank's (tp-shard)
  // parameters, with the hybrid norm accounting (MeshFsdpOptimizer).
  Configured configure_fully_sharded(const std::shared_ptr<torch::nn::Module>& model,
                                     const std::shared_ptr<torch::optim::Optimizer>& optimizer,
                                     const std::shared_ptr<MeshModel>& state);
  // split_gather: the tp group over which zero_stage 2 and 3 sum the tp-replicated parameters'
  // partial gradients (booster/parallel/mesh_optimizer.h); null otherwise.
  std::shared_ptr<dist::ProcessGroup> partial_tp() const { return topo_.split_gather ? topo_.tp_group : nullptr; }

  HybridOptions options_;
  MeshTopology topo_;
  std::shared_ptr<MeshModelRegistry> registry_ = std::make_shared<MeshModelRegistry>();
  std::map<const torch::nn::Module*, std::weak_ptr<MeshModelHooks>> hooks_;
  std::map<const torch::nn::Module*, std::shared_ptr<MeshModel>> sharded_states_;  // zero_stage 3
};

void HybridParallelPlugin::split_into_stages(MeshModel& state) {
  parallel::PipelineOptions po;
  po.pp_style = options_.pp_style;
  po.num_model_chunks = options_.num_model_chunks;
  po.pp_partition = options_.pp_partition;
  po.enable_metadata_cache = options_.enable_metadata_cache;
  if (!dynamic_cast<nn::PipelineModule*>(state.module.get()))
    throw PluginError("hybrid_parallel: pp_size = " + std::to_string(topo_.pp) + " needs a model that derives from "
                      "booster::nn::PipelineModule (booster/nn/pipeline.h) and lists its layers in "
                      "pipeline_layers(); this model does not. Set pp_size = 1 or implement pipeline_layers()");
  try {
    state.runner = parallel::pipeline(*state.module, *topo_.mesh, "pp", po);
  } catch (const std::invalid_argument& e) {
    throw PluginError(std::string("hybrid_parallel: ") + e.what());
  }
  state.owner_stage = state.runner->owner_stage();
  state.held = state.runner->held();
  state.shared = state.runner->shared();
}

// [plugin.tp_plan]: shards the dense model's planned layers over the tp group (in place: the
// optimizer keeps the same parameter tensors, now this rank's shards).
void HybridParallelPlugin::apply_tp_plan(torch::nn::Module& model, const torch::optim::Optimizer* optimizer) const {
  if (options_.tp_plan.empty()) return;
  if (optimizer)
    for (const auto& group : optimizer->param_groups())
      for (const auto& p : group.params())
        if (optimizer->state().count(optimizer_state_key(p)))
          throw PluginError("hybrid_parallel: [plugin.tp_plan] shards the parameters at boost(), but the optimizer "
                            "already has state for them (shaped for the dense model); boost before the first step, "
                            "or build the model with booster.tensor_parallel_context() and remove tp_plan");
  try {
    const auto done = parallel::parallelize(model, tensor_parallel_context(), options_.tp_plan);
    if (world()->rank() == 0)
      log::info("hybrid_parallel: tp_plan sharded " + std::to_string(done.size()) + " modules over tp " +
                std::to_string(topo_.tp));
  } catch (const std::exception& e) {
    throw PluginError(std::string("hybrid_parallel: [plugin.tp_plan]: ") + e.what());
  }
}

Configured HybridParallelPlugin::configure(std::shared_ptr<torch::nn::Module> model,
                                           std::shared_ptr<torch::optim::Optimizer> optimizer) {
  apply_tp_plan(*model, optimizer.get());
  // zero_stage 3 keeps fp32 shards and gathers them in fp16 (fully_shard's param_dtype): the model is
  // not cast to half, only checked to be on CUDA.
  if (options_.precision == "fp16" && options_.zero_stage == 3) {
    for (const auto& p : model->parameters())
      if (p.device().is_cpu())
        throw PluginError("hybrid_parallel: precision = \"fp16\" needs the model on a CUDA device (booster.device = "
                          "\"cuda\"); on the CPU set plugin.precision = \"bf16\" or \"fp32\"");
  } else {
    options_.mixed->prepare_model(*model);
  }
  auto state = parallel::make_mesh_model(model);
  if (topo_.pp > 1) split_into_stages(*state);
  // zero_stage 3 keeps fp32 shards and gathers them in bf16 / fp16 (fully_shard's param_dtype).
  if (options_.precision == "bf16" && options_.zero_stage != 3) mixed_precision::cast_floating_point(*model, at::kBFloat16);
  // dp replicas identical at start (tp shards and stages differ, so over the dp group only).
  sync_replicas(*topo_.dp_group, *model);
  if (options_.zero_stage == 3) return configure_fully_sharded(model, optimizer, state);

  auto hooks = std::make_shared<MeshModelHooks>(state, topo_, mib_to_bytes(options_.ddp_bucket_cap_mb),
                                             options_.zero_stage == 2 && optimizer != nullptr);
  registry_->states[model.get()] = state;
  hooks_[model.get()] = hooks;
  Configured c;
  c.hooks = options_.mixed->wrap_hooks(hooks);
  if (!optimizer) return c;
  parallel::drop_other_stages(*state, *optimizer);
  OptimizerWrapperOptions wo = options_.mixed->optimizer_options();
  wo.max_norm = options_.max_norm;
  wo.norm_type = options_.norm_type;
  NormFilter counts = parallel::mesh_norm_filter(*state, topo_);
  if (options_.zero_stage == 0) {
    wo.group = world();
    c.optimizer = std::make_shared<MeshOptimizer>(optimizer, c.hooks, wo, world(), topo_.dp_rank == 0, counts);
  } else {
    wo.group = topo_.dp_group;
    ZeroOptions zo;
    zo.stage = options_.zero_stage;
    zo.reduce_bucket_elements = std::max<int64_t>(1, static_cast<int64_t>(options_.zero_bucket_size_in_m * (1 << 20)));
    std::vector<std::pair<std::string, torch::Tensor>> stage_params;
    for (const auto& [name, p] : state->named_parameters)
      if (state->held.at(name)) stage_params.emplace_back(name, p);
    try {
      c.optimizer = std::make_shared<MeshZeroOptimizer>(optimizer, c.hooks, wo, zo, stage_params, world(), counts,
                                                          partial_tp());
    } catch (const std::invalid_argument& e) {
      throw PluginError(std::string("hybrid_parallel: ") + e.what());
    }
  }
  return c;
}

Configured HybridParallelPlugin::configure_fully_sharded(const std::shared_ptr<torch::nn::Module>& model,
                                                         const std::shared_ptr<torch::optim::Optimizer>& optimizer,
                                                         const std::shared_ptr<MeshModel>& state) {
  parallel::FullyShardOptions fo;
  fo.shard_group = topo_.dp_group;
  fo.world = world();
  if (options_.precision == "bf16" || options_.precision == "fp16") {
    fo.param_dtype = options_.precision == "bf16" ? at::kBFloat16 : at::kHalf;
    fo.reduce_dtype = at::kFloat;
  }
  // Another stage's parameters (released to 0 elements) are neither stepped nor sharded here.
  for (const auto& [name, p] : state->named_parameters)
    if (!state->held.at(name)) const_cast<at::Tensor&>(p).set_requires_grad(false);
  if (optimizer) parallel::drop_other_stages(*state, *optimizer);
  std::shared_ptr<parallel::FullyShardState> runtime;
  try {
    runtime = std::make_shared<parallel::FullyShardState>(*model, optimizer.get(), fo, "hybrid_parallel");
    runtime->install();
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    throw PluginError(what.find("hybrid_parallel") == std::string::npos ? "hybrid_parallel: " + what : what);
  }
  state->sharded = runtime;
  registry_->states[model.get()] = state;
  Configured c;
  if (topo_.pp > 1) {
    // Pipelined: execute_pipeline drives the runtime (parameters gathered for the whole schedule,
    // gradients accumulated over the micro-batches, summed over the stages sharing a parameter,
    // then reduce-scattered over dp once); the hooks refuse a whole-model forward.
    auto hooks = std::make_shared<MeshModelHooks>(state, topo_, mib_to_bytes(options_.ddp_bucket_cap_mb), true);
    hooks_[model.get()] = hooks;
    c.hooks = options_.mixed->wrap_hooks(hooks);
  } else {
    sharded_states_[model.get()] = state;  // the registry holds it weakly; no MeshModelHooks owns it here
    c.hooks = options_.mixed->wrap_hooks(std::make_shared<parallel::ShardedModelHooks>(model, runtime));
  }
  if (!optimizer) return c;
  OptimizerWrapperOptions wo = options_.mixed->optimizer_options();  // fp16: the loss scaler
  wo.master_weights = false;  // the fp32 shards are the masters
  wo.max_norm = options_.max_norm;
  wo.norm_type = options_.norm_type;
  wo.group = world();
  c.optimizer = std::make_shared<MeshFsdpOptimizer>(optimizer, c.hooks, wo, runtime, world(),
                                                    parallel::mesh_norm_filter(*state, topo_), partial_tp());
  std::map<const void*, std::string> names;
  for (const auto& [name, p] : state->named_parameters) names[p.unsafeGetTensorImpl()] = name;
  std::vector<std::string> ordered;
  for (const auto& p : c.optimizer->parameters()) ordered.push_back(names.at(p.unsafeGetTensorImpl()));
  c.optimizer->set_parameter_names(std::move(ordered));
  return c;
}

static PipelineOutput to_output(parallel::PipelineResult r) {
  PipelineOutput out;
  out.loss = std::move(r.loss);
  out.outputs = std::move(r.outputs);
  out.is_last_stage = r.is_last_stage;
  return out;
}

PipelineOutput HybridParallelPlugin::execute_pipeline(ModelHooks& hooks, const torch::Tensor& inputs,
                                                      const torch::Tensor& targets, const Criterion& criterion,
                                                      OptimizerWrapper* optimizer, bool return_loss,
                                                      bool return_outputs) {
  std::shared_ptr<MeshModel> found = registry_->find(hooks.module());
  if (!found) throw PluginError("hybrid_parallel: execute_pipeline got a model this plugin did not boost");
  MeshModel& state = *found;
  auto it = hooks_.find(&hooks.module());
  auto mine = it == hooks_.end() ? nullptr : it->second.lock();
  if (!state.runner || !mine)
    throw PluginError("hybrid_parallel: execute_pipeline needs pp_size > 1 (this model is not pipelined: pp_size = 1); "
                      "train it with model.forward + booster.backward");
  parallel::PipelineRunOptions o;
  const int64_t batch = inputs.defined() && inputs.dim() > 0 ? inputs.size(0) : 0;
  if (options_.num_microbatches > 0) {
    o.microbatches = static_cast<int>(options_.num_microbatches);
  } else {
    if (batch % options_.microbatch_size != 0)
      throw std::invalid_argument("booster: execute_pipeline: batch size " + std::to_string(batch) +
                                  " is not a multiple of microbatch_size = " + std::to_string(options_.microbatch_size));
    o.microbatches = static_cast<int>(batch / options_.microbatch_size);
  }
  o.train = optimizer != nullptr;
  o.return_loss = return_loss;
  o.return_outputs = return_outputs;
  return to_output(parallel::run_mesh_pipeline(state, *mine, inputs, targets, criterion, o));
}

}  // namespace booster::hybrid

BOOSTER_PLUGIN("hybrid_parallel", "0.1.0", booster::hybrid::HybridParallelPlugin)
