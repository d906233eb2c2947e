// booster_impl.h — internal: the Booster's state (booster.cpp; the memory report, the estimate mode
// and plugin = "auto" in booster_memory.cpp).
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "booster/booster.h"
#include "booster/mixed_precision/precision.h"

namespace booster {

struct Booster::Impl {
  Config config;
  std::string activation_checkpointing = "none";  // [booster] activation_checkpointing
  int64_t selective_ac_every = 2;                 // [booster] selective_ac_every
  // set_state_dict_adapter's registrations, by the boosted module.
  std::map<const torch::nn::Module*, std::shared_ptr<const checkpoint::StateDictAdapter>> adapters;
  std::shared_ptr<Plugin> plugin;
  PluginTraits traits;  // the plugin's traits(), read once when it is attached
  std::string mixed_precision;
  std::shared_ptr<mixed_precision::MixedPrecision> precision;
  double max_norm = 0.0;
  double norm_type = 2.0;
  std::shared_ptr<checkpoint::CheckpointIO> checkpoint_io;
  std::vector<std::weak_ptr<OptimizerWrapper>> optimizers;  // boosted here (for after_model_load)
  // tensor_parallel_context(): the plugin's (set at attach_plugin); T = 1 until a plugin is attached.
  nn::TensorParallelContext tensor_parallel_context;
  bool estimate = false;               // [booster] estimate
  std::pair<torch::Tensor, torch::Tensor> estimate_batch;  // set_estimate_batch
  int estimate_world_size = 0;         // [booster] estimate_world_size (0: the launched world size)
  std::shared_ptr<dist::ProcessGroup> world;
  std::string device_name = "cpu";     // [booster] device
  c10::Device device{c10::kCPU};       // this rank's device (select_device)
  std::string malloc_mode;             // [booster] malloc ("" = the plugin's default)
  std::string host_allocator;          // the mode in effect (set at attach_plugin)
  double malloc_cache_mb = -1;         // [booster] malloc_cache_mb (-1: default_host_cache_limit at boost())
  int64_t boosted_model_state_bytes = 0;  // model states of every boosted model, per rank
  int64_t cache_limit_bytes(int64_t fallback) const {
    return malloc_cache_mb >= 0 ? static_cast<int64_t>(malloc_cache_mb * (1 << 20)) : fallback;
  }
  // plugin = "auto": [auto] options; the plugin is loaded at the first boost().
  bool auto_pending = false;
  bool world_sharded_before_boost = false;  // auto: prepare_dataloader / data_parallel_group() before boost()
  double auto_budget_mb = 0;           // 0: MemAvailable / local ranks (min over ranks)
  double auto_activation_mb = 0;
  double auto_runtime_mb = -1;         // < 0: measured at boost()
  std::string auto_offload_dir;
  std::string auto_communication_dtype;  // [auto] communication_dtype: "" | "bf16" | "fp8"
  std::set<const torch::nn::Module*> boosted;  // models boost() configured (enable_lora refuses them)
};

}  // namespace booster
