// booster.h — the one-call entry point: Booster::boost() makes a LibTorch training loop distributed
// with the plugin and precision named in the TOML config (ColossalAI's Booster, in C++).
//
//   booster::launch_from_config(config, args);               // or any booster::dist::launch_*
//   booster::Booster booster(config);                         // loads the plugin .so
//   auto [model, optimizer, criterion, loader, scheduler] =
//       booster.boost(net, adamw, criterion, loader, scheduler);
//   for (auto& batch : *loader) {
//     auto loss = criterion(model.forward(batch.data), batch.target);
//     booster.backward(loss, *optimizer);
//     optimizer->step();
//     optimizer->zero_grad();
//   }
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <type_traits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/checkpoint/peft_lora.h"
#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/config.h"
#include "booster/data/dataloader.h"
#include "booster/dist/environment.h"
#include "booster/dist/process_group.h"
#include "booster/estimate.h"
#include "booster/export.h"
#include "booster/lr_scheduler.h"
#include "booster/nn/lora.h"
#include "booster/plugin.h"
#include "booster/wrappers/model_wrapper.h"
#include "booster/wrappers/optimizer_wrapper.h"

namespace booster {

namespace detail {
// true when M::forward takes one tensor and returns one (what the estimate's measured micro-batch calls).
template <class M, class = void>
struct HasTensorForward : std::false_type {};
template <class M>
struct HasTensorForward<M, std::void_t<decltype(std::declval<M&>().forward(std::declval<torch::Tensor>()))>>
    : std::is_convertible<decltype(std::declval<M&>().forward(std::declval<torch::Tensor>())), torch::Tensor> {};
}  // namespace detail

// What boost() returns (an aggregate: use structured bindings). Members not passed in are null.
template <class M>
struct Boosted {
  ModelWrapper<M> model;
  std::shared_ptr<OptimizerWrapper> optimizer;
  Criterion criterion;
  std::shared_ptr<data::DataLoader> dataloader;
  std::shared_ptr<LRScheduler> lr_scheduler;
};

// Reads [distributed] (backend = "gloo", or "nccl" when booster.device = "cuda"; timeout_s = 1800,
// threads_per_rank = 0 (auto), host, port) and launches by what the process has (see dist::launch_auto): --rank/--world_size flags in
// args (removed from args), torchrun / `booster run` variables, OpenMPI, SLURM, else one process.
// Does nothing and returns the world when already launched. Throws ConfigError / EnvError / DistError;
// ConfigError also for backend "nccl" with device "cpu", and, before any rendezvous, for device
// "cuda" when CUDA support or a visible GPU is missing.
BOOSTER_API std::shared_ptr<dist::ProcessGroup> launch_from_config(const Config& config,
                                                                   std::vector<std::string>& args);

class BOOSTER_API Booster {
 public:
  // Reads [booster] (plugin = "torch_ddp", device = "cpu" | "cuda" (device.h: each rank takes
  // cuda:(LOCAL_RANK % visible devices); boost() moves the model there and prepare_dataloader's
  // batches arrive there through pinned memory; a plugin whose traits().devices lacks it is
  // refused by name), mixed_precision = "fp32" | "bf16" | "fp16", max_norm = 0
  // (no clipping in step()), norm_type = 2.0 or inf (TOML float), estimate = false (true: the run asks
  // for estimate() instead of training: estimate_requested(); needs a single-process run),
  // estimate_world_size (the ranks estimate() estimates for; default: the launched world size); plugin = "auto": the plugin and its [plugin] options are chosen at the first
  // boost() (auto_select.h) from the installed plugins' estimates for this model, with [auto]
  // memory_budget_mb (per rank; default MemAvailable / ranks on the node, least over ranks),
  // activation_mb (added to every configuration; default 0), runtime_mb (memory a rank holds besides
  // the model; default measured, most over ranks) and offload_dir (lets Gemini keep its optimizer side
  // on disk); [plugin] must then be empty, and plugin() / checkpoint IO exist only after boost()), [mixed_precision] (fp16 loss scaler options,
  // see mixed_precision/precision.h) and loads the plugin with the [plugin] table (plugin.path =
  // explicit .so). Launches a single-process world when nothing was
  // launched yet (launch_from_config with no args). Throws ConfigError for bad or unknown keys and
  // sections, PluginError when the plugin cannot be loaded or does not support the precision.
  explicit Booster(const Config& config);
  // As Booster(config), over a world the program launched itself (launch_from_config, or any
  // dist::launch*): the rendezvous is then an explicit step before the Booster, which starts no
  // process group of its own. [distributed] is still checked (unknown keys, nccl without cuda).
  // A null world launches as Booster(config) does.
  Booster(const Config& config, std::shared_ptr<dist::ProcessGroup> world);
  // Config::from_file(path) plus dotted overrides ("plugin.bucket_cap_mb=4").
  static Booster from_file(const std::string& path, const std::vector<std::string>& overrides = {});
  ~Booster();
  Booster(Booster&&) noexcept;
  Booster& operator=(Booster&&) noexcept;

  // Boosts the model and whatever else is given (all but the model may be null/empty). The model is
  // configured by the plugin (DDP: replicas verified and broadcast from rank 0, gradient hooks
  // installed). The optimizer must hold the model's parameters. Returns the boosted objects.
  template <class M>
  Boosted<M> boost(std::shared_ptr<M> model, std::shared_ptr<torch::optim::Optimizer> optimizer = nullptr,
                   Criterion criterion = {}, std::shared_ptr<data::DataLoader> dataloader = nullptr,
                   std::shared_ptr<LRScheduler> lr_scheduler = nullptr) {
    static_assert(std::is_base_of_v<torch::nn::Module, M>, "boost(): the model must derive from torch::nn::Module");
    if (estimate_requested()) refuse_boost_under_estimate();
    Configured c = configure(model, optimizer);
    // A plugin that replaced the optimizer keeps the schedule: the scheduler follows the new one.
    if (lr_scheduler && c.optimizer && optimizer && c.optimizer->optimizer_ptr() != optimizer)
      lr_scheduler->rebind(c.optimizer->optimizer());
    return Boosted<M>{ModelWrapper<M>(model, c.hooks), c.optimizer, wrap_criterion(std::move(criterion)),
                      std::move(dataloader), std::move(lr_scheduler)};
  }
  // The same for a TORCH_MODULE holder (e.g. `Net net;` made by TORCH_MODULE(Net)).
  template <class M>
  Boosted<M> boost(torch::nn::ModuleHolder<M> model, std::shared_ptr<torch::optim::Optimizer> optimizer = nullptr,
                   Criterion criterion = {}, std::shared_ptr<data::DataLoader> dataloader = nullptr,
                   std::shared_ptr<LRScheduler> lr_scheduler = nullptr) {
    return boost<M>(model.ptr(), std::move(optimizer), std::move(criterion), std::move(dataloader),
                    std::move(lr_scheduler));
  }

  // The micro-batch estimate() measures when it gets no data loader (a trainer that builds its own
  // batches, like examples/gpt): inputs as the model's forward takes them ([micro-batch, ...]) and
  // targets as the criterion takes them. estimate() then runs criterion(model->forward(inputs),
  // targets), its backward and one optimizer step to measure the activations and the optimizer state
  // (estimate.h's measure_iteration). Call it before estimate(); otherwise it is only kept. A data
  // loader given to estimate() takes precedence.
  // Throws std::invalid_argument when either tensor is undefined or inputs has no batch dimension.
  void set_estimate_batch(torch::Tensor inputs, torch::Tensor targets);

  // Backward of a scalar loss through the optimizer wrapper (loss scaling, plugin gradient sync).
  // A pipelined model (hybrid_parallel with pp_size > 1) throws PluginError: use execute_pipeline.
  void backward(const torch::Tensor& loss, OptimizerWrapper& optimizer);

  // One pipeline-parallel iteration (ColossalAI's booster.execute_pipeline): the batch (inputs and
  // targets, split along dim 0 into the plugin's micro-batches) runs through the plugin's schedule
  // (1F1B, interleaved) with forward, criterion(outputs, targets) and, when `optimizer` is given,
  // backward and the gradient synchronisation; then call optimizer->step() and zero_grad() as usual.
  // optimizer == nullptr: forward only under no-grad (evaluation). Every rank passes the batch of its
  // data-parallel rank (all pipeline and tensor-parallel peers the same one); stage 0 reads inputs,
  // the last stage reads targets. Returns {loss, outputs} on the last stage (plugin.h,
  // PipelineOutput). Throws PluginError for a plugin without pipelines and std::invalid_argument for
  // a batch that does not split into the configured micro-batches.
  template <class M>
  PipelineOutput execute_pipeline(const torch::Tensor& inputs, const torch::Tensor& targets, ModelWrapper<M>& model,
                                  const Criterion& criterion, OptimizerWrapper* optimizer, bool return_loss = true,
                                  bool return_outputs = false) {
    return plugin().execute_pipeline(model.hooks(), inputs, targets, criterion, optimizer, return_loss,
                                     return_outputs);
  }
  // The same with the next batch of a data loader's iterator (advanced by one), as ColossalAI's
  // execute_pipeline(data_iter, ...).
  template <class M>
  PipelineOutput execute_pipeline(data::DataLoader::Iterator& data_iter, ModelWrapper<M>& model,
                                  const Criterion& criterion, OptimizerWrapper* optimizer, bool return_loss = true,
                                  bool return_outputs = false) {
    data::Example batch = *data_iter;
    ++data_iter;
    return execute_pipeline(batch.data, batch.target, model, criterion, optimizer, return_loss, return_outputs);
  }

  // Inside the returned guard gradients accumulate locally; the first backward after it ends
  // averages the accumulated gradients (gradient accumulation). Throws PluginError when the plugin
  // does not support no_sync.
  template <class M>
  ScopeGuard no_sync(ModelWrapper<M>& model, OptimizerWrapper* optimizer = nullptr) {
    return no_sync_hooks(model.hooks(), optimizer);
  }

  // A data loader whose sampler gives this rank a disjoint shard of `dataset` (see
  // data/dataloader.h); batch_size is per rank; seed as ColossalAI's default 1024. Before boost()
  // under plugin = "auto" it shards over the world, and auto then chooses among the data-parallel
  // configurations only.
  std::shared_ptr<data::DataLoader> prepare_dataloader(std::shared_ptr<data::Dataset> dataset, int64_t batch_size,
                                                       bool shuffle = false, uint64_t seed = 1024,
                                                       bool drop_last = false);

  // ---- Checkpoints (collective: every rank calls; see checkpoint/checkpoint_io.h for the format).
  // HuggingFace layout in directory `path`: model.safetensors, or shards + index when
  // options.shard and the model exceeds size_per_shard_mb (MiB), or pytorch_model*.bin.
  // With a state-dict adapter (options.adapter, or the one set_state_dict_adapter registered for
  // this model) the directory is that HuggingFace architecture's, config.json included
  // (checkpoint/state_dict_adapter.h).
  // A model with unmerged LoRA adapters (enable_lora) saved through a HuggingFace adapter:
  // checkpoint::CheckpointError (the architecture has no tensors for them): save them with
  // save_lora_as_pretrained, or merge them first (nn::merge_lora). Without an adapter every tensor,
  // adapters included, is written under its own name (a training checkpoint).
  template <class M>
  void save_model(ModelWrapper<M>& model, const std::string& path, const checkpoint::ModelSaveOptions& options = {}) {
    checkpoint::ModelSaveOptions o = options;
    if (!o.adapter) o.adapter = state_dict_adapter_of(*model.module());
    check_no_lora_through(*model.module(), o.adapter.get());
    if (o.use_async) {  // checkpoint/async_save.h: returns once staged; the background writer commits
      checkpoint::async_save(&world(), path, o.async_policy, [&] { checkpoint_io().save_model(*model.module(), path, o); });
      return;
    }
    checkpoint_io().save_model(*model.module(), path, o);
  }
  // strict: every key must match (all problems reported together, model untouched on error).
  // Optimizers boosted by this Booster that hold fp32 master copies of the model's weights are
  // refreshed from the loaded weights. The registered adapter, if any, applies.
  template <class M>
  void load_model(ModelWrapper<M>& model, const std::string& path, bool strict = true) {
    checkpoint::ModelLoadOptions o;
    o.strict = strict;
    load_model(model, path, o);
  }
  // The same with options (strict, and a state-dict adapter that replaces the registered one).
  // Through a HuggingFace adapter a model with LoRA adapters (enable_lora) loads its base weights:
  // the adapters are not expected in the file and keep their values (load them with load_lora).
  template <class M>
  void load_model(ModelWrapper<M>& model, const std::string& path, const checkpoint::ModelLoadOptions& options) {
    checkpoint::ModelLoadOptions o = options;
    if (!o.adapter) o.adapter = state_dict_adapter_of(*model.module());
    o.adapter = without_lora(*model.module(), o.adapter);
    checkpoint_io().load_model(*model.module(), path, o);
    after_model_load(*model.module());
  }
  // Declares how this model's state maps to a HuggingFace architecture: save_model / load_model
  // use `adapter` for it from now on (nullptr removes it). Checks at once that the adapter has a
  // rule for every parameter and buffer name of the model (LoRA adapters excepted: they are saved
  // with save_lora_as_pretrained); throws checkpoint::CheckpointError naming the tensors it does
  // not cover (shapes are checked at each save and load, on the full tensors). Local.
  template <class M>
  void set_state_dict_adapter(ModelWrapper<M>& model, std::shared_ptr<const checkpoint::StateDictAdapter> adapter) {
    register_state_dict_adapter(*model.module(), std::move(adapter));
  }
  // ---- LoRA (nn/lora.h; PEFT's files: checkpoint/peft_lora.h; ColossalAI's Booster.enable_lora /
  // save_lora_as_pretrained).
  // Before boost(): adds low-rank adapters to the layers of `model` that config.target_modules
  // names and freezes every other parameter (nn::enable_lora, whose errors it throws). boost() then
  // drops the frozen parameters from the optimizer's groups (logged), so gradients, master weights
  // and optimizer states exist for the adapters only, under every plugin; tensor-parallel layers
  // (hybrid_parallel tp > 1) get adapters split like their weight. Throws std::logic_error when
  // `model` was already boosted (its optimizer would not hold the adapters).
  nn::LoraReport enable_lora(torch::nn::Module& model, const nn::LoraConfig& config);
  // Collective. Writes the adapters in PEFT's layout into directory `dir` (adapter_config.json +
  // adapter_model.safetensors, checkpoint::save_lora_as_pretrained's content;
  // PeftModel.from_pretrained loads it onto the HuggingFace model), through the plugin's checkpoint
  // IO: tp shards are gathered, FlatParameters viewed, each pipeline stage writes its layers'. The
  // HuggingFace names come from the adapter set_state_dict_adapter registered
  // (std::invalid_argument when there is none). base_model_name_or_path goes into
  // adapter_config.json. Throws what checkpoint::lora_state_dict_adapter and
  // CheckpointIO::save_model throw.
  template <class M>
  void save_lora_as_pretrained(ModelWrapper<M>& model, const std::string& dir, const std::string& base_model_name_or_path = "") {
    checkpoint::ModelSaveOptions o;
    o.adapter = lora_adapter_of(*model.module(), base_model_name_or_path, "save_lora_as_pretrained");
    checkpoint_io().save_model(*model.module(), dir, o);
    merge_into_one_file(dir, *o.adapter);
  }
  // Collective. Reads PEFT's layout from `dir` into the model's adapters (enable_lora with the
  // adapter's config before boost()): checkpoint::check_lora_adapter_config's checks, then a strict
  // load through the plugin's checkpoint IO (every adapter tensor present with its shape); master
  // weights are refreshed as after load_model. Throws checkpoint::CheckpointError naming the field
  // or the tensors, before anything changes.
  template <class M>
  void load_lora(ModelWrapper<M>& model, const std::string& dir) {
    checkpoint::ModelLoadOptions o;
    o.adapter = lora_adapter_of(*model.module(), "", "load_lora");
    checkpoint::check_lora_adapter_config(*model.module(), dir, *state_dict_adapter_of(*model.module()));
    checkpoint_io().load_model(*model.module(), dir, o);
    after_model_load(*model.module());
  }

  // Optimizer state by parameter name in directory `path`. options.format (default kAuto): sharded
  // (every rank writes its own file, nothing is gathered) for plugins that shard the state
  // (low_level_zero, torch_fsdp), gathered (one set of full tensors, HF-like) for torch_ddp; a
  // SaveOptions (shard, size_per_shard_mb, use_safetensors) still works and applies to the gathered
  // format. load_optimizer reads either format, saved at any world size by any plugin.
  // use_async (save_model too): see checkpoint/async_save.h; wait_async_save(&world()) is the sync
  // point, and ~Booster waits for a save in flight (logging its error).
  void save_optimizer(OptimizerWrapper& optimizer, const std::string& path,
                      const checkpoint::OptimizerSaveOptions& options = {});
  void load_optimizer(OptimizerWrapper& optimizer, const std::string& path);
  void save_lr_scheduler(LRScheduler& scheduler, const std::string& path);
  void load_lr_scheduler(LRScheduler& scheduler, const std::string& path);
  // Bytes of model state this rank holds in steady state (see core/memory.h): the module's
  // parameters, the optimizer wrapper's gradients, master weights and optimizer states, the
  // plugin's communication buffers. Also logged (rank 0) at the end of boost(). Local, no
  // communication.
  template <class M>
  MemoryReport memory_report(ModelWrapper<M>& model, OptimizerWrapper* optimizer = nullptr) {
    return memory_report_of(*model.module(), model.hooks(), optimizer);
  }

  // The plugin's CheckpointIO when it controls checkpointing, else the general one.
  checkpoint::CheckpointIO& checkpoint_io();

  Plugin& plugin();
  // The plugin's data-parallel group (Plugin::data_parallel_group): ranks in it see different data.
  // Before boost() under plugin = "auto", the world; auto then chooses among the data-parallel
  // configurations only (call it after boost() to let auto choose a pipeline mesh).
  std::shared_ptr<dist::ProcessGroup> data_parallel_group();
  // Under plugin = "auto": the concrete configuration auto would choose for this model and
  // optimizer (auto_select.h), as a Config with booster.plugin and the [plugin] options set (print it
  // with to_toml()); a Booster built from it over the same world trains as this one would after
  // boost(). Collective over the world (every rank chooses the same); logs the reasons on rank 0.
  // Throws ConfigError when booster.plugin is not "auto", and as boost() under auto (no configuration
  // fits, auto.communication_dtype that no plugin can send).
  Config resolve_auto(torch::nn::Module& model, torch::optim::Optimizer* optimizer = nullptr);
  // The plugin's tensor-parallel context (Plugin::tensor_parallel_context; nn/tensor_parallel.h):
  // hand it to the model's tensor- and sequence-parallel layers (their options' `context`) so they
  // shard over the plugin's tp group. T = 1 (a default-constructed context) for plugins without
  // tensor parallelism and for plugin = "auto", which chooses among configurations of tp = 1 only.
  // Valid while the Booster lives (the reference); copies share the groups. Local, no communication.
  const nn::TensorParallelContext& tensor_parallel_context() const;
  const Config& config() const;
  dist::ProcessGroup& world();
  // This rank's device ([booster] device): cpu, or cuda:(LOCAL_RANK % visible devices). Models are
  // moved there at boost(); prepare_dataloader's batches arrive there.
  // [booster] estimate = true (a trainer's `--estimate N`): the run asks for the memory estimate
  // instead of training; the trainer calls estimate() and decides what follows (the examples print
  // report.text and exit 0). boost() refuses to train such a run (ConfigError naming estimate()).
  bool estimate_requested() const;
  // The per-rank memory of every installed plugin's configurations for this model and optimizer at
  // [booster] estimate_world_size ranks (default: this job's), as estimate.h's
  // estimate_installed_plugins, with the activations and the optimizer state measured on one real
  // micro-batch when the model's forward takes one tensor and a criterion is given: the data
  // loader's first batch, else set_estimate_batch()'s (run under the configured precision and
  // activation checkpointing); without one they are left out (the text says so). Prints nothing and
  // does not exit. The measured micro-batch runs a forward, a backward and one optimizer step: build
  // a fresh model and optimizer to train afterwards. Throws ConfigError in a job of more than one
  // rank (it measures one process; set estimate_world_size instead), std::invalid_argument when the
  // measured loss is not a scalar that requires grad. Models: Booster's own memory formulas
  // (docs/plugins.md) with ZeRO's (Rajbhandari et al., SC 2020) and Korthikanti et al. 2022's
  // activations when not measured.
  template <class M>
  EstimateReport estimate(std::shared_ptr<M> model, std::shared_ptr<torch::optim::Optimizer> optimizer = nullptr,
                          Criterion criterion = {}, std::shared_ptr<data::DataLoader> dataloader = nullptr) {
    static_assert(std::is_base_of_v<torch::nn::Module, M>, "estimate(): the model must derive from torch::nn::Module");
    std::function<torch::Tensor()> loss;
    std::string source = "the data loader's first batch";
    if constexpr (detail::HasTensorForward<M>::value) {
      if (dataloader && criterion)
        loss = [&]() -> torch::Tensor {
          data::Example batch = *dataloader->begin();
          return criterion(model->forward(batch.data), batch.target);
        };
      else if (criterion && estimate_batch().first.defined()) {
        loss = [&]() -> torch::Tensor {
          const auto& [inputs, targets] = estimate_batch();
          return criterion(model->forward(inputs), targets);
        };
        source = "set_estimate_batch()'s micro-batch";
      }
    }
    return estimate_report(*model, optimizer.get(), loss, source);
  }

  const c10::Device& device() const;
  const std::string& mixed_precision() const;

 private:
  Configured configure(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<torch::optim::Optimizer> optimizer);
  [[noreturn]] void refuse_boost_under_estimate() const;
  // Removes the parameters with requires_grad false (a LoRA base model) from the optimizer's groups
  // and their state (logged); std::invalid_argument when none is left. Idempotent.
  void drop_frozen_parameters(torch::optim::Optimizer& optimizer);
  // set_estimate_batch's tensors (undefined when it was not called).
  const std::pair<torch::Tensor, torch::Tensor>& estimate_batch() const;
  void attach_plugin(std::shared_ptr<Plugin> plugin);
  // plugin = "auto": picks and loads the configuration for this model (auto_select.h).
  void choose_auto(torch::nn::Module& model, torch::optim::Optimizer* optimizer);
  // Chooses (see choose_auto), writes the choice into `config` and loads the chosen plugin.
  void auto_config(torch::nn::Module& model, torch::optim::Optimizer* optimizer, Config& config,
                   std::shared_ptr<Plugin>& plugin);
  std::string auto_not_chosen(const std::string& what) const;
  // estimate()'s work for this model, optimizer and measured micro-batch (loss may be empty:
  // activations not measured; source names where its micro-batch came from).
  EstimateReport estimate_report(torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                                 const std::function<torch::Tensor()>& loss, const std::string& source);
  ScopeGuard no_sync_hooks(ModelHooks& hooks, OptimizerWrapper* optimizer);
  MemoryReport memory_report_of(torch::nn::Module& module, ModelHooks& hooks, OptimizerWrapper* optimizer);
  void after_model_load(torch::nn::Module& module);
  // [booster] activation_checkpointing: sets each Unit's checkpoint flag (nn/unit.h).
  void apply_activation_checkpointing(torch::nn::Module& model);
  void register_state_dict_adapter(torch::nn::Module& module, std::shared_ptr<const checkpoint::StateDictAdapter> adapter);
  std::shared_ptr<const checkpoint::StateDictAdapter> state_dict_adapter_of(const torch::nn::Module& module) const;
  // The PEFT adapter of the module's LoRA layers over its registered adapter (std::invalid_argument
  // naming `what` when none is registered).
  std::shared_ptr<const checkpoint::StateDictAdapter> lora_adapter_of(torch::nn::Module& module, const std::string& base,
                                                                      const char* what);
  // `adapter` as a partial format leaving the module's LoRA tensors out (after checking that it
  // covers every other tensor), or `adapter` itself when there is no LoRA or no adapter.
  static std::shared_ptr<const checkpoint::StateDictAdapter> without_lora(
      torch::nn::Module& module, std::shared_ptr<const checkpoint::StateDictAdapter> adapter);
  // Collective: when the checkpoint IO wrote `dir` as several files (pipeline stages write their
  // own), rank 0 rewrites it as one (PEFT reads adapter_model.safetensors only); errors agreed.
  void merge_into_one_file(const std::string& dir, const checkpoint::StateDictAdapter& adapter);
  // CheckpointError when `adapter` is a full HuggingFace format and the module has unmerged LoRA.
  static void check_no_lora_through(torch::nn::Module& module, const checkpoint::StateDictAdapter* adapter);
  Criterion wrap_criterion(Criterion criterion) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace booster
