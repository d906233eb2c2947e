// estimate.cpp — model description, one measured iteration, every installed plugin's estimates
// and the table (see booster/estimate.h).
#include "booster/estimate.h"

#include <torch/optim.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "booster/config.h"
#include "booster/core/cpu_byte_counter.h"
#include "booster/nn/pipeline.h"
#include "booster/nn/unit.h"
#include "booster/optim/cpu_adam.h"
#include "booster/plugin_loader.h"

namespace booster {

EstimateRequest describe_model(torch::nn::Module& model, const torch::optim::Optimizer* optimizer, std::string* note) {
  EstimateRequest r;
  std::set<const void*> seen;
  for (const auto& p : model.parameters()) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    r.parameters += p.numel();
    r.largest_parameter = std::max<int64_t>(r.largest_parameter, p.numel());
  }
  for (const auto& b : model.buffers()) r.buffer_bytes += static_cast<int64_t>(b.nbytes());
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (auto* unit = dynamic_cast<nn::UnitBase*>(m.get())) {
      int64_t n = 0;
      for (const auto& p : unit->unit_module().parameters()) n += p.numel();
      r.largest_unit = std::max(r.largest_unit, n);
      ++r.units;
    }
  }
  if (r.units == 0) r.largest_unit = r.parameters;
  if (auto* pipeline = dynamic_cast<nn::PipelineModule*>(&model)) {
    const auto layers = pipeline->pipeline_layers();
    r.layers = static_cast<int64_t>(layers.size());
    for (const auto& layer : layers) r.layer_parameters.push_back(nn::layer_parameter_count(layer));
  }
  r.optimizer_state_bytes_per_parameter = 0;
  if (optimizer) {
    const auto* o = optimizer;
    auto& opts = o->param_groups().empty() ? o->defaults() : o->param_groups()[0].options();
    if (auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&opts)) {
      r.optimizer_state_bytes_per_parameter = adam->amsgrad() ? 12 : 8;
    } else if (auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&opts)) {
      r.optimizer_state_bytes_per_parameter = adamw->amsgrad() ? 12 : 8;
    } else if (auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&opts)) {
      r.optimizer_state_bytes_per_parameter = sgd->momentum() != 0 ? 4 : 0;
    } else if (auto* rms = dynamic_cast<const torch::optim::RMSpropOptions*>(&opts)) {
      r.optimizer_state_bytes_per_parameter = 4 + (rms->momentum() != 0 ? 4 : 0) + (rms->centered() ? 4 : 0);
    } else if (dynamic_cast<const torch::optim::AdagradOptions*>(&opts)) {
      r.optimizer_state_bytes_per_parameter = 4;
    } else if (dynamic_cast<const torch::optim::LBFGSOptions*>(&opts)) {
      r.optimizer_state_bytes_per_parameter = 0;
    } else if (dynamic_cast<const optim::CPUAdam*>(o)) {
      r.optimizer_state_bytes_per_parameter = 8;
    } else {
      r.optimizer_state_bytes_per_parameter = 8;
      if (note) *note = "optimizer of an unknown type: Adam's 8 bytes of state per parameter assumed";
    }
  }
  return r;
}

MeasuredIteration measure_iteration(torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                                    const std::function<torch::Tensor()>& loss_of_micro_batch) {
  install_cpu_byte_counter();
  for (auto& p : model.parameters()) p.mutable_grad() = torch::Tensor();
  MeasuredIteration m;
  const int64_t start = counted_cpu_bytes();
  reset_peak_cpu_bytes();
  {
    torch::Tensor loss = loss_of_micro_batch();
    if (!loss.defined() || loss.numel() != 1 || !loss.requires_grad())
      throw std::invalid_argument("estimate: the criterion must return a scalar loss that requires grad (got " +
                                  std::string(loss.defined() ? "a tensor of " + std::to_string(loss.numel()) +
                                                                   " elements" + (loss.requires_grad() ? "" : " without grad")
                                                             : "an undefined tensor") +
                                  ")");
    loss.backward();
  }
  for (const auto& p : model.parameters())
    if (p.grad().defined()) m.gradient_bytes += static_cast<int64_t>(p.grad().nbytes());
  m.activation_bytes = std::max<int64_t>(0, peak_cpu_bytes() - start - m.gradient_bytes);
  if (optimizer) {
    int64_t elements = 0;
    for (const auto& g : optimizer->param_groups())
      for (const auto& p : g.params()) elements += p.numel();
    const int64_t before = counted_cpu_bytes();
    optimizer->step();
    m.optimizer_state_bytes_per_parameter =
        elements > 0 ? static_cast<double>(counted_cpu_bytes() - before) / static_cast<double>(elements) : 0.0;
  }
  if (!cpu_byte_counter_installed()) m.activation_bytes = 0;  // nothing was counted
  return m;
}

EstimateTable estimate_installed_plugins(const EstimateRequest& request,
                                         const std::shared_ptr<dist::ProcessGroup>& world) {
  EstimateTable table;
  // Plugins are created with empty options; one whose defaults cannot run here (ColossalAI's
  // precision = "fp16" default without CUDA) is created with the request's precision instead.
  const Config empty = Config::from_string("", "<estimate>");
  const Config with_precision = Config::from_string("[plugin]\nprecision = \"" + request.precision + "\"\n", "<estimate>");
  for (const PluginLibraryInfo& file : find_plugin_files()) {
    try {
      PluginContext ctx;
      ctx.name = file.name;
      ctx.world = world;
      std::shared_ptr<Plugin> plugin;
      try {
        ctx.options = empty.section("plugin");
        plugin = load_plugin(ctx, file.path);
      } catch (const std::exception& first) {
        const std::string reason = first.what();
        try {
          ctx.options = with_precision.section("plugin");
          plugin = load_plugin(ctx, file.path);
        } catch (const std::exception&) {
          throw std::runtime_error(reason);  // the defaults' reason, not the retry's
        }
      }
      if (!request.device.empty() && request.device != "cpu") {
        const auto devices = plugin->traits().devices;
        if (std::find(devices.begin(), devices.end(), request.device) == devices.end())
          throw std::runtime_error("does not support booster.device = \"" + request.device + "\"");
      }
      std::vector<MemoryEstimate> rows = plugin->estimate_memory(request);
      if (rows.empty()) table.without_estimate.push_back(file.name);
      for (auto& row : rows) {
        row.plugin = file.name;
        table.rows.push_back(std::move(row));
      }
    } catch (const std::exception& e) {
      std::string what = e.what();
      table.failed.push_back(file.name + ": " + what.substr(0, what.find('\n')));
    }
  }
  return table;
}

namespace {

int64_t kib_field(const std::string& file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size(), key) == 0) return std::stoll(line.substr(key.size())) * 1024;
  return 0;
}

std::string mib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

int64_t available_memory_bytes() { return kib_field("/proc/meminfo", "MemAvailable:"); }
int64_t resident_memory_bytes() { return kib_field("/proc/self/status", "VmRSS:"); }

std::string format_estimate_table(const EstimateRequest& request, const EstimateTable& table, int64_t runtime_bytes,
                                  int64_t budget_bytes, int64_t device_budget_bytes) {
  const bool accelerator = !request.device.empty() && request.device != "cpu";
  std::ostringstream s;
  char head[256];
  std::snprintf(head, sizeof head, "memory per rank (MiB) for %lld parameters, %d ranks, %s, %.0f bytes of optimizer state "
                "per parameter, activations %s MiB per micro-batch\n",
                static_cast<long long>(request.parameters), request.world_size, request.precision.c_str(),
                request.optimizer_state_bytes_per_parameter, mib(request.activation_bytes).c_str());
  s << head;
  std::vector<std::string> header{"plugin", "configuration", "params", "grads", "master", "optim", "comm",
                                  "transient", "activations", "runtime", "total"};
  if (accelerator) header.push_back("on " + request.device);
  if (accelerator && device_budget_bytes > 0) header.push_back("fits on " + request.device + " in " + mib(device_budget_bytes));
  if (budget_bytes > 0) header.push_back(accelerator ? "host fits in " + mib(budget_bytes) : "fits in " + mib(budget_bytes));
  header.push_back("comm volume");
  std::vector<std::vector<std::string>> cells{header};
  for (const auto& r : table.rows) {
    char vol[32];
    std::snprintf(vol, sizeof vol, "%gΨ", r.communication_volume);
    std::vector<std::string> row{r.plugin, r.configuration, mib(r.states.parameters), mib(r.states.gradients),
                                 mib(r.states.master_weights), mib(r.states.optimizer_states),
                                 mib(r.states.communication_buffers), mib(r.transient), mib(r.activations),
                                 mib(runtime_bytes), mib(r.total() + runtime_bytes)};
    if (accelerator) row.push_back(mib(r.device_bytes));
    if (accelerator && device_budget_bytes > 0) row.push_back(r.device_bytes <= device_budget_bytes ? "yes" : "no");
    if (budget_bytes > 0) row.push_back(r.host_total() + runtime_bytes <= budget_bytes ? "yes" : "no");
    row.push_back(vol);
    cells.push_back(std::move(row));
  }
  std::vector<size_t> width(header.size(), 0);
  for (const auto& row : cells)
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  for (const auto& row : cells) {
    for (size_t i = 0; i < row.size(); ++i) {
      s << row[i];
      if (i + 1 < row.size()) s << std::string(width[i] - row[i].size() + 2, ' ');
    }
    s << "\n";
  }
  std::set<std::string> notes;  // a note shared by several rows of a plugin is printed once
  for (const auto& r : table.rows)
    if (!r.note.empty() && notes.insert(r.plugin + ": " + r.note).second) s << "  " << r.plugin << ": " << r.note << "\n";
  for (const auto& name : table.without_estimate) s << "  " << name << ": the plugin reports no estimate\n";
  for (const auto& failure : table.failed) s << "  not estimated: " << failure << "\n";
  return s.str();
}

}  // namespace booster
