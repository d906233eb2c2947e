// torch_fsdp_plugin.cpp — the TorchFSDP plugin (`plugin = "torch_fsdp"`, ColossalAI's
// TorchFSDPPlugin): ZeRO-3 as PyTorch FSDP does it, per shard unit (booster::nn::Unit). This file
// maps the [plugin] options (PyTorch FSDP's names and defaults), builds the process mesh of the
// sharding strategy, keeps the ranks' initial weights identical, and applies
// booster::parallel::fully_shard (the runtime, the optimizer on the shards, the checkpoint IO).
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <optional>

#include "booster/core/replica.h"
#include "booster/dist/process_group.h"
#include "booster/dist/process_mesh.h"
#include "booster/mixed_precision/grad_scaler.h"
#include "booster/mixed_precision/precision.h"
#include "booster/parallel/fully_shard.h"
#include "booster/plugin.h"

namespace booster::plugins::fsdp {

// ---------------------------------------------------------------------------------------------
// Options ([plugin] table)

struct FsdpOptions {
  std::string sharding_strategy = "FULL_SHARD";  // FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD
  int64_t shard_group_size = 0;                  // HYBRID_SHARD: ranks per shard group (0: LOCAL_WORLD_SIZE)
  std::string backward_prefetch = "BACKWARD_PRE";  // BACKWARD_PRE | BACKWARD_POST | none
  bool forward_prefetch = false;
  bool limit_all_gathers = true;
  bool sync_module_states = false;
  bool cpu_offload = false;  // CPU: a no-op (the shards live in host memory); CUDA: shards in pinned host memory
  std::string param_dtype, reduce_dtype, buffer_dtype;  // [plugin.mixed_precision]; "" = unchanged
  // [plugin.mixed_precision] initial_scale, growth_factor, ... (DynamicGradScaler's names and
  // defaults): the loss scaler of fp16 parameters or gradients.
  mixed_precision::DynamicGradScalerOptions scaler;
  double max_norm = 0.0;
  double norm_type = 2.0;
  // "" | "fp8": float8 e4m3 parameter all-gathers and gradient reduce-scatters (dist/fp8.h);
  // ColossalAI's fp8_communication = true is "fp8". bf16 on the wire is param_dtype / reduce_dtype.
  std::string communication_dtype;
};

static FsdpOptions parse_options(const Options& o) {
  FsdpOptions t;
  t.sharding_strategy =
      o.get_choice("sharding_strategy", t.sharding_strategy, {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"});
  t.shard_group_size = o.get_int("shard_group_size", 0, 0);
  if (o.has("shard_group_size") && t.sharding_strategy != "HYBRID_SHARD")
    throw ConfigError(o.where("shard_group_size") + ": shard_group_size applies to sharding_strategy = "
                      "\"HYBRID_SHARD\" only (the strategy is \"" + t.sharding_strategy + "\"); remove it or set "
                      "the strategy to HYBRID_SHARD");
  t.backward_prefetch = o.get_choice("backward_prefetch", t.backward_prefetch, {"BACKWARD_PRE", "BACKWARD_POST", "none"});
  t.forward_prefetch = o.get_bool("forward_prefetch", t.forward_prefetch);
  t.limit_all_gathers = o.get_bool("limit_all_gathers", t.limit_all_gathers);
  t.sync_module_states = o.get_bool("sync_module_states", t.sync_module_states);
  t.cpu_offload = o.get_bool("cpu_offload", t.cpu_offload);
  t.max_norm = o.get_double("max_norm", t.max_norm, 0.0);
  t.norm_type = o.get_double("norm_type", t.norm_type, 1e-9, INFINITY);
  t.communication_dtype = mixed_precision::communication_dtype_option(o, {"", "fp32", "bf16", "fp16", "fp8"});
  if (!t.communication_dtype.empty() && t.communication_dtype != "fp8")
    throw ConfigError(o.where("communication_dtype") + ": torch_fsdp takes communication_dtype = \"fp8\" only; "
                      "it all-gathers parameters in [plugin.mixed_precision] param_dtype and reduce-scatters "
                      "gradients in reduce_dtype, so set those to \"" + t.communication_dtype + "\" instead");
  if (o.has("mixed_precision")) {
    Options mp = o.table("mixed_precision");
    t.param_dtype = mp.get_choice("param_dtype", "", {"", "fp32", "bf16", "fp16"});
    t.reduce_dtype = mp.get_choice("reduce_dtype", "", {"", "fp32", "bf16", "fp16"});
    t.buffer_dtype = mp.get_choice("buffer_dtype", "", {"", "fp32", "bf16", "fp16"});
    t.scaler = mixed_precision::DynamicGradScaler::from_options(mp);
    if (t.param_dtype == "fp16" || t.reduce_dtype == "fp16") {
      try {
        mixed_precision::DynamicGradScaler check(t.scaler);  // validates the values
      } catch (const std::invalid_argument& e) {
        throw ConfigError(mp.where("initial_scale") + ": " + e.what());
      }
    }
    mp.check_unknown();
  }
  return t;
}

// The launched job's ranks per node (torchrun / booster run set LOCAL_WORLD_SIZE).
static int64_t local_world_size(int world) {
  const char* env = std::getenv("LOCAL_WORLD_SIZE");
  return env != nullptr && std::atoi(env) > 0 ? std::atoi(env) : world;
}

// ---------------------------------------------------------------------------------------------
// Identical initial weights on every rank

// A 64-bit digest of the module's parameter and buffer bytes (FNV-1a over every element).
static int64_t digest_of(const torch::nn::Module& model) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](const at::Tensor& t) {
    at::Tensor c = t.detach().contiguous();
    if (!c.device().is_cpu()) c = c.to(at::kCPU);
    const auto* bytes = static_cast<const unsigned char*>(c.data_ptr());
    const size_t n = static_cast<size_t>(c.numel()) * c.element_size();
    for (size_t i = 0; i < n; ++i) h = (h ^ bytes[i]) * 1099511628211ULL;
  };
  for (const auto& p : model.parameters()) mix(p);
  for (const auto& b : model.buffers()) mix(b);
  return static_cast<int64_t>(h);
}

// sync_module_states: rank 0's weights everywhere (FSDP's broadcast at wrap time). Otherwise the
// weights must already be equal (a seeded init): checked, since unequal shards would silently mix.
static void make_replicas_identical(dist::ProcessGroup& world, torch::nn::Module& model, bool sync) {
  if (sync) {
    sync_replicas(world, model);
    return;
  }
  auto named = named_parameters_of(model, false);
  auto buffers = named_buffers_of(model);
  named.insert(named.end(), buffers.begin(), buffers.end());
  verify_replicas(world, named);
  const auto digests = world.all_gather_int64({digest_of(model)});
  for (int r = 1; r < world.size(); ++r)
    if (digests[r][0] != digests[0][0])
      throw PluginError("torch_fsdp: the model's initial weights differ between rank 0 and rank " + std::to_string(r) +
                        " (FSDP shards rank-local values, so the ranks' shards would come from different models); "
                        "seed every rank identically before building the model, or set plugin.sync_module_states = "
                        "true to broadcast rank 0's weights");
}

// ---------------------------------------------------------------------------------------------
// Plugin

class TorchFSDPPlugin : public Plugin {
 public:
  explicit TorchFSDPPlugin(const PluginContext& ctx) : Plugin(ctx), options_(parse_options(ctx.options)) {
    const int world_size = world()->size();
    int64_t shard = world_size;
    if (options_.sharding_strategy == "NO_SHARD") shard = 1;
    if (options_.sharding_strategy == "HYBRID_SHARD") {
      shard = options_.shard_group_size > 0 ? options_.shard_group_size : local_world_size(world_size);
      if (shard > world_size || world_size % shard != 0)
        throw PluginError("torch_fsdp: HYBRID_SHARD shard_group_size = " + std::to_string(shard) +
                          " does not divide the world size " + std::to_string(world_size) +
                          "; set plugin.shard_group_size to a divisor of " + std::to_string(world_size) +
                          " (the ranks per node, usually)");
    }
    mesh_ = std::make_shared<dist::ProcessMesh>(
        world(), std::vector<dist::ProcessMesh::Dim>{{"replicate", static_cast<int>(world_size / shard)},
                                                      {"shard", static_cast<int>(shard)}});
    if (!options_.param_dtype.empty() && options_.param_dtype != "fp32")
      mixed_ = mixed_precision::make_mixed_precision(options_.param_dtype, Options("mixed_precision"));
  }

  // CUDA: the FlatParameters, their gathered storage and the optimizer step live on the model's
  // device; collectives run on NCCL, or over Gloo staged through host memory (ranks sharing a GPU).
  PluginTraits traits() const override {
    PluginTraits t;
    t.precisions = {"fp32", "bf16"};
    t.devices = {"cpu", "cuda"};
    t.controls_precision = true;
    t.supports_no_sync = true;
    return t;
  }

  // ZeRO-3 (Rajbhandari et al.; PyTorch FSDP, Zhao et al., VLDB 2023), core/memory_estimate.h's
  // fully_sharded_estimate: fp32 shards of the parameters, gradients and optimizer states over the
  // shard group S, plus while an iteration runs the gathered units in param_dtype (FULL_SHARD /
  // HYBRID_SHARD: the unit in backward and the one BACKWARD_PRE prefetches; SHARD_GRAD_OP: every
  // unit, kept from forward to backward) and two full-size fp32 gradients of the unit being reduced
  // (autograd's and the flat one); or the step's temporaries on a unit's shard, whichever is more.
  // Rows: FULL_SHARD, SHARD_GRAD_OP and, from 4 ranks, HYBRID_SHARD over two groups of world/2 ranks.
  std::vector<MemoryEstimate> estimate_memory(const EstimateRequest& r) const override {
    if (r.precision != "fp32" && r.precision != "bf16") return {};
    struct Row {
      std::string strategy;
      int64_t shard_group;
    };
    std::vector<Row> rows{{"FULL_SHARD", r.world_size}, {"SHARD_GRAD_OP", r.world_size}};
    if (r.world_size >= 4 && r.world_size % 2 == 0) rows.push_back({"HYBRID_SHARD", r.world_size / 2});
    std::vector<MemoryEstimate> out;
    for (const Row& row : rows) {
      FullyShardedSchedule schedule;
      schedule.shard_group = row.shard_group;
      schedule.gathered_bytes = precision_bytes(r.precision);
      schedule.keep_gathered = row.strategy == "SHARD_GRAD_OP";
      // HYBRID_SHARD's volume is 3Ψ within the shard group, plus the 2Ψ/S allreduce across replicas.
      schedule.replicated = row.strategy == "HYBRID_SHARD";
      MemoryEstimate e = fully_sharded_estimate(r, r.parameters, r.largest_unit, schedule);
      e.configuration = "sharding_strategy = \"" + row.strategy + "\"";
      e.options = {"sharding_strategy=\"" + row.strategy + "\""};
      if (row.strategy == "HYBRID_SHARD") {
        e.configuration += ", shard_group_size = " + std::to_string(row.shard_group);
        e.options.push_back("shard_group_size=" + std::to_string(row.shard_group));
      }
      if (r.precision == "bf16") {
        e.configuration += ", param_dtype = \"bf16\"";
        e.options.push_back("mixed_precision.param_dtype=\"bf16\"");
      }
      if (r.units == 0) e.note = "the model has no nn::Unit: it is one unit, gathered whole";
      out.push_back(std::move(e));
    }
    return out;
  }

  std::vector<ShadowedSetting> shadowed_settings() const override {
    const std::string precision = options_.param_dtype.empty() ? "fp32" : options_.param_dtype;
    return {{"booster.mixed_precision", "plugin.mixed_precision.param_dtype", shadowed_value(precision)},
            {"mixed_precision", "[plugin.mixed_precision] (param_dtype, reduce_dtype, buffer_dtype)", ""},
            {"booster.max_norm", "plugin.max_norm", shadowed_value(options_.max_norm)},
            {"booster.norm_type", "plugin.norm_type", shadowed_value(options_.norm_type)}};
  }

  Configured configure(std::shared_ptr<torch::nn::Module> model,
                       std::shared_ptr<torch::optim::Optimizer> optimizer) override {
    std::optional<c10::Device> device;
    for (const auto& p : model->parameters()) {
      if (!device) device = p.device();
      if (p.device() != *device)
        throw PluginError("torch_fsdp: parameters on " + device->str() + " and on " + p.device().str() +
                          "; FSDP flattens each unit into one buffer, so every parameter must be on one device "
                          "(the Booster moves the model to booster.device: leave it there)");
    }
    const bool fp16 = options_.param_dtype == "fp16" || options_.reduce_dtype == "fp16" || options_.buffer_dtype == "fp16";
    if (fp16 && (!device || device->is_cpu()))
      throw PluginError("torch_fsdp: [plugin.mixed_precision] fp16 needs the model on a CUDA device (booster.device = "
                        "\"cuda\"); on the CPU LibTorch has no fp16 kernels for most ops: use \"bf16\" or \"fp32\"");
    // bf16: autocast on the model's device type (the fp16 component's would cast the model to half;
    // the shards keep full precision, so it is not called).
    if (mixed_ && options_.param_dtype == "bf16") mixed_->prepare_model(*model);
    make_replicas_identical(*world(), *model, options_.sync_module_states);
    if (!options_.buffer_dtype.empty()) {
      const at::ScalarType dtype = mixed_precision::dtype_from_name(options_.buffer_dtype);
      torch::NoGradGuard no_grad;
      for (auto& b : model->buffers())
        if (b.is_floating_point()) b.set_data(b.to(dtype));
    }

    parallel::FullyShardOptions config;
    config.strategy = options_.sharding_strategy == "SHARD_GRAD_OP" ? parallel::ShardingStrategy::kShardGradOp
                      : options_.sharding_strategy == "NO_SHARD"    ? parallel::ShardingStrategy::kNoShard
                      : options_.sharding_strategy == "HYBRID_SHARD" ? parallel::ShardingStrategy::kHybridShard
                                                                     : parallel::ShardingStrategy::kFullShard;
    config.backward_prefetch = options_.backward_prefetch == "BACKWARD_PRE"    ? parallel::BackwardPrefetch::kBackwardPre
                               : options_.backward_prefetch == "BACKWARD_POST" ? parallel::BackwardPrefetch::kBackwardPost
                                                                               : parallel::BackwardPrefetch::kNone;
    config.forward_prefetch = options_.forward_prefetch;
    config.limit_all_gathers = options_.limit_all_gathers;
    config.param_dtype = mixed_precision::dtype_from_name(options_.param_dtype);
    config.reduce_dtype = mixed_precision::dtype_from_name(options_.reduce_dtype);
    config.fp8_communication = options_.communication_dtype == "fp8";
    config.shard_group = mesh_->group("shard");
    config.replicate_group = mesh_->group("replicate");

    config.world = world();
    config.cpu_offload = options_.cpu_offload;
    OptimizerWrapperOptions wo;
    // fp16 parameters or gradients: the dynamic loss scaler (ColossalAI's defaults) decorates the step.
    if (options_.param_dtype == "fp16" || options_.reduce_dtype == "fp16")
      wo.scaler = std::make_shared<mixed_precision::DynamicGradScaler>(options_.scaler);
    wo.max_norm = options_.max_norm;
    wo.norm_type = options_.norm_type;
    parallel::HooksDecorator decorate;
    if (mixed_) decorate = [this](std::shared_ptr<ModelHooks> hooks) { return mixed_->wrap_hooks(std::move(hooks)); };
    parallel::ShardedModel sharded;
    try {
      sharded = parallel::fully_shard(model, optimizer, config, wo, decorate, "torch_fsdp");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      throw PluginError(what.find("torch_fsdp") == std::string::npos ? "torch_fsdp: " + what : what);
    }
    state_ = sharded.runtime;
    return {sharded.hooks, sharded.optimizer};
  }

  std::shared_ptr<checkpoint::CheckpointIO> checkpoint_io() override {
    return std::make_shared<parallel::ShardedCheckpointIO>(world(), state_, "torch_fsdp");
  }

  Criterion wrap_criterion(Criterion criterion) const override {
    return mixed_ ? mixed_->wrap_criterion(std::move(criterion)) : criterion;
  }

 private:
  FsdpOptions options_;
  std::shared_ptr<dist::ProcessMesh> mesh_;
  std::shared_ptr<mixed_precision::MixedPrecision> mixed_;
  std::weak_ptr<parallel::ShardedRuntime> state_;
};

}  // namespace booster::plugins::fsdp

BOOSTER_PLUGIN("torch_fsdp", "0.1.0", booster::plugins::fsdp::TorchFSDPPlugin)
