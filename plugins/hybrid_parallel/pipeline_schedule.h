// pipeline_schedule.h — the order in which one pipeline rank runs the forward and backward passes
// of its micro-batches (pure: no tensors, no communication; the executor is pipeline_stage.h).
//
// A model of V = pp * num_model_chunks "virtual stages" (contiguous runs of layers) is spread over
// pp ranks: virtual stage v lives on rank v % pp as its model chunk v / pp. Every micro-batch passes
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
// Bubble fraction (idle time over the ideal time, forward and backward of one micro-batch chunk
// taking t_f and t_b): (pp-1)/m for gpipe and 1f1b, (pp-1)/(m*num_model_chunks) for interleaved,
// i.e. busy time m*(t_f+t_b) out of (m+pp-1)*(t_f+t_b) for 1f1b.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace booster::hybrid {

struct PipelineAction {
  enum class Kind { kForward, kBackward };
  Kind kind = Kind::kForward;
  int microbatch = 0;
  int chunk = 0;  // model chunk of this rank (0 unless interleaved)
  bool operator==(const PipelineAction& o) const {
    return kind == o.kind && microbatch == o.microbatch && chunk == o.chunk;
  }
};

enum class ScheduleKind { kGPipe, k1F1B, kInterleaved };

// The actions of pipeline rank `rank` (0 <= rank < pp) for `microbatches` micro-batches; forward_only
// keeps just the forwards (evaluation). Throws std::invalid_argument for pp < 1, rank outside
// [0, pp), microbatches < 1, chunks < 1, chunks > 1 with a schedule other than interleaved, 1f1b /
// interleaved with microbatches < pp (the message names both and the fix: raise num_microbatches or
// lower pp_size), and interleaved with microbatches % pp != 0.
std::vector<PipelineAction> make_schedule(ScheduleKind kind, int pp, int rank, int microbatches, int chunks,
                                          bool forward_only = false);

// Runs every rank's schedule in a discrete-event simulation in which an action starts when its rank
// is free and its input exists (forward: t_forward, backward: t_backward time units; communication
// free). Returns the makespan; throws std::logic_error naming the stuck ranks and actions when the
// schedules deadlock or an action is missing or repeated. For tests and for the bubble benchmark's
// ideal numbers.
double simulate(const std::vector<std::vector<PipelineAction>>& schedules, int pp, int microbatches, int chunks,
                double t_forward = 1.0, double t_backward = 2.0);

ScheduleKind schedule_kind_from_name(const std::string& pp_style, int chunks);

}  // namespace booster::hybrid
