// gemini_placement.cpp — where Gemini's chunk pieces live: static placement, memory accounting,
// the auto policy's eviction, and moving the optimizer side and parameter shards to and from the
// offload tier (see gemini_state.h, "Placement").
#include <algorithm>
#include <ATen/core/grad_mode.h>
#include <climits>
#include <stdexcept>

#include "booster/logging.h"
#include "booster/core/cpu_byte_counter.h"
#include "booster/device.h"
#include "gemini_detail.h"
#include "gemini_state.h"

namespace booster::parallel::gemini {

using detail::bytes_of;
using detail::mib;

void GeminiState::place_static() {
  int64_t total = 0;
  for (const auto& c : chunks_) total += c.flat->layout().padded_numel;
  const double keep_limit = static_cast<double>(total) * (1.0 - config_.shard_param_frac);
  int64_t kept = 0, param_off = 0, optim_off = 0;
  for (auto& c : chunks_) {
    const int64_t size = c.flat->layout().padded_numel;
    if (!c.keep_gathered && static_cast<double>(kept + size) <= keep_limit) {
      c.keep_gathered = true;
      kept += size;
    }
    if (!c.keep_gathered && static_cast<double>(param_off) < config_.offload_param_frac * static_cast<double>(total) &&
        config_.offload_param_frac > 0) {
      c.param_tier = Tier::kOffload;
      param_off += size;
    }
    if (static_cast<double>(optim_off) < config_.offload_optim_frac * static_cast<double>(total) &&
        config_.offload_optim_frac > 0) {
      c.optim_tier = Tier::kOffload;
      optim_off += size;
    }
  }
}


// ---------------------------------------------------------------------------------------------
// Memory accounting and placement

at::Tensor GeminiState::to_host(const at::Tensor& t) const { return device_.is_cpu() ? t : pinned_host_copy(t); }

int64_t GeminiState::device_allocated_bytes() const { return device_.is_cpu() ? 0 : device_memory(device_).allocated; }

void GeminiState::note_host_copies() {
  if (device_.is_cpu()) return;
  if (!host_copies_) host_copies_.emplace(device_);
  host_copies_->record();
}

void GeminiState::wait_host_copies() {
  if (host_copies_) host_copies_->synchronize();
}

// Queued without blocking the host (FSDP2 offloads its reduced gradients the same way): backward
// goes on while the copy runs; on_finish_backward waits for it before anything reads the shard.
void GeminiState::gradient_to_optim_tier(Chunk& c) {
  at::Tensor& grad = c.flat->local_grad();
  if (c.optim_tier != Tier::kOffload || !grad.defined() || grad.device().is_cpu()) return;
  grad = pinned_host_copy_async(grad);
  note_host_copies();
}

int64_t GeminiState::compute_model_bytes() const {
  int64_t total = 0;
  for (const auto& c : chunks_) {
    total += c.flat->is_aliased() ? 0 : c.flat->unsharded_storage_bytes();
    if (c.param_tier == Tier::kCompute) total += bytes_of(c.flat->local_shard());
    // The gradient shard lives with the optimizer side (ColossalAI keeps it in the fp32 chunk).
    if (c.optim_tier == Tier::kCompute) total += bytes_of(c.flat->local_grad()) + bytes_of(c.master);
  }
  return total;
}

int64_t GeminiState::model_bytes_in_memory() const {
  int64_t total = 0;
  for (const auto& c : chunks_)
    total += (c.flat->is_aliased() ? 0 : c.flat->unsharded_storage_bytes()) + bytes_of(c.flat->local_shard()) +
             bytes_of(c.flat->local_grad()) + bytes_of(c.master);
  return total;
}

int64_t GeminiState::model_capacity() const {
  const double capacity = static_cast<double>(config_.memory_budget_bytes) * config_.steady_cuda_cap_ratio;
  if (!warmed_up_) return static_cast<int64_t>(capacity * (1.0 - config_.warmup_non_model_data_ratio));
  return static_cast<int64_t>(capacity) - non_model_peak_;
}

void GeminiState::sample_memory() {
  const int64_t model = compute_model_bytes();
  compute_peak_ = std::max(compute_peak_, model);
  if (warmed_up_ || !config_.auto_placement) return;
  // Non-model data: compute memory allocated since boost() that is not model data of this state (CPU:
  // tensor bytes counted by the allocator hook; CUDA: the caching allocator's allocated bytes, where
  // the compute tier's model data is compute_model_bytes()).
  const int64_t non_model =
      device_.is_cpu()
          ? counted_cpu_bytes() + OffloadFile::mapped_bytes() - model_bytes_in_memory() - baseline_non_model_
          : device_allocated_bytes() - model - baseline_non_model_;
  non_model_peak_ = std::max(non_model_peak_, non_model);
}

void GeminiState::ensure_param_resident(Chunk& c) {
  if (file_ && c.param_slot >= 0) file_->swap_in(c.flat->local_shard(), c.param_slot);
}

// The position of chunk c's next use after `now` in the previous iteration's access order, one
// iteration later when none is left; "never" when it was not accessed.
static int64_t next_use(const std::vector<size_t>& uses, int64_t now, int64_t period) {
  if (uses.empty()) return INT64_MAX;
  auto it = std::upper_bound(uses.begin(), uses.end(), static_cast<size_t>(std::max<int64_t>(now, 0)));
  return it != uses.end() ? static_cast<int64_t>(*it) : period + static_cast<int64_t>(uses.front());
}

void GeminiState::make_room(int64_t need, const std::vector<size_t>& in_use) {
  if (!config_.auto_placement) return;
  const int64_t capacity = model_capacity();
  const int64_t now = static_cast<int64_t>(accesses_.size());
  const int64_t period = static_cast<int64_t>(previous_accesses_.size());
  while (compute_model_bytes() + need > capacity) {
    size_t victim = chunks_.size();
    int64_t farthest = -1;
    for (size_t ci = 0; ci < chunks_.size(); ++ci) {
      const Chunk& c = chunks_[ci];
      if (std::find(in_use.begin(), in_use.end(), ci) != in_use.end()) continue;
      const bool gathered = !c.flat->is_aliased() && c.flat->unsharded_storage_bytes() > 0;
      const bool shard_here = c.param_tier == Tier::kCompute && !c.flat->is_aliased();
      if (!gathered && !shard_here) continue;
      const int64_t when = next_use(next_uses_[ci], now, period);
      if (when > farthest) {
        farthest = when;
        victim = ci;
      }
    }
    if (victim == chunks_.size())
      throw std::runtime_error(
          "gemini: memory_budget_mb = " + mib(config_.memory_budget_bytes) + " leaves " + mib(std::max<int64_t>(capacity, 0)) +
          " for model data (" + (warmed_up_ ? "after the measured non-model peak of " + mib(non_model_peak_)
                                            : std::string("warm-up share")) +
          "), but " + mib(compute_model_bytes() + need) + " are needed now and nothing more can be evicted; raise "
          "plugin.memory_budget_mb");
    Chunk& c = chunks_[victim];
    if (!c.flat->is_aliased() && c.flat->unsharded_storage_bytes() > 0) {
      c.flat->reshard();
    } else {
      c.param_tier = Tier::kOffload;
      c.flat->local_shard() = to_host(c.flat->local_shard());
      if (file_) {
        if (c.param_slot < 0) c.param_slot = file_->reserve(bytes_of(c.flat->local_shard()));
        if (c.param_dirty) file_->swap_out(c.flat->local_shard(), c.param_slot);
        else file_->release(c.flat->local_shard());
        c.param_dirty = false;
      }
    }
    ++evictions_;
  }
}

// gpu_margin_mem_ratio: as ColossalAI's GeminiOptimizer, every chunk whose optimizer side still fits
// in what is left of ratio * margin moves (chunk order, a chunk that does not fit is skipped).
void GeminiState::place_optim_in_margin(double bytes_per_element) {
  if (margin_placed_ || !warmed_up_ || !config_.auto_placement || config_.margin_mem_ratio <= 0) return;
  margin_placed_ = true;
  const auto capacity = static_cast<int64_t>(static_cast<double>(config_.memory_budget_bytes) * config_.steady_cuda_cap_ratio);
  margin_bytes_ = std::max<int64_t>(0, capacity - non_model_peak_ - compute_peak_);
  const double available = config_.margin_mem_ratio * static_cast<double>(margin_bytes_);
  int64_t moved = 0;
  for (auto& c : chunks_) {
    if (c.group < 0 || c.optim_tier != Tier::kOffload) continue;
    const auto need = static_cast<int64_t>(static_cast<double>(c.flat->layout().shard_numel) * bytes_per_element);
    if (static_cast<double>(optim_in_margin_bytes_ + need) > available) continue;
    c.optim_tier = Tier::kCompute;  // fetched by the next step, no longer stored back
    optim_in_margin_bytes_ += need;
    ++moved;
  }
  log::info("gemini: gpu_margin_mem_ratio = " + std::to_string(config_.margin_mem_ratio) + " of a margin of " +
            mib(margin_bytes_) + ": the optimizer side of " + std::to_string(moved) + " chunk(s) (" +
            mib(optim_in_margin_bytes_) + ") moves to compute memory");
}

// ---------------------------------------------------------------------------------------------
// The optimizer side

void GeminiState::fetch_optim(Chunk& c, std::vector<at::Tensor>& states) {
  if (file_ && c.optim_slot >= 0) {
    const int64_t size = c.master.numel() * 4;
    file_->swap_in(c.master, c.optim_slot);
    for (size_t k = 0; k < states.size() && static_cast<int64_t>(k + 1) * size < c.optim_slot_size; ++k)
      if (!OffloadFile::resident(states[k])) file_->swap_in(states[k], c.optim_slot + static_cast<int64_t>(k + 1) * size);
  }
  if (c.optim_tier != Tier::kCompute || c.master.device() == device_) return;
  // Moved to the compute tier (gpu_margin_mem_ratio): master, states and gradient go to the device
  // once; the file's slot is no longer used.
  at::NoGradGuard no_grad;
  c.master.set_data(c.master.to(device_));
  for (at::Tensor& t : states)
    if (t.defined() && t.device() != device_) t.set_data(t.to(device_));
  if (c.flat->local_grad().defined()) c.flat->local_grad() = c.flat->local_grad().to(device_);
  c.optim_slot = -1;
  c.master_dirty = false;
}


void GeminiState::release_clean_master(Chunk& c) {
  if (file_ && c.optim_slot >= 0 && c.optim_tier == Tier::kOffload && !c.master_dirty) file_->release(c.master);
}

void GeminiState::store_optim(Chunk& c, std::vector<at::Tensor>& states) {
  if (!file_ || c.optim_tier != Tier::kOffload) return;
  const int64_t size = c.master.numel() * 4;
  const int64_t need = size * static_cast<int64_t>(1 + states.size());
  if (c.optim_slot < 0 || need > c.optim_slot_size) {
    for (const at::Tensor& s : states)
      if (!OffloadFile::resident(s)) throw std::logic_error("gemini: an optimizer state tensor is not in memory");
    c.optim_slot = file_->reserve(need);
    c.optim_slot_size = need;
  }
  // A failed write leaves everything in memory (the offload file reports it); nothing is lost.
  file_->swap_out(c.master, c.optim_slot);
  c.master_dirty = false;
  for (size_t k = 0; k < states.size(); ++k) {
    if (states[k].scalar_type() != at::kFloat || states[k].numel() != c.master.numel()) continue;  // stays in memory
    file_->swap_out(states[k], c.optim_slot + static_cast<int64_t>(k + 1) * size);
  }
}

at::Tensor GeminiState::begin_param_write(Chunk& c) {
  c.flat->wait_shard_reads();  // an offloaded shard: the all-gathers' copies to the device have read it
  if (file_ && c.param_slot >= 0) file_->swap_in(c.flat->local_shard(), c.param_slot);
  c.flat->reshard();
  return c.flat->local_shard();
}

void GeminiState::end_param_write(Chunk& c) {
  c.param_dirty = true;
  if (file_ && c.param_slot >= 0 && c.param_tier == Tier::kOffload) {
    file_->swap_out(c.flat->local_shard(), c.param_slot);
    c.param_dirty = false;
  }
}

void GeminiState::refresh_param_shard(Chunk& c) {
  at::NoGradGuard no_grad;
  const bool master_was_resident = OffloadFile::resident(c.master);
  std::vector<at::Tensor> none;
  fetch_optim(c, none);  // the master in memory (no-op when it is)
  begin_param_write(c).copy_(c.master);
  end_param_write(c);
  if (!master_was_resident) release_clean_master(c);  // read back only for the copy: the file holds it
}

}  // namespace booster::parallel::gemini
