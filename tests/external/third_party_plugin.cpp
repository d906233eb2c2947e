// A third-party plugin built outside the Booster tree: plain data parallelism for one process that
// counts forwards (to prove its hooks run), and supports no_sync.
#include <torch/version.h>

#include <booster/plugin.h>

namespace {
class CountingHooks : public booster::ModelHooks {
 public:
  explicit CountingHooks(std::shared_ptr<torch::nn::Module> m) : m_(std::move(m)) {}
  void pre_forward() override { ++forwards_; }
  torch::nn::Module& module() override { return *m_; }
  std::map<std::string, int64_t> stats() const override { return {{"forwards", forwards_}}; }

 private:
  std::shared_ptr<torch::nn::Module> m_;
  int64_t forwards_ = 0;
};

class ThirdPartyPlugin : public booster::Plugin {
 public:
  explicit ThirdPartyPlugin(const booster::PluginContext& ctx) : Plugin(ctx) {}
  bool support_no_sync() const override { return true; }
  booster::Configured configure(std::shared_ptr<torch::nn::Module> model,
                                std::shared_ptr<torch::optim::Optimizer>) override {
    return {std::make_shared<CountingHooks>(model), nullptr};
  }
  booster::ScopeGuard no_sync(booster::ModelHooks&, booster::OptimizerWrapper*) override { return {}; }
};
}  // namespace

BOOSTER_PLUGIN("third_party", "9.9.9", ThirdPartyPlugin)
