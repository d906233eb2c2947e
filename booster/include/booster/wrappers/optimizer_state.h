// optimizer_state.h — the optimizer state of one parameter, independent of how it is stored
// (per-parameter tensors for DDP, flat slices for ZeRO), for the five elementwise optimizers of
// LibTorch 1.13: SGD, Adam, AdamW, RMSprop, Adagrad. Used by checkpointing (state keyed by
// parameter name, gathered to full shape) and by the sharded optimizers to cut and re-assemble state.
// Keys are PyTorch's state_dict keys (torch/optim/*.py): "step", "exp_avg", "exp_avg_sq",
// "max_exp_avg_sq", "momentum_buffer", "square_avg", "grad_avg", "sum".
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "booster/export.h"

namespace booster {

struct ParamOptimState {
  std::map<std::string, at::Tensor> tensors;  // e.g. "exp_avg" -> tensor shaped like the parameter
  std::map<std::string, int64_t> scalars;     // e.g. "step" -> 3
  bool empty() const { return tensors.empty() && scalars.empty(); }
};

// "SGD", "Adam", "AdamW", "RMSprop" or "Adagrad". Throws std::invalid_argument for any other type
// (its state layout is unknown, so it cannot be checkpointed or sharded).
BOOSTER_API std::string optimizer_type_name(const torch::optim::Optimizer& optimizer);

// The tensors and integer scalars of one parameter's state (tensors not copied).
BOOSTER_API ParamOptimState extract_param_state(const torch::optim::OptimizerParamState& state);

// A state object of optimizer `type` (see optimizer_type_name) holding `state`'s values; missing
// keys stay undefined / 0.
BOOSTER_API std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(const std::string& type,
                                                                                const ParamOptimState& state);

// The key under which LibTorch stores the state of parameter `p` in Optimizer::state().
BOOSTER_API std::string optimizer_state_key(const at::Tensor& p);

// State tensors per parameter element once the optimizer has stepped, from the group's options:
// Adam/AdamW 2 (3 with amsgrad), SGD 1 with momentum != 0 else 0, RMSprop 1 + (momentum > 0) +
// centered, Adagrad 1. Used for memory planning before the first step. Throws std::invalid_argument
// for an unknown optimizer type.
BOOSTER_API int64_t state_tensors_per_element(const torch::optim::Optimizer& optimizer,
                                              const torch::optim::OptimizerParamGroup& group);

// Bytes of the optimizer's state tensors: the actual tensors once it has state, else planned from
// state_tensors_per_element() and its parameters' numel and element size.
BOOSTER_API int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer);

}  // namespace booster
