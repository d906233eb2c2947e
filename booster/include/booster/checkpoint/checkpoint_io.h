// checkpoint_io.h — saving and loading the boosted objects (model, optimizer, LR scheduler) in the
// HuggingFace-compatible layout of state_dict_io.h. This class is the default CheckpointIO: it
// serves every plugin whose model is replicated on each rank; a plugin whose checkpoint_io() returns one
// supplies its own (e.g. to gather shards).
//
// All calls are collective: every rank calls them; rank 0 writes (every rank its own file in the
// sharded optimizer format), and every rank learns whether the write succeeded; every rank reads.
//
// Optimizer formats (docs/checkpoint-format.md), both keyed by the parameter's NAME, so either loads
// into any world size and any plugin (DDP, ZeRO-1/2, FSDP):
//  - gathered: full tensors, written by rank 0 (HF-like; the default for replicated state, DDP):
//      optimizer.safetensors (or optimizer-0000i-of-0000N.safetensors + optimizer.safetensors.index.json)
//          "<param name>.<state key>" -> tensor in the parameter's shape (e.g. "fc1.weight.exp_avg")
//  - sharded (booster-sharded-v1, checkpoint/sharded_state.h; the default for ZeRO and FSDP): every
//    rank writes the pieces of the flattened tensors it holds, nothing is gathered:
//      optimizer-rank-0000r-of-0000N.safetensors + optimizer.sharded.json
//  and in both
//   optimizer_groups.json
//       {"format": "booster-optimizer-v1", "optimizer": "AdamW",
//        "param_groups": [{"options": {"lr": ..., ...}, "params": [names...]}],
//        "scalars": {"<param name>": {"step": 3}}, "wrapper": {"skipped_steps": n,
//        "loss_scaler": {"scale": s, "growth_step": g, "hysteresis_step": h}}}
#pragma once

#include <torch/nn/module.h>

#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "booster/checkpoint/async_save.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/export.h"

namespace booster {
struct OptimizerWrapperState;
class LRScheduler;
namespace dist {
class ProcessGroup;
}

namespace checkpoint {
class CheckpointableOptimizer;

// Which optimizer format save_optimizer writes.
enum class OptimizerFormat {
  kAuto,      // kSharded when the wrapper's state is split across ranks (CheckpointableOptimizer::
              // state_is_sharded(): ZeRO, FSDP on more than one rank) and use_safetensors; else kGathered
  kGathered,  // full tensors, gathered to rank 0 and written there (shard, size_per_shard_mb and
              // use_safetensors apply)
  kSharded,   // every rank writes what it holds (safetensors only; shard / size_per_shard_mb do not apply)
};

// save_optimizer's options: the state-dict options (for the gathered format) plus the format.
// A SaveOptions converts implicitly (format kAuto), so save_optimizer(o, path, save_options) works.
struct OptimizerSaveOptions : SaveOptions {
  OptimizerFormat format = OptimizerFormat::kAuto;
  // Booster::save_optimizer: write in the background (async_save.h; ColossalAI's use_async). The
  // call returns once the state is copied into host buffers; errors surface at the next sync point.
  // A CheckpointIO called directly ignores these two fields.
  bool use_async = false;
  AsyncSavePolicy async_policy;
  OptimizerSaveOptions() = default;
  OptimizerSaveOptions(const SaveOptions& options, OptimizerFormat format = OptimizerFormat::kAuto)  // NOLINT
      : SaveOptions(options), format(format) {}
};

class StateDictAdapter;

struct ModelSaveOptions {
  bool shard = false;
  int64_t size_per_shard_mb = 1024;  // MiB
  bool use_safetensors = true;
  std::string prefix;                // prepended to every name ("model." -> "model.fc1.weight")
  // Writes the model as this HuggingFace architecture (state_dict_adapter.h): every tensor goes
  // through its rule as it is written (one full tensor at a time: a tp shard is gathered, a
  // FlatParameter's view taken, first), and the directory gets the adapter's config.json. The
  // adapter must cover every parameter and buffer (CheckpointError naming the others, before
  // anything is written). With an adapter, prefix must be empty. nullptr: the module's own names
  // and layouts, no config.json.
  std::shared_ptr<const StateDictAdapter> adapter;
  // Booster::save_model: write in the background (async_save.h; ColossalAI's use_async). The call
  // returns once the state is copied into host buffers; errors surface at the next sync point.
  // A CheckpointIO called directly ignores these two fields.
  bool use_async = false;
  AsyncSavePolicy async_policy;
};

struct ModelLoadOptions {
  bool strict = true;
  // Reads a checkpoint of this HuggingFace architecture (the inverse of ModelSaveOptions::adapter):
  // the directory's config.json, when there is one, must match the adapter's (StateDictAdapter::
  // check_config), the file's tensors are named, shaped and checked as the adapter's HuggingFace
  // tensors, and each is turned into the model's layout as it is copied (a tensor stored split is
  // assembled once all its parts were read: peak one tensor). HuggingFace names the adapter ignores
  // on load (a tied lm_head.weight) are not unexpected keys.
  std::shared_ptr<const StateDictAdapter> adapter;
};

class BOOSTER_API CheckpointIO {
 public:
  explicit CheckpointIO(std::shared_ptr<dist::ProcessGroup> world);
  virtual ~CheckpointIO();

  // Parameters and buffers by dotted name (`features.0.weight`) into directory `path`.
  virtual void save_model(torch::nn::Module& model, const std::string& path, const ModelSaveOptions& options);
  // Loads into the model. strict: missing or unexpected keys, shape mismatches and refused dtypes
  // (below) are all reported together in one CheckpointError before any parameter is modified. Names
  // absent from the file whose tensor shares storage with a loaded name (tied weights written once)
  // are satisfied. Non-strict: loads what matches, ignores the rest (shape mismatches and refused
  // dtypes are still errors).
  //
  // Dtypes: a tensor loads into the model's tensor in the model's dtype, as torch's
  // Module.load_state_dict (copy_) and HF from_pretrained do, so a checkpoint moves between
  // precisions (a bf16 ZeRO model's weights into an fp32 DDP model, and back). The rule is
  // torch.can_cast (c10::canCast), the one PyTorch applies to in-place arithmetic, plus one case:
  //   converted: floating <-> floating (rounded to nearest even when narrowing, fp32 -> bf16),
  //              integer <-> integer (narrowing wraps values out of range, as copy_ does),
  //              integer or bool -> floating, bool -> integer, anything real -> complex;
  //   floating -> integer: converted only when every value is a whole number in the integer
  //              dtype's range (LibTorch's Module::to(kBFloat16) also casts integer buffers such as
  //              BatchNorm's num_batches_tracked, so bf16 checkpoints hold them as floats); any
  //              other value would be truncated and is refused, naming the first such value. These
  //              tensors are read once more, before anything changes, to check the values;
  //   refused:   non-bool -> bool, complex -> real.
  // A refused tensor is named in the error with both dtypes. Conversion happens per tensor while
  // copying (no second copy of a shard). Rank 0 logs one line per load when tensors were converted:
  // "converted 8 tensors BFloat16 -> Float (the model's dtype)".
  virtual void load_model(torch::nn::Module& model, const std::string& path, const ModelLoadOptions& options);
  void load_model(torch::nn::Module& model, const std::string& path, bool strict = true) {
    ModelLoadOptions options;
    options.strict = strict;
    load_model(model, path, options);
  }

  // Optimizer state keyed by parameter name (the names Booster::boost recorded in the wrapper) into
  // directory `path` (replaced atomically; a failure on any rank leaves it unchanged and makes every
  // rank throw CheckpointError). options.format (kAuto: sharded for ZeRO / FSDP, gathered for DDP):
  //  - gathered: CheckpointableOptimizer::gather_param_states (a sharded wrapper all-gathers its slices:
  //    collective), rank 0 writes the full tensors with save_state_dict;
  //  - sharded: each rank's CheckpointableOptimizer::local_state_pieces with save_sharded_state over the
  //    world (checkpoint/sharded_state.h): one file per rank, nothing gathered; rank 0 adds
  //    optimizer_groups.json (scalars from its local_state_scalars).
  // Throws CheckpointError for an optimizer type that is not registered (optim/
  // optimizer_registry.h: LibTorch's SGD, Adam, AdamW, RMSprop, Adagrad and any user registration),
  // a wrapper without parameter names (not made by boost()), or kSharded with use_safetensors = false.
  virtual void save_optimizer(CheckpointableOptimizer& optimizer, const std::string& path,
                              const OptimizerSaveOptions& options);
  // Loads either format (detected: <path>/optimizer.sharded.json marks a sharded one) saved at any
  // world size by any plugin. Validates the files against the optimizer (same type, same parameter
  // names per group, shapes, dtypes, every state tensor matching a parameter, a sharded tensor fully
  // covered by its pieces) before changing anything; then CheckpointableOptimizer::load_state_ranges reads
  // the ranges this rank keeps (its slices' pieces for ZeRO / FSDP, whole tensors for DDP: from a
  // sharded checkpoint only those bytes are read; a gathered one is loaded whole on every rank),
  // and the group options and the wrapper's scaler state are restored. Each state tensor is
  // converted to the dtype of the tensor the wrapped optimizer updates
  // for its parameter (the fp32 master copy or ZeRO master slice when there is one, else the
  // parameter), under torch.can_cast (floating -> integer refused), and rank 0 logs the conversions
  // in one line. With master weights (the default) state is fp32 in every plugin and precision, so
  // only a run without master weights (bf16 or fp16 state) converts. Local: every rank reads on its
  // own; errors name the file and the mismatch.
  virtual void load_optimizer(CheckpointableOptimizer& optimizer, const std::string& path);

  // `path` is a file (lr_scheduler.json) holding LRScheduler::to_json(), written by rank 0 with
  // io::atomic_write_file; when that fails every rank throws CheckpointError (the write's message).
  // load throws CheckpointError when the file is missing or unreadable.
  virtual void save_lr_scheduler(LRScheduler& scheduler, const std::string& path);
  virtual void load_lr_scheduler(LRScheduler& scheduler, const std::string& path);

 protected:
  // One tensor load_model fills: its name, the shape and dtype it must have, a key that identifies
  // its storage (names absent from the file whose key equals a loaded tensor's are tied and
  // satisfied), and what to do with the file's tensor (already checked against shape and dtype;
  // `copy` converts to `dtype` itself, e.g. with Tensor::copy_).
  struct LoadTarget {
    std::string name;
    std::vector<int64_t> shape;
    at::ScalarType dtype = at::ScalarType::Undefined;
    const void* storage_key = nullptr;
    std::function<void(const at::Tensor& from_file)> copy;
  };
  // load_model's algorithm for any targets (a sharded plugin copies into its shards): validates the
  // whole checkpoint against `targets` (shapes, the dtype rule, missing / unexpected names when
  // strict) and throws one CheckpointError listing every problem before any `copy` runs; then reads
  // the checkpoint one file at a time and calls each target's copy once; rank 0 logs conversions.
  // With options.adapter the targets are the model's tensors (full shapes) and the file's are
  // matched through the adapter (ModelLoadOptions::adapter).
  void load_targets(const std::string& path, const std::vector<LoadTarget>& targets, const ModelLoadOptions& options);

  // The HuggingFace tensors `adapter` stores the model's `model_targets` as (state_dict_adapter.h),
  // each copying through from_hf into its model target (a tensor stored split: once every part
  // was read). Throws CheckpointError when the adapter does not cover every target.
  static std::vector<LoadTarget> adapted_targets(const StateDictAdapter& adapter,
                                                 const std::vector<LoadTarget>& model_targets);

  // The wrapper state ("wrapper": skipped_steps, loss_scaler) of an optimizer checkpoint's
  // optimizer_groups.json document `doc` (read from directory `path`), checked against `wrapper`'s
  // scaler. Throws CheckpointError for a malformed entry or when exactly one side has loss-scaler
  // state. Local. Shared by load_optimizer and plugins' own optimizer loaders.
  static OptimizerWrapperState wrapper_state(CheckpointableOptimizer& wrapper, const nlohmann::json& doc,
                                             const std::string& path);

  bool is_writer() const;
  void barrier() const;
  std::shared_ptr<dist::ProcessGroup> world_;
};

}  // namespace checkpoint
}  // namespace booster
