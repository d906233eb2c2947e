// optimizer_state.h — the optimizer state of one parameter, independent of how it is stored
// (per-parameter tensors for DDP, flat slices for ZeRO). Used by checkpointing (state keyed by
// parameter name, gathered to full shape) and by the sharded optimizers to cut and re-assemble state.
// Keys are PyTorch's state_dict keys (torch/optim/*.py), e.g. "step", "exp_avg", "momentum_buffer".
// Which keys an optimizer type has, and how its LibTorch ParamState converts to and from this, is
// in the optimizer registry (optimizer_registry.h).
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <string>

#include "booster/core/memory.h"
#include "booster/export.h"

namespace booster {

struct ParamOptimState {
  std::map<std::string, at::Tensor> tensors;  // e.g. "exp_avg" -> tensor shaped like the parameter
  std::map<std::string, int64_t> scalars;     // e.g. "step" -> 3
  bool empty() const { return tensors.empty() && scalars.empty(); }
  // The tensor under `key`, undefined if absent.
  at::Tensor tensor(const std::string& key) const {
    auto it = tensors.find(key);
    return it == tensors.end() ? at::Tensor() : it->second;
  }
  // The scalar under `key`, 0 if absent.
  int64_t scalar(const std::string& key) const {
    auto it = scalars.find(key);
    return it == scalars.end() ? 0 : it->second;
  }
};

// The key under which LibTorch stores the state of parameter `p` in Optimizer::state(): its
// TensorImpl's address (LibTorch 2.x keys the map by void*). Valid while `p` is alive.
using OptimizerStateKey = void*;
BOOSTER_API OptimizerStateKey optimizer_state_key(const at::Tensor& p);

// Bytes of the optimizer's state tensors: the actual tensors once it has state, else planned from
// the registry's state_tensors_per_element for each group and its parameters' numel and element
// size. Throws std::invalid_argument if the optimizer's type is not registered.
BOOSTER_API int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer);

// The same bytes by place (core/memory.h's PlacedBytes): the actual state tensors once the optimizer
// has state (pinned ones looked up with check_pinned); before its first step the planned ones, each
// group's placed with the tensors the group updates, counted as pinned when `planned_pinned` and
// they are on the host (ZeRO's cpu_offload pins its states after the first step). Throws
// std::invalid_argument if the optimizer's type is not registered.
BOOSTER_API PlacedBytes optimizer_state_places(torch::optim::Optimizer& optimizer, bool check_pinned,
                                               bool planned_pinned);

}  // namespace booster
