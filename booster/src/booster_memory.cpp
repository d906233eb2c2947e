// booster_memory.cpp — the Booster's memory: the per-rank report (memory_report_of, core/memory.h),
// the estimate mode ([booster] estimate = true, estimate.h) and plugin = "auto" (auto_select.h).
#include <ATen/autocast_mode.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <set>
#include <sstream>

#include "booster/auto_select.h"
#include "booster/booster.h"
#include "booster/device.h"
#include "booster/core/host_cache.h"
#include "booster/estimate.h"
#include "booster/logging.h"
#include "booster/plugin_loader.h"
#include "booster_impl.h"

namespace booster {

namespace {
// A TOML float for an override: "1.0", "0.5", "inf".
std::string toml_float(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string t = buf;
  if (t.find_first_of(".e") == std::string::npos) t += ".0";
  return t;
}
}  // namespace

Config Booster::resolve_auto(torch::nn::Module& model, torch::optim::Optimizer* optimizer) {
  if (!impl_->auto_pending)
    throw ConfigError("booster: resolve_auto() chooses a configuration for booster.plugin = \"auto\", and this "
                      "Booster's plugin is \"" + (impl_->plugin ? impl_->plugin->name() : std::string("(none)")) +
                      "\" (or auto already chose at boost()); set booster.plugin = \"auto\"");
  if (optimizer) drop_frozen_parameters(*optimizer);  // as boost() does before it chooses
  Config config = impl_->config.clone();  // the user's Config (and this Booster's) stay as they are
  config.remove_section("auto");          // [auto] applies to plugin = "auto" only
  std::shared_ptr<Plugin> plugin;
  auto_config(model, optimizer, config, plugin);
  return config;
}

void Booster::choose_auto(torch::nn::Module& model, torch::optim::Optimizer* optimizer) {
  std::shared_ptr<Plugin> plugin;
  auto_config(model, optimizer, impl_->config, plugin);
  impl_->auto_pending = false;
  attach_plugin(std::move(plugin));
}

void Booster::auto_config(torch::nn::Module& model, torch::optim::Optimizer* optimizer, Config& config,
                          std::shared_ptr<Plugin>& plugin) {
  dist::ProcessGroup& w = *impl_->world;
  constexpr double kMiB = 1024.0 * 1024.0;
  EstimateRequest request = describe_model(model, optimizer);
  request.world_size = w.size();
  request.precision = impl_->mixed_precision;
  request.device = impl_->device_name;  // "cuda": only the plugins that support it are estimated
  request.activation_bytes = static_cast<int64_t>(impl_->auto_activation_mb * kMiB);
  int64_t model_bytes = request.buffer_bytes;
  for (const auto& p : model.parameters()) model_bytes += static_cast<int64_t>(p.nbytes());
  // Every rank must choose the same: the most any rank holds besides the model, the least any has.
  const bool runtime_given = impl_->auto_runtime_mb >= 0;
  const int64_t runtime = static_cast<int64_t>(
      runtime_given ? impl_->auto_runtime_mb * kMiB
                    : w.allreduce_scalar(static_cast<double>(std::max<int64_t>(0, resident_memory_bytes() - model_bytes)),
                                         dist::ReduceOp::MAX));
  int local = w.size();
  if (const char* l = std::getenv("LOCAL_WORLD_SIZE")) local = std::max(1, std::atoi(l));
  const bool budget_given = impl_->auto_budget_mb > 0;
  const int64_t budget = static_cast<int64_t>(
      budget_given ? impl_->auto_budget_mb * kMiB
                   : w.allreduce_scalar(static_cast<double>(available_memory_bytes() / local), dist::ReduceOp::MIN));
  EstimateTable table = estimate_installed_plugins(request, impl_->world);
  if (!impl_->auto_communication_dtype.empty()) {
    // Only the configurations that can send that dtype compete; the chosen one gets the option.
    table.rows = rows_for_communication_dtype(table.rows, impl_->auto_communication_dtype);
    if (table.rows.empty())
      throw ConfigError("booster: auto.communication_dtype = \"" + impl_->auto_communication_dtype +
                        "\": no installed plugin offers a configuration that can send it (torch_ddp and "
                        "low_level_zero take \"bf16\" and \"fp8\", torch_fsdp and gemini \"fp8\"); remove it");
  }
  AutoSelection selection = select_auto_configuration(table.rows, runtime, budget, impl_->auto_offload_dir,
                                                      !impl_->world_sharded_before_boost);
  const MemoryEstimate& chosen = selection.chosen;
  if (w.rank() == 0) {
    char head[256];
    std::snprintf(head, sizeof head, "booster: auto: %lld parameters, %d ranks, %s; budget %.1f MiB per rank (%s), "
                  "runtime %.1f MiB (%s), activations %.1f MiB (%s)",
                  static_cast<long long>(request.parameters), request.world_size, request.precision.c_str(),
                  static_cast<double>(budget) / kMiB,
                  budget_given ? "auto.memory_budget_mb" : "MemAvailable / ranks on this node",
                  static_cast<double>(runtime) / kMiB, runtime_given ? "auto.runtime_mb" : "measured",
                  impl_->auto_activation_mb, impl_->auto_activation_mb > 0 ? "auto.activation_mb" : "not counted: set auto.activation_mb");
    log::info(head);
    for (const auto& line : selection.reasons) log::info("booster: auto:   " + line);
    for (const auto& f : table.failed) log::info("booster: auto:   not estimated: " + f);
    log::info("booster: auto: chose " + chosen.plugin + " (" + chosen.configuration +
              (chosen.pipeline ? "): no data-parallel configuration fits; a pipeline mesh, trained with "
                                 "booster.execute_pipeline"
                               : "): the least communication per step among the configurations that fit"));
  }
  config.apply_override("booster.plugin=\"" + chosen.plugin + "\"");
  for (const auto& o : chosen.options) config.apply_override("plugin." + o);
  PluginContext ctx;
  ctx.name = chosen.plugin;
  ctx.options = config.section("plugin");
  ctx.world = impl_->world;
  plugin = load_plugin(ctx);
  // Booster settings the chosen plugin replaces (max_norm, norm_type) move to its own options.
  Options b = config.section("booster");
  std::vector<std::string> moved;
  for (const ShadowedSetting& s : plugin->shadowed_settings()) {
    if (s.replacement.rfind("plugin.", 0) != 0 || s.replacement.find(' ') != std::string::npos) continue;
    if (s.key == "booster.max_norm" && b.has("max_norm")) moved.push_back(s.replacement + "=" + toml_float(impl_->max_norm));
    if (s.key == "booster.norm_type" && b.has("norm_type"))
      moved.push_back(s.replacement + "=" + toml_float(impl_->norm_type));
  }
  if (!moved.empty()) {
    config.apply_overrides(moved);
    ctx.options = config.section("plugin");
    plugin = load_plugin(ctx);
  }
}

void Booster::refuse_boost_under_estimate() const {
  throw ConfigError("booster: [booster] estimate = true asks for the memory estimate, not training: call "
                    "booster.estimate(model, optimizer, criterion, dataloader) and print its report's text "
                    "(the examples' --estimate N does), or unset booster.estimate to train");
}

EstimateReport Booster::estimate_report(torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                                        const std::function<torch::Tensor()>& loss, const std::string& source) {
  dist::ProcessGroup& w = *impl_->world;
  if (w.size() != 1)
    throw ConfigError("booster: estimate() ([booster] estimate = true) measures one micro-batch in one process, but this job has " +
                      std::to_string(w.size()) + " ranks; run the trainer as a single process and set "
                      "booster.estimate_world_size to the world size to estimate");
  if (optimizer) drop_frozen_parameters(*optimizer);  // as boost() would: a LoRA run trains the adapters only
  std::string note;
  EstimateRequest request = describe_model(model, optimizer, &note);
  int64_t model_bytes = request.buffer_bytes;
  for (const auto& p : model.parameters()) model_bytes += static_cast<int64_t>(p.nbytes());
  const int64_t runtime = std::max<int64_t>(0, resident_memory_bytes() - model_bytes);
  request.world_size = impl_->estimate_world_size > 0 ? impl_->estimate_world_size : w.size();
  request.device = impl_->device_name;
  Options plugin_options = impl_->config.section("plugin");
  request.precision = plugin_options.has("precision") ? plugin_options.get_string("precision", "fp32")
                                                       : impl_->mixed_precision;
  std::string measured = "activations not measured (boost() got no criterion, or neither a data loader nor "
                         "set_estimate_batch(), or the model's forward does not take one tensor)";
  // The micro-batch runs with the configured activation checkpointing, so the measured activations
  // are what the checkpointed units keep (their recomputation's peak included).
  apply_activation_checkpointing(model);
  if (loss) {
    const bool autocast = request.precision == "bf16";
    if (autocast) {
      at::autocast::set_autocast_enabled(at::kCPU, true);
      at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    }
    MeasuredIteration m = measure_iteration(model, optimizer, loss);
    if (autocast) {
      at::autocast::set_autocast_enabled(at::kCPU, false);
      at::autocast::clear_cache();
    }
    request.activation_bytes = m.activation_bytes;
    if (m.optimizer_state_bytes_per_parameter >= 0) {
      request.optimizer_state_bytes_per_parameter = m.optimizer_state_bytes_per_parameter;
      note.clear();  // measured, not guessed
    }
    measured = "activations measured on " + source + std::string(autocast ? " under bf16 autocast" : "") +
               (impl_->activation_checkpointing != "none"
                    ? " with activation checkpointing (" + impl_->activation_checkpointing + ")"
                    : std::string()) +
               ", optimizer state measured from one step";
  }
  const int64_t available = available_memory_bytes();
  const int64_t budget = available / std::max(1, request.world_size);
  // On a GPU: the ranks share the visible devices (cuda:(LOCAL_RANK % devices)), each rank the
  // device's total memory / ranks per device.
  int64_t device_budget = 0, ranks_per_device = 1;
  if (!impl_->device.is_cpu()) {
    const int devices = std::max(1, cuda_device_count());
    ranks_per_device = (request.world_size + devices - 1) / devices;
    device_budget = device_memory(impl_->device).total / std::max<int64_t>(1, ranks_per_device);
  }
  EstimateTable table = estimate_installed_plugins(request, impl_->world);
  std::ostringstream out;
  out << format_estimate_table(request, table, runtime, budget, device_budget) << "  " << measured << "\n"
            << "  runtime: this process's resident memory besides the model (LibTorch, Gloo, data)\n";
  if (impl_->device.is_cpu()) {
    out << "  fits: total <= MemAvailable / world size (all ranks on this machine: "
              << available / (1024 * 1024) << " MiB / " << request.world_size << ")\n";
  } else {
    out << "  on " << impl_->device_name << ": model states, buffers, transient and activations in device memory; "
              << "fits on " << impl_->device_name << ": on " << impl_->device_name << " <= the device's memory / ranks per device ("
              << device_memory(impl_->device).total / (1024 * 1024) << " MiB / " << ranks_per_device << ")\n"
              << "  host fits: runtime + the rest <= MemAvailable / world size (" << available / (1024 * 1024)
              << " MiB / " << request.world_size << ")\n";
  }
  if (!note.empty()) out << "  " << note << "\n";
  return EstimateReport{request, std::move(table), out.str()};
}

MemoryReport Booster::memory_report_of(torch::nn::Module& module, ModelHooks& hooks, OptimizerWrapper* optimizer) {
  const bool accelerator = !impl_->device.is_cpu();
  MemoryReportBuilder builder;
  if (optimizer) optimizer->visit_memory(builder);
  std::set<const void*> seen;
  bool model_on_device = false;
  for (const auto& p : module.parameters()) {
    if (!seen.insert(p.storage().unsafeGetStorageImpl()).second) continue;
    PlacedBytes b;
    b.total = static_cast<int64_t>(p.storage().nbytes());
    if (!p.device().is_cpu()) b.on_device = b.total;
    model_on_device = model_on_device || !p.device().is_cpu();
    builder.visit(MemoryCategory::kParameters, b);
  }
  // The hooks' buffers (DDP's buckets) are made like the gradients, where the parameters are.
  builder.visit_planned(MemoryCategory::kCommunicationBuffers, hooks.communication_buffer_bytes(), model_on_device);
  MemoryReport r = builder.report();
  r.host_cache_held = host_cache_stats().held_bytes;
  r.device = impl_->device.str();
  if (accelerator) {
    const DeviceMemory m = device_memory(impl_->device);
    r.device_allocated = m.allocated;
    r.device_reserved = m.reserved;
    r.device_peak_allocated = m.peak_allocated;
    r.device_peak_reserved = m.peak_reserved;
  }
  return r;
}

}  // namespace booster
