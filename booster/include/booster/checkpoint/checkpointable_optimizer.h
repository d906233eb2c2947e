// checkpointable_optimizer.h — the capability CheckpointIO needs of an optimizer: its parameters by
// name and group, its state in full shape or as pieces of flattened full-shape tensors (sharded or
// not), and the wrapper's own counters (loss scaler, skipped steps). checkpoint/ owns it; the
// optimizer wrappers (wrappers/optimizer_wrapper.h and the sharded ones derived from it) implement
// it, so checkpointing depends on this interface and never on how an optimizer steps.
//
// State keys are PyTorch's optimizer state_dict keys (torch/optim/*.py); the formats that use this
// interface are described in checkpoint_io.h and sharded_state.h.
#pragma once

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "booster/checkpoint/sharded_state.h"
#include "booster/export.h"
#include "booster/mixed_precision/grad_scaler.h"
#include "booster/optim/optimizer_state.h"

namespace booster {

// Serializable wrapper state: the loss scaler's and the count of skipped steps (the wrapped
// optimizer's own state is saved as tensors and scalars by parameter).
struct OptimizerWrapperState {
  std::optional<mixed_precision::ScalerState> scaler;
  int64_t skipped_steps = 0;
};

// One parameter's optimizer state in a checkpoint, as load_state_ranges receives it.
struct ParamStateSource {
  // State keys that have a tensor ("exp_avg", ...): each the parameter's full shape, read flattened.
  std::vector<std::string> tensor_keys;
  std::map<std::string, int64_t> scalars;  // e.g. "step" -> 3
  bool empty() const { return tensor_keys.empty() && scalars.empty(); }
};

// Elements [offset, offset + length) of the FLATTENED full-shape state tensor `key` of parameters()[param]
// (0 <= offset, offset + length <= the parameter's numel): a 1-D tensor of `length` elements, any
// dtype the caller validated as loadable (the receiver converts it), any device. May throw
// (checkpoint::CheckpointError for an unreadable range); thread-compatible (called on the caller's thread).
using StateRangeReader =
    std::function<at::Tensor(size_t param, const std::string& key, int64_t offset, int64_t length)>;

namespace checkpoint {

class BOOSTER_API CheckpointableOptimizer {
 public:
  virtual ~CheckpointableOptimizer();

  // The wrapped LibTorch optimizer: its type (the optimizer registry's name) and param-group options
  // are written beside the state and checked on load.
  virtual torch::optim::Optimizer& optimizer() = 0;
  // The model's parameters, in the optimizer's group order (not master copies).
  virtual std::vector<torch::Tensor> parameters() const = 0;
  // What the optimizer updates, aligned with parameters(): an fp32 master copy or the parameter
  // itself; state is converted to these tensors' dtype on load.
  virtual const std::vector<torch::Tensor>& master_parameters() const = 0;
  // Dotted parameter names aligned with parameters(); state is keyed "<name>.<state key>". Empty
  // when the names were never set (the checkpoint IO then refuses, naming Booster::boost).
  virtual const std::vector<std::string>& parameter_names() const = 0;
  // How many of parameters() belong to each param group, in group order.
  virtual const std::vector<size_t>& param_group_sizes() const = 0;

  // Whether the optimizer scales the loss (fp16): a checkpoint has loss-scaler state exactly when so.
  virtual bool has_loss_scaler() const = 0;
  virtual OptimizerWrapperState state_dict() const = 0;
  // Restores the scaler state and the skip count. Throws std::invalid_argument when exactly one of
  // the state and this optimizer has a loss scaler.
  virtual void load_state_dict(const OptimizerWrapperState& state) = 0;

  // ---- State in full shape, by parameter (the gathered format).
  // The optimizer state of each of parameters(), tensors shaped like the parameter (the master
  // dtype). Empty for a parameter without state (not stepped yet, frozen). Collective for sharded
  // optimizers (ZeRO all-gathers its slices): every rank of the state's group calls it.
  // Throws std::invalid_argument for an optimizer type the registry does not know.
  virtual std::vector<ParamOptimState> gather_param_states() = 0;

  // ---- State as pieces of flattened full-shape tensors (the sharded format; nothing gathered).
  // The pieces THIS rank contributes to a checkpoint saved over the world: 1-D ranges of state
  // tensors in the master dtype (views of the state, not copies), named with parameter_names(),
  // shape = the parameter's shape; over all ranks every state tensor is covered exactly once
  // (replicas contribute from one copy only). A sharded optimizer lists every state tensor of a
  // slice it holds, zero-length when its slice holds none of the elements. Local (no communication).
  // Throws std::invalid_argument when the names are not set or the optimizer type is unknown.
  virtual std::vector<StatePiece> local_state_pieces() = 0;
  // The integer scalars ("step") of each of parameters() (empty map: no state); every rank that
  // holds state returns the same values, so rank 0's are written. Local.
  virtual std::vector<std::map<std::string, int64_t>> local_state_scalars() = 0;
  // Whether the state is split across ranks (ZeRO, FSDP): save_optimizer's kAuto then writes the
  // sharded format.
  virtual bool state_is_sharded() const = 0;
  // Replaces the whole state with the checkpoint's: for each parameter (sources aligned with
  // parameters(); an empty source = no state) the tensor keys are read through `read`, only the
  // ranges this rank keeps (a sharded optimizer: the pieces of its slices, FlatLayout::piece), so no
  // rank materialises a full tensor it does not own. Values are converted to the master dtype and
  // device. Everything is read first and swapped in at the end: when `read` (or anything) throws
  // the state is unchanged. Local. Throws std::invalid_argument when sources.size() differs from
  // parameters().size() or a read returns the wrong number of elements.
  virtual void load_state_ranges(const std::vector<ParamStateSource>& sources, const StateRangeReader& read) = 0;
};

}  // namespace checkpoint
}  // namespace booster
