// gemini_state.h — Gemini's chunk packing and placement policy on the sharded runtime (private to
// libbooster): the chunks, their gather / release schedule and their placement in the compute and
// offload tiers, as booster/parallel/gemini.h describes them.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "booster/device.h"
#include "booster/dist/process_group.h"
#include "booster/parallel/gemini.h"
#include "booster/parallel/sharded_runtime.h"
#include "offload_file.h"

namespace booster::parallel::gemini {

enum class Tier { kCompute, kOffload };


// A chunk's placement; chunks()[c] describes flats()[c], the FlatParameter of chunk c.
struct Chunk {
  FlatParameter* flat = nullptr;  // flats()[c].flat
  int group = -1;            // optimizer parameter group; -1: frozen parameters
  int64_t capacity = 0;      // the chunk size (elements); oversized parameters: their numel
  bool keep_gathered = false;
  at::Tensor master;          // [shard_numel] float32 (trainable chunks)
  Tier param_tier = Tier::kCompute, optim_tier = Tier::kCompute;
  int64_t param_slot = -1, optim_slot = -1;  // offload file offsets (-1: none reserved)
  int64_t optim_slot_size = 0;               // bytes of the optimizer slot (master + states)
  bool param_dirty = true;                   // the file's copy of the parameter shard is stale
  bool master_dirty = false;                 // the master shard in memory differs from the file's copy
  int forward_left = 0;  // units of this chunk still to run in this forward
};

// Gemini's chunk packing and placement policy on the sharded runtime.
class GeminiState : public parallel::ShardedRuntime {
 public:
  // Builds the chunks of `model` (its parameters become views of the chunk buffers, cast to the
  // compute dtype) and places them. `optimizer` (may be null) decides the chunk of each trainable
  // parameter. Throws std::invalid_argument without a group, and as parallel::ShardedRuntime's
  // constructor (a trainable parameter missing from the optimizer, an optimizer parameter the model
  // does not own, nested units, parameters shared by two units); std::runtime_error for an
  // offload_dir that cannot be used; at install(), std::runtime_error for a budget too small for one
  // unit's chunks.
  GeminiState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, GeminiShardOptions config);

  // Releases every gathered chunk (kept-gathered ones too): after a step, before a checkpoint.
  void release_all() override;

  // Called by the optimizer once it has state: the chunk layout is final (no first-use rebuild).
  void freeze_layout() { layout_frozen_ = true; }
  // Set by the optimizer's zero_grad / step: a backward is allowed again without accumulation.
  void note_gradients_consumed() { backward_since_step_ = false; }

  std::vector<Chunk>& chunks() { return chunks_; }
  const GeminiShardOptions& config() const { return config_; }
  // The compute device (the parameters' device at construction): gathered chunks, parameter shards
  // of the compute tier, gradient shards and the optimizer side of the compute tier live there.
  const c10::Device& device() const { return device_; }
  // A copy of t in host memory: page-locked when the compute device is an accelerator (its copies
  // to and from the device need it); t itself when the compute device is the CPU (then the offload
  // tier's host memory is the compute memory: only offload_dir moves bytes).
  at::Tensor to_host(const at::Tensor& t) const;
  // Host copies in flight (an accelerator: gradient shards going to an offloaded optimizer side,
  // updated masters going to device parameter shards, both queued without blocking the host):
  // note_host_copies marks what is queued so far; wait_host_copies blocks until it is done. Every
  // reader of an offloaded gradient shard and every writer of a master waits first (the end of
  // backward, the step, checkpoints). No-op on a CPU compute device.
  void note_host_copies();
  void wait_host_copies();
  OffloadFile* offload_file() const { return file_.get(); }
  // Incremented whenever the chunks are (re)built: pointers into chunks() are valid within one.
  int64_t generation() const { return generation_; }

  // The optimizer side of chunk c in memory: its master shard resident (read back from the offload
  // file when it is there). States are the optimizer's state tensors of c (may be empty).
  // The master and states then live where c.optim_tier says: a chunk moved to the compute tier (by
  // gpu_margin_mem_ratio) has them moved to the compute device here (Tensor::set_data: the optimizer
  // keeps its keys).
  void fetch_optim(Chunk& c, std::vector<at::Tensor>& states);
  // Frees an offloaded master shard read only since its last store (the file holds these values).
  void release_clean_master(Chunk& c);
  // Puts it back where the placement says (offload file: written and freed; else nothing).
  void store_optim(Chunk& c, std::vector<at::Tensor>& states);
  // gpu_margin_mem_ratio (see "Placement"): once, after the warm-up, under "auto" with a ratio > 0.
  // bytes_per_element: the optimizer side's bytes per master element (master, states, gradient).
  void place_optim_in_margin(double bytes_per_element);
  // The parameter shard of c from its master (cast to the compute dtype), wherever the shard lives;
  // releases c when gathered (the next use gathers the new values). A master in the offload file is
  // read for the copy and released again (it stays where it was).
  void refresh_param_shard(Chunk& c);
  // refresh_param_shard in two halves, for a writer of its own (the optimizer's fused bf16 step):
  // begin releases c and returns its parameter shard in memory (read from the offload file when it
  // is there; shard_numel elements of the compute dtype, contiguous); end marks it written and puts it
  // back in its tier.
  at::Tensor begin_param_write(Chunk& c);
  void end_param_write(Chunk& c);
  // Counts a chunk step whose bf16 parameter shard was written by the fused CPU Adam pass (stat
  // fused_param_writes).
  void note_fused_param_write() { ++fused_param_writes_; }
  // The runtime's counters plus chunk_size, chunks, chunks_kept_gathered, chunks_param_offloaded,
  // chunks_optim_offloaded, evictions, param_shards_restored (auto: evicted parameter shards brought
  // back to compute memory at their next use), offload_bytes_written, offload_bytes_read,
  // compute_model_bytes_peak, non_model_bytes_peak, rebuilt (1 when the chunks were rebuilt in
  // first-use order), margin_bytes and optim_bytes_in_margin (gpu_margin_mem_ratio: the margin
  // measured, the optimizer-side bytes moved into it), fused_param_writes (see
  // note_fused_param_write), master_bytes_resident (float32 master shards in memory now; with
  // offload_dir, 0 between steps).
  std::map<std::string, int64_t> stats() const override;
  // The model checkpoint reads the float32 master shards (gathered one chunk at a time, an offloaded
  // master read back and released again) and loads into them; after_checkpoint_load refreshes every
  // chunk's parameter shard from its master.
  std::vector<checkpoint::FlatSource> checkpoint_sources() override;
  void after_checkpoint_load() override;
  // (name, chunk index) for every parameter, in chunk order (tests and logs).
  std::vector<std::pair<std::string, size_t>> chunk_map() const;

 private:
  // The schedule (see "Schedule of one iteration").
  void on_install() override;
  void on_begin_iteration() override;
  void on_begin_forward() override;
  void on_pre_forward(size_t u) override;
  void on_post_forward(size_t u) override;
  void on_forward_without_backward() override { release_all_but_kept(); }
  void on_end_iteration() override { finish_iteration_order(); }
  void on_abort_forward() override;
  void on_backward_start() override;
  void on_pre_backward(size_t u) override;
  void on_gradients_ready(size_t c) override;
  void on_reduced(size_t c) override { gradient_to_optim_tier(chunks_[c]); }
  void on_finish_backward() override;
  void before_gather(size_t c) override;
  void before_prefetch(size_t c) override { ensure_param_resident(chunks_[c]); }

  void build_chunks(const parallel::NamedParameters& order);
  int64_t model_capacity() const;  // bytes of compute memory model data may use now (auto)
  std::vector<size_t> forward_chunks_in_use() const;
  void note_first_use(size_t u);
  void release_all_but_kept();
  void finish_iteration_order();
  void place_static();
  void access(size_t c);  // gather chunk c for use now (placement, eviction, all-gather)
  void prefetch_after(size_t c);
  void release(size_t c);
  void ensure_param_resident(Chunk& c);
  // A reduced gradient shard whose optimizer side is offloaded goes to host memory (ColossalAI moves
  // the gradient chunk to the optimizer's device); no-op on a CPU compute device.
  void gradient_to_optim_tier(Chunk& c);
  void make_room(int64_t need, const std::vector<size_t>& in_use);
  int64_t compute_model_bytes() const;
  int64_t device_allocated_bytes() const;  // the caching allocator's allocated bytes (accelerator)
  int64_t model_bytes_in_memory() const;
  void sample_memory();
  void rebuild_in_first_use_order();

  GeminiShardOptions config_;
  c10::Device device_{c10::kCPU};
  std::unique_ptr<OffloadFile> file_;
  std::optional<StreamEvent> host_copies_;  // recorded after the last queued host copy
  std::vector<Chunk> chunks_;
  int64_t chunk_size_ = 0;
  bool keep_all_gathered_ = false;  // the model is under min_chunk_size: one chunk, kept gathered
  int64_t baseline_non_model_ = 0;  // counted CPU bytes that are not model data, at install()
  std::vector<size_t> active_units_;  // units between pre_forward/pre_backward and their end
  // access order (chunk indices) of the current and the previous iteration
  std::vector<size_t> accesses_, previous_accesses_;
  std::vector<std::vector<size_t>> next_uses_;  // per chunk: its positions in previous_accesses_
  parallel::NamedParameters first_use_, order_;  // recorded / current packing order
  std::set<const void*> seen_;
  bool first_iteration_ = true, layout_frozen_ = false, rebuilt_ = false, backward_since_step_ = false;
  bool warmed_up_ = false, margin_placed_ = false;
  int64_t margin_bytes_ = 0, optim_in_margin_bytes_ = 0;
  int64_t generation_ = 0;
  int64_t non_model_peak_ = 0;
  int64_t evictions_ = 0, fused_param_writes_ = 0, restored_ = 0;
  int64_t compute_peak_ = 0;
};

}  // namespace booster::parallel::gemini
