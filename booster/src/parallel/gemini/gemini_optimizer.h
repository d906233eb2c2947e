// gemini_optimizer.h — the Gemini plugin's optimizer wrapper (ColossalAI's GeminiOptimizer): the
// user's optimizer steps the float32 master shard of every trainable chunk (gemini_state.h), one
// chunk at a time, so a chunk whose optimizer side is offloaded is in memory only for its own
// update. Any elementwise optimizer of the registry (optim/optimizer_registry.h) works; the Adam
// family (torch::optim::Adam / AdamW without amsgrad, booster::optim::CPUAdam / HybridAdam) steps
// through the fused CPU Adam kernel (optim::step_with_cpu_adam_kernel), on the optimizer's own state.
//
// Invariants:
//  - The optimizer's param group g holds the master shards of the chunks built from group g, in
//    chunk order (re-bound after the chunks are rebuilt in first-use order). parameters() still lists
//    the model's parameters (checkpoint names).
//  - A master's gradient is its chunk's reduced gradient shard (the average over the data-parallel
//    ranks) in float32; a chunk without a gradient in a step is skipped, as LibTorch skips a parameter
//    without .grad().
//  - step(): with fp16, decorated by the loss scaler (overflow agreed over the group: the step is
//    skipped and the gradients dropped; else the gradients divided by the scale, in float32 where
//    the master is, or while clipping); global-norm clipping (sum of squares over the group, every
//    element once), then per chunk: its optimizer side in memory (offload file: read; moved to the
//    device when gpu_margin_mem_ratio placed it there), its gradient shard where the master is
//    (device or host), the optimizer's step on its master alone, the
//    parameter shard refreshed from the master (cast to the compute dtype; for bf16 chunks under the
//    Adam family written in the same kernel pass, optim::step_parameter_with_cpu_adam_kernel, reading
//    the bf16 gradient shard as it is) and the chunk released, so the next forward gathers the new
//    values, then the optimizer side back to its tier (written and freed).
//  - Checkpoints: sharded (local_state_pieces, the default) or gathered; either loads through
//    load_state_ranges. Saving or loading brings offloaded optimizer states into memory until the next
//    step() puts them back.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "booster/parallel/shard_optimizer.h"
#include "gemini_state.h"

namespace booster::parallel::gemini {

class GeminiOptimizer : public parallel::ShardOptimizer {
 public:
  // options.group: the data-parallel group. Throws std::invalid_argument for an optimizer type that
  // is not registered.
  GeminiOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                  OptimizerWrapperOptions options, std::shared_ptr<GeminiState> state);

  bool step() override;
  void zero_grad() override;
  void visit_memory(MemoryVisitor& visitor) const override;

 protected:
  // The reduced gradient shards of the current chunks (bound or not yet).
  std::vector<torch::Tensor> local_gradients() const override;
  // Binds the current chunks; with need_tensors, every chunk's optimizer side in memory.
  void prepare_state_access(bool need_tensors) override;
  void after_state_load() override { state_->freeze_layout(); }  // the state is keyed by these masters

 private:
  void bind();  // param groups and shards from the state's current chunks
  // The step proper: clipping (or the division by the loss scale, inv_scale), then every chunk's
  // update (see "step()" above).
  void update_chunks(double inv_scale);
  std::vector<at::Tensor> state_tensors(const at::Tensor& master) const;  // in key order; empty: none
  Chunk& chunk_of(const Shard& s) const { return state_->chunks()[s.flat_index]; }

  std::shared_ptr<GeminiState> state_;
  int64_t bound_generation_ = -1;  // the state's chunk generation the binding was made for
};

}  // namespace booster::parallel::gemini
