// hybrid_estimate.h — hybrid_parallel's memory estimate rows (Plugin::estimate_memory,
// core/memory_estimate.h): what `booster estimate`, a trainer's --estimate and plugin = "auto" list
// for tensor, pipeline and sequence parallel meshes.
#pragma once

#include <cstdint>
#include <vector>

#include "booster/core/memory_estimate.h"

namespace booster::hybrid {

// Every mesh with tp * pp > 1 dividing the world (pp at most the model's layers; none when the
// model is not a PipelineModule); with pp = 1 also sequence parallelism: split_gather for tp > 1,
// all_to_all for every sp_size >= 2 that fits beside tp. Each mesh has a row per zero_stage the
// plugin accepts there (hybrid_parallel_plugin.cpp's refusals): 0 always; 1, 2 and 3 when the
// data-parallel replicas (dp, times sp under all_to_all) are more than one (over one rank a ZeRO
// stage shards nothing: zero_stage 0's row stands for it); no 2 with pp > 1, no 3 with precision "fp16".
// A rank holds ~Ψ/(tp·pp) parameters (Megatron's split; pipeline stages assumed equal unless the
// layers' sizes are known) in the request's precision, over the replicas R (core/memory_estimate.h):
//   zero_stage 0: replicated_estimate (DDP: weights, gradients, fp32 masters below fp32, Adam);
//   zero_stage 1, 2: zero_estimate over R (ZeRO-1: optimizer states and masters sharded; ZeRO-2:
//     and the gradients, reduce-scattered in buckets of zero_bucket_elements during backward);
//   zero_stage 3: fully_sharded_estimate over R (fp32 shards of parameters, gradients and optimizer
//     states, 16Ψ/(tp·pp·R) bytes with Adam; gathered in the compute dtype two units at a time as
//     FULL_SHARD, a unit being the model's largest over tp (the rank's whole part without units);
//     with pp > 1 the stage's micro-batches keep the whole stage gathered and accumulate its
//     gradients unreduced until one reduce-scatter).
// Activations (Korthikanti et al. 2022, the per-layer 34·s·b·h bytes without the attention-score
// term): tensor parallelism alone splits 24 of the 34 over tp and keeps the LayerNorm, dropout and
// residual activations (10 of 34) whole; split_gather shards those too (all / tp); all_to_all
// shards everything over sp (then as tp alone over tp); over pp a stage's share (num_microbatches
// = pp in flight under 1F1B). Not data parallel: the model is built for the mesh. Communication
// volume: the dp traffic in Ψ, the rank's part (Ψ/(tp·pp)) times 2 (allreduce; ZeRO-1/2), 3 (ZeRO-3)
// or, ZeRO-3 under a pipeline, at most 2·num_microbatches + 1 (a unit regathered in each
// micro-batch's forward and backward; 2 for a model without units, gathered once); the activations'
// tp collectives, all-to-alls and pp sends are extra (noted).
// Each pp > 1 mesh with at least 2 * pp layers also has pp_style = "zbv" rows (after its 1F1B
// rows, so auto prefers 1F1B at equal need): a rank holds the V's two stages of the 2 * pp stage
// partition (r and 2pp-1-r; the largest such pair when the layers' sizes are known), and its
// activations are counted as 1F1B's (ZB-V's peak equals 1F1B's at the same micro-batch size, Qi et
// al. 2024 section 6; with its num_microbatches = 2 * pp the micro-batches are half 1F1B's, so this
// is an upper bound).
// Rows name their settings in MemoryEstimate::options ("zero_stage=2", ...), so auto can pick them;
// their figures are bytes per rank.
// zero_bucket_elements: ZeRO-1/2's reduce bucket (zero_bucket_size_in_m in elements). Returns no
// rows for precision "fp16" on a machine without CUDA; throws std::invalid_argument for another
// unknown precision (precision_bytes).
std::vector<MemoryEstimate> hybrid_estimate_memory(const EstimateRequest& r, int64_t zero_bucket_elements);

}  // namespace booster::hybrid
