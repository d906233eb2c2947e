// debiased_momentum.h — a user-defined optimizer for the registry tests (unit tests, dist_worker and
// the single-process references in booster_dist_tests), with its own Options and ParamState:
//   m <- beta m + (1 - beta) g;   p <- p (1 - lr wd) - lr m / (1 - beta^step)   (the division only
//   with debias = true). Elementwise, so ZeRO may step it on flat slices. State: "momentum" (tensor),
//   "step" (integer). Options JSON: lr, beta, weight_decay, debias.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "booster/optim/optimizer_registry.h"

namespace booster::testing {

struct DebiasedMomentumOptions : torch::optim::OptimizerCloneableOptions<DebiasedMomentumOptions> {
  DebiasedMomentumOptions(double lr = 1e-2) : lr_(lr) {}  // NOLINT: implicit, as LibTorch's options
  TORCH_ARG(double, lr);
  TORCH_ARG(double, beta) = 0.9;
  TORCH_ARG(double, weight_decay) = 0;
  TORCH_ARG(bool, debias) = true;
  double get_lr() const override { return lr(); }
  void set_lr(const double lr) override { this->lr(lr); }
};

struct DebiasedMomentumParamState : torch::optim::OptimizerCloneableParamState<DebiasedMomentumParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, momentum);
};

class DebiasedMomentum : public torch::optim::Optimizer {
 public:
  DebiasedMomentum(std::vector<torch::optim::OptimizerParamGroup> groups, DebiasedMomentumOptions defaults)
      : Optimizer(std::move(groups), std::make_unique<DebiasedMomentumOptions>(defaults)) {}
  DebiasedMomentum(std::vector<torch::Tensor> params, DebiasedMomentumOptions defaults)
      : DebiasedMomentum({torch::optim::OptimizerParamGroup(std::move(params))}, defaults) {}

  torch::Tensor step(LossClosure closure = nullptr) override {
    torch::NoGradGuard no_grad;
    torch::Tensor loss;
    if (closure) {
      at::AutoGradMode enable_grad(true);
      loss = closure();
    }
    for (auto& group : param_groups_) {
      const auto& o = static_cast<const DebiasedMomentumOptions&>(group.options());
      for (auto& p : group.params()) {
        if (!p.grad().defined()) continue;
        auto& slot = state_[p.unsafeGetTensorImpl()];
        if (!slot) {
          auto fresh = std::make_unique<DebiasedMomentumParamState>();
          fresh->momentum(torch::zeros_like(p, torch::MemoryFormat::Preserve));
          slot = std::move(fresh);
        }
        auto& st = static_cast<DebiasedMomentumParamState&>(*slot);
        st.step(st.step() + 1);
        st.momentum().mul_(o.beta()).add_(p.grad(), 1 - o.beta());
        if (o.weight_decay() != 0) p.mul_(1 - o.lr() * o.weight_decay());
        double correction = o.debias() ? 1 - std::pow(o.beta(), static_cast<double>(st.step())) : 1.0;
        p.add_(st.momentum(), -o.lr() / correction);
      }
    }
    return loss;
  }
};

inline OptimizerSpec<DebiasedMomentumOptions, DebiasedMomentumParamState> debiased_momentum_spec() {
  OptimizerSpec<DebiasedMomentumOptions, DebiasedMomentumParamState> s;
  s.name = "DebiasedMomentum";
  s.tensor_keys = {"momentum"};
  s.scalar_keys = {"step"};
  s.get_state = [](const DebiasedMomentumParamState& st, ParamOptimState& out) {
    out.tensors["momentum"] = st.momentum();
    out.scalars["step"] = st.step();
  };
  s.set_state = [](const ParamOptimState& in, DebiasedMomentumParamState& st) {
    st.momentum(in.tensor("momentum"));
    st.step(in.scalar("step"));
  };
  s.options_to_json = [](const DebiasedMomentumOptions& o) {
    return nlohmann::json{{"lr", o.lr()}, {"beta", o.beta()}, {"weight_decay", o.weight_decay()}, {"debias", o.debias()}};
  };
  s.options_from_json = [](const nlohmann::json& j, DebiasedMomentumOptions& o) {
    o.lr(j.at("lr").get<double>())
        .beta(j.at("beta").get<double>())
        .weight_decay(j.at("weight_decay").get<double>())
        .debias(j.at("debias").get<bool>());
  };
  s.state_tensors_per_element = [](const DebiasedMomentumOptions&) -> int64_t { return 1; };
  return s;
}

// The configuration of the multi-process tests (dist_worker and its single-process reference).
inline std::shared_ptr<torch::optim::Optimizer> make_debiased_momentum(std::vector<torch::Tensor> params) {
  return std::make_shared<DebiasedMomentum>(std::move(params), DebiasedMomentumOptions(0.05).beta(0.8).weight_decay(0.01));
}

// Registers DebiasedMomentum the first time it is called in this process; later calls do nothing.
inline void ensure_debiased_momentum_registered() {
  static const bool registered = [] {
    register_optimizer<DebiasedMomentum>(debiased_momentum_spec());
    return true;
  }();
  (void)registered;
}

}  // namespace booster::testing
