// small_net.h — the two-layer model of the unit tests that checkpoint and step optimizers
// (checkpoint_io_test, optimizer_registry_test): a, b are shard units (pass-through here; names
// "a.weight", "a.bias", "b.weight", "b.bias" as without them).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "booster/nn/unit.h"
#include "booster/wrappers/optimizer_wrapper.h"

namespace booster::testing {

struct NetImpl : torch::nn::Module {
  using Layer = booster::nn::Unit<torch::nn::Linear>;
  NetImpl() {
    a = register_module("a", Layer(6, 5));
    b = register_module("b", Layer(5, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(torch::tanh(a(x))); }
  Layer a{nullptr}, b{nullptr};
};
TORCH_MODULE(Net);

// A Net and its optimizer wrapper with the parameter names set, as Booster::boost makes them.
// Set `net` and `opt`, then wrap(). steps(n, offset) trains on random batches from generators
// seeded seed_base + offset + step, in the model's dtype (the loss in fp32: no bf16 mse on CPU).
struct NetTrainer {
  Net net{nullptr};
  std::shared_ptr<torch::optim::Optimizer> opt;
  std::unique_ptr<booster::OptimizerWrapper> wrapper;
  uint64_t seed_base = 100;

  void wrap(booster::OptimizerWrapperOptions options = {}) {
    wrapper = std::make_unique<booster::OptimizerWrapper>(opt, nullptr, options);
    std::vector<std::string> names;
    for (auto& item : net->named_parameters()) names.push_back(item.key());
    wrapper->set_parameter_names(names);
  }
  void steps(int n, int offset = 0) {
    for (int s = 0; s < n; ++s) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(seed_base + offset + s);
      const auto dtype = net->a->weight.scalar_type();
      auto x = at::randn({4, 6}, gen).to(dtype), y = at::randn({4, 3}, gen);
      wrapper->backward(torch::mse_loss(net->forward(x).to(at::kFloat), y));
      wrapper->step();
      wrapper->zero_grad();
    }
  }
};

}  // namespace booster::testing
