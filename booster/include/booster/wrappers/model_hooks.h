// model_hooks.h — the type-erased hooks a parallelism installs around a boosted model: the
// ModelWrapper (model_wrapper.h) calls pre_forward / post_forward around the user's forward and
// Booster::backward calls backward. Plugins and the booster/parallel functions implement them.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>

#include "booster/export.h"

namespace booster {

// Per-model hooks a plugin installs; the ModelWrapper calls pre_forward/post_forward around the
// user's forward, Booster::backward calls backward. Defaults do nothing special.
class BOOSTER_API ModelHooks {
 public:
  virtual ~ModelHooks();
  // Before the user's forward (DDP: broadcast buffers from rank 0 when broadcast_buffers).
  virtual void pre_forward() {}
  // After the user's forward.
  virtual void post_forward() {}
  // Instead of post_forward when the user's forward threw (restore thread-local state, e.g. autocast).
  virtual void abort_forward() {}
  // Runs the backward pass of a scalar loss (already scaled by the optimizer wrapper when a loss
  // scaler is active). Default: loss.backward().
  virtual void backward(const torch::Tensor& loss);
  // false inside Booster::no_sync: gradients accumulate locally, no communication.
  virtual void set_require_grad_sync(bool required) { (void)required; }
  // The underlying module (type-erased).
  virtual torch::nn::Module& module() = 0;
  // Plugin-specific counters for logs and tests, e.g. DDP's {"buckets": 3,
  // "buckets_launched_during_backward": 12}. Default: empty.
  virtual std::map<std::string, int64_t> stats() const { return {}; }
  // Bytes of communication buffers the hooks keep that are not also the gradients (DDP's buckets
  // when gradients are not bucket views), for Booster::memory_report(). Default 0.
  virtual int64_t communication_buffer_bytes() const { return 0; }
};

}  // namespace booster
