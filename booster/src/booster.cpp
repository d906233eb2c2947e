// booster.cpp — Booster: config -> plugin, boost(), backward(), no_sync(), prepare_dataloader().
// The memory report, the estimate mode and plugin = "auto" are in booster_memory.cpp.
#include "booster/booster.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <cmath>
#include <map>
#include <set>

#include "booster/device.h"
#include "booster/core/host_allocator.h"
#include "booster/core/host_cache.h"
#include "booster/auto_select.h"
#include "booster/estimate.h"
#include "booster/logging.h"
#include "booster/nn/unit.h"
#include "booster/mixed_precision/precision.h"
#include "booster/plugin_loader.h"
#include "booster_impl.h"
#include "bf16_speed.h"

namespace booster {

// ---------------------------------------------------------------------------------------------
// Sections every Booster program may have; [train] belongs to the program (examples check it).
static const std::vector<std::string> kSections{"booster", "plugin", "mixed_precision", "checkpoint",
                                                "distributed", "train", "auto"};

// [booster] device ("cpu" default); read here as well as by the Booster, which validates it.
static std::string configured_device(const Config& config) {
  Options b = config.section("booster");
  return b.has("device") ? b.get_choice("device", "cpu", {"cpu", "cuda"}) : "cpu";
}

namespace {
struct DistributedSettings {
  dist::LaunchOptions launch;
  std::string device, backend, host;
  int port = 29500;
};

// [distributed] read and checked (unknown keys, nccl without cuda), whether or not it launches.
DistributedSettings read_distributed(const Config& config) {
  DistributedSettings s;
  s.device = configured_device(config);
  Options d = config.section("distributed");
  s.launch.timeout_s = d.get_double("timeout_s", 1800.0, 1e-3, 1e9);
  s.launch.threads_per_rank = static_cast<int>(d.get_int("threads_per_rank", 0, 0, 1024));
  // NCCL is the default on CUDA, as torch.distributed's "cuda:nccl".
  s.backend = d.get_choice("backend", s.device == "cuda" ? "nccl" : "gloo", {"gloo", "nccl"});
  s.host = d.get_string("host", "127.0.0.1");
  s.port = static_cast<int>(d.get_int("port", 29500, 1, 65535));
  d.check_unknown();  // validated even when already launched: a typo is never silently accepted
  if (s.backend == "nccl" && s.device != "cuda")
    throw ConfigError(d.where("backend") + ": distributed.backend = \"nccl\" reduces CUDA tensors only, and "
                      "booster.device is \"" + s.device + "\"; set booster.device = \"cuda\" or backend = \"gloo\"");
  return s;
}
}  // namespace

std::shared_ptr<dist::ProcessGroup> launch_from_config(const Config& config, std::vector<std::string>& args) {
  const DistributedSettings s = read_distributed(config);
  if (auto w = dist::world()) return w;
  // A missing GPU or CUDA library is reported before any rendezvous (no rank waits for this one).
  if (s.device == "cuda" && cuda_device_count() == 0) {
    try {
      (void)select_device("cuda", 0, 1, s.backend);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(e.what());
    }
  }
  // Config host/port/backend are the defaults the flags and launchers start from.
  std::vector<std::string> with_defaults{"--host", s.host, "--port", std::to_string(s.port), "--backend", s.backend};
  with_defaults.insert(with_defaults.end(), args.begin(), args.end());
  auto world = dist::launch_auto(with_defaults, s.launch);
  args = with_defaults;
  return world;
}

// A setting the plugin replaces may be set only to the plugin's own value (see
// Plugin::shadowed_settings); `mine` holds the Booster's effective values of its own keys.
static void check_shadowed_settings(const Config& config, const Plugin& plugin,
                                    const std::map<std::string, std::string>& mine) {
  for (const ShadowedSetting& s : plugin.shadowed_settings()) {
    const size_t dot = s.key.find('.');
    if (dot == std::string::npos) {  // a whole table
      Options table = config.section(s.key);
      const std::vector<std::string> keys = table.keys();
      if (keys.empty()) continue;
      throw ConfigError(table.where(keys.front()) + ": " + s.key + "." + keys.front() + " is set, but plugin " +
                        plugin.name() + " replaces every [" + s.key + "] setting with " + s.replacement +
                        "; set it there and remove [" + s.key + "]");
    }
    Options section = config.section(s.key.substr(0, dot));
    const std::string key = s.key.substr(dot + 1);
    if (!section.has(key)) continue;
    auto it = mine.find(s.key);
    if (!s.value.empty() && it != mine.end() && it->second == s.value) continue;  // the same setting
    throw ConfigError(section.where(key) + ": " + s.key + (it != mine.end() ? " = " + it->second : "") +
                      " is set, but plugin " + plugin.name() + " replaces it with " + s.replacement +
                      (s.value.empty() ? "" : " (= " + s.value + ")") + "; set " + s.replacement +
                      " instead and remove " + s.key);
  }
}

Booster::Booster(const Config& config) : Booster(config, nullptr) {}

Booster::Booster(const Config& config, std::shared_ptr<dist::ProcessGroup> world) : impl_(std::make_unique<Impl>()) {
  impl_->config = config;
  config.check_sections(kSections);
  Options b = config.section("booster");
  std::string plugin_name = b.get_string("plugin", "torch_ddp");
  impl_->mixed_precision = b.get_choice("mixed_precision", "fp32", {"fp32", "fp16", "bf16"});
  impl_->max_norm = b.get_double("max_norm", 0.0, 0.0);
  impl_->norm_type = b.get_double("norm_type", 2.0, 1e-9, INFINITY);  // TOML: norm_type = inf
  const std::string malloc_mode = b.has("malloc") ? b.get_choice("malloc", "cache", {"cache", "retain", "return", "system"}) : "";
  impl_->malloc_cache_mb = b.get_double("malloc_cache_mb", -1.0, 0.0, 1e9);
  if (b.has("malloc_cache_mb") && !malloc_mode.empty() && malloc_mode != "cache")
    throw ConfigError(b.where("malloc_cache_mb") + ": booster.malloc_cache_mb bounds the tensor cache of malloc = "
                      "\"cache\", and malloc = \"" + malloc_mode + "\" has none; remove malloc_cache_mb or set "
                      "malloc = \"cache\"");
  impl_->device_name = b.get_choice("device", "cpu", {"cpu", "cuda"});
  impl_->activation_checkpointing = b.get_choice("activation_checkpointing", "none", {"none", "full", "selective"});
  impl_->selective_ac_every = b.get_int("selective_ac_every", 2, 1, 1 << 20);
  if (b.has("selective_ac_every") && impl_->activation_checkpointing != "selective")
    throw ConfigError(b.where("selective_ac_every") + ": booster.selective_ac_every applies to activation_checkpointing "
                      "= \"selective\" only, and it is \"" + impl_->activation_checkpointing +
                      "\"; remove selective_ac_every or set activation_checkpointing = \"selective\"");
  impl_->estimate = b.get_bool("estimate", false);
  impl_->estimate_world_size = static_cast<int>(b.get_int("estimate_world_size", 0, 0, 1 << 20));
  b.check_unknown();
  impl_->precision = mixed_precision::make_mixed_precision(impl_->mixed_precision, config.section("mixed_precision"));
  try {
    config.section("checkpoint").check_unknown();
  } catch (const ConfigError& e) {
    throw ConfigError(std::string(e.what()) +
                      "\n[checkpoint] has no options yet: checkpoint settings are arguments of booster.save_model / "
                      "save_optimizer (shard, size_per_shard_mb, use_safetensors); remove its keys");
  }

  if (world) {
    (void)read_distributed(config);  // the launch happened elsewhere; [distributed] is still checked
  } else {
    std::vector<std::string> no_args;
    world = launch_from_config(config, no_args);
  }
  impl_->world = world;
  try {
    const dist::DistEnv& env = dist::current_env();
    impl_->device = select_device(impl_->device_name, env.local_rank, env.local_world_size, world->backend());
  } catch (const std::invalid_argument& e) {
    throw ConfigError(e.what());
  }
  impl_->malloc_mode = malloc_mode;

  Options auto_options = config.section("auto");
  if (plugin_name == "auto") {
    impl_->auto_budget_mb = auto_options.get_double("memory_budget_mb", 0.0, 0.0, 1e12);
    impl_->auto_activation_mb = auto_options.get_double("activation_mb", 0.0, 0.0, 1e12);
    impl_->auto_runtime_mb = auto_options.get_double("runtime_mb", -1.0, -1.0, 1e12);
    impl_->auto_offload_dir = auto_options.get_string("offload_dir", "");
    impl_->auto_communication_dtype = auto_options.get_choice("communication_dtype", "", {"", "bf16", "fp8"});
    auto_options.check_unknown();
    Options plugin_options = config.section("plugin");
    const std::vector<std::string> keys = plugin_options.keys();
    if (!keys.empty())
      throw ConfigError(plugin_options.where(keys.front()) + ": plugin." + keys.front() +
                        " is set, but plugin = \"auto\" chooses the plugin and its [plugin] options at boost(); "
                        "remove [plugin], or name the plugin in booster.plugin");
    impl_->auto_pending = true;
    log::info("booster: plugin auto (chosen at boost() from the installed plugins' estimates), world size " +
              std::to_string(world->size()) + " (" + world->backend() + ")");
    return;
  }
  if (!auto_options.keys().empty())
    throw ConfigError(auto_options.where(auto_options.keys().front()) + ": [auto] applies to booster.plugin = "
                      "\"auto\" only, and the plugin is \"" + plugin_name + "\"; remove [auto]");

  PluginContext ctx;
  ctx.name = plugin_name;
  ctx.options = config.section("plugin");
  ctx.world = world;
  std::string path = ctx.options.get_string("path", "");
  attach_plugin(load_plugin(ctx, path));
}

void Booster::attach_plugin(std::shared_ptr<Plugin> plugin) {
  const Config& config = impl_->config;
  const std::string& malloc_mode = impl_->malloc_mode;
  const std::string plugin_name = plugin->name();
  auto world = impl_->world;
  impl_->plugin = std::move(plugin);
  impl_->traits = impl_->plugin->traits();
  impl_->host_allocator = malloc_mode.empty() ? impl_->traits.default_malloc : malloc_mode;
  if (impl_->host_allocator != "cache" && impl_->malloc_cache_mb >= 0)
    throw ConfigError("booster.malloc_cache_mb bounds the tensor cache of malloc = \"cache\", and plugin " +
                      impl_->plugin->name() + "'s default malloc is \"" + impl_->host_allocator +
                      "\"; remove malloc_cache_mb or set malloc = \"cache\"");
  const std::string allocator =
      configure_host_allocator(impl_->host_allocator, impl_->cache_limit_bytes(kHostCacheFloorBytes)) +
      (malloc_mode.empty() ? " (the plugin's default)" : "");

  check_shadowed_settings(config, *impl_->plugin,
                          {{"booster.mixed_precision", shadowed_value(impl_->mixed_precision)},
                           {"booster.max_norm", shadowed_value(impl_->max_norm)},
                           {"booster.norm_type", shadowed_value(impl_->norm_type)}});
  const auto& devices = impl_->traits.devices;
  if (std::find(devices.begin(), devices.end(), impl_->device_name) == devices.end()) {
    std::string list;
    for (const auto& d : devices) list += (list.empty() ? "" : ", ") + d;
    throw PluginError("booster: plugin " + plugin_name + " does not support booster.device = \"" + impl_->device_name +
                      "\" yet (it supports: " + list + "); use one of those devices or another plugin");
  }
  const auto& precisions = impl_->traits.precisions;
  if (std::find(precisions.begin(), precisions.end(), impl_->mixed_precision) == precisions.end()) {
    std::string list;
    for (const auto& p : precisions) list += (list.empty() ? "" : ", ") + p;
    throw PluginError("booster: plugin " + plugin_name + " does not support mixed_precision = \"" +
                      impl_->mixed_precision + "\" (it supports: " + list + ")");
  }
  impl_->tensor_parallel_context = impl_->plugin->tensor_parallel_context();
  const std::string precision = impl_->traits.controls_precision ? "set by the plugin" : impl_->mixed_precision;
  log::info("booster: plugin " + plugin_name + ", precision " + precision + ", device " + impl_->device.str() +
            ", world size " + std::to_string(world->size()) + " (" + world->backend() + ")");
  log::info("booster: " + allocator);
}

Booster Booster::from_file(const std::string& path, const std::vector<std::string>& overrides) {
  Config c = Config::from_file(path);
  c.apply_overrides(overrides);
  return Booster(c);
}

Booster::~Booster() {
  if (impl_) checkpoint::wait_async_save_noexcept();  // an asynchronous save in flight (logs its error)
}
Booster::Booster(Booster&&) noexcept = default;
Booster& Booster::operator=(Booster&&) noexcept = default;

Configured Booster::configure(std::shared_ptr<torch::nn::Module> model,
                              std::shared_ptr<torch::optim::Optimizer> optimizer) {
  if (!model) throw std::invalid_argument("booster: boost() needs a model (got null)");
  apply_activation_checkpointing(*model);
  if (optimizer) drop_frozen_parameters(*optimizer);  // before auto: it sizes the optimizer states
  if (impl_->auto_pending) choose_auto(*model, optimizer.get());
  if (optimizer) {
    // Every optimizer parameter must belong to the model (the plugin syncs the model's gradients).
    std::vector<const void*> mine;
    for (const auto& p : model->parameters()) mine.push_back(p.unsafeGetTensorImpl());
    std::sort(mine.begin(), mine.end());
    for (const auto& g : optimizer->param_groups())
      for (const auto& p : g.params())
        if (!std::binary_search(mine.begin(), mine.end(), static_cast<const void*>(p.unsafeGetTensorImpl())))
          throw std::invalid_argument("booster: boost(): the optimizer holds a parameter that is not in the "
                                      "model; build the optimizer from model->parameters()");
  }
  impl_->boosted.insert(model.get());
  // The model, its buffers and (through the parameters) the optimizer's states live on this rank's
  // device; Module::to moves the parameters in place, so the optimizer keeps holding them.
  if (!impl_->device.is_cpu()) model->to(impl_->device);
  bool own_precision = !impl_->traits.controls_precision;
  if (own_precision) impl_->precision->prepare_model(*model);
  Configured c = impl_->plugin->configure(model, optimizer);
  if (!c.hooks) throw PluginError("booster: plugin " + impl_->plugin->name() + " returned no model hooks");
  if (own_precision) c.hooks = impl_->precision->wrap_hooks(c.hooks);
  // bf16 compute (autocast, or bf16 parameters the plugin made) on a CPU without fast bf16 kernels;
  // the CPU is probed once per process.
  const auto params = model->parameters();
  if ((own_precision && impl_->mixed_precision == "bf16") ||
      std::any_of(params.begin(), params.end(),
                  [](const at::Tensor& p) { return p.device().is_cpu() && p.scalar_type() == at::kBFloat16; })) {
    static const double slowdown = mixed_precision::bf16_matmul_slowdown();
    mixed_precision::warn_if_bf16_is_slow(slowdown);
  }
  if (optimizer && !c.optimizer) {
    OptimizerWrapperOptions o = impl_->precision->optimizer_options();
    o.group = impl_->plugin->world();
    o.max_norm = impl_->max_norm;
    o.norm_type = impl_->norm_type;
    c.optimizer = std::make_shared<OptimizerWrapper>(optimizer, c.hooks, o);
  }
  if (c.optimizer && c.optimizer->parameter_names().empty()) {
    // Optimizer state is checkpointed by parameter name.
    std::map<const void*, std::string> names;
    for (const auto& item : model->named_parameters(true)) names[item.value().unsafeGetTensorImpl()] = item.key();
    std::vector<std::string> ordered;
    for (const auto& p : c.optimizer->parameters()) ordered.push_back(names.at(p.unsafeGetTensorImpl()));
    c.optimizer->set_parameter_names(std::move(ordered));
  }
  if (c.optimizer) impl_->optimizers.push_back(c.optimizer);
  MemoryReport report = memory_report_of(*model, *c.hooks, c.optimizer.get());
  impl_->boosted_model_state_bytes += report.model_states();
  // The cache is installed unless a preloaded allocator or AddressSanitizer serves the tensors.
  if (impl_->host_allocator == "cache" && host_cache_stats().installed) {
    const int64_t limit = impl_->cache_limit_bytes(default_host_cache_limit(impl_->boosted_model_state_bytes));
    if (limit != host_cache_stats().limit_bytes) {
      install_host_cache(limit);
      log::info("booster: host tensor cache bound " + std::to_string(limit >> 20) + " MiB" +
                (impl_->malloc_cache_mb >= 0 ? " (malloc_cache_mb)" : " (max(48 MiB, 0.15 x model states))"));
    }
  }
  if (impl_->plugin->world()->rank() == 0)
    log::info("booster: memory per rank in steady state (" + impl_->plugin->name() + "): " + report.to_string());
  return c;
}

void Booster::drop_frozen_parameters(torch::optim::Optimizer& optimizer) {
  // Frozen parameters (requires_grad false: a LoRA base model) never train: dropped from the
  // groups, so that no plugin keeps gradients, master weights or states for them.
  int64_t dropped = 0, dropped_numel = 0, kept = 0;
  for (auto& g : optimizer.param_groups()) {
    auto& params = g.params();
    std::vector<at::Tensor> trainable;
    for (auto& p : params) {
      if (p.requires_grad()) {
        trainable.push_back(p);
        continue;
      }
      ++dropped;
      dropped_numel += p.numel();
      optimizer.state().erase(p.unsafeGetTensorImpl());
    }
    kept += static_cast<int64_t>(trainable.size());
    params = std::move(trainable);
  }
  if (dropped > 0 && kept == 0)
    throw std::invalid_argument("booster: boost(): every parameter the optimizer holds is frozen (requires_grad "
                                "false), so nothing would train; unfreeze some, or enable_lora before building "
                                "the optimizer from model->parameters()");
  if (dropped > 0)
    log::info("booster: boost(): " + std::to_string(dropped) + " frozen parameters (" + std::to_string(dropped_numel) +
              " elements, requires_grad false) left out of the optimizer; " + std::to_string(kept) + " train");
  }

bool Booster::estimate_requested() const { return impl_->estimate; }

void Booster::set_estimate_batch(torch::Tensor inputs, torch::Tensor targets) {
  if (!inputs.defined() || !targets.defined() || inputs.dim() < 1)
    throw std::invalid_argument("booster: set_estimate_batch needs defined inputs with a batch dimension and defined "
                                "targets (one micro-batch, as the model's forward and the criterion take them)");
  impl_->estimate_batch = {std::move(inputs), std::move(targets)};
}

const std::pair<torch::Tensor, torch::Tensor>& Booster::estimate_batch() const { return impl_->estimate_batch; }

std::string Booster::auto_not_chosen(const std::string& what) const {
  return "booster: plugin = \"auto\" chooses the plugin at the first boost(); " + what +
         " is available after it (call boost() first)";
}

void Booster::apply_activation_checkpointing(torch::nn::Module& model) {
  const std::string& mode = impl_->activation_checkpointing;
  if (mode == "none") return;  // the units' flags stay as the model set them (default off)
  std::vector<nn::NamedUnit> units = nn::collect_named_units(model);
  if (units.empty())
    throw ConfigError("booster: activation_checkpointing = \"" + mode + "\" recomputes booster::nn::Unit blocks, and "
                      "this model has none; wrap its blocks in booster::nn::Unit (nn/unit.h) or set "
                      "activation_checkpointing = \"none\"");
  // full: every unit; selective: every selective_ac_every-th unit, from the first (torchtitan's ac_freq).
  size_t on = 0;
  for (size_t i = 0; i < units.size(); ++i) {
    const bool c = mode == "full" || i % static_cast<size_t>(impl_->selective_ac_every) == 0;
    units[i].unit->set_unit_checkpoint(c);
    on += c;
  }
  log::info("booster: activation checkpointing (" + mode + "): " + std::to_string(on) + " of " +
            std::to_string(units.size()) + " units recompute their forward in backward");
}

void Booster::register_state_dict_adapter(torch::nn::Module& module,
                                          std::shared_ptr<const checkpoint::StateDictAdapter> adapter) {
  if (!adapter) {
    impl_->adapters.erase(&module);
    return;
  }
  if (!nn::lora_modules(module).empty()) {
    without_lora(module, adapter);  // checks the coverage of every tensor but the LoRA adapters
  } else {
    std::vector<std::string> names;
    for (const auto& item : module.named_parameters(true)) names.push_back(item.key());
    for (const auto& item : module.named_buffers(true)) names.push_back(item.key());
    adapter->check_covers(names);
  }
  impl_->adapters[&module] = std::move(adapter);
}

std::shared_ptr<const checkpoint::StateDictAdapter> Booster::state_dict_adapter_of(const torch::nn::Module& module) const {
  auto it = impl_->adapters.find(&module);
  return it == impl_->adapters.end() ? nullptr : it->second;
}

void Booster::after_model_load(torch::nn::Module& module) {
  std::set<const void*> mine;
  for (const auto& p : module.parameters()) mine.insert(p.unsafeGetTensorImpl());
  for (auto& weak : impl_->optimizers) {
    auto opt = weak.lock();
    if (!opt) continue;
    for (const auto& p : opt->parameters()) {
      if (mine.count(p.unsafeGetTensorImpl())) {
        opt->sync_master_from_model();
        break;
      }
    }
  }
}

Criterion Booster::wrap_criterion(Criterion criterion) const {
  if (impl_->traits.controls_precision) return impl_->plugin->wrap_criterion(std::move(criterion));
  return impl_->precision->wrap_criterion(std::move(criterion));
}

void Booster::backward(const torch::Tensor& loss, OptimizerWrapper& optimizer) { optimizer.backward(loss); }

ScopeGuard Booster::no_sync_hooks(ModelHooks& hooks, OptimizerWrapper* optimizer) {
  if (!impl_->traits.supports_no_sync)
    throw PluginError("booster: plugin " + impl_->plugin->name() +
                      " does not support no_sync; use a plugin that does (e.g. torch_ddp) or call backward "
                      "without the no_sync guard");
  return impl_->plugin->no_sync(hooks, optimizer);
}

std::shared_ptr<data::DataLoader> Booster::prepare_dataloader(std::shared_ptr<data::Dataset> dataset,
                                                              int64_t batch_size, bool shuffle, uint64_t seed,
                                                              bool drop_last) {
  if (!dataset) throw std::invalid_argument("booster: prepare_dataloader needs a dataset (got null)");
  if (batch_size < 1) throw std::invalid_argument("booster: prepare_dataloader: batch_size must be >= 1");
  data::DataLoaderOptions o;
  o.batch_size = batch_size;
  o.shuffle = shuffle;
  o.seed = seed;
  o.drop_last = drop_last;
  o.device = impl_->device;
  o.pin_memory = !impl_->device.is_cpu();
  // plugin = "auto" before boost(): the loader shards over the world, so auto then keeps to the
  // data-parallel configurations (a pipeline mesh would need its stages to read the same batches).
  if (!impl_->plugin) {
    impl_->world_sharded_before_boost = true;
    return std::make_shared<data::DataLoader>(std::move(dataset), o, impl_->world->size(), impl_->world->rank());
  }
  return impl_->plugin->prepare_dataloader(std::move(dataset), o);
}

checkpoint::CheckpointIO& Booster::checkpoint_io() {
  if (!impl_->plugin) throw PluginError(auto_not_chosen("checkpoint IO"));
  if (!impl_->checkpoint_io) {
    impl_->checkpoint_io = impl_->plugin->checkpoint_io();
    if (!impl_->checkpoint_io) impl_->checkpoint_io = std::make_shared<checkpoint::CheckpointIO>(impl_->plugin->world());
  }
  return *impl_->checkpoint_io;
}

void Booster::save_optimizer(OptimizerWrapper& optimizer, const std::string& path,
                             const checkpoint::OptimizerSaveOptions& options) {
  if (options.use_async) {
    checkpoint::async_save(&world(), path, options.async_policy,
                           [&] { checkpoint_io().save_optimizer(optimizer, path, options); });
    return;
  }
  checkpoint_io().save_optimizer(optimizer, path, options);
}
void Booster::load_optimizer(OptimizerWrapper& optimizer, const std::string& path) {
  checkpoint_io().load_optimizer(optimizer, path);
}
void Booster::save_lr_scheduler(LRScheduler& scheduler, const std::string& path) {
  checkpoint_io().save_lr_scheduler(scheduler, path);
}
void Booster::load_lr_scheduler(LRScheduler& scheduler, const std::string& path) {
  checkpoint_io().load_lr_scheduler(scheduler, path);
}

Plugin& Booster::plugin() {
  if (!impl_->plugin) throw PluginError(auto_not_chosen("plugin()"));
  return *impl_->plugin;
}
std::shared_ptr<dist::ProcessGroup> Booster::data_parallel_group() {
  if (impl_->plugin) return impl_->plugin->data_parallel_group();
  impl_->world_sharded_before_boost = true;  // auto: see prepare_dataloader
  return impl_->world;
}
const nn::TensorParallelContext& Booster::tensor_parallel_context() const { return impl_->tensor_parallel_context; }
const Config& Booster::config() const { return impl_->config; }
const c10::Device& Booster::device() const { return impl_->device; }

dist::ProcessGroup& Booster::world() { return *impl_->world; }
const std::string& Booster::mixed_precision() const { return impl_->mixed_precision; }

}  // namespace booster
