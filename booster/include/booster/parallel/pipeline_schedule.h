// pipeline_schedule.h — the order in which one pipeline rank runs the forward and backward passes
// of its micro-batches (pure: no tensors, no communication; the executor is parallel/pipeline.h),
// and the split of a model's layers into stages.
//
// A model of V = pp * num_model_chunks "virtual stages" (contiguous runs of layers) is spread over
// pp ranks by stage_rank() / chunk_stage(): virtual stage v lives on rank v % pp as its model chunk
// v / pp, except under zbv (V-shaped: rank r holds stages r and 2*pp-1-r). Every micro-batch passes
// forward through virtual stages 0..V-1 and backward through V-1..0. A rank's schedule is the list of
// its actions; each action waits only for its own input (the activation of virtual stage v-1, or the
// gradient of v+1), and sends are asynchronous, so a schedule is valid when the actions of all ranks,
// each list run in order, can complete (simulate() checks it).
//   gpipe:       all forwards, then all backwards (Huang et al., "GPipe", 2019); the reference order.
//   1f1b:        PipeDream-Flush (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN
//                Training", 2021): pp - rank - 1 warm-up forwards, then one forward one backward,
//                then the remaining backwards; at most pp micro-batches' activations alive.
//   interleaved: Megatron-LM's interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language
//                Model Training on GPU Clusters Using Megatron-LM", SC21): num_model_chunks chunks per
//                rank, micro-batches in groups of pp; needs num_microbatches % pp == 0.
//   zbv:         ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, section 6), in the
//                order of PyTorch's ScheduleZBVZeroBubble: exactly 2 chunks per rank on the V
//                placement (the last virtual stage, with the loss, on rank 0), and each backward
//                split into B (kBackwardInput: the gradient of the stage input, sent on at once) and
//                W (kBackwardWeight: the weight gradients, later, filling the bubble). Any
//                num_microbatches >= 1; the bubble is smallest from m >= 2*pp - 1 on.
// Bubble fraction (idle time over the ideal time, forward and backward of one micro-batch chunk
// taking t_f and t_b): (pp-1)/m for gpipe and 1f1b, (pp-1)/(m*num_model_chunks) for interleaved,
// i.e. busy time m*(t_f+t_b) out of (m+pp-1)*(t_f+t_b) for 1f1b. ZB-H1 (one chunk per rank, B and W
// split) reaches (pp-1)/(3m) with t_f = t_b = t_w; ZB-V with the same times (each chunk half the
// work: t_f = t_b = t_w = 1/2 of a stage's F) takes 3m + (pp-1)/2 stage units for m >= 2*pp - 1,
// a bubble of (pp-1)/(6m), half ZB-H1's (simulate(); pipeline_schedule_test.cpp checks it).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "booster/export.h"

namespace booster::parallel {

struct PipelineAction {
  // kBackward: the whole backward of the chunk (input and weight gradients); kBackwardInput (B):
  // the input gradient only, the graph kept; kBackwardWeight (W): the weight gradients of a chunk
  // whose B ran, freeing the graph. A schedule uses either kBackward or the B/W pair per action.
  enum class Kind { kForward, kBackward, kBackwardInput, kBackwardWeight };
  Kind kind = Kind::kForward;
  int microbatch = 0;
  int chunk = 0;  // model chunk of this rank (0 unless interleaved or zbv)
  bool operator==(const PipelineAction& o) const {
    return kind == o.kind && microbatch == o.microbatch && chunk == o.chunk;
  }
};

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved, kZeroBubbleV };

// The placement of virtual stages on pipeline ranks, the one function the schedules, the executor
// and the plugin's layer split use: the pp rank running virtual stage `virtual_stage` (0 <= it <
// pp * chunks), and the virtual stage of model chunk `chunk` on `rank`. kZeroBubbleV: stage v < pp
// on rank v, stage v >= pp on rank 2*pp-1-v (chunk 0 = stage rank, chunk 1 = stage 2*pp-1-rank);
// every other kind: rank v % pp, chunk v / pp. No checks (the callers validated pp, rank, chunks).
BOOSTER_API int stage_rank(ScheduleKind kind, int pp, int virtual_stage);
BOOSTER_API int chunk_stage(ScheduleKind kind, int pp, int rank, int chunk);

// The actions of pipeline rank `rank` (0 <= rank < pp) for `microbatches` micro-batches; forward_only
// keeps just the forwards (evaluation). Throws std::invalid_argument for pp < 1, rank outside
// [0, pp), microbatches < 1, chunks < 1, chunks > 1 with a schedule other than interleaved or zbv,
// 1f1b / interleaved with microbatches < pp (the message names both and the fix: raise
// num_microbatches or lower pp_size), interleaved with microbatches % pp != 0, and zbv with
// chunks != 2 ("num_model_chunks = 2") or pp < 2 ("pp_size > 1").
BOOSTER_API std::vector<PipelineAction> make_schedule(ScheduleKind kind, int pp, int rank, int microbatches, int chunks,
                                                      bool forward_only = false);

// Runs every rank's schedule in a discrete-event simulation in which an action starts when its rank
// is free and its input exists (forward: t_forward, backward: t_backward, B: t_backward, W: t_weight
// time units; communication free). A forward needs the previous virtual stage's forward, a backward
// or B the next stage's backward or B and its own forward, a W only its own B. Virtual stages are
// placed by stage_rank(placement, ...). Returns the makespan; throws std::logic_error naming the
// stuck ranks and actions when the schedules deadlock or an action is missing, repeated, or a W
// has no B. For tests and for the bubble benchmark's ideal numbers.
BOOSTER_API double simulate(const std::vector<std::vector<PipelineAction>>& schedules, int pp, int microbatches,
                            int chunks, double t_forward = 1.0, double t_backward = 2.0, double t_weight = 1.0,
                            ScheduleKind placement = ScheduleKind::k1F1B);

// pp_style -> kind: "1f1b" (with chunks > 1: interleaved), "interleaved", "gpipe", "zbv". Throws
// std::invalid_argument naming the accepted values for any other name.
BOOSTER_API ScheduleKind schedule_kind_from_name(const std::string& pp_style, int chunks);

// Splits n layers into `stages` contiguous runs [begin, end), stage 0 first, every run non-empty.
// uniform: by layer count (sizes differ by at most one; the larger runs come first);
// balanced ("parameters"): minimises the largest sum of `weights` (a layer's parameter count) over a
// stage (exact linear partition by binary search on the bound). Throws std::invalid_argument when
// n < stages ("the model has 3 pipeline layers, fewer than pp_size * num_model_chunks = 4 stages"),
// weights.size() != n for balanced, or stages < 1.
BOOSTER_API std::vector<std::pair<int, int>> partition_layers(int n, int stages, bool balanced,
                                                              const std::vector<int64_t>& weights);

}  // namespace booster::parallel
