// plugin.cpp — Plugin's default implementations (throw "does not support"), ScopeGuard.
#include "booster/plugin.h"

#include <algorithm>

#include "booster/data/dataloader.h"
#include "booster/dist/process_group.h"
#include "number_text.h"

namespace booster {

// ---------------------------------------------------------------------------------------------
// ScopeGuard

ScopeGuard& ScopeGuard::operator=(ScopeGuard&& other) noexcept {
  if (this != &other) {
    if (on_exit_) on_exit_();
    on_exit_ = std::move(other.on_exit_);
    other.on_exit_ = nullptr;
  }
  return *this;
}

ScopeGuard::~ScopeGuard() {
  if (on_exit_) on_exit_();
}

void ScopeGuard::release() {
  if (on_exit_) {
    auto f = std::move(on_exit_);
    on_exit_ = nullptr;
    f();
  }
}

// ---------------------------------------------------------------------------------------------
// Helpers

std::string shadowed_value(const std::string& text) { return text; }

std::string shadowed_value(double number) { return text::shortest_double(number); }

int64_t mib_to_bytes(double mib) { return std::max<int64_t>(1, static_cast<int64_t>(mib * (1 << 20))); }

ScopeGuard pause_grad_sync(ModelHooks& hooks) {
  hooks.set_require_grad_sync(false);
  ModelHooks* h = &hooks;
  return ScopeGuard([h]() { h->set_require_grad_sync(true); });
}

// ---------------------------------------------------------------------------------------------
// Plugin defaults

Plugin::Plugin(const PluginContext& ctx) : name_(ctx.name), world_(ctx.world) {
  if (!world_) throw PluginError("booster: plugin " + name_ + " was created without a process group");
}

Plugin::~Plugin() = default;

void Plugin::unsupported(const std::string& op) const {
  throw PluginError("booster: plugin " + name_ + " does not support " + op);
}

std::vector<ShadowedSetting> Plugin::shadowed_settings() const {
  if (!traits().controls_precision) return {};
  return {{"booster.mixed_precision", "the precision option of plugin " + name_ + " (in [plugin])", ""},
          {"mixed_precision", "the loss-scaler options of plugin " + name_ + " (in [plugin])", ""}};
}

Configured Plugin::configure(std::shared_ptr<torch::nn::Module>, std::shared_ptr<torch::optim::Optimizer>) {
  unsupported("configure (boost)");
}

ScopeGuard Plugin::no_sync(ModelHooks& hooks, OptimizerWrapper*) {
  if (traits().supports_no_sync) return pause_grad_sync(hooks);
  unsupported("no_sync (gradient accumulation without synchronisation); use a plugin that does (e.g. torch_ddp) "
              "or call backward without the no_sync guard");
}

PipelineOutput Plugin::execute_pipeline(ModelHooks&, const torch::Tensor&, const torch::Tensor&, const Criterion&,
                                        OptimizerWrapper*, bool, bool) {
  unsupported("execute_pipeline (pipeline parallelism); set booster.plugin = \"hybrid_parallel\" with "
              "plugin.pp_size > 1, or train with model.forward + booster.backward");
}

std::shared_ptr<data::DataLoader> Plugin::prepare_dataloader(std::shared_ptr<data::Dataset> dataset,
                                                             const data::DataLoaderOptions& options) {
  const std::shared_ptr<dist::ProcessGroup> dp = data_parallel_group();
  if (!dp) throw PluginError("booster: plugin " + name_ + " returned no data-parallel group");
  return std::make_shared<data::DataLoader>(std::move(dataset), options, dp->size(), dp->rank());
}

}  // namespace booster
