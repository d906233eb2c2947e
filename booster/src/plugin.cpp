// plugin.cpp — Plugin's default implementations (throw "does not support"), ModelHooks, ScopeGuard.
#include "booster/plugin.h"

#include "booster/data/dataloader.h"
#include "booster/dist/process_group.h"

namespace booster {

// ---------------------------------------------------------------------------------------------
// ModelHooks / ScopeGuard

ModelHooks::~ModelHooks() = default;

void ModelHooks::backward(const torch::Tensor& loss) { loss.backward(); }

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
// Plugin defaults

Plugin::Plugin(const PluginContext& ctx) : name_(ctx.name), world_(ctx.world) {
  if (!world_) throw PluginError("booster: plugin " + name_ + " was created without a process group");
}

Plugin::~Plugin() = default;

void Plugin::unsupported(const std::string& op) const {
  throw PluginError("booster: plugin " + name_ + " does not support " + op);
}

std::vector<std::string> Plugin::supported_precisions() const { return {"fp32"}; }
std::vector<std::string> Plugin::supported_devices() const { return {"cpu"}; }

Configured Plugin::configure(std::shared_ptr<torch::nn::Module>, std::shared_ptr<torch::optim::Optimizer>) {
  unsupported("configure (boost)");
}

ScopeGuard Plugin::no_sync(ModelHooks&, OptimizerWrapper*) {
  unsupported("no_sync (gradient accumulation without synchronisation); use a plugin that does (e.g. torch_ddp) "
              "or call backward without the no_sync guard");
}

std::shared_ptr<checkpoint::CheckpointIO> Plugin::checkpoint_io() { unsupported("checkpoint_io"); }

std::shared_ptr<data::DataLoader> Plugin::prepare_dataloader(std::shared_ptr<data::Dataset> dataset,
                                                             const data::DataLoaderOptions& options) {
  return std::make_shared<data::DataLoader>(std::move(dataset), options, world_->size(), world_->rank());
}

}  // namespace booster
