// hybrid_estimate.h — hybrid_parallel's memory estimate rows (Plugin::estimate_memory,
// core/memory_estimate.h): what `booster estimate`, a trainer's --estimate and plugin = "auto" list
// for tensor, pipeline and sequence parallel meshes.
#pragma once

#include <cstdint>
#include <vector>

#include "booster/core/memory_estimate.h"

namespace booster::hybrid {

// Every mesh with tp * pp > 1 dividing the world (pp at most the model's layers; none when the
// model is not a PipelineModule), zero_stage 0 and, when dp > 1, 1; with pp = 1 also sequence
// parallelism: split_gather for tp > 1, all_to_all for every sp_size >= 2 that fits beside tp. A
// rank holds ~Ψ/(tp·pp) parameters (Megatron's split; pipeline stages assumed equal): the DDP
// formula for zero_stage 0, ZeRO-1's over the data-parallel replicas (dp, times sp under
// all_to_all) for 1 (core/memory_estimate.h), in the request's precision with fp32 masters.
// Activations (Korthikanti et al. 2022, the per-layer 34·s·b·h bytes without the attention-score
// term): tensor parallelism alone splits 24 of the 34 over tp and keeps the LayerNorm, dropout and
// residual activations (10 of 34) whole; split_gather shards those too (all / tp); all_to_all
// shards everything over sp (then as tp alone over tp); over pp a stage's share (num_microbatches
// = pp in flight under 1F1B). Not data parallel: the model is built for the mesh. Communication
// volume: the dp gradient traffic in Ψ; the activations' tp collectives, all-to-alls and pp sends
// are extra (noted).
// Each pp > 1 mesh with at least 2 * pp layers also has a pp_style = "zbv" row (after its 1F1B
// rows, so auto prefers 1F1B at equal need): a rank holds the V's two stages of the 2 * pp stage
// partition (r and 2pp-1-r; the largest such pair when the layers' sizes are known), and its
// activations are counted as 1F1B's (ZB-V's peak equals 1F1B's at the same micro-batch size, Qi et
// al. 2024 section 6; with its num_microbatches = 2 * pp the micro-batches are half 1F1B's, so this
// is an upper bound).
// zero_bucket_bytes: ZeRO-1's reduce bucket (zero_bucket_size_in_m in bytes). Returns no rows for
// precision "fp16" on a machine without CUDA.
std::vector<MemoryEstimate> hybrid_estimate_memory(const EstimateRequest& r, int64_t zero_bucket_bytes);

}  // namespace booster::hybrid
