// shard_optimizer.cpp — binding the optimizer to shards, and sharded-optimizer checkpoints (see
// booster/parallel/shard_optimizer.h).
#include "booster/parallel/shard_optimizer.h"

#include <stdexcept>

#include "booster/optim/optimizer_registry.h"

namespace booster::parallel {

ShardOptimizer::ShardOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                               OptimizerWrapperOptions options, std::shared_ptr<dist::ProcessGroup> shard_group)
    : OptimizerWrapper(std::move(optimizer), std::move(hooks), std::move(options), NoMasterCopies{}),
      shard_group_(std::move(shard_group)) {
  if (!shard_group_) throw std::invalid_argument("booster: ShardOptimizer needs the shard group");
  optimizer_type_info(*optimizer_);  // throws for optimizers whose state cannot be sliced
  existing_ = OptimizerWrapper::gather_param_states();
  had_state_ = !optimizer_->state().empty();
  for (size_t i = 0; i < model_params_.size(); ++i) index_of_[model_params_[i].unsafeGetTensorImpl()] = i;
}

void ShardOptimizer::bind_shards(std::vector<Shard> shards, const std::vector<int>& groups) {
  if (groups.size() != shards.size())
    throw std::logic_error("booster: ShardOptimizer::bind_shards: " + std::to_string(groups.size()) + " groups for " +
                           std::to_string(shards.size()) + " shards");
  auto& param_groups = optimizer_->param_groups();
  std::vector<std::vector<at::Tensor>> stepped(param_groups.size());
  for (size_t k = 0; k < shards.size(); ++k) stepped.at(static_cast<size_t>(groups[k])).push_back(shards[k].stepped);
  for (size_t g = 0; g < param_groups.size(); ++g) param_groups[g].params() = stepped[g];
  shards_ = std::move(shards);
  if (bound_) return;
  bound_ = true;
  optimizer_->state().clear();
  if (had_state_) load_param_states(existing_);
  existing_.clear();
}

std::vector<torch::Tensor> ShardOptimizer::local_gradients() const {
  std::vector<torch::Tensor> grads;
  for (const auto& s : shards_)
    if (s.flat->local_grad().defined()) grads.push_back(s.flat->local_grad());
  return grads;
}

std::vector<ParamOptimState> ShardOptimizer::gather_param_states() {
  prepare_state_access(true);
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<ParamOptimState> out(model_params_.size());
  auto& state = optimizer_->state();
  for (auto& s : shards_) {
    auto it = state.find(optimizer_state_key(s.stepped));
    if (it == state.end()) continue;
    gather_slice_state(info.extract_state(*it->second), s.flat->layout(), s.flat->group(), s.param_index, out);
  }
  return out;
}

std::vector<checkpoint::StatePiece> ShardOptimizer::local_state_pieces() {
  prepare_state_access(true);
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<checkpoint::StatePiece> pieces;
  auto& state = optimizer_->state();
  for (auto& s : shards_) {
    if (!saves_pieces(s)) continue;
    auto it = state.find(optimizer_state_key(s.stepped));
    if (it == state.end()) continue;
    for (auto& p : slice_state_pieces(info.extract_state(*it->second), s.flat->layout(), s.flat->group().rank(),
                                      s.param_index))
      pieces.push_back(std::move(p));
  }
  return pieces;
}

std::vector<std::map<std::string, int64_t>> ShardOptimizer::local_state_scalars() {
  prepare_state_access(false);
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<std::map<std::string, int64_t>> out(model_params_.size());
  auto& state = optimizer_->state();
  for (auto& s : shards_) {
    auto it = state.find(optimizer_state_key(s.stepped));
    if (it == state.end()) continue;
    auto scalars = info.extract_state(*it->second).scalars;
    for (size_t idx : s.param_index) out[idx] = scalars;
  }
  return out;
}

void ShardOptimizer::load_state_ranges(const std::vector<ParamStateSource>& sources, const StateRangeReader& read) {
  prepare_state_access(false);
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  if (sources.size() != model_params_.size())
    throw std::invalid_argument("booster: load_state_ranges: " + std::to_string(sources.size()) + " sources for " +
                                std::to_string(model_params_.size()) + " parameters");
  std::vector<std::pair<OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>>> fresh;
  for (auto& s : shards_) {
    ParamOptimState slice =
        read_slice_state(sources, read, s.flat->layout(), s.flat->group().rank(), s.param_index, s.stepped.options());
    if (!slice.empty()) fresh.emplace_back(optimizer_state_key(s.stepped), info.make_state(slice));
  }
  optimizer_->state().clear();
  for (auto& [k, st] : fresh) optimizer_->state()[k] = std::move(st);
  after_state_load();
}

}  // namespace booster::parallel
