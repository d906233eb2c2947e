// checkpoint.h — activation checkpointing for LibTorch (torch.utils.checkpoint; Chen et al. 2016,
// "Training Deep Nets with Sublinear Memory Cost"): a function's activations are not kept for the
// backward pass; its inputs are, and the backward pass runs the function again to rebuild them.
//
//     // inside a module's forward:
//     x = booster::nn::checkpoint([&](const std::vector<torch::Tensor>& in) { return block->forward(in[0]); },
//                                 {x}, block->parameters());
//
// A booster::nn::Unit checkpoints itself with unit->set_unit_checkpoint(true), which
// `[booster] activation_checkpointing` sets for the model's units at boost() (booster.h).
//
// Contract:
//  - Forward: fn(inputs) runs once under no-grad; the result is returned with a gradient edge to
//    `inputs` and `params`. Kept for backward: `inputs` (as they were: do not modify them in place
//    afterwards), the states of the CPU generator, of the CUDA generator of each device the inputs
//    are on, and of the tensor-parallel dropout generator (tensor_parallel.h). Nothing fn computes is
//    kept.
//  - Backward: the generators are set to the saved states and autocast (CPU, CUDA) to the forward's
//    settings, fn runs again on detached copies of the inputs with grad enabled, the generators and
//    autocast get back the states they had, and the gradients of
//    the inputs and of `params` are computed with torch::autograd::grad over the recomputed graph
//    and returned through this node, so they reach each tensor's gradient accumulator in the outer
//    backward pass, once, as without checkpointing (the accumulator hooks of DDP, ZeRO and FSDP see
//    the same events). Because fn is deterministic given its inputs and the generator states
//    (dropout included), the gradients are bit-identical to the run without checkpointing on CPU.
//  - `params`: every tensor fn reads that needs a gradient and is not in `inputs` (a block's
//    parameters). Tensors fn reads that need gradients but are missing from both lists get none:
//    list them. Those that do not require grad are ignored.
//  - Cost: one more forward of fn per backward.
// Shapes and dtypes: any; fn returns one tensor (its dtype and device are the result's). When no
// input or param requires grad, or grad mode is off, fn simply runs and nothing is kept.
// Errors: std::invalid_argument when fn returns an undefined tensor; exceptions of fn propagate from
// the forward call, or from the backward pass during recomputation.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <vector>

#include "booster/export.h"

namespace booster::nn {

using CheckpointFunction = std::function<at::Tensor(const std::vector<at::Tensor>& inputs)>;

BOOSTER_API at::Tensor checkpoint(CheckpointFunction fn, const std::vector<at::Tensor>& inputs,
                                  const std::vector<at::Tensor>& params);

}  // namespace booster::nn
