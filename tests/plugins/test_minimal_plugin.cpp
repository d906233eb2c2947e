// A third-party-style plugin that overrides only configure(): everything else keeps the
// "does not support" defaults. Reads one option, `scale`, to test option validation.
#include <torch/version.h>

#include "booster/plugin.h"

namespace {
class MinimalHooks : public booster::ModelHooks {
 public:
  explicit MinimalHooks(std::shared_ptr<torch::nn::Module> m) : m_(std::move(m)) {}
  torch::nn::Module& module() override { return *m_; }

 private:
  std::shared_ptr<torch::nn::Module> m_;
};

class MinimalPlugin : public booster::Plugin {
 public:
  explicit MinimalPlugin(const booster::PluginContext& ctx)
      : Plugin(ctx), scale_(ctx.options.get_double("scale", 1.0, 0.0, 10.0)) {}
  booster::Configured configure(std::shared_ptr<torch::nn::Module> model,
                                std::shared_ptr<torch::optim::Optimizer>) override {
    return {std::make_shared<MinimalHooks>(model), nullptr};
  }

 private:
  double scale_;
};
}  // namespace

BOOSTER_PLUGIN("test_minimal", "1.2.3", MinimalPlugin)
