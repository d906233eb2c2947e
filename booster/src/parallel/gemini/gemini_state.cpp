// gemini_state.cpp — Gemini's chunks and their gather / release schedule (see gemini_state.h; the
// bookkeeping is the sharded runtime's); placement and the optimizer side are in
// gemini_placement.cpp.
#include "gemini_state.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <stdexcept>

#include "booster/core/cpu_byte_counter.h"
#include "booster/logging.h"
#include "chunk_search.h"
#include "gemini_detail.h"

namespace booster::parallel::gemini {

using detail::bytes_of;
using detail::mib;

// ---------------------------------------------------------------------------------------------
// Construction

GeminiState::GeminiState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, GeminiShardOptions config)
    : ShardedRuntime(model, optimizer, "gemini"), config_(std::move(config)) {
  // The compute device: every parameter's (chunks are flat buffers of one device).
  bool first = true;
  for (const auto& item : model.named_parameters(true)) {
    const c10::Device d = item.value().device();
    if (first) device_ = d;
    first = false;
    if (d != device_)
      throw std::invalid_argument("booster: gemini: parameter '" + item.key() + "' is on " + d.str() +
                                  " and others on " + device_.str() +
                                  "; Gemini packs parameters into chunks on one compute device: move the whole "
                                  "model to one device first");
    if (!d.is_cpu() && !d.is_cuda())
      throw std::invalid_argument("booster: gemini: parameter '" + item.key() + "' is on " + d.str() +
                                  "; Gemini's compute device is the CPU or a CUDA device");
  }
  if (!config_.group) throw std::invalid_argument("booster: gemini needs a data-parallel group");
  if (config_.auto_placement) install_cpu_byte_counter();  // before any chunk memory is allocated
  if (!config_.offload_dir.empty()) {
    // Offloading is only worth its I/O if the freed bytes leave the process: the plugin's default
    // [booster] malloc = "return" (core/host_allocator.h) gives chunk pieces mappings of their own.
    file_ = std::make_unique<OffloadFile>(config_.offload_dir, config_.group->rank());
  }

  // Registration order: model.named_parameters(), each tensor once.
  parallel::NamedParameters order;
  std::set<const void*> listed;
  for (const auto& item : model.named_parameters(true))
    if (listed.insert(item.value().unsafeGetTensorImpl()).second) order.emplace_back(item.key(), item.value());
  std::vector<int64_t> numels;
  for (const auto& [name, p] : order) numels.push_back(p.numel());
  const ChunkSearchResult search = search_chunk_size(numels, config_.search_range, config_.search_interval,
                                                     config_.min_chunk_size, true, config_.group->size());
  chunk_size_ = search.chunk_size;
  keep_all_gathered_ = search.keep_gathered;
  build_chunks(order);
}

void GeminiState::build_chunks(const parallel::NamedParameters& order) {
  // One packing per (optimizer group or frozen, compute dtype), in first-appearance order; BatchNorm
  // parameters keep full precision (FSDP's rule).
  using Key = std::pair<int, at::ScalarType>;
  std::vector<std::pair<Key, std::vector<std::pair<std::string, at::Tensor>>>> parts;
  for (const auto& [name, p] : order) {
    const at::ScalarType dtype = keeps_full_precision(p) ? at::kFloat : config_.compute_dtype;
    Key key{group_of(p), dtype};
    auto part = std::find_if(parts.begin(), parts.end(), [&](const auto& x) { return x.first == key; });
    if (part == parts.end()) {
      parts.push_back({key, {}});
      part = parts.end() - 1;
    }
    part->second.emplace_back(name, p);
  }
  at::NoGradGuard no_grad;
  chunks_.clear();
  std::vector<parallel::ShardedFlat> flats;
  ++generation_;
  order_ = order;
  for (auto& [key, params] : parts) {
    std::vector<int64_t> numels;
    for (const auto& [name, p] : params) numels.push_back(p.numel());
    std::vector<std::vector<size_t>> packs =
        keep_all_gathered_ ? std::vector<std::vector<size_t>>{{}} : pack_chunks(numels, chunk_size_);
    if (keep_all_gathered_)
      for (size_t i = 0; i < params.size(); ++i) packs[0].push_back(i);
    for (const auto& pack : packs) {
      Chunk c;
      c.group = key.first;
      std::vector<std::pair<std::string, at::Tensor>> members;
      int64_t numel = 0;
      for (size_t i : pack) {
        members.push_back(params[i]);
        numel += params[i].second.numel();
      }
      c.capacity = keep_all_gathered_ ? numel : std::max(numel, chunk_size_);
      c.keep_gathered = keep_all_gathered_;
      // The master shard from the full-precision values, then the parameters in the compute dtype.
      std::vector<int64_t> sizes;
      for (const auto& [name, p] : members) sizes.push_back(p.numel());
      const FlatLayout layout = make_flat_layout(sizes, config_.group->size());
      at::Tensor full = at::zeros({layout.padded_numel}, at::TensorOptions(at::kFloat).device(device_));
      for (size_t j = 0; j < members.size(); ++j)
        full.narrow(0, layout.offsets[j], layout.numels[j]).copy_(members[j].second.detach().reshape({-1}));
      c.master = full.narrow(0, layout.shard_begin(config_.group->rank()), layout.shard_numel).clone();
      full = at::Tensor();
      for (auto& [name, p] : members)
        if (p.scalar_type() != key.second) p.set_data(p.detach().to(key.second));
      FlatParameterOptions fo;
      fo.compute_dtype = key.second;
      fo.fp8_communication = config_.fp8_communication;
      parallel::ShardedFlat s;
      s.flat = std::make_unique<FlatParameter>(std::move(members), config_.group, fo);
      s.group = c.group;
      c.flat = s.flat.get();
      flats.push_back(std::move(s));
      chunks_.push_back(std::move(c));
    }
  }
  set_flats(std::move(flats));
  next_uses_.assign(chunks_.size(), {});
  previous_accesses_.clear();
  if (config_.auto_placement) {
    for (auto& c : chunks_) c.optim_tier = Tier::kOffload;
  } else {
    place_static();
  }
  // The offload tier's pieces to host memory (a no-op on a CPU compute device), then to the file.
  for (auto& c : chunks_) {
    if (c.optim_tier == Tier::kOffload) c.master = to_host(c.master);
    if (c.param_tier == Tier::kOffload && !c.flat->is_aliased()) c.flat->local_shard() = to_host(c.flat->local_shard());
    if (!file_) continue;
    if (c.optim_tier == Tier::kOffload) {
      c.optim_slot_size = 3 * bytes_of(c.master);  // master + two state tensors (Adam)
      c.optim_slot = file_->reserve(c.optim_slot_size);
      file_->swap_out(c.master, c.optim_slot);
    }
    if (c.param_tier == Tier::kOffload && !c.flat->is_aliased()) {
      c.param_slot = file_->reserve(bytes_of(c.flat->local_shard()));
      file_->swap_out(c.flat->local_shard(), c.param_slot);
      c.param_dirty = false;
    }
  }
}

void GeminiState::on_install() {
  baseline_non_model_ = device_.is_cpu()
                            ? counted_cpu_bytes() + OffloadFile::mapped_bytes() - model_bytes_in_memory()
                            : device_allocated_bytes() - compute_model_bytes();
  if (config_.auto_placement) {
    int64_t largest = 0;
    for (const auto& unit_chunks : unit_flats_) {
      int64_t need = 0;
      for (size_t ci : unit_chunks)
        need += chunks_[ci].flat->layout().padded_numel * static_cast<int64_t>(c10::elementSize(chunks_[ci].flat->compute_dtype()));
      largest = std::max(largest, need);
    }
    const int64_t capacity = model_capacity();
    if (capacity < largest)
      throw std::runtime_error(
          "gemini: memory_budget_mb is too small for one unit's chunks: the largest unit needs " + mib(largest) +
          " gathered, the budget leaves " + mib(capacity) + " for model data (memory_budget_mb * steady_cuda_cap_ratio * (1 - warmup_non_model_data_ratio) in the "
          "warm-up); raise plugin.memory_budget_mb or split the unit");
  }
}

// Before the all-gather of a sharded chunk about to be used: room for it, its shard in memory.
void GeminiState::before_gather(size_t ci) {
  Chunk& c = chunks_[ci];
  std::vector<size_t> in_use = forward_chunks_in_use();
  in_use.push_back(ci);
  const int64_t gathered = c.flat->layout().padded_numel * static_cast<int64_t>(c10::elementSize(c.flat->compute_dtype()));
  make_room(gathered, in_use);
  ensure_param_resident(c);
  // auto: a parameter shard evicted earlier comes back to compute memory when it fits beside the
  // gathered chunk without evicting anything else (ColossalAI moves an accessed chunk to the device).
  if (config_.auto_placement && c.param_tier == Tier::kOffload && !c.flat->is_aliased() &&
      compute_model_bytes() + gathered + bytes_of(c.flat->local_shard()) <= model_capacity()) {
    c.param_tier = Tier::kCompute;
    c.flat->local_shard() = c.flat->local_shard().to(device_);  // the file's copy (if any) stays valid
    ++restored_;
  }
}

void GeminiState::access(size_t ci) {
  Chunk& c = chunks_[ci];
  accesses_.push_back(ci);
  gather(ci);
  if (file_ && c.param_tier == Tier::kOffload && c.param_slot >= 0 && !c.param_dirty) file_->release(c.flat->local_shard());
  sample_memory();
  note_gathered_bytes();
}

std::vector<size_t> GeminiState::forward_chunks_in_use() const {
  std::vector<size_t> out = unit_flats_[0];  // the chunks outside every unit stay gathered
  for (size_t u : active_units_)
    for (size_t ci : unit_flats_[u]) out.push_back(ci);
  return out;
}

void GeminiState::prefetch_after(size_t position) {
  if (config_.max_prefetch <= 0 || previous_accesses_.empty()) return;
  int started = 0;
  for (size_t k = position + 1; k < previous_accesses_.size() && started < config_.max_prefetch; ++k)
    if (prefetch(previous_accesses_[k])) ++started;
}

void GeminiState::release(size_t ci) {
  Chunk& c = chunks_[ci];
  if (c.keep_gathered) return;
  c.flat->reshard();
  if (file_ && c.param_tier == Tier::kOffload && c.param_slot >= 0) {
    if (c.param_dirty) file_->swap_out(c.flat->local_shard(), c.param_slot);
    else file_->release(c.flat->local_shard());
    c.param_dirty = false;
  }
}

void GeminiState::release_all() {
  for (auto& c : chunks_) {
    c.flat->reshard();
    if (file_ && c.param_tier == Tier::kOffload && c.param_slot >= 0) {
      if (c.param_dirty) file_->swap_out(c.flat->local_shard(), c.param_slot);
      else file_->release(c.flat->local_shard());
      c.param_dirty = false;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward

void GeminiState::note_first_use(size_t u) {
  if (!first_iteration_) return;
  for (const auto& [name, p] : unit_params_[u])
    if (seen_.insert(p.unsafeGetTensorImpl()).second) first_use_.emplace_back(name, p);
}

void GeminiState::on_begin_iteration() {
  for (size_t ci = 0; ci < chunks_.size(); ++ci) {
    const auto& units = flats_[ci].units;
    chunks_[ci].forward_left = static_cast<int>(std::count_if(units.begin(), units.end(), [](size_t u) { return u != 0; }));
  }
  active_units_.clear();
}

void GeminiState::on_begin_forward() {
  note_first_use(0);
  for (size_t ci : unit_flats_[0]) access(ci);
}

void GeminiState::on_abort_forward() {
  release_all();
  active_units_.clear();
}

void GeminiState::release_all_but_kept() {
  for (size_t ci = 0; ci < chunks_.size(); ++ci) release(ci);
}

void GeminiState::on_pre_forward(size_t u) {
  note_first_use(u);
  active_units_.push_back(u);
  for (size_t ci : unit_flats_[u]) access(ci);
  prefetch_after(accesses_.size() - 1);
}

void GeminiState::on_post_forward(size_t u) {
  auto it = std::find(active_units_.begin(), active_units_.end(), u);
  if (it != active_units_.end()) active_units_.erase(it);
  if (forward_calls_[u] > 1) return;  // counted at its first run
  for (size_t ci : unit_flats_[u]) {
    Chunk& c = chunks_[ci];
    if (--c.forward_left > 0) continue;
    // Still needed by the parameters outside every unit, or by a unit that is running.
    const std::vector<size_t> in_use = forward_chunks_in_use();
    if (std::find(in_use.begin(), in_use.end(), ci) != in_use.end()) continue;
    release(ci);
  }
  sample_memory();
}

// ---------------------------------------------------------------------------------------------
// Backward

void GeminiState::on_backward_start() {
  if (backward_since_step_ && require_sync_ && !config_.enable_gradient_accumulation)
    throw std::runtime_error(
        "booster: gemini: a second backward pass before optimizer.step() / zero_grad(): gradient accumulation is off; "
        "set plugin.enable_gradient_accumulation = true, or use booster.no_sync() for the passes that only accumulate");
}

void GeminiState::on_pre_backward(size_t u) {
  active_units_.push_back(u);
  for (size_t ci : unit_flats_[u]) access(ci);
  prefetch_after(accesses_.size() - 1);
}

void GeminiState::on_gradients_ready(size_t ci) {
  const auto& units = flats_[ci].units;
  bool multi = false;
  for (size_t u : units) multi = multi || forward_calls_[u] > 1;
  if (multi) return;  // its units run again in this backward: reduced and released at the end
  reduce(ci);
  // Finished at once (ColossalAI reduces a chunk before backward goes on): a reduce-scatter kept in
  // flight would hold the chunk's packed gradient through the next chunk's backward, memory the
  // budget counts as non-model data.
  finish_reductions();
  active_units_.erase(std::remove_if(active_units_.begin(), active_units_.end(),
                                     [&](size_t u) { return std::find(units.begin(), units.end(), u) != units.end(); }),
                      active_units_.end());
  release(ci);
  sample_memory();
}

void GeminiState::on_finish_backward() {
  active_units_.clear();
  wait_host_copies();  // the gradient shards on_reduced queued to host memory
  release_all_but_kept();
  if (require_sync_) backward_since_step_ = true;
  finish_iteration_order();
}

// The end of an iteration (backward, or a forward without grad): the access order becomes the
// previous one (prefetch, eviction); after the first, the warm-up is over and the chunks may be
// rebuilt in first-use order.
void GeminiState::finish_iteration_order() {
  previous_accesses_ = std::move(accesses_);
  accesses_.clear();
  next_uses_.assign(chunks_.size(), {});
  for (size_t k = 0; k < previous_accesses_.size(); ++k) next_uses_[previous_accesses_[k]].push_back(k);
  if (!first_iteration_) return;
  first_iteration_ = false;
  warmed_up_ = true;
  for (const auto& item : model_->named_parameters(true))
    if (seen_.insert(item.value().unsafeGetTensorImpl()).second) first_use_.emplace_back(item.key(), item.value());
  bool same = first_use_.size() == order_.size();
  for (size_t k = 0; same && k < order_.size(); ++k)
    same = first_use_[k].second.unsafeGetTensorImpl() == order_[k].second.unsafeGetTensorImpl();
  if (same) return;
  if (layout_frozen_) {
    log::info("gemini: chunks stay in registration order (the optimizer already has state)");
    return;
  }
  rebuild_in_first_use_order();
}

// Rebuild once, at the end of the first backward: every parameter back to its full float32 value
// (gathered from the master shards), packed again in first-use order, its reduced gradient carried
// over. Collective; holds the whole model in float32 on every rank for the duration.
void GeminiState::rebuild_in_first_use_order() {
  at::NoGradGuard no_grad;
  release_all();
  std::map<const void*, at::Tensor> grads;  // parameter -> full reduced gradient (compute dtype)
  for (auto& c : chunks_) {
    const FlatLayout& l = c.flat->layout();
    std::vector<at::Tensor> none;
    fetch_optim(c, none);
    at::Tensor full = at::empty({l.padded_numel}, at::TensorOptions(at::kFloat).device(device_));
    c.flat->group().all_gather_into_tensor(full, c.master.to(device_)).wait();
    at::Tensor full_grad;
    if (c.flat->local_grad().defined()) {
      full_grad = at::empty({l.padded_numel}, c.flat->local_grad().options().device(device_));
      c.flat->group().all_gather_into_tensor(full_grad, c.flat->local_grad().to(device_)).wait();
    }
    for (size_t j = 0; j < c.flat->params().size(); ++j) {
      at::Tensor p = c.flat->params()[j].second;
      p.set_data(full.narrow(0, l.offsets[j], l.numels[j]).view(p.sizes()).clone());
      if (full_grad.defined()) grads[p.unsafeGetTensorImpl()] = full_grad.narrow(0, l.offsets[j], l.numels[j]);
    }
  }
  chunks_.clear();
  flats_.clear();  // the old chunks' FlatParameters go before the new ones are built
  if (file_) file_ = std::make_unique<OffloadFile>(config_.offload_dir, config_.group->rank());  // fresh slots
  build_chunks(first_use_);
  for (auto& c : chunks_) {
    const FlatLayout& l = c.flat->layout();
    bool any = false;
    for (const auto& [name, p] : c.flat->params()) any = any || grads.count(p.unsafeGetTensorImpl());
    if (!any) continue;
    at::Tensor flat = at::zeros({l.padded_numel}, c.flat->params().front().second.options());
    for (size_t j = 0; j < c.flat->params().size(); ++j) {
      auto it = grads.find(c.flat->params()[j].second.unsafeGetTensorImpl());
      if (it != grads.end()) flat.narrow(0, l.offsets[j], l.numels[j]).copy_(it->second);
    }
    c.flat->local_grad() = flat.narrow(0, l.shard_begin(c.flat->group().rank()), l.shard_numel).clone();
    if (c.optim_tier == Tier::kOffload) c.flat->local_grad() = to_host(c.flat->local_grad());
  }
  rebuilt_ = true;
}

std::map<std::string, int64_t> GeminiState::stats() const {
  int64_t kept = 0, param_off = 0, optim_off = 0, masters_resident = 0;
  for (const auto& c : chunks_) {
    kept += c.keep_gathered;
    param_off += c.param_tier == Tier::kOffload;
    optim_off += c.optim_tier == Tier::kOffload;
    if (c.master.defined() && OffloadFile::resident(c.master)) masters_resident += c.master.numel() * 4;
  }
  std::map<std::string, int64_t> out = ShardedRuntime::stats();
  out.insert({{"chunk_size", chunk_size_},
          {"chunks", static_cast<int64_t>(chunks_.size())},
          {"chunks_kept_gathered", kept},
          {"chunks_param_offloaded", param_off},
          {"chunks_optim_offloaded", optim_off},
          {"evictions", evictions_},
          {"param_shards_restored", restored_},
          {"offload_bytes_written", file_ ? file_->bytes_written() : 0},
          {"offload_bytes_read", file_ ? file_->bytes_read() : 0},
          {"compute_model_bytes_peak", compute_peak_},
          {"non_model_bytes_peak", non_model_peak_},
          {"margin_bytes", margin_bytes_},
          {"optim_bytes_in_margin", optim_in_margin_bytes_},
          {"rebuilt", rebuilt_ ? 1 : 0},
          {"fused_param_writes", fused_param_writes_},
          {"master_bytes_resident", masters_resident}});
  return out;
}

std::vector<checkpoint::FlatSource> GeminiState::checkpoint_sources() {
  wait_host_copies();
  release_all();
  std::vector<checkpoint::FlatSource> sources;
  for (auto& c : chunks_) {
    Chunk* chunk = &c;
    auto master = [chunk, this] {
      std::vector<at::Tensor> none;
      fetch_optim(*chunk, none);
      return chunk->master;
    };
    sources.push_back({chunk->flat, at::kFloat,
                       [chunk, master, this] {
                         const FlatLayout& l = chunk->flat->layout();
                         // On the compute device (NCCL's): an offloaded master travels there.
                         at::Tensor full = at::empty({l.padded_numel}, at::TensorOptions(at::kFloat).device(device_));
                         chunk->flat->group().all_gather_into_tensor(full, master().to(device_)).wait();
                         release_clean_master(*chunk);  // a save only reads it
                         return full;
                       },
                       [chunk, master] {
                         chunk->master_dirty = true;  // a load writes into it
                         return master();
                       }});
  }
  return sources;
}

void GeminiState::after_checkpoint_load() {
  for (auto& c : chunks_) refresh_param_shard(c);
}

std::vector<std::pair<std::string, size_t>> GeminiState::chunk_map() const {
  std::vector<std::pair<std::string, size_t>> out;
  for (size_t ci = 0; ci < chunks_.size(); ++ci)
    for (const auto& [name, p] : chunks_[ci].flat->params()) out.emplace_back(name, ci);
  return out;
}

}  // namespace booster::parallel::gemini
