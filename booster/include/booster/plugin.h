// plugin.h — the plugin interface (ColossalAI's Plugin, in C++), the extern "C" descriptor every
// plugin .so exports, and the BOOSTER_PLUGIN export macro. The loader is plugin_loader.h.
//
// A plugin is a MODULE library `booster_plugin_<name>.so` that contains
//     BOOSTER_PLUGIN("<name>", "<version>", MyPluginClass)
// where MyPluginClass derives from booster::Plugin and has a constructor taking
// `const booster::PluginContext&`. The loader checks the descriptor (ABI version, LibTorch
// major.minor, _GLIBCXX_USE_CXX11_ABI) before it calls the factory. Libraries are loaded
// RTLD_LOCAL and never unloaded (a libtorch-linked library is NODELETE anyway).
// Design after the ggml backend registry (descriptor with an API version, checked before use) and
// the Boost.DLL plugin tutorial (a small abstract interface; the factory returns a shared_ptr).
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "booster/config.h"
#include "booster/core/memory_estimate.h"
#include "booster/export.h"
#include "booster/nn/tensor_parallel.h"
#include "booster/wrappers/model_hooks.h"

namespace booster {

namespace dist {
class ProcessGroup;
}
namespace data {
class Dataset;
class DataLoader;
struct DataLoaderOptions;
}  // namespace data
class OptimizerWrapper;
namespace checkpoint {
class CheckpointIO;
}

// A loss function: (output, target) -> scalar loss.
using Criterion = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;

// Bumped whenever Plugin, PluginContext, ModelHooks, OptimizerWrapper, a public class a plugin may
// derive from (the optimizer wrappers), an options struct a plugin fills in and passes by value (the
// booster/parallel functions' options, FlatParameterOptions) or the descriptor change layout or meaning. A plugin built against another value is refused at load time.
// 11: Plugin::supported_devices; MemoryReport's device split (*_on_device, pinned_host_bytes,
// located, device and its allocator figures) and EstimateRequest::device / MemoryEstimate::device_bytes,
// which plugins fill in and return by value.
// 12: CheckpointIO::load_model takes ModelLoadOptions; ModelSaveOptions has a state-dict adapter.
// 13: StateDictAdapter has an AdapterFormat (file names, partial formats such as PEFT's LoRA files)
// that checkpoint IOs honour; ModelSaveOptions / OptimizerSaveOptions have use_async and async_policy.
// 14: sequence parallelism in TensorParallelContext.
// 15: Plugin::traits() replaces supported_precisions, supported_devices, control_precision,
// support_no_sync and default_malloc; checkpoint_io() returning null replaces control_checkpoint_io;
// prepare_dataloader is not virtual; CheckpointIO takes a checkpoint::CheckpointableOptimizer
// (OptimizerWrapper implements it). docs/plugins.md ("Porting a plugin") lists the edits.
// 16: ZeroOptimizer has a protected virtual on_gradients_prepared (its vtable grew).
// 17: FullyShardOptions::cpu_offload and FlatParameterOptions::keep_shard_apart (FSDP's cpu_offload on
// CUDA); FullyShardState and MeshModelHooks have more members.
constexpr uint32_t BOOSTER_PLUGIN_ABI_VERSION = 18;

// Thrown for every "this plugin cannot do that" and every plugin-loading failure.
class BOOSTER_API PluginError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What a plugin factory receives.
struct PluginContext {
  std::string name;                          // the plugin's name as configured
  Options options;                           // the [plugin] table; read with get_*; the loader
                                             // calls check_unknown() after construction
  std::shared_ptr<dist::ProcessGroup> world;  // the launched process group (never null)
};

// RAII: runs `on_exit` once when destroyed (or on release()). Movable, not copyable.
class BOOSTER_API ScopeGuard {
 public:
  ScopeGuard() = default;
  explicit ScopeGuard(std::function<void()> on_exit) : on_exit_(std::move(on_exit)) {}
  ScopeGuard(ScopeGuard&& other) noexcept : on_exit_(std::move(other.on_exit_)) { other.on_exit_ = nullptr; }
  ScopeGuard& operator=(ScopeGuard&& other) noexcept;
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
  ~ScopeGuard();
  void release();

 private:
  std::function<void()> on_exit_;
};

// A Booster-level setting that a plugin replaces (see Plugin::shadowed_settings).
struct ShadowedSetting {
  std::string key;          // "booster.max_norm" (one key) or "mixed_precision" (every key of a table)
  std::string replacement;  // what to set instead, for the message: "plugin.max_norm"
  // The plugin's effective value in shadowed_value() form; the shadowed key may be set to exactly
  // this value (e.g. mixed_precision = "fp32" with plugin.precision = "fp32"). Empty: any value of
  // the key conflicts (always so for a table).
  std::string value;
};

// The comparable text of a setting's value: strings as they are, numbers as the shortest "%g" text
// that reads back as the same double ("1", "0.05", "inf"; equal text <=> equal value). Used on both
// sides of a ShadowedSetting comparison.
BOOSTER_API std::string shadowed_value(const std::string& text);
BOOSTER_API std::string shadowed_value(double number);

// Plugin helpers shared by the in-tree plugins (and available to third-party ones).
// MiB (2^20 bytes; fractions allowed, as bucket_cap_mb) to bytes, at least 1.
BOOSTER_API int64_t mib_to_bytes(double mib);

// What configure() returns: the hooks for the model and the (possibly replaced) optimizer wrapper.
struct Configured {
  std::shared_ptr<ModelHooks> hooks;
  std::shared_ptr<OptimizerWrapper> optimizer;  // null when no optimizer was given
};

// What execute_pipeline returns (ColossalAI's {"loss", "outputs"}). Only the last pipeline stage has
// values; on the other stages both are undefined and is_last_stage is false.
struct PipelineOutput {
  // The mean of the micro-batch losses (float32 scalar, detached): the loss single-process training
  // on the whole batch would report for a mean-reduced criterion. Undefined without return_loss.
  torch::Tensor loss;
  // The last stage's outputs of every micro-batch concatenated along dim 0 (detached), with
  // return_outputs; undefined otherwise.
  torch::Tensor outputs;
  bool is_last_stage = true;
};

// Pauses the gradient synchronisation of `hooks` (set_require_grad_sync(false)) until the returned
// guard ends: the body of no_sync for plugins whose hooks own the synchronisation.
BOOSTER_API ScopeGuard pause_grad_sync(ModelHooks& hooks);

// What a plugin can do: the answers the Booster checks before configure() and after loading it.
struct PluginTraits {
  // Precisions it trains in ("fp32", "bf16", "fp16"); a config asking for another is refused by name.
  std::vector<std::string> precisions{"fp32"};
  // Devices it trains on ([booster] device: "cpu", "cuda"); a config asking for another is refused
  // by name (also by the estimate and plugin = "auto", which then skip the plugin).
  std::vector<std::string> devices{"cpu"};
  // true: the plugin casts the model and builds the optimizer wrapper for its own precision option
  // (wrap_criterion applies); the Booster's mixed_precision setting is then one of its
  // shadowed_settings().
  bool controls_precision = false;
  // true: no_sync() works (the default no_sync then pauses the hooks' gradient synchronisation).
  bool supports_no_sync = false;
  // [booster] malloc when the config does not set it (core/host_allocator.h): "cache" (freed tensor
  // blocks kept for the next step up to a bound: as fast as "retain", resident memory at most the
  // bound above the live tensors), "retain", "return" or "system".
  std::string default_malloc = "cache";
};

// The plugin interface. Every operation has a default that throws PluginError
// "plugin <name> does not support <op>", so a third-party plugin overrides only what it has.
class BOOSTER_API Plugin {
 public:
  explicit Plugin(const PluginContext& ctx);
  virtual ~Plugin();

  const std::string& name() const { return name_; }
  const std::shared_ptr<dist::ProcessGroup>& world() const { return world_; }

  // What this plugin can do (PluginTraits), checked by the Booster before configure(). Default:
  // PluginTraits{} (fp32 on the CPU, the Booster's precision and checkpoint IO, no no_sync).
  virtual PluginTraits traits() const { return {}; }
  // Per-rank memory of each configuration this plugin offers for `request` (its own formulas; see
  // core/memory_estimate.h): `booster estimate`, [booster] estimate = true and plugin = "auto" list
  // them for every installed plugin, third-party ones included. Must not depend on this plugin's own
  // options or world (the request names the world size; the plugin may have been created with empty
  // options on a single process). Rows a plugin cannot run for the request (a mesh that does not
  // divide the world, a precision it lacks) are left out. Default: none (the table says so).
  virtual std::vector<MemoryEstimate> estimate_memory(const EstimateRequest& request) const {
    (void)request;
    return {};
  }

  // Booster-level settings that this plugin replaces with options of its own, so that one setting
  // never has two names of which one is silently ignored. The Booster checks them after loading the
  // plugin: a shadowed key that the config sets (file or --set) with a value other than `value` is
  // a ConfigError naming both keys and telling the user to set `replacement` instead. Default: with
  // traits().controls_precision, [booster] mixed_precision and every key of [mixed_precision] (any value).
  virtual std::vector<ShadowedSetting> shadowed_settings() const;

  // Wraps the model (and optimizer, may be null) for distributed training. Called once per boost().
  // Default throws PluginError.
  virtual Configured configure(std::shared_ptr<torch::nn::Module> model,
                               std::shared_ptr<torch::optim::Optimizer> optimizer);
  // Inside the returned guard gradients are not synchronised (gradient accumulation); they are on the
  // first backward after it ends. Default: with traits().supports_no_sync, pause_grad_sync(hooks); otherwise
  // throws PluginError ("does not support no_sync").
  virtual ScopeGuard no_sync(ModelHooks& hooks, OptimizerWrapper* optimizer);
  // The plugin's own checkpoint IO, or null (the default) for the Booster's (checkpoint/checkpoint_io.h,
  // which saves the module's tensors as they are). Called once, on the first save or load.
  virtual std::shared_ptr<checkpoint::CheckpointIO> checkpoint_io() { return nullptr; }
  // With traits().controls_precision: wraps the criterion for the plugin's precision (e.g. float32 loss on
  // bf16 logits). Default: unchanged.
  virtual Criterion wrap_criterion(Criterion criterion) const { return criterion; }
  // The data-parallel group: ranks in it see different data, ranks outside it (a tensor- or
  // pipeline-parallel peer, a HYBRID_SHARD replica... as the plugin's dist::ProcessMesh lays them
  // out) see the same. Default: the world (pure data parallelism). Never null.
  virtual std::shared_ptr<dist::ProcessGroup> data_parallel_group() const { return world_; }
  // A data loader whose sampler gives this rank a disjoint shard (see data/dataloader.h):
  // DistributedSampler over data_parallel_group(): num_replicas = its size, rank = this rank in it.
  std::shared_ptr<data::DataLoader> prepare_dataloader(std::shared_ptr<data::Dataset> dataset,
                                                               const data::DataLoaderOptions& options);
  // The tensor-parallel context (nn/tensor_parallel.h) of this plugin's layout: its tp group, its
  // sequence-parallel mode and groups. Booster::tensor_parallel_context() returns it, and the program
  // hands it to the tensor-parallel layers of the model it builds. Default: T = 1 (null group; the
  // layers are the dense ones).
  virtual nn::TensorParallelContext tensor_parallel_context() const { return {}; }
  // One iteration of a pipelined model (Booster::execute_pipeline): splits inputs / targets (dim 0)
  // into micro-batches, runs the plugin's schedule (forward and, with an optimizer, backward of
  // criterion(outputs, targets) / num_microbatches), and synchronises the gradients; the caller then
  // calls optimizer->step(). optimizer null: forward only, under no-grad (evaluation). Collective
  // over the world. Default throws PluginError ("does not support execute_pipeline").
  virtual PipelineOutput execute_pipeline(ModelHooks& hooks, const torch::Tensor& inputs, const torch::Tensor& targets,
                                          const Criterion& criterion, OptimizerWrapper* optimizer, bool return_loss,
                                          bool return_outputs);

 protected:
  [[noreturn]] void unsupported(const std::string& op) const;

 private:
  std::string name_;
  std::shared_ptr<dist::ProcessGroup> world_;
};

// ---------------------------------------------------------------------------------------------
// The descriptor each plugin library exports through `booster_plugin_descriptor()`.
extern "C" {
struct BoosterPluginDescriptor {
  uint32_t abi_version;  // BOOSTER_PLUGIN_ABI_VERSION the plugin was built with
  const char* name;      // plugin name, e.g. "torch_ddp"
  const char* version;   // the plugin's own version string
  int32_t torch_major;   // TORCH_VERSION_MAJOR the plugin was built with
  int32_t torch_minor;   // TORCH_VERSION_MINOR
  int32_t cxx11_abi;     // _GLIBCXX_USE_CXX11_ABI (0 or 1)
  std::shared_ptr<booster::Plugin> (*create)(const booster::PluginContext&);
};
}

// The name of the exported symbol (a function returning `const BoosterPluginDescriptor*`).
constexpr const char* BOOSTER_PLUGIN_DESCRIPTOR_SYMBOL = "booster_plugin_descriptor";

}  // namespace booster

// Put once in a plugin's .cpp: BOOSTER_PLUGIN("torch_ddp", "0.1.0", TorchDDPPlugin)
#define BOOSTER_PLUGIN(NAME, VERSION, CLASS)                                                   \
  extern "C" BOOSTER_API const ::booster::BoosterPluginDescriptor* booster_plugin_descriptor() { \
    static const ::booster::BoosterPluginDescriptor descriptor{                                \
        ::booster::BOOSTER_PLUGIN_ABI_VERSION,                                                 \
        NAME,                                                                                  \
        VERSION,                                                                               \
        TORCH_VERSION_MAJOR,                                                                   \
        TORCH_VERSION_MINOR,                                                                   \
        _GLIBCXX_USE_CXX11_ABI,                                                                \
        [](const ::booster::PluginContext& ctx) -> std::shared_ptr<::booster::Plugin> {       \
          return std::make_shared<CLASS>(ctx);                                                 \
        }};                                                                                    \
    return &descriptor;                                                                        \
  }
