// replicate.h — data parallelism as a function over a group: PyTorch DistributedDataParallel's
// semantics (Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training",
// VLDB 2020; torch/nn/parallel/distributed.py), the counterpart of FSDP2's `replicate`. Usable
// without a plugin:
//     auto hooks = booster::parallel::replicate(model, world);
//     booster::ModelWrapper<Net> ddp(model, hooks);      // forward as the user's Net::forward
//     loss = ...; hooks->backward(loss);                 // gradients averaged over `world`
// What it does:
//  - at the call: every rank's parameters and buffers are made rank 0's (core/replica.h
//    sync_replicas; collective), and the parameters are checked to be the same list on every rank;
//  - backward: gradients are averaged over the group in buckets launched while backward runs
//    (core/grad_reducer.h GradientReducer with options.reducer; the buckets are rebuilt in
//    gradient-ready order after the first iteration, as PyTorch's rebuild_buckets);
//  - before each training forward, with broadcast_buffers: buffers (BatchNorm's running statistics)
//    are broadcast from rank 0;
//  - set_require_grad_sync(false) (Booster::no_sync) accumulates gradients locally.
// A group of one rank does no communication. The parameters keep their device and dtype; the
// buckets live where the parameters do.
#pragma once

#include <torch/nn/module.h>

#include <memory>

#include "booster/core/grad_reducer.h"
#include "booster/dist/process_group.h"
#include "booster/export.h"
#include "booster/wrappers/model_hooks.h"

namespace booster::parallel {

struct ReplicateOptions {
  // Buckets and their wire format (ReducerOptions). replicate() sets reducer.rebuild_buckets.
  ReducerOptions reducer;
  // Broadcast the buffers from rank 0 before each forward in training mode (DDP's default).
  bool broadcast_buffers = true;
};

// Replicates `model` over `group` and returns its model hooks (for ModelWrapper, the optimizer
// wrapper and Booster). Collective over `group`. Throws std::invalid_argument for a null model or
// group, and as GradientReducer (a non-positive bucket cap, a non-leaf parameter) and
// verify_replicas (the ranks' parameter lists differ: names, shapes or dtypes).
BOOSTER_API std::shared_ptr<ModelHooks> replicate(std::shared_ptr<torch::nn::Module> model,
                                                  std::shared_ptr<dist::ProcessGroup> group,
                                                  ReplicateOptions options = {});

}  // namespace booster::parallel
