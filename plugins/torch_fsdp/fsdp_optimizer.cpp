// fsdp_optimizer.cpp — the optimizer on FlatParameter shards (see fsdp_optimizer.h).
#include "fsdp_optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <set>
#include <stdexcept>

#include "booster/wrappers/optimizer_registry.h"

namespace booster::plugins::fsdp {

FsdpOptimizer::FsdpOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                             OptimizerWrapperOptions options, std::shared_ptr<FsdpState> state)
    : OptimizerWrapper(std::move(optimizer), std::move(hooks), std::move(options), NoMasterCopies{}),
      state_(std::move(state)) {
  optimizer_type_info(*optimizer_);  // throws for optimizers whose state cannot be sliced
  // State the optimizer already has (Adagrad creates its sums eagerly) is re-cut into the shards.
  std::vector<ParamOptimState> existing = OptimizerWrapper::gather_param_states();
  const bool has_state = !optimizer_->state().empty();

  std::map<const void*, size_t> index_of;
  for (size_t i = 0; i < model_params_.size(); ++i) index_of[model_params_[i].unsafeGetTensorImpl()] = i;
  auto& groups = optimizer_->param_groups();
  std::vector<std::vector<at::Tensor>> group_shards(groups.size());
  for (auto& unit : state_->units())
    for (size_t f = 0; f < unit.flats.size(); ++f) {
      if (unit.flat_group[f] < 0) continue;
      Shard s{unit.flats[f].get(), {}};
      for (const auto& [name, p] : s.flat->params()) s.param_index.push_back(index_of.at(p.unsafeGetTensorImpl()));
      group_shards.at(static_cast<size_t>(unit.flat_group[f])).push_back(s.flat->local_shard());
      shards_.push_back(std::move(s));
    }
  for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = group_shards[g];
  optimizer_->state().clear();
  if (has_state) load_param_states(existing);
}

dist::ProcessGroup* FsdpOptimizer::norm_group() const {
  dist::ProcessGroup& g = *state_->config().shard_group;
  return g.size() > 1 ? &g : nullptr;
}

void FsdpOptimizer::attach_grads() {
  for (auto& s : shards_) s.flat->local_shard().mutable_grad() = s.flat->local_grad();
}

std::vector<torch::Tensor> FsdpOptimizer::local_gradients() const {
  std::vector<torch::Tensor> grads;
  for (const auto& s : shards_)
    if (s.flat->local_grad().defined()) grads.push_back(s.flat->local_grad());
  return grads;
}

double FsdpOptimizer::clip_grad_by_norm(double max_norm, double norm_type) {
  attach_grads();
  return OptimizerWrapper::clip_grad_by_norm(max_norm, norm_type);
}

void FsdpOptimizer::clip_grad_by_value(double clip_value) {
  attach_grads();
  OptimizerWrapper::clip_grad_by_value(clip_value);
}

bool FsdpOptimizer::step() {
  at::NoGradGuard no_grad;
  attach_grads();
  const bool stepped = OptimizerWrapper::step();  // overflow skip, clip, the optimizer on the shards
  state_->reshard_all();                          // the next forward gathers the updated shards
  return stepped;
}

void FsdpOptimizer::zero_grad() {
  for (auto& s : shards_) {
    s.flat->local_grad() = at::Tensor();
    s.flat->local_shard().mutable_grad() = at::Tensor();
    for (const auto& [name, p] : s.flat->params()) const_cast<at::Tensor&>(p).mutable_grad() = at::Tensor();
  }
  unscaled_ = false;
}

std::vector<ParamOptimState> FsdpOptimizer::gather_param_states() {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<ParamOptimState> out(model_params_.size());
  auto& state = optimizer_->state();
  for (auto& s : shards_) {
    auto it = state.find(optimizer_state_key(s.flat->local_shard()));
    // Ranks agree on whether a shard has state: its FlatParameter was reduced on every rank or none.
    if (it == state.end()) continue;
    gather_slice_state(info.extract_state(*it->second), s.flat->layout(), s.flat->group(), s.param_index, out);
  }
  return out;
}

std::vector<checkpoint::StatePiece> FsdpOptimizer::local_state_pieces() {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<checkpoint::StatePiece> pieces;
  auto& state = optimizer_->state();
  for (auto& s : shards_) {
    // Replicated shards (HYBRID_SHARD, NO_SHARD) are saved from replica 0 only.
    const auto& replicas = s.flat->replicate_group();
    if (replicas && replicas->rank() != 0) continue;
    auto it = state.find(optimizer_state_key(s.flat->local_shard()));
    if (it == state.end()) continue;
    for (auto& p : slice_state_pieces(info.extract_state(*it->second), s.flat->layout(), s.flat->group().rank(),
                                      s.param_index))
      pieces.push_back(std::move(p));
  }
  return pieces;
}

std::vector<std::map<std::string, int64_t>> FsdpOptimizer::local_state_scalars() {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<std::map<std::string, int64_t>> out(model_params_.size());
  auto& state = optimizer_->state();
  for (auto& s : shards_) {
    auto it = state.find(optimizer_state_key(s.flat->local_shard()));
    if (it == state.end()) continue;
    auto scalars = info.extract_state(*it->second).scalars;
    for (size_t idx : s.param_index) out[idx] = scalars;
  }
  return out;
}

bool FsdpOptimizer::state_is_sharded() const { return state_->config().shard_group->size() > 1; }

void FsdpOptimizer::load_state_ranges(const std::vector<ParamStateSource>& sources, const StateRangeReader& read) {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  if (sources.size() != model_params_.size())
    throw std::invalid_argument("booster: load_state_ranges: " + std::to_string(sources.size()) + " sources for " +
                                std::to_string(model_params_.size()) + " parameters");
  std::vector<std::pair<OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>>> fresh;
  for (auto& s : shards_) {
    const at::Tensor& shard = s.flat->local_shard();
    ParamOptimState slice =
        read_slice_state(sources, read, s.flat->layout(), s.flat->group().rank(), s.param_index, shard.options());
    if (!slice.empty()) fresh.emplace_back(optimizer_state_key(shard), info.make_state(slice));
  }
  optimizer_->state().clear();
  for (auto& [k, st] : fresh) optimizer_->state()[k] = std::move(st);
}

MemoryReport FsdpOptimizer::memory_report() const {
  MemoryReport r;
  auto bytes = [](const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; };
  for (auto& unit : state_->units())
    for (auto& f : unit.flats) {
      if (f->is_aliased()) continue;  // the module's storage (Booster counts it)
      // The shard is the full-precision weight: "parameters" when the compute dtype is the same,
      // the master copy of the low-precision gathered parameters otherwise.
      if (f->compute_dtype() == f->shard_dtype())
        r.parameters += bytes(f->local_shard());
      else
        r.master_weights += bytes(f->local_shard());
    }
  for (const auto& s : shards_) r.gradients += s.flat->layout().shard_numel * static_cast<int64_t>(s.flat->local_shard().element_size());
  r.optimizer_states = optimizer_state_bytes(*optimizer_);
  return r;
}

}  // namespace booster::plugins::fsdp
