// gemini_plugin.cpp — the Gemini plugin (`plugin = "gemini"`, ColossalAI's GeminiPlugin): ZeRO-3
// over chunks with heterogeneous memory placement. This file maps the [plugin] options (ColossalAI's
// names and defaults, plus memory_budget_mb and offload_dir), checks that the ranks
// start from the same weights, and calls booster/parallel/gemini.h's gemini_shard, which builds the
// chunks, the optimizer on the master shards and the checkpoint IO.
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "booster/core/replica.h"
#include "booster/device.h"
#include "booster/dist/process_group.h"
#include "booster/logging.h"
#include "booster/mixed_precision/precision.h"
#include "booster/plugin.h"
#include "booster/parallel/gemini.h"

namespace booster::plugins::gemini {

// ---------------------------------------------------------------------------------------------
// Options ([plugin] table)

struct GeminiOptions {
  std::string precision = "fp16";  // ColossalAI's default; needs CUDA
  std::string placement_policy = "static";
  double shard_param_frac = 1.0, offload_optim_frac = 0.0, offload_param_frac = 0.0;
  double warmup_non_model_data_ratio = 0.8, steady_cuda_cap_ratio = 0.9;
  double search_range_m = 32, min_chunk_size_m = 32;
  int64_t hidden_dim = 0;  // 0: ColossalAI's None (search interval 1024)
  int64_t max_prefetch = 0;
  bool enable_gradient_accumulation = false;
  double memory_budget_mb = 0;  // auto: 0 = the compute device's memory (CPU: the available memory)
  bool pin_memory_set = false, pin_memory = false;  // ColossalAI's pin_memory: see configure()
  double gpu_margin_mem_ratio = 0.0;  // auto: share of the compute margin for optimizer sides
  std::string offload_dir;
  double max_norm = 0.0, norm_type = 2.0;
  // "" | "fp8": float8 e4m3 chunk all-gathers and gradient reduce-scatters (dist/fp8.h); ColossalAI's
  // fp8_communication = true is "fp8". bf16 on the wire is precision = "bf16".
  std::string communication_dtype;
  std::shared_ptr<mixed_precision::MixedPrecision> mixed;
};

static GeminiOptions parse_options(const Options& o) {
  GeminiOptions t;
  const std::string w = "gemini: ";
  t.precision = o.get_choice("precision", t.precision, {"fp16", "bf16", "fp32"});
  t.placement_policy = o.get_choice("placement_policy", t.placement_policy, {"static", "auto"});
  t.shard_param_frac = o.get_double("shard_param_frac", t.shard_param_frac, 0.0, 1.0);
  t.offload_optim_frac = o.get_double("offload_optim_frac", t.offload_optim_frac, 0.0, 1.0);
  t.offload_param_frac = o.get_double("offload_param_frac", t.offload_param_frac, 0.0, 1.0);
  t.warmup_non_model_data_ratio = o.get_double("warmup_non_model_data_ratio", t.warmup_non_model_data_ratio, 0.0, 1.0);
  t.steady_cuda_cap_ratio = o.get_double("steady_cuda_cap_ratio", t.steady_cuda_cap_ratio, 0.0, 1.0);
  t.search_range_m = o.get_double("search_range_m", t.search_range_m, 0.0, 1e6);
  t.min_chunk_size_m = o.get_double("min_chunk_size_m", t.min_chunk_size_m, 0.0, 1e6);
  t.hidden_dim = o.get_int("hidden_dim", 0, 1);
  t.max_prefetch = o.get_int("max_prefetch", t.max_prefetch, 0, 1 << 20);
  t.enable_gradient_accumulation = o.get_bool("enable_gradient_accumulation", t.enable_gradient_accumulation);
  t.memory_budget_mb = o.get_double("memory_budget_mb", 0, 0.0, 1e12);
  t.offload_dir = o.get_string("offload_dir", "");
  t.max_norm = o.get_double("max_norm", t.max_norm, 0.0);
  t.norm_type = o.get_double("norm_type", t.norm_type, 1e-9, INFINITY);
  t.communication_dtype = mixed_precision::communication_dtype_option(o, {"", "fp32", "bf16", "fp16", "fp8"});
  if (!t.communication_dtype.empty() && t.communication_dtype != "fp8")
    throw PluginError(w + o.where("communication_dtype") + ": gemini takes communication_dtype = \"fp8\" only; its "
                      "chunks travel in the compute dtype, so set precision = \"" + t.communication_dtype +
                      "\" for that wire dtype instead");
  t.pin_memory_set = o.has("pin_memory");
  t.pin_memory = o.get_bool("pin_memory", true);
  if (o.has("tp_size") && o.get_int("tp_size", 1, 1) != 1)
    throw PluginError(w + o.where("tp_size") + ": tensor parallelism inside Gemini is not supported; use plugin = "
                      "\"hybrid_parallel\" for tp_size > 1, or remove tp_size");
  t.gpu_margin_mem_ratio = o.get_double("gpu_margin_mem_ratio", t.gpu_margin_mem_ratio, 0.0, 1.0);
  // A setting of the other policy is an error when it would change something (not at its default), so
  // a config can list both policies' options and switch with --set plugin.placement_policy=...
  const GeminiOptions defaults;
  const std::vector<std::pair<const char*, bool>> auto_only{
      {"warmup_non_model_data_ratio", t.warmup_non_model_data_ratio != defaults.warmup_non_model_data_ratio},
      {"steady_cuda_cap_ratio", t.steady_cuda_cap_ratio != defaults.steady_cuda_cap_ratio},
      {"memory_budget_mb", t.memory_budget_mb != defaults.memory_budget_mb},
      {"gpu_margin_mem_ratio", t.gpu_margin_mem_ratio != defaults.gpu_margin_mem_ratio}};
  const std::vector<std::pair<const char*, bool>> static_only{
      {"shard_param_frac", t.shard_param_frac != defaults.shard_param_frac},
      {"offload_optim_frac", t.offload_optim_frac != defaults.offload_optim_frac},
      {"offload_param_frac", t.offload_param_frac != defaults.offload_param_frac}};
  for (const auto& [key, changed] : t.placement_policy == "static" ? auto_only : static_only)
    if (changed)
      throw PluginError(w + o.where(key) + ": " + key + " applies to placement_policy = \"" +
                        (t.placement_policy == "static" ? "auto" : "static") + "\" only (the policy is \"" +
                        t.placement_policy + "\"); remove it, leave it at its default, or change the policy");
  if (t.offload_param_frac > 0 && t.shard_param_frac < 1.0)
    throw PluginError(w + o.where("offload_param_frac") + ": offload_param_frac needs shard_param_frac = 1.0 "
                      "(ColossalAI's rule: only sharded parameter chunks are offloaded)");
  mixed_precision::DynamicGradScalerOptions scaler_defaults;
  scaler_defaults.initial_scale = 65536.0;  // GeminiPlugin's initial_scale = 2^16
  t.mixed = mixed_precision::make_mixed_precision(t.precision, o, scaler_defaults);  // + check_unknown
  if (t.precision == "fp16" && !torch::cuda::is_available())
    throw PluginError(w + "precision = \"fp16\" (ColossalAI's default) needs a CUDA device, and this machine has "
                      "none: LibTorch has no fp16 kernels for most CPU ops. Set plugin.precision = \"bf16\" (bf16 "
                      "chunks, fp32 master shards) or \"fp32\".");
  return t;
}

static int64_t available_memory_bytes() {
  return static_cast<int64_t>(::sysconf(_SC_AVPHYS_PAGES)) * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

// ---------------------------------------------------------------------------------------------
// Plugin

class GeminiPlugin : public Plugin {
 public:
  explicit GeminiPlugin(const PluginContext& ctx) : Plugin(ctx), options_(parse_options(ctx.options)) {}

  PluginTraits traits() const override {
    PluginTraits t;
    t.precisions = {"fp16", "bf16", "fp32"};
    t.controls_precision = true;
    t.supports_no_sync = true;
    // cuda: chunks and the compute tier on the device, the host tier in (pinned) host memory.
    t.devices = {"cpu", "cuda"};
    return t;
  }

  // Chunk-based ZeRO-3 (ColossalAI's Gemini): per rank a 1/N shard of every chunk in the training
  // precision, its gradient shard, the fp32 master shard (kept apart from the parameters even in
  // fp32) and the optimizer states; while an iteration runs, two chunks gathered (the chunk in use
  // and the next) and one chunk's fp32 gradient. Chunks are at least min_chunk_size_m = 32 Mi
  // elements (ColossalAI's default); a smaller model is one chunk kept gathered, and two more rows
  // shard it in chunks of about an eighth of it (min_chunk_size_m and search_range_m = 0 in their
  // options). Rows: the default placement (everything in memory), and the optimizer side (master +
  // states) in an offload_dir file, stepped one chunk at a time (options carry offload_dir="" for
  // the caller to fill in). On cuda a third row per chunking offloads the optimizer side to pinned
  // host memory (offload_optim_frac = 1.0); the rows place on the device the parameter shards, the
  // gathered chunks, the backward's buffers, the activations and whatever is not offloaded
  // (device_bytes), the rest in host memory.
  std::vector<MemoryEstimate> estimate_memory(const EstimateRequest& r) const override {
    if (r.precision == "fp16" && !torch::cuda::is_available()) return {};
    const int64_t min_chunk = static_cast<int64_t>(GeminiOptions{}.min_chunk_size_m * (1 << 20));
    std::vector<MemoryEstimate> out;
    if (r.parameters >= min_chunk) {
      append_estimates(r, std::min(std::max(min_chunk, r.largest_parameter), r.parameters), false, {}, out);
    } else {
      // Under min_chunk_size_m the model is one chunk kept gathered (ColossalAI's default); the rows
      // after it shard such a model in chunks of about an eighth of it (at least its largest
      // parameter), which is what makes Gemini the most frugal choice for a small model.
      append_estimates(r, r.parameters, true, {}, out);
      const int64_t chunk = std::max(r.largest_parameter, (r.parameters + 7) / 8);
      if (chunk < r.parameters) {
        char m[64];
        std::snprintf(m, sizeof m, "%.9g", static_cast<double>(chunk) / (1 << 20));
        append_estimates(r, chunk, false, {std::string("min_chunk_size_m=") + m, "search_range_m=0"}, out);
      }
    }
    return out;
  }

  // The rows without and with offload_dir for chunks of `chunk` elements (one_chunk: the whole
  // model, kept gathered), with extra options selecting that chunk size.
  static void append_estimates(const EstimateRequest& r, int64_t chunk, bool one_chunk,
                               const std::vector<std::string>& chunk_options, std::vector<MemoryEstimate>& out) {
    const int64_t e_bytes = precision_bytes(r.precision);
    const int64_t N = r.world_size;
    const int64_t shard = (r.parameters + N - 1) / N;
    const int64_t chunk_shard = (chunk + N - 1) / N;
    const int64_t optim_side = 4 * shard + static_cast<int64_t>(r.optimizer_state_bytes_per_parameter * shard + 0.5);
    const bool cuda = r.device == "cuda";
    // 0: everything in compute memory; 1: the optimizer side in the offload_dir file; 2 (cuda): the
    // optimizer side in pinned host memory.
    for (int where : cuda ? std::vector<int>{0, 2, 1} : std::vector<int>{0, 1}) {
      const bool offload = where == 1;
      const bool host = where == 2;
      MemoryEstimate e;
      e.states.parameters = (one_chunk ? r.parameters : shard) * e_bytes + r.buffer_bytes;
      e.states.gradients = shard * e_bytes;
      e.states.master_weights = offload ? 0 : 4 * shard;
      e.states.optimizer_states =
          offload ? 0 : static_cast<int64_t>(r.optimizer_state_bytes_per_parameter * static_cast<double>(shard) + 0.5);
      const int64_t gathered = one_chunk ? 0 : std::min(2 * chunk, r.parameters) * e_bytes;
      const int64_t backward = gathered + 4 * chunk;
      const int64_t step = optimizer_step_temporaries(r.optimizer_state_bytes_per_parameter, chunk_shard) +
                           (offload ? optim_side / std::max<int64_t>(1, (r.parameters + chunk - 1) / chunk) : 0);
      e.transient = std::max(backward, step);
      e.activations = r.activation_bytes;
      if (cuda && where == 0) place_on_device(r, e);
      if (cuda && where != 0) {
        // On the device: parameter shards, buffers, the backward's gathered chunks and gradient
        // buffers, activations. In host memory (pinned): gradient shards, master shards and states
        // (offload_dir: in the file), the step's temporaries.
        e.states.device = r.device;
        e.states.parameters_on_device = e.states.parameters;
        e.states.pinned_host_bytes = e.states.gradients + e.states.master_weights + e.states.optimizer_states;
        e.states.located = true;
        e.device_bytes = e.states.parameters + backward + e.activations;
      }
      e.communication_volume = 3;
      e.configuration = "precision = \"" + r.precision + "\"";
      e.options = {"precision=\"" + r.precision + "\""};
      if (!chunk_options.empty()) {
        e.configuration += ", chunks of " + std::to_string(chunk) + " elements (" + chunk_options[0] + ")";
        e.options.insert(e.options.end(), chunk_options.begin(), chunk_options.end());
      }
      if (host) {
        e.configuration += ", offload_optim_frac = 1 (pinned host memory)";
        e.options.push_back("offload_optim_frac=1.0");
        e.note = "master weights, optimizer states and gradient shards live in pinned host memory; the CPU Adam kernel steps them";
      }
      if (offload) {
        e.configuration += ", offload_optim_frac = 1, offload_dir = (a directory)";
        e.options.push_back("offload_optim_frac=1.0");
        e.options.push_back("offload_dir=\"\"");
        e.note = "master weights and optimizer states live in the offload_dir file (disk), paged in one chunk at a time";
      }
      if (one_chunk) e.note += std::string(e.note.empty() ? "" : "; ") + "a model under 32 Mi elements is one chunk kept gathered";
      out.push_back(std::move(e));
    }
  }

  std::vector<ShadowedSetting> shadowed_settings() const override {
    return {{"booster.mixed_precision", "plugin.precision", shadowed_value(options_.precision)},
            {"mixed_precision", "the plugin's precision options (plugin.precision)", ""},
            {"booster.max_norm", "plugin.max_norm", shadowed_value(options_.max_norm)},
            {"booster.norm_type", "plugin.norm_type", shadowed_value(options_.norm_type)}};
  }

  std::shared_ptr<checkpoint::CheckpointIO> checkpoint_io() override {
    return std::make_shared<parallel::ShardedCheckpointIO>(world(), runtime_, "gemini");
  }

  Criterion wrap_criterion(Criterion criterion) const override {
    return options_.mixed ? options_.mixed->wrap_criterion(std::move(criterion)) : criterion;
  }

  Configured configure(std::shared_ptr<torch::nn::Module> model,
                       std::shared_ptr<torch::optim::Optimizer> optimizer) override {
    c10::Device device(c10::kCPU);
    for (const auto& p : model->parameters()) device = p.device();
    if (device.is_cpu() && options_.precision == "fp16")
      throw PluginError("gemini: precision = \"fp16\" (ColossalAI's default) needs the model on a CUDA device "
                        "(booster.device = \"cuda\"); on the CPU LibTorch has no fp16 kernels for most ops. Set "
                        "plugin.precision = \"bf16\" (bf16 chunks, fp32 master shards) or \"fp32\".");
    // On CUDA the host tier is always page-locked (gemini.h): pin_memory = true says so, false is refused.
    if (device.is_cpu() && options_.pin_memory_set && options_.pin_memory)
      throw PluginError("gemini: pin_memory = true needs a CUDA compute device (page-locked host memory for device "
                        "copies); on the CPU the host tier is the compute memory and there is nothing to pin. Remove "
                        "it, or set booster.device = \"cuda\".");
    if (!device.is_cpu() && options_.pin_memory_set && !options_.pin_memory)
      throw PluginError("gemini: pin_memory = false: on " + device.str() + " Gemini's host tier is always "
                        "page-locked (its copies to and from the device need it); remove pin_memory or set it to true.");
    // bf16: autocast on the model's device type (CPU or CUDA).
    if (options_.precision == "bf16") options_.mixed->prepare_model(*model);
    // Chunks shard rank-local values: the ranks must start from the same model (rank 0's is taken).
    sync_replicas(*world(), *model);

    parallel::GeminiShardOptions config;
    config.group = world();
    // fp16 / bf16 chunks with float32 master shards (built from the full-precision values).
    config.compute_dtype = mixed_precision::dtype_from_name(options_.precision);
    config.fp8_communication = options_.communication_dtype == "fp8";
    config.search_range = std::llround(options_.search_range_m * (1 << 20));
    config.min_chunk_size = std::llround(options_.min_chunk_size_m * (1 << 20));
    config.search_interval = options_.hidden_dim > 0 ? options_.hidden_dim : 1024;
    config.auto_placement = options_.placement_policy == "auto";
    config.shard_param_frac = options_.shard_param_frac;
    config.offload_optim_frac = options_.offload_optim_frac;
    config.offload_param_frac = options_.offload_param_frac;
    config.warmup_non_model_data_ratio = options_.warmup_non_model_data_ratio;
    config.steady_cuda_cap_ratio = options_.steady_cuda_cap_ratio;
    config.memory_budget_bytes = options_.memory_budget_mb > 0 ? static_cast<int64_t>(options_.memory_budget_mb * (1 << 20))
                                 : device.is_cpu()            ? available_memory_bytes()
                                                              : device_memory(device).total;
    config.offload_dir = options_.offload_dir;
    config.margin_mem_ratio = options_.gpu_margin_mem_ratio;
    config.max_prefetch = static_cast<int>(options_.max_prefetch);
    config.enable_gradient_accumulation = options_.enable_gradient_accumulation;

    OptimizerWrapperOptions wo = options_.mixed ? options_.mixed->optimizer_options() : OptimizerWrapperOptions{};  // fp16: a loss scaler
    wo.max_norm = options_.max_norm;
    wo.norm_type = options_.norm_type;
    parallel::HooksDecorator decorate;
    if (options_.mixed)
      decorate = [this](std::shared_ptr<ModelHooks> hooks) { return options_.mixed->wrap_hooks(std::move(hooks)); };
    parallel::ShardedModel sharded;
    try {
      sharded = parallel::gemini_shard(model, optimizer, std::move(config), wo, decorate, "gemini");
    } catch (const std::invalid_argument& e) {
      const std::string what = e.what();
      throw PluginError(what.find("gemini") == std::string::npos ? "gemini: " + what : what);
    } catch (const std::runtime_error& e) {
      throw PluginError(e.what());
    }
    runtime_ = sharded.runtime;
    const auto stats = sharded.runtime->stats();
    log::info("gemini: " + std::to_string(stats.at("chunks")) + " chunks of " + std::to_string(stats.at("chunk_size")) +
              " elements (" + std::to_string(stats.at("chunks_kept_gathered")) + " kept gathered, " +
              std::to_string(stats.at("chunks_param_offloaded")) + " parameter and " +
              std::to_string(stats.at("chunks_optim_offloaded")) + " optimizer sides offloaded to " +
              (options_.offload_dir.empty() ? std::string("host memory") : options_.offload_dir) + "), placement " +
              options_.placement_policy);

    return {sharded.hooks, sharded.optimizer};
  }

 private:
  GeminiOptions options_;
  std::weak_ptr<parallel::ShardedRuntime> runtime_;
};

}  // namespace booster::plugins::gemini

BOOSTER_PLUGIN("gemini", "0.1.0", booster::plugins::gemini::GeminiPlugin)
