// gemini.h — Gemini (ColossalAI's GeminiDDP + ChunkManager + placement policies + GeminiOptimizer) as
// a function over a data-parallel group, usable without a plugin:
//     booster::parallel::GeminiShardOptions options;
//     options.group = world;
//     options.auto_placement = true;               // placement_policy = "auto"
//     auto sharded = booster::parallel::gemini_shard(model, optimizer, options);
//     booster::ModelWrapper<Net> m(model, sharded.hooks);  // forward gathers chunk by chunk
//     sharded.hooks->backward(loss); sharded.optimizer->step();  // reduce-scatter, step on masters
// The gemini plugin is this function behind ColossalAI's GeminiPlugin option names.
//
// A layout policy on the sharded runtime (sharded_runtime.h):
// the model's parameters packed into chunks, each chunk a FlatParameter sharded over the
// data-parallel group, gathered around the shard units (booster::nn::Unit) that use it, and a
// placement of every chunk's pieces in a compute and an offload tier.
//
// Chunks. Parameters of one optimizer parameter group (frozen ones apart) are packed in order into
// chunks of the size ColossalAI's search finds (search_range, min_chunk_size, search_interval). The order
// is the registration order at boost(); the first forward records the order of first use (units in
// the order they run, the parameters outside every unit first), and at the end of the first backward
// the chunks are rebuilt in that order when it differs (once; values and the reduced gradients are
// carried over; skipped, and logged, when the optimizer already has state, e.g. loaded).
// Each chunk holds:
//   flat        the FlatParameter: the parameters are views of its buffer, in the compute dtype
//               (fp32, or bf16 for precision = "bf16"); its local shard is the parameter shard
//   master      [shard_numel] float32: the master shard the optimizer steps (trainable chunks)
//   local_grad  the FlatParameter's [shard_numel] reduced gradient (compute dtype)
//
// Schedule of one iteration (chunk c, unit u):
//   model pre_forward     gather the chunks of the parameters outside every unit (kept until the end
//                         of backward)
//   pre_forward(u)        gather every chunk holding a parameter of u; then start gathering the next
//                         max_prefetch chunks of the previous iteration's access order
//   post_forward(u)       release every chunk none of whose units is still to run in this forward
//   pre_backward(u)       gather the chunks of u (and prefetch as in forward, backwards)
//   all gradients of c    reduce-scatter them (AVG) into c's gradient shard, release c
//   end of backward       reduce what is left (unused parameters count as zeros), release all
// Chunks kept gathered (keep_gathered: shard_param_frac < 1, or a model under min_chunk_size_m) are
// released only by the optimizer step (their shard changed) and by eviction.
//
// Placement (tiers: compute, offload; offload is host memory, or a per-rank unlinked file in offload_dir,
// ZeRO-Infinity's NVMe tier on a file). What can be placed: a chunk's parameter shard, and its optimizer side (master shard
// and optimizer states). "static": in chunk order, the chunks holding the first (1 - shard_param_frac)
// of the parameter bytes are kept gathered; of the others, chunks are offloaded in order until
// offload_param_frac of the bytes are; the optimizer side of chunks is offloaded in order until
// offload_optim_frac of the bytes are (ColossalAI's StaticPlacementPolicy). "auto": the optimizer
// side is offloaded; parameter shards start in compute memory; the first iteration (warm-up) measures
// non-model memory (CPU tensor bytes alive, cpu_byte_counter.h, minus the model data this state
// holds in memory, relative to boost()) at every hook; from then on,
// before a chunk is gathered, chunks not in use are evicted (gathered ones released, parameter shards
// moved to the offload tier) while compute model data + the chunk > memory_budget *
// steady_cuda_cap_ratio - the measured non-model peak, evicting the chunk whose next use (in the
// recorded access order) is farthest first (Belady); an evicted parameter shard comes back to compute
// memory at its next use when it fits there beside the gathered chunk without evicting anything else
// (ColossalAI moves an accessed chunk to the device). During the warm-up the non-model share is
// warmup_non_model_data_ratio of that capacity (ColossalAI's AutoPlacementPolicy). At the first
// optimizer step after the warm-up, gpu_margin_mem_ratio (ColossalAI's GeminiOptimizer) moves the
// optimizer side of chunks back to the compute tier, in chunk order, each while its bytes still fit in
// ratio * margin, margin = memory_budget * steady_cuda_cap_ratio - non-model peak - compute model
// peak (both measured in the warm-up); the budget counts them from then on.
// The compute device is the parameters' (all on one device). On the CPU compute and host memory are
// both RAM: only offload_dir moves bytes out of the process; host placement is bookkeeping (what the
// budget counts). On a CUDA device (ColossalAI's meaning) compute memory is the GPU: gathered chunks,
// compute-tier parameter shards, and the optimizer side (master shard, states) and gradient shard of
// compute-tier chunks live there; the offload tier is pinned host memory (or the offload_dir file). An
// offloaded parameter shard is copied to the device for each all-gather (FlatParameter::unshard); a
// reduced gradient shard goes to the host at once when its optimizer side is there; non-model memory
// is the caching allocator's allocated bytes minus the compute model data; memory_budget_bytes is
// the device's budget. The copies between the tiers run on the current stream; three are queued
// without blocking the host: an offloaded parameter shard going to the device for its all-gather
// (FlatParameter::unshard_async; writes of the shard wait for it), a gradient shard going to host
// memory (the end of backward waits for them) and an updated host master going to its device
// parameter shard (the next step and every checkpoint wait for them). The step queues the compute-tier chunks' updates first, so the device
// runs them while the host steps the offloaded chunks (ColossalAI's HybridAdam split).
//
// Every rank runs the same units in the same order (the collectives are matched by order).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "booster/dist/process_group.h"
#include "booster/export.h"
#include "booster/parallel/hooks_decorator.h"
#include "booster/parallel/sharded_runtime.h"

namespace booster::parallel {

// The options of gemini_shard: ColossalAI's GeminiPlugin options in elements and bytes.
struct GeminiShardOptions {
  std::shared_ptr<dist::ProcessGroup> group;  // data-parallel ranks (chunks shard over it)
  at::ScalarType compute_dtype = at::kFloat;  // fp32, bf16, or fp16 (CUDA)
  int64_t search_range = 32 << 20;            // elements
  int64_t search_interval = 1024;             // elements (hidden_dim)
  int64_t min_chunk_size = 32 << 20;          // elements
  bool auto_placement = false;                // placement_policy = "auto"
  double shard_param_frac = 1.0, offload_optim_frac = 0.0, offload_param_frac = 0.0;
  double warmup_non_model_data_ratio = 0.8, steady_cuda_cap_ratio = 0.9;
  int64_t memory_budget_bytes = 0;  // auto: the compute memory budget
  double margin_mem_ratio = 0.0;    // auto: gpu_margin_mem_ratio
  std::string offload_dir;          // "" : the offload tier is host memory
  int max_prefetch = 0;
  bool enable_gradient_accumulation = false;
  // Float8 e4m3 chunk all-gathers and gradient reduce-scatters (FlatParameterOptions::
  // fp8_communication; ColossalAI's fp8_communication); the fp32 masters stay exact.
  bool fp8_communication = false;
};

// Packs `model`'s parameters into chunks sharded over options.group (the parameters become views of
// the chunk buffers, cast to options.compute_dtype: float32, bfloat16, or float16 (CUDA), on the
// parameters' device, the CPU or a CUDA device), places them, and wraps `optimizer` (may be null) to
// step the float32 master shards one chunk at a time (any elementwise optimizer of
// optim/optimizer_registry.h; masters in host memory of the Adam family through the fused CPU Adam
// kernel, masters on a device through the optimizer's own step: HybridAdam's is the multi-tensor CUDA
// kernel). With optimizer_options.scaler (fp16) the step is skipped on every rank when a gradient shard
// overflows anywhere, else the gradients are divided by the scale in float32. Returns the runtime (its
// stats(): chunk_size, chunks, chunks_kept_gathered, chunks_param_offloaded, chunks_optim_offloaded,
// evictions, param_shards_restored, offload bytes, memory peaks), the model
// hooks, the optimizer wrapper and a checkpoint IO over options.group whose model checkpoints read
// and write the float32 master shards. Collective over options.group (every rank must call it with
// the same model structure). optimizer_options: clipping and loss scaling as OptimizerWrapper's; its
// group is set to options.group. `owner` names the caller in errors.
// Throws std::invalid_argument without a group, for parameters on two devices or on a device other than
// the CPU or CUDA (named), for an optimizer type that is not registered, a
// trainable parameter missing from the optimizer, an optimizer parameter the model does not own,
// nested units or parameters shared by two units; std::runtime_error for an offload_dir that cannot
// be used (missing, not a directory, read-only, full: nothing is changed), and at the first forward
// for a memory_budget_bytes too small for one unit's chunks.
BOOSTER_API ShardedModel gemini_shard(std::shared_ptr<torch::nn::Module> model,
                                      std::shared_ptr<torch::optim::Optimizer> optimizer, GeminiShardOptions options,
                                      OptimizerWrapperOptions optimizer_options = {},
                                      const HooksDecorator& decorate = {}, const std::string& owner = "gemini");

}  // namespace booster::parallel
