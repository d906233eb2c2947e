// gemini_optimizer.cpp — the optimizer on chunk master shards (see gemini_optimizer.h).
#include "gemini_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <malloc.h>

#include <stdexcept>

#include "booster/optim/cpu_adam.h"
#include "booster/optim/optimizer_registry.h"

namespace booster::parallel::gemini {

GeminiOptimizer::GeminiOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                                 OptimizerWrapperOptions options, std::shared_ptr<GeminiState> state)
    : ShardOptimizer(std::move(optimizer), std::move(hooks), std::move(options), state->config().group),
      state_(std::move(state)) {
  bind();
}

void GeminiOptimizer::bind() {
  if (bound_generation_ == state_->generation()) return;
  auto& chunks = state_->chunks();
  std::vector<Shard> shards;
  std::vector<int> groups;
  for (size_t ci = 0; ci < chunks.size(); ++ci) {
    Chunk& c = chunks[ci];
    if (c.group < 0) continue;
    Shard s;
    s.flat = c.flat;
    s.stepped = c.master;
    s.flat_index = ci;
    for (const auto& [name, p] : c.flat->params()) s.param_index.push_back(param_index_of(p));
    shards.push_back(std::move(s));
    groups.push_back(c.group);
  }
  bound_generation_ = state_->generation();
  bind_shards(std::move(shards), groups);
}

void GeminiOptimizer::prepare_state_access(bool need_tensors) {
  bind();
  state_->wait_host_copies();  // a checkpoint load writes the masters
  if (!need_tensors) return;
  for (auto& s : shards_) {
    std::vector<at::Tensor> states = state_tensors(s.stepped);
    state_->fetch_optim(chunk_of(s), states);
  }
}

std::vector<torch::Tensor> GeminiOptimizer::local_gradients() const {
  std::vector<torch::Tensor> grads;
  for (const auto& c : state_->chunks())
    if (c.group >= 0 && c.flat->local_grad().defined()) grads.push_back(c.flat->local_grad());
  return grads;
}

std::vector<at::Tensor> GeminiOptimizer::state_tensors(const at::Tensor& master) const {
  auto it = optimizer_->state().find(optimizer_state_key(master));
  if (it == optimizer_->state().end()) return {};
  ParamOptimState st = optimizer_type_info(*optimizer_).extract_state(*it->second);
  std::vector<at::Tensor> out;
  for (auto& [key, t] : st.tensors) out.push_back(t);
  return out;
}

bool GeminiOptimizer::step() {
  at::NoGradGuard no_grad;
  bind();
  if (!loss_scaling_) {
    update_chunks(1.0);
    return true;
  }
  // fp16: the loss scaler decorates the step (overflow agreed over the group, skip or run with 1/scale).
  return loss_scaling_->step(
      local_gradients(), unscaled_, [&](double inv_scale) { update_chunks(inv_scale); },
      [&] {
        zero_grad();
        unscaled_ = false;
      });
}

void GeminiOptimizer::update_chunks(double inv_scale) {
  state_->wait_host_copies();  // the previous step's master copies have been read
  if (options_.max_norm > 0) {
    clip_grad_by_norm(options_.max_norm, options_.norm_type);  // divides by the loss scale too
    inv_scale = 1.0;
  } else if (unscaled_) {
    inv_scale = 1.0;
  }
  if (state_->config().margin_mem_ratio > 0) {
    // Master (4 bytes) + the optimizer's planned states + the gradient shard, per master element.
    int64_t masters = 0;
    for (const auto& s : shards_) masters += s.stepped.numel();
    const double states = masters > 0 ? static_cast<double>(optimizer_state_bytes(*optimizer_)) / masters : 0.0;
    state_->place_optim_in_margin(4.0 + states + static_cast<double>(c10::elementSize(state_->config().compute_dtype)));
  }
  // Compute-tier optimizer sides first: on an accelerator their steps are queued on the device and
  // run while the host steps the offloaded ones (HybridAdam's split: the device kernel and the CPU
  // Adam kernel at once). An offloaded master's copy to a parameter shard on the device is queued
  // too (from pinned memory), so it overlaps the next chunk's CPU step; the next step and every
  // checkpoint wait for it (wait_host_copies) before a master is written again.
  std::vector<Shard*> order;
  for (auto& s : shards_)
    if (chunk_of(s).optim_tier == Tier::kCompute) order.push_back(&s);
  for (auto& s : shards_)
    if (chunk_of(s).optim_tier != Tier::kCompute) order.push_back(&s);
  for (Shard* sp : order) {
    Chunk& c = chunk_of(*sp);
    const at::Tensor grad = c.flat->local_grad();
    if (!grad.defined()) continue;
    std::vector<at::Tensor> states = state_tensors(c.master);
    state_->fetch_optim(c, states);
    at::Tensor shard = state_->begin_param_write(c);
    // bf16 chunks under the Adam family, every piece on the CPU: one kernel pass reads the gradient
    // shard as it is and writes the bf16 parameter shard next to the master (bit-identical to the
    // unfused path below).
    const bool on_cpu = c.master.device().is_cpu() && grad.device().is_cpu() && shard.device().is_cpu();
    const bool fused = on_cpu && inv_scale == 1.0 && shard.scalar_type() == at::kBFloat16 &&
                       optim::step_parameter_with_cpu_adam_kernel(*optimizer_, c.master, grad, shard);
    if (fused) {
      state_->note_fused_param_write();
    } else {
      // The gradient where the master is (an offloaded optimizer side: host memory), in float32,
      // divided by the loss scale there (an fp16 gradient is not divided in fp16).
      at::Tensor g = grad.to(c.master.device(), at::kFloat);
      if (inv_scale != 1.0) g = g * inv_scale;
      c.master.mutable_grad() = g;
      // Only this master has a gradient: the others are skipped. The Adam family on the CPU steps
      // through the CPU Adam kernel on the optimizer's own state (bit-identical to LibTorch's step);
      // a master on the device steps through the optimizer's own step (HybridAdam: the multi-tensor
      // device kernel).
      if (!optim::step_with_cpu_adam_kernel(*optimizer_)) optimizer_->step();
      c.master.mutable_grad() = at::Tensor();
      // Pinned master to a device shard: queued (an offload file frees its masters after the step:
      // then blocking, as every other direction).
      shard.copy_(c.master, /*non_blocking=*/!shard.device().is_cpu() && state_->offload_file() == nullptr);
    }
    state_->end_param_write(c);
    states = state_tensors(c.master);
    state_->store_optim(c, states);
  }
  // The optimizer's temporaries and the state tensors it created before they were offloaded are heap
  // memory glibc keeps after they are freed: hand it back, so offloading lowers the RSS for real.
  if (state_->offload_file() != nullptr) ::malloc_trim(0);
  state_->note_host_copies();
  state_->freeze_layout();
  state_->note_gradients_consumed();
  unscaled_ = false;
}

void GeminiOptimizer::zero_grad() {
  state_->wait_host_copies();
  for (auto& c : state_->chunks()) {
    c.flat->local_grad() = at::Tensor();
    for (const auto& [name, p] : c.flat->params()) const_cast<at::Tensor&>(p).mutable_grad() = at::Tensor();
  }
  state_->note_gradients_consumed();
  unscaled_ = false;
}


void GeminiOptimizer::visit_memory(MemoryVisitor& visitor) const {
  // Steady state as placed: what lives in memory (an offload file's share is not counted). The
  // compute tier is the compute device's memory (CUDA: on the device), the offload tier host memory
  // (CUDA: pinned); a chunk's gradient shard lives with its optimizer side.
  const bool disk = state_->offload_file() != nullptr;
  const bool accelerator = !state_->device().is_cpu();
  auto visit = [&](MemoryCategory category, int64_t bytes, Tier tier) {
    const bool on_device = accelerator && tier == Tier::kCompute;
    visitor.visit_planned(category, bytes, on_device, accelerator && !on_device);
  };
  int64_t masters_compute = 0, masters_host = 0, total_masters = 0;
  for (const auto& c : state_->chunks()) {
    const int64_t shard = c.flat->layout().shard_numel;
    const int64_t compute = shard * static_cast<int64_t>(c10::elementSize(c.flat->compute_dtype()));
    if (!c.flat->is_aliased() && !(disk && c.param_tier == Tier::kOffload))
      visit(MemoryCategory::kParameters, compute, c.param_tier);
    if (c.group < 0) continue;
    total_masters += shard;
    visit(MemoryCategory::kGradients, compute, c.optim_tier);
    if (disk && c.optim_tier == Tier::kOffload) continue;
    visit(MemoryCategory::kMasterWeights, shard * 4, c.optim_tier);
    (c.optim_tier == Tier::kCompute ? masters_compute : masters_host) += shard;
  }
  // Planned states per element of the masters kept in memory (the registry's count), where they are.
  const int64_t planned = optimizer_state_bytes(*optimizer_);
  if (total_masters > 0) {
    visit(MemoryCategory::kOptimizerStates, planned * masters_compute / total_masters, Tier::kCompute);
    visit(MemoryCategory::kOptimizerStates, planned * masters_host / total_masters, Tier::kOffload);
  }
}

}  // namespace booster::parallel::gemini
