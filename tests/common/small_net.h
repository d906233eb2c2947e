// small_net.h — the two-layer model of the unit tests that checkpoint and step optimizers
// (checkpoint_io_test, optimizer_registry_test): a, b are shard units (pass-through here; names
// "a.weight", "a.bias", "b.weight", "b.bias" as without them).
#pragma once

#include <torch/torch.h>

#include "booster/nn/unit.h"

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

}  // namespace booster::testing
