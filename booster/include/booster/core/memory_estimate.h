// memory_estimate.h — per-rank memory a plugin configuration needs for a model it has not yet
// configured: what `booster estimate`, a trainer run with [booster] estimate = true, and
// plugin = "auto" ask every installed plugin (Plugin::estimate_memory). Model states follow the
// ZeRO paper (Rajbhandari et al., SC20, section 3.1; memory.h's MemoryReport): with Ψ parameters,
// N ranks, fp32 and Adam, DDP 16Ψ, ZeRO-1 8Ψ + 8Ψ/N, ZeRO-2 4Ψ + 12Ψ/N, ZeRO-3 16Ψ/N bytes; the
// per-step communication volumes are the paper's section 7 (DDP 2Ψ, ZeRO-1/2 2Ψ, ZeRO-3 3Ψ
// elements sent + received per rank). On top of the model states an estimate counts what one
// iteration adds at its peak (gathered units, optimizer temporaries, buffers in flight) and the
// activations, measured by the caller on one micro-batch (estimate.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "booster/core/memory.h"
#include "booster/export.h"

namespace booster {

// The model, optimizer and job an estimate is for. Element counts are of parameters (requires_grad
// or not), bytes are per rank.
struct EstimateRequest {
  int64_t parameters = 0;          // Ψ, elements
  int64_t largest_parameter = 0;   // elements of the largest parameter tensor (optimizer temporaries)
  int64_t largest_unit = 0;        // elements of the largest nn::Unit (a shard unit); Ψ when the model has none
  int64_t units = 0;               // nn::Units in the model (0: none; FSDP/Gemini then shard the model as one unit)
  int64_t layers = 0;              // layers of a nn::PipelineModule (0: not one; no pipeline meshes)
  std::vector<int64_t> layer_parameters;  // elements of each of those layers (a parameter two layers
                                          // share, such as a tied embedding, in both); empty: unknown,
                                          // a stage is then assumed to hold Ψ / pp
  int64_t buffer_bytes = 0;        // module buffers (BatchNorm statistics), kept whole on every rank
  // fp32 bytes of optimizer state per parameter element: Adam/AdamW 8 (amsgrad 12), SGD with
  // momentum 4, SGD 0. Measured from one real step by estimate.h; the type-based guess otherwise.
  double optimizer_state_bytes_per_parameter = 8;
  int64_t activation_bytes = 0;    // the peak of one micro-batch's forward + backward on one rank, above
                                   // the model states (0: not measured)
  int world_size = 1;              // N
  std::string precision = "fp32";  // "fp32" | "bf16" | "fp16": the training precision
  std::string device = "cpu";      // [booster] device: "cpu" | "cuda". On "cuda" the formulas below place
                                   // the model states, buffers, transient and activations in device
                                   // memory (MemoryReport's *_on_device, MemoryEstimate::device_bytes)
};

// One configuration of one plugin for a request. Bytes per rank.
struct BOOSTER_API MemoryEstimate {
  std::string plugin;                // the plugin's name (filled in by the caller)
  std::string configuration;         // human-readable: "zero_stage = 2, precision = \"bf16\""
  std::vector<std::string> options;  // the [plugin] settings that select it, as --set text: "zero_stage=2"
  MemoryReport states;               // steady-state model states and communication buffers (memory.h)
  int64_t transient = 0;             // the most one iteration adds on top (gathered units, optimizer
                                     // temporaries of the largest stepped tensor, buffers in flight)
  int64_t activations = 0;           // activation bytes as this configuration holds them
  double communication_volume = 0;  // elements sent + received per rank per step, in units of Ψ
  bool data_parallel = true;         // every rank sees different data and the model is built as for
                                     // one rank (no tensor/pipeline split): plugin = "auto" may pick it
  bool pipeline = false;             // a pipeline mesh without tensor parallelism (hybrid_parallel,
                                     // tp_size = 1): the model is built as for one rank and split into
                                     // stages at boost(), but trained with booster.execute_pipeline;
                                     // plugin = "auto" picks it only when no data_parallel row fits
  std::string note;                  // what the figure leaves out or assumes ("" when nothing)
  int64_t device_bytes = 0;          // of total(), the bytes in device memory (request.device "cuda"); the
                                     // rest is host memory. 0 for a CPU request

  // states.model_states() + states.communication_buffers + transient + activations (bytes).
  int64_t total() const;
  // total() - device_bytes: what the configuration holds in host memory (bytes).
  int64_t host_total() const { return total() - device_bytes; }
};

// For a request on an accelerator (request.device != "cpu"): places everything `e` counts in device
// memory (states.*_on_device = the figures, device_bytes = total()), as data-parallel training on the
// GPU holds it. No-op for a CPU request. replicated_estimate and zero_estimate call it.
BOOSTER_API void place_on_device(const EstimateRequest& request, MemoryEstimate& e);

// fp32 temporaries of one optimizer step on a tensor of `elements`: LibTorch's Adam/AdamW allocate
// two tensors of its size (the sqrt of exp_avg_sq and the denominator), SGD one (the decayed
// gradient), whatever holds no state none. Bytes.
BOOSTER_API int64_t optimizer_step_temporaries(double state_bytes_per_parameter, int64_t elements);

// Bytes per element of a floating-point precision name ("fp32" 4, "bf16" / "fp16" 2). Throws
// std::invalid_argument for another name.
BOOSTER_API int64_t precision_bytes(const std::string& precision);

// The replicated-gradient data-parallel formula (torch_ddp; hybrid_parallel with zero_stage 0):
// `parameters` elements on this rank (Ψ, or Ψ/(tp·pp) of a mesh) of param_bytes each, gradients of
// the same size and dtype, fp32 master weights when param_bytes < 4 (keep_fp32_master), optimizer
// states of the request's size per element; `bucket_bytes` of buckets besides the gradients (DDP
// without gradient_as_bucket_view: a second gradient copy); transient = the optimizer's temporaries
// on the largest parameter. Communication volume 2 (allreduce).
BOOSTER_API MemoryEstimate replicated_estimate(const EstimateRequest& request, int64_t parameters, int64_t param_bytes,
                                               bool keep_fp32_master, int64_t bucket_bytes,
                                               int64_t largest_parameter);

// ZeRO-1/2 over `dp` ranks (low_level_zero; hybrid_parallel with zero_stage 1 and 2), Rajbhandari et al.:
// parameters whole (param_bytes each), gradients whole (stage 1: the flat buckets are the
// gradients) or a 1/dp shard (stage 2), an fp32 master shard when param_bytes < 4, optimizer states
// of a 1/dp shard. transient = max(backward: the largest parameter's gradient as autograd made it,
// plus (stage 2) two buckets of bucket_elements in flight, plus the reduce-scatter's receive buffers:
// dp - 1 peers' parts of this rank's range within the buckets in flight (at most its shard; the
// in-place reduce-scatter of dist::ProcessGroup receives each peer into a buffer of its own), step:
// the fp32 copy of the gradient shard plus the optimizer's temporaries on it (one flat tensor per
// group)).
// Communication volume 2 (reduce-scatter + all-gather).
BOOSTER_API MemoryEstimate zero_estimate(const EstimateRequest& request, int stage, int64_t parameters, int dp,
                                         int64_t param_bytes, int64_t bucket_elements, int64_t largest_parameter);

// How a fully sharded (ZeRO-3) configuration gathers and reduces in one iteration.
struct FullyShardedSchedule {
  int64_t shard_group = 1;     // S: the ranks the FlatParameters shard over
  int64_t gathered_bytes = 4;  // bytes per element of a gathered FlatParameter (the compute dtype)
  // false: FULL_SHARD / HYBRID_SHARD, a unit is freed after its forward and its backward, so two are
  // gathered at a time (the one in use and the one BACKWARD_PRE prefetches); true: SHARD_GRAD_OP,
  // or a pipeline stage whose micro-batches are in flight together: every unit stays gathered.
  bool keep_gathered = false;
  // HYBRID_SHARD: a unit's shard gradient is also allreduced over the replicas (one more fp32
  // buffer of a unit's shard in backward).
  bool replicated = false;
  // A pipeline stage (hybrid_parallel zero_stage 3 with pp_size > 1): the micro-batches' gradients
  // accumulate unreduced in the gathered dtype and are reduce-scattered once after the schedule.
  bool accumulate_gradients = false;
};

// ZeRO-3 on the sharded runtime (torch_fsdp; hybrid_parallel with zero_stage 3), Rajbhandari et
// al. section 5 and PyTorch FSDP (Zhao et al., VLDB 2023): `parameters` elements on this rank (Ψ,
// or the rank's part of a mesh) in fp32 shards of ceil(parameters / S) elements: parameters,
// gradients and optimizer states (16Ψ/S bytes with Adam), buffers whole. transient = max(backward,
// step), bytes, with U = `largest_unit` elements (the largest FlatParameter, one nn::Unit):
//   backward = the gathered FlatParameters in gathered_bytes (none when S = 1 and gathered_bytes =
//     4: the FlatParameter aliases its shard): min(2U, parameters) elements, or all of them with
//     keep_gathered; plus the gradients: reduced unit by unit, two full-size fp32 gradients of U
//     (autograd's and the flat one), or with accumulate_gradients every parameter's gradient in
//     gathered_bytes plus the flat fp32 gradient of U being reduced; plus (replicated) an fp32
//     shard of U;
//   step = the optimizer's temporaries on U's shard, ceil(U / S) elements.
// Communication volume 3 (ZeRO-3: all-gather in forward and in backward, reduce-scatter), 2 with
// keep_gathered (gathered once); in units of `parameters`, the caller scales it to Ψ. Throws
// std::invalid_argument for shard_group < 1.
BOOSTER_API MemoryEstimate fully_sharded_estimate(const EstimateRequest& request, int64_t parameters,
                                                  int64_t largest_unit, const FullyShardedSchedule& schedule);

}  // namespace booster
