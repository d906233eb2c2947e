// net.h — the Fashion-MNIST example's CNN, shared with benchmarks/bench_ddp (the same architecture
// as the Python peer there).
#pragma once

#include <torch/torch.h>

#include "booster/nn/unit.h"

// ---------------------------------------------------------------------------------------------
// Model: conv(1->32) BN ReLU pool, conv(32->64) BN ReLU pool, fc(3136->128) ReLU dropout fc(128->10)
// The conv and linear layers are shard units (booster::nn::Unit) for plugins that shard parameters
// per unit; the BatchNorm parameters form the root unit. Under DDP and ZeRO-1/2 a Unit is a
// pass-through, and parameter names (so checkpoints) are those of the plain layers.

struct NetImpl : torch::nn::Module {
  explicit NetImpl(double dropout_p = 0.25)
      : conv1(torch::nn::Conv2dOptions(1, 32, 3).padding(1)),
        bn1(32),
        conv2(torch::nn::Conv2dOptions(32, 64, 3).padding(1)),
        bn2(64),
        fc1(64 * 7 * 7, 128),
        dropout(dropout_p),
        fc2(128, 10) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("fc1", fc1);
    register_module("dropout", dropout);
    register_module("fc2", fc2);
  }
  // x: float32 [B, 1, 28, 28] -> logits float32 [B, 10]
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::max_pool2d(torch::relu(bn1(conv1(x))), 2);
    h = torch::max_pool2d(torch::relu(bn2(conv2(h))), 2);
    h = dropout(torch::relu(fc1(h.flatten(1))));
    return fc2(h);
  }
  booster::nn::Unit<torch::nn::Conv2d> conv1;
  torch::nn::BatchNorm2d bn1;
  booster::nn::Unit<torch::nn::Conv2d> conv2;
  torch::nn::BatchNorm2d bn2;
  booster::nn::Unit<torch::nn::Linear> fc1;
  torch::nn::Dropout dropout;
  booster::nn::Unit<torch::nn::Linear> fc2;
};
TORCH_MODULE(Net);
