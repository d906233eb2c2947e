// pipeline_stage.h — private to libbooster: the executor behind parallel::PipelineStage
// (booster/parallel/pipeline.h) that runs a schedule (pipeline_schedule.h) on this rank's chunks
// with point-to-point activations and gradients.
#pragma once

#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "booster/nn/pipeline.h"
#include "booster/parallel/pipeline.h"
#include "booster/parallel/pipeline_schedule.h"
#include "shm_ring.h"

namespace booster {
namespace dist {
class ProcessGroup;
}

namespace parallel {


// Runs schedules on this rank's model chunks. Chunk c of this rank is virtual stage
// chunk_stage(kind, pp, rank, c) (c * pp + rank; under zbv the V: rank, then 2*pp-1-rank) and runs
// layers[ranges[c].first, ranges[c].second) in order. Consecutive virtual stages on the same rank
// (zbv's stages pp-1 and pp) hand activations and gradients over in memory, without messages.
// Backward: kBackward runs torch::autograd::backward of the chunk's output (or loss); zbv's B and W
// are SplitBackward's input_gradient() (the input gradient, sent on at once; the graph kept) and
// weight_gradients() (the weight gradients, then the graph and the slot are freed), split_backward.h.
// B of virtual stage 0 (no input gradient to send) does nothing and its W runs the whole backward.
// Gradients equal kBackward's up to the order in which parts of a parameter's gradient are summed.
class PipelineRunner {
 public:
  // pp_group: the ranks that differ from this one only in the pipeline coordinate (rank = stage).
  // enable_metadata_cache: ColossalAI's HybridParallelPlugin option (see run()).
  PipelineRunner(std::vector<nn::PipelineLayer> layers, std::vector<std::pair<int, int>> chunk_ranges,
                 std::shared_ptr<dist::ProcessGroup> pp_group, ScheduleKind kind, bool enable_metadata_cache = true);

  using Options = PipelineRunOptions;
  // One iteration: inputs and targets split along dim 0 into options.microbatches equal parts (their
  // dim 0 must be divisible: std::invalid_argument naming the sizes). Stage 0 reads inputs, the last
  // stage targets; loss per micro-batch criterion(output, target) / microbatches (training) is
  // back-propagated; activations go forward and gradients backward. Returns the PipelineResult of
  // pipeline.h (values on the last stage only).
  // Messages: micro-batch 0 of each stream (sending virtual stage, direction) carries its shape and
  // dtype (ProcessGroup::isend_tensor / recv_tensor), later micro-batches are plain isend / irecv into
  // buffers of that shape, each receive posted when the previous one of its stream completed. With
  // the metadata cache (ColossalAI's enable_metadata_cache, default on), a run whose key (train or
  // not, micro-batch count, inputs' and targets' shapes and dtypes: the same on every stage) matches
  // an earlier completed run sends micro-batch 0 plain too, and every stream's first receive is posted
  // before any compute, so no send waits for its receiver to ask for it. The activation shapes are
  // assumed to depend on that key only (as ColossalAI assumes); a model whose activation shapes vary
  // otherwise needs enable_metadata_cache = false.
  // Same host: after the first completed run of a key, the pipeline ranks set up one shared-memory
  // ring (shm_ring.h) per stream whose peers share a machine (shm_host_id), with num_microbatches
  // slots of that stream's message size (at most 256 MiB per ring), in one collective step over the
  // pp group; later runs of the key send those streams through the rings instead of Gloo. A stream
  // whose ring cannot be created or opened (e.g. /dev/shm too small or not shared) stays on Gloo.
  // The ring names are unlinked as soon as both sides have mapped them.
  PipelineResult run(const at::Tensor& inputs, const at::Tensor& targets, const PipelineCriterion& criterion,
                     const Options& options);

  bool is_first_stage() const { return rank_ == 0; }
  // Whether this rank runs the last virtual stage (the loss): rank pp-1, or rank 0 under zbv.
  bool is_last_stage() const { return stage_rank(kind_, pp_, pp_ * chunks() - 1) == rank_; }
  int chunks() const { return static_cast<int>(ranges_.size()); }
  const std::vector<std::pair<int, int>>& chunk_ranges() const { return ranges_; }
  // Seconds this rank spent computing (forward + backward of its chunks, loss included) in the last
  // run(), for the bubble benchmark: the rest of run()'s wall time is waiting.
  double last_compute_seconds() const { return compute_s_; }
  double last_wall_seconds() const { return wall_s_; }  // of the whole last run()
  // Messages this rank sent and received through shared-memory rings, over all runs.
  int64_t shared_memory_messages() const { return shm_messages_; }
  // zbv: the W passes, over all runs, that ran as a whole backward (SplitBackward's fallback).
  int64_t weight_fallbacks() const { return w_fallbacks_; }

 private:
  at::Tensor run_chunk(int chunk, at::Tensor x) const;
  // The parameters requiring grad of chunk `chunk`'s layers (W's inputs), each once.
  std::vector<at::Tensor> chunk_parameters(int chunk) const;
  using Stream = std::pair<int, bool>;  // (sending virtual stage, backward)
  struct StreamMeta {
    std::vector<int64_t> sizes;
    at::ScalarType dtype;
  };
  // The collective set-up of the shared-memory rings for `key` (see run()): `received` are the
  // streams this rank receives with their shapes, `sent_bytes` the message sizes of those it sends.
  void setup_shared_memory(const std::string& key, int microbatches, const std::map<Stream, StreamMeta>& received,
                           const std::map<Stream, int64_t>& sent_bytes);

  std::vector<nn::PipelineLayer> layers_;
  std::vector<std::pair<int, int>> ranges_;
  std::shared_ptr<dist::ProcessGroup> pp_group_;
  ScheduleKind kind_;
  int pp_ = 1, rank_ = 0;
  double compute_s_ = 0, wall_s_ = 0;
  bool metadata_cache_ = true;
  // Run key -> (sending virtual stage, backward) -> micro-batch 0's shape, from completed runs.
  std::map<std::string, std::map<std::pair<int, bool>, StreamMeta>> stream_meta_;
  std::set<std::string> completed_keys_;
  struct Channel {
    ShmRing ring;
    int peer_pid = 0;
    std::string what;  // for errors: "activations from virtual stage 2 (pipeline rank 0)"
    StreamMeta meta;   // receiving side: the messages' shape and dtype
  };
  // Run key -> stream -> its ring, on the sending and the receiving rank.
  std::map<std::string, std::map<Stream, Channel>> send_rings_, recv_rings_;
  int64_t shm_messages_ = 0;
  int64_t w_fallbacks_ = 0;
};

}  // namespace parallel
}  // namespace booster
