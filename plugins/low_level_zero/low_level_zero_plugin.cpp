// low_level_zero_plugin.cpp — the LowLevelZero plugin: ZeRO stage 1 (optimizer states sharded) and
// stage 2 (gradients too) across the data-parallel ranks, ColossalAI's LowLevelZeroPlugin in C++.
// A recipe over booster::parallel::shard_optimizer_states / shard_gradients (parallel/zero.h): this
// file maps the options and controls precision (the model is cast to bf16 with fp32 master slices,
// as ColossalAI casts it to fp16/bf16).
#include <torch/cuda.h>
#include <torch/torch.h>

#include "booster/dist/process_group.h"
#include "booster/mixed_precision/precision.h"
#include "booster/parallel/zero.h"
#include "booster/plugin.h"

namespace booster::plugins {

// ---------------------------------------------------------------------------------------------
// Options ([plugin] table): names and defaults of ColossalAI's LowLevelZeroPlugin

struct LowLevelZeroOptions {
  int stage = 1;                        // 1 | 2
  std::string precision = "fp16";       // "fp16" (CUDA only) | "bf16" | "fp32"
  double max_norm = 0.0;                // > 0: clip gradients to this global norm in step()
  double norm_type = 2.0;               // 2.0 or inf
  double reduce_bucket_size_in_m = 12;  // gradient bucket, millions (2^20) of elements
  // "" (the parameters' dtype) | "fp32" | "bf16" | "fp16" (CUDA) | "fp8" (float8 e4m3 with one
  // scale per bucket per rank, dist/fp8.h); ColossalAI's fp8_communication = true is "fp8".
  std::string communication_dtype;
  bool overlap_communication = true;    // reduce buckets during backward
  bool cpu_offload = false;             // master slice, optimizer states and step in host memory
  bool master_weights = true;           // fp32 master slice for bf16/fp16 models
  std::shared_ptr<mixed_precision::MixedPrecision> mixed;  // the precision's hooks/criterion/scaler
};

static LowLevelZeroOptions parse_options(const Options& o) {
  LowLevelZeroOptions t;
  t.stage = static_cast<int>(o.get_int("stage", t.stage, 1, 2));
  t.precision = o.get_choice("precision", t.precision, {"fp16", "bf16", "fp32"});
  t.max_norm = o.get_double("max_norm", t.max_norm, 0.0);
  t.norm_type = o.get_double("norm_type", t.norm_type, 1e-9, INFINITY);
  t.reduce_bucket_size_in_m = o.get_double("reduce_bucket_size_in_m", t.reduce_bucket_size_in_m, 1e-6, 1e6);
  t.communication_dtype = mixed_precision::communication_dtype_option(o, {"", "fp32", "bf16", "fp16", "fp8"});
  t.overlap_communication = o.get_bool("overlap_communication", t.overlap_communication);
  t.cpu_offload = o.get_bool("cpu_offload", t.cpu_offload);
  t.master_weights = o.get_bool("master_weights", t.master_weights);
  // Reads the loss-scaler options (initial_scale, min_scale, growth_factor, backoff_factor,
  // growth_interval, hysteresis, max_scale) and checks the table for unknown keys.
  mixed_precision::DynamicGradScalerOptions scaler_defaults;
  scaler_defaults.initial_scale = 4294967296.0;  // 2^32: LowLevelZeroPlugin's default (booster's is 2^16)
  t.mixed = mixed_precision::make_mixed_precision(t.precision, o, scaler_defaults);
  if (t.precision == "fp16" && !torch::cuda::is_available())
    throw PluginError("low_level_zero: precision = \"fp16\" (ColossalAI's default) needs a CUDA device, and this "
                      "machine has none: LibTorch has no fp16 kernels for most CPU ops. Set plugin.precision = "
                      "\"bf16\" (bf16 weights, fp32 master slices) or \"fp32\".");
  if (t.communication_dtype == "fp16" && !torch::cuda::is_available())
    throw PluginError("low_level_zero: communication_dtype = \"fp16\" needs CUDA; use \"bf16\", \"fp8\" or \"fp32\" on CPU");
  return t;
}

// ---------------------------------------------------------------------------------------------
// Plugin

class LowLevelZeroPlugin : public Plugin {
 public:
  explicit LowLevelZeroPlugin(const PluginContext& ctx) : Plugin(ctx), options_(parse_options(ctx.options)) {}

  PluginTraits traits() const override {
    PluginTraits t;
    t.precisions = {"fp16", "bf16", "fp32"};
    t.devices = {"cpu", "cuda"};
    t.controls_precision = true;
    t.supports_no_sync = true;
    return t;
  }

  // Stage 1 and stage 2 at the request's precision (ZeRO's formulas, core/memory_estimate.h), with
  // the default bucket of reduce_bucket_size_in_m = 12.
  std::vector<MemoryEstimate> estimate_memory(const EstimateRequest& r) const override {
    if (r.precision == "fp16" && !torch::cuda::is_available()) return {};
    const int64_t bytes = precision_bytes(r.precision);
    const int64_t bucket = static_cast<int64_t>(LowLevelZeroOptions{}.reduce_bucket_size_in_m * (1 << 20));
    std::vector<MemoryEstimate> rows;
    for (int stage : {1, 2}) {
      MemoryEstimate e = zero_estimate(r, stage, r.parameters, r.world_size, bytes, bucket, r.largest_parameter);
      e.configuration = "stage = " + std::to_string(stage) + ", precision = \"" + r.precision + "\"";
      e.options = {"stage=" + std::to_string(stage), "precision=\"" + r.precision + "\""};
      rows.push_back(std::move(e));
    }
    return rows;
  }

  // The plugin builds the optimizer wrapper, so precision, the loss scaler and clipping are its own
  // options (ColossalAI's LowLevelZeroPlugin arguments).
  std::vector<ShadowedSetting> shadowed_settings() const override {
    return {{"booster.mixed_precision", "plugin.precision", shadowed_value(options_.precision)},
            {"mixed_precision", "the plugin's loss-scaler options (plugin.initial_scale, plugin.growth_interval, ...)", ""},
            {"booster.max_norm", "plugin.max_norm", shadowed_value(options_.max_norm)},
            {"booster.norm_type", "plugin.norm_type", shadowed_value(options_.norm_type)}};
  }

  Configured configure(std::shared_ptr<torch::nn::Module> model,
                       std::shared_ptr<torch::optim::Optimizer> optimizer) override {
    // Precision: bf16/fp16 weights (ColossalAI casts the module); fp32 master slices below.
    options_.mixed->prepare_model(*model);  // device checks (fp16 needs CUDA and casts to half)
    if (options_.precision == "bf16") mixed_precision::cast_floating_point(*model, at::kBFloat16);

    OptimizerWrapperOptions wo = options_.mixed->optimizer_options();  // fp16: a fresh loss scaler
    wo.max_norm = options_.max_norm;
    wo.norm_type = options_.norm_type;
    wo.master_weights = options_.master_weights;
    ZeroOptions zo;
    zo.reduce_bucket_elements = std::max<int64_t>(1, static_cast<int64_t>(options_.reduce_bucket_size_in_m * (1 << 20)));
    zo.overlap_communication = options_.overlap_communication;
    zo.communication_dtype = mixed_precision::dtype_from_name(options_.communication_dtype);
    zo.cpu_offload = options_.cpu_offload;
    auto decorate = [this](std::shared_ptr<ModelHooks> hooks) { return options_.mixed->wrap_hooks(std::move(hooks)); };
    parallel::ZeroModel zero;
    try {
      zero = options_.stage == 1 ? parallel::shard_optimizer_states(model, optimizer, world(), zo, wo, decorate)
                                 : parallel::shard_gradients(model, optimizer, world(), zo, wo, decorate);
    } catch (const std::invalid_argument& e) {
      throw PluginError(std::string("low_level_zero: ") + e.what());
    }
    Configured c;
    c.hooks = zero.hooks;
    c.optimizer = zero.optimizer;
    return c;
  }

  ScopeGuard no_sync(ModelHooks& hooks, OptimizerWrapper*) override {
    if (options_.stage == 2)
      throw PluginError("low_level_zero: no_sync is not supported with stage = 2 (each rank keeps only its "
                        "gradient shard, so unsynchronised local accumulation has nowhere to live). Use stage = 1, "
                        "or call backward on every micro-batch without no_sync: stage 2 accumulates the reduced "
                        "gradients into the shard until zero_grad().");
    return pause_grad_sync(hooks);
  }

  Criterion wrap_criterion(Criterion criterion) const override {
    return options_.mixed->wrap_criterion(std::move(criterion));
  }

 private:
  LowLevelZeroOptions options_;
};

}  // namespace booster::plugins

BOOSTER_PLUGIN("low_level_zero", "0.1.0", booster::plugins::LowLevelZeroPlugin)
