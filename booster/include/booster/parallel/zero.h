// zero.h — ZeRO stages 1 and 2 as functions over a data-parallel group (Rajbhandari et al., "ZeRO:
// Memory Optimizations Toward Training Trillion Parameter Models", SC 2020; ColossalAI's
// LowLevelZeroOptimizer, DeepSpeed's stage_1_and_2.py), usable without a plugin:
//     auto zero = booster::parallel::shard_gradients(model, optimizer, world);   // ZeRO-2
//     booster::ModelWrapper<Net> m(model, zero.hooks);
//     zero.hooks->backward(loss); zero.optimizer->step();
//  - shard_optimizer_states (ZeRO-1): each rank keeps the fp32 master slice and the optimizer
//    states of 1/N of every parameter group's flat buffer; gradients are reduce-scattered in buckets
//    during backward, the optimizer steps the slice, and the updated parameters are all-gathered.
//  - shard_gradients (ZeRO-2): as ZeRO-1, and each rank keeps only its slice of the reduced
//    gradients (accumulated into the slice across backward passes until zero_grad()).
// Both make every rank's parameters rank 0's first (core/replica.h sync_replicas; collective).
// The details (buckets, wire dtype, CPU offload) are wrappers/zero_optimizer.h's ZeroOptions.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>

#include "booster/dist/process_group.h"
#include "booster/export.h"
#include "booster/parallel/hooks_decorator.h"
#include "booster/wrappers/model_hooks.h"
#include "booster/wrappers/zero_optimizer.h"

namespace booster::parallel {

struct ZeroModel {
  std::shared_ptr<ModelHooks> hooks;          // no_sync (stage 1) and the reducer's stats
  std::shared_ptr<ZeroOptimizer> optimizer;   // null when no optimizer was given
};

// ZeRO-1 over `group`: `zero_options.stage` is set to 1. optimizer_options: loss scaling, clipping
// and master weights as OptimizerWrapper's; its group is set to `group`. Collective over `group`.
// Throws std::invalid_argument for a null model or group, and as ZeroOptimizer's constructor (a
// parameter that requires grad but is not in the optimizer, mixed dtypes in a group, an
// unregistered optimizer type, reduce_bucket_elements < 1) and verify_replicas.
BOOSTER_API ZeroModel shard_optimizer_states(std::shared_ptr<torch::nn::Module> model,
                                             std::shared_ptr<torch::optim::Optimizer> optimizer,
                                             std::shared_ptr<dist::ProcessGroup> group, ZeroOptions zero_options = {},
                                             OptimizerWrapperOptions optimizer_options = {},
                                             const HooksDecorator& decorate = {});
// ZeRO-2: as shard_optimizer_states with zero_options.stage = 2.
BOOSTER_API ZeroModel shard_gradients(std::shared_ptr<torch::nn::Module> model,
                                      std::shared_ptr<torch::optim::Optimizer> optimizer,
                                      std::shared_ptr<dist::ProcessGroup> group, ZeroOptions zero_options = {},
                                      OptimizerWrapperOptions optimizer_options = {},
                                      const HooksDecorator& decorate = {});

}  // namespace booster::parallel
