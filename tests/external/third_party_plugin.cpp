// A third-party plugin built outside the Booster tree, as a recipe over booster/parallel: data
// parallelism from booster::parallel::replicate, with hooks of its own around replicate's that count
// forwards (to prove they run); supports no_sync (the default no_sync pauses replicate's reduction).
#include <torch/version.h>

#include <booster/parallel/replicate.h>
#include <booster/plugin.h>

namespace {
class CountingHooks : public booster::ModelHooks {
 public:
  explicit CountingHooks(std::shared_ptr<booster::ModelHooks> inner) : inner_(std::move(inner)) {}
  void pre_forward() override {
    ++forwards_;
    inner_->pre_forward();
  }
  void post_forward() override { inner_->post_forward(); }
  void abort_forward() override { inner_->abort_forward(); }
  void backward(const torch::Tensor& loss) override { inner_->backward(loss); }
  void set_require_grad_sync(bool required) override { inner_->set_require_grad_sync(required); }
  torch::nn::Module& module() override { return inner_->module(); }
  std::map<std::string, int64_t> stats() const override {
    auto stats = inner_->stats();
    stats["forwards"] = forwards_;
    return stats;
  }

 private:
  std::shared_ptr<booster::ModelHooks> inner_;
  int64_t forwards_ = 0;
};

class ThirdPartyPlugin : public booster::Plugin {
 public:
  explicit ThirdPartyPlugin(const booster::PluginContext& ctx) : Plugin(ctx) {}
  booster::PluginTraits traits() const override {
    booster::PluginTraits t;
    t.supports_no_sync = true;
    return t;
  }
  booster::Configured configure(std::shared_ptr<torch::nn::Module> model,
                                std::shared_ptr<torch::optim::Optimizer>) override {
    return {std::make_shared<CountingHooks>(booster::parallel::replicate(model, world())), nullptr};
  }
};
}  // namespace

BOOSTER_PLUGIN("third_party", "9.9.9", ThirdPartyPlugin)
