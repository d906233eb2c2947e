// fully_shard.cpp — the FSDP layout: building one FlatParameter per (unit, group, dtype), the gather /
// free schedule, and fully_shard() (see booster/parallel/fully_shard.h); the bookkeeping is the
// sharded runtime's.
#include "booster/parallel/fully_shard.h"

#include <algorithm>
#include <stdexcept>
#include <tuple>

#include "booster/device.h"
#include "booster/parallel/fully_shard_optimizer.h"

namespace booster::parallel {

FullyShardState::FullyShardState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, FullyShardOptions config,
                                 const std::string& owner)
    : ShardedRuntime(model, optimizer, owner), config_(std::move(config)) {
  if (!config_.shard_group) throw std::invalid_argument("booster: " + owner + ": FSDP needs a shard group");
  // cpu_offload: the shards go to pinned host memory below (on a CPU model they are there already).
  offload_ = config_.cpu_offload;
  FlatParameterOptions mixed, full;
  mixed.keep_shard_apart = full.keep_shard_apart = offload_;
  mixed.compute_dtype = config_.param_dtype;
  mixed.reduce_dtype = config_.reduce_dtype;
  mixed.replicate_group = full.replicate_group = config_.replicate_group;
  mixed.fp8_communication = full.fp8_communication = config_.fp8_communication;
  std::vector<ShardedFlat> flats;
  for (size_t u = 0; u < unit_params_.size(); ++u) {
    // One FlatParameter per (optimizer group or frozen, dtype, full precision), in first-appearance
    // order.
    using Key = std::tuple<int, at::ScalarType, bool>;
    std::vector<std::pair<Key, NamedParameters>> parts;
    for (const auto& [name, p] : unit_params_[u]) {
      Key key{group_of(p), p.scalar_type(), keeps_full_precision(p)};
      auto part = std::find_if(parts.begin(), parts.end(), [&](const auto& x) { return x.first == key; });
      if (part == parts.end()) {
        parts.push_back({key, {}});
        part = parts.end() - 1;
      }
      part->second.emplace_back(name, p);
    }
    for (auto& [key, params] : parts) {
      ShardedFlat s;
      s.flat = std::make_unique<FlatParameter>(std::move(params), config_.shard_group, std::get<2>(key) ? full : mixed);
      s.group = std::get<0>(key);
      flats.push_back(std::move(s));
    }
  }
  if (offload_) {
    at::NoGradGuard no_grad;
    for (auto& s : flats) s.flat->local_shard() = pinned_host_copy(s.flat->local_shard());
  }
  if (!flats.empty()) device_ = flats.front().flat->params().front().second.device();
  set_flats(std::move(flats));
  backward_done_.assign(units_.size(), 0);
}

// Queued without blocking the host (FSDP2's cpu_offload: a non_blocking copy to pinned memory and an
// event the step waits on): backward goes on while the shard comes down; on_finish_backward waits.
void FullyShardState::offload_gradient(size_t f) {
  if (!offload_) return;
  at::Tensor& g = flats_[f].flat->local_grad();
  if (!g.defined() || g.device().is_cpu()) return;
  g = pinned_host_copy_async(g);
  if (!gradient_copies_) gradient_copies_.emplace(device_);
  gradient_copies_->record();
}

bool FullyShardState::reshards_after_forward() const {
  return config_.strategy == ShardingStrategy::kFullShard || config_.strategy == ShardingStrategy::kHybridShard;
}

// ---------------------------------------------------------------------------------------------
// Gathering and freeing

void FullyShardState::note_gathered() {
  int64_t units = 0;
  for (const auto& flats : unit_flats_) {
    bool any = false;
    for (size_t f : flats) {
      const FlatParameter& flat = *flats_[f].flat;
      // Gathered or being gathered (a prefetch in flight holds its storage already).
      any = any || (!flat.is_aliased() &&
                    (flat.state() == FlatParameter::State::kUnsharded || flat.unshard_in_flight()));
    }
    units += any ? 1 : 0;
  }
  max_gathered_units_ = std::max(max_gathered_units_, units);
  note_gathered_bytes();
}

bool FullyShardState::needs_gather(size_t u) const {
  for (size_t f : unit_flats_[u]) {
    const FlatParameter& flat = *flats_[f].flat;
    if (flat.state() == FlatParameter::State::kSharded && !flat.unshard_in_flight()) return true;
  }
  return false;
}

// FSDP's _FreeEventQueue.dequeue_if_needed with _max_num_inflight_all_gathers = 2: the host runs at
// most two frees ahead of the device before it issues another all-gather.
void FullyShardState::wait_for_oldest_free() {
  constexpr size_t kMaxAllGathersInFlight = 2;
  if (!config_.limit_all_gathers || free_events_.size() < kMaxAllGathersInFlight) return;
  free_events_.front().synchronize();
  free_events_.pop_front();
  ++rate_limiter_waits_;
}

void FullyShardState::record_free() {
  if (!config_.limit_all_gathers) return;
  StreamEvent done(device_);
  done.record();
  free_events_.push_back(std::move(done));
}

void FullyShardState::unshard_unit(size_t u) {
  if (needs_gather(u)) wait_for_oldest_free();
  for (size_t f : unit_flats_[u]) gather(f);
  note_gathered();
}

void FullyShardState::prefetch_unit(size_t u) {
  if (needs_gather(u)) wait_for_oldest_free();
  for (size_t f : unit_flats_[u]) prefetch(f);
  note_gathered();
}

void FullyShardState::reshard_unit(size_t u) {
  bool freed = false;
  for (size_t f : unit_flats_[u]) {
    FlatParameter& flat = *flats_[f].flat;
    freed = freed || (flat.state() == FlatParameter::State::kUnsharded && !flat.is_aliased());
    flat.reshard();
  }
  if (freed) record_free();
}

// ---------------------------------------------------------------------------------------------
// Forward

void FullyShardState::on_pre_forward(size_t u) {
  unshard_unit(u);
  if (!config_.forward_prefetch) return;
  // The units that followed this one in the previous iteration's forward.
  const size_t pos = forward_order_.size() - 1;
  if (pos >= previous_forward_order_.size() || previous_forward_order_[pos] != u) return;
  const size_t ahead = config_.limit_all_gathers ? 1 : 2;
  for (size_t k = 1; k <= ahead && pos + k < previous_forward_order_.size(); ++k) prefetch_unit(previous_forward_order_[pos + k]);
}

void FullyShardState::on_post_forward(size_t u) {
  if (reshards_after_forward()) reshard_unit(u);
}

// ---------------------------------------------------------------------------------------------
// Backward

void FullyShardState::on_pre_backward(size_t u) {
  unshard_unit(u);
  if (config_.backward_prefetch != BackwardPrefetch::kBackwardPre) return;
  auto it = std::find(forward_order_.begin(), forward_order_.end(), u);
  const size_t pos = static_cast<size_t>(it - forward_order_.begin());
  const size_t ahead = config_.limit_all_gathers ? 1 : 2;
  for (size_t k = 1; k <= ahead && k <= pos && it != forward_order_.end(); ++k) prefetch_unit(forward_order_[pos - k]);
}

void FullyShardState::on_gradients_ready(size_t f) {
  reduce(f);
  maybe_post_backward(flats_[f].units.front());
}

void FullyShardState::maybe_post_backward(size_t u) {
  if (backward_done_[u]) return;
  for (size_t f : unit_flats_[u]) {
    // Frozen parameters (a LoRA base layer) are still read by the input-gradient products after the
    // unit's last trainable gradient arrived; no gradient marks their last use, so such a unit
    // stays gathered until the backward pass ends (on_finish_backward reshards it).
    if (flats_[f].group < 0 || !flats_[f].reduced) return;
  }
  if (units_[u] != nullptr) post_backward(*units_[u]);
}

void FullyShardState::on_post_backward(size_t u) {
  backward_done_[u] = 1;
  if (forward_calls_[u] <= 1) reshard_unit(u);
  if (config_.backward_prefetch != BackwardPrefetch::kBackwardPost) return;
  auto it = std::find(forward_order_.begin(), forward_order_.end(), u);
  if (it == forward_order_.end()) return;
  const size_t pos = static_cast<size_t>(it - forward_order_.begin());
  const size_t ahead = config_.limit_all_gathers ? 1 : 2;
  for (size_t k = 1; k <= ahead && k <= pos; ++k) prefetch_unit(forward_order_[pos - k]);
}

void FullyShardState::on_finish_backward() {
  if (gradient_copies_) gradient_copies_->synchronize();  // the step reads them on the host
  std::fill(backward_done_.begin(), backward_done_.end(), 0);
  release_all();
}

std::map<std::string, int64_t> FullyShardState::stats() const {
  std::map<std::string, int64_t> out = ShardedRuntime::stats();
  out["flat_parameters"] = static_cast<int64_t>(flats_.size());
  out["max_gathered_units"] = max_gathered_units_;
  out["rate_limiter_waits"] = rate_limiter_waits_;
  return out;
}

ShardedModel fully_shard(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<torch::optim::Optimizer> optimizer,
                         FullyShardOptions options, OptimizerWrapperOptions optimizer_options, const HooksDecorator& decorate,
                         const std::string& owner) {
  if (!model) throw std::invalid_argument("booster: " + owner + ": the model is null");
  if (!options.world) options.world = options.shard_group;
  auto state = std::make_shared<FullyShardState>(*model, optimizer.get(), options, owner);
  ShardOptimizerFactory make_optimizer;
  if (optimizer)
    make_optimizer = [&](std::shared_ptr<ModelHooks> hooks, OptimizerWrapperOptions wo) {
      return std::make_shared<FullyShardOptimizer>(optimizer, std::move(hooks), std::move(wo), state);
    };
  return make_sharded_model(model, state, options.world, owner, decorate, make_optimizer, std::move(optimizer_options));
}

}  // namespace booster::parallel
