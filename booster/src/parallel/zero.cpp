// zero.cpp — ZeRO-1/2's model hooks and the ZeroOptimizer behind them (see booster/parallel/zero.h).
#include "booster/parallel/zero.h"

#include <stdexcept>

#include "booster/core/grad_reducer.h"
#include "booster/core/memory.h"
#include "booster/core/replica.h"

namespace booster::parallel {

namespace {

// Gradients are reduced by the ZeroOptimizer's reducer (autograd hooks), so the hooks only forward
// no_sync and the statistics.
class ZeroModelHooks : public ModelHooks {
 public:
  explicit ZeroModelHooks(std::shared_ptr<torch::nn::Module> model) : model_(std::move(model)) {}
  torch::nn::Module& module() override { return *model_; }
  void set_require_grad_sync(bool required) override {
    if (auto z = zero_.lock()) z->set_require_grad_sync(required);
  }
  std::map<std::string, int64_t> stats() const override {
    auto z = zero_.lock();
    if (!z) return {{"buckets", 0}};
    auto stats = z->reducer().stats();
    stats["stage"] = z->stage();
    if (z->zero_options().cpu_offload) {
      // Where the offloaded master slices and optimizer states are: host bytes, and how many of them
      // are pinned (all of them with the model on an accelerator; none on the CPU).
      const MemoryReport r = z->memory_report();
      stats["offload_host_bytes"] = (r.master_weights - r.master_weights_on_device) +
                                    (r.optimizer_states - r.optimizer_states_on_device);
      stats["offload_pinned_bytes"] = r.pinned_host_bytes;
    }
    return stats;
  }
  void attach(const std::shared_ptr<ZeroOptimizer>& z) { zero_ = z; }

 private:
  std::shared_ptr<torch::nn::Module> model_;
  std::weak_ptr<ZeroOptimizer> zero_;
};

ZeroModel apply_zero(int stage, std::shared_ptr<torch::nn::Module> model, std::shared_ptr<torch::optim::Optimizer> optimizer,
                     std::shared_ptr<dist::ProcessGroup> group, ZeroOptions zero_options,
                     OptimizerWrapperOptions optimizer_options, const HooksDecorator& decorate) {
  zero_options.stage = stage;
  if (!model) throw std::invalid_argument("booster: ZeRO: the model is null");
  if (!group) throw std::invalid_argument("booster: ZeRO: the process group is null");
  // Identical replicas at start, as DDP: verify names/shapes/dtypes, broadcast from rank 0.
  sync_replicas(*group, *model);
  auto hooks = std::make_shared<ZeroModelHooks>(model);
  ZeroModel out;
  out.hooks = decorate ? decorate(hooks) : hooks;
  if (!optimizer) return out;
  optimizer_options.group = group;
  out.optimizer = std::make_shared<ZeroOptimizer>(optimizer, out.hooks, optimizer_options, zero_options,
                                                  named_parameters_of(*model, false));
  hooks->attach(out.optimizer);
  return out;
}

}  // namespace

ZeroModel shard_optimizer_states(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<torch::optim::Optimizer> optimizer,
                                 std::shared_ptr<dist::ProcessGroup> group, ZeroOptions zero_options,
                                 OptimizerWrapperOptions optimizer_options, const HooksDecorator& decorate) {
  return apply_zero(1, std::move(model), std::move(optimizer), std::move(group), zero_options, optimizer_options, decorate);
}

ZeroModel shard_gradients(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<torch::optim::Optimizer> optimizer,
                          std::shared_ptr<dist::ProcessGroup> group, ZeroOptions zero_options,
                          OptimizerWrapperOptions optimizer_options, const HooksDecorator& decorate) {
  return apply_zero(2, std::move(model), std::move(optimizer), std::move(group), zero_options, optimizer_options, decorate);
}

}  // namespace booster::parallel
