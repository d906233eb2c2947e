// fsdp_state.cpp — the FSDP runtime: building units and FlatParameters, and the gather / free /
// reduce schedule (see fsdp_state.h).
#include "fsdp_state.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>

#include <algorithm>
#include <set>
#include <stdexcept>
#include <tuple>

namespace booster::plugins::fsdp {

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

FsdpState::FsdpState(torch::nn::Module& model, torch::optim::Optimizer* optimizer, FsdpConfig config)
    : model_(&model), config_(std::move(config)) {
  if (!config_.shard_group) throw std::invalid_argument("booster: FSDP needs a shard group");
  std::vector<nn::NamedUnit> named_units = nn::collect_named_units(model);  // throws: nested, shared
  std::vector<std::shared_ptr<nn::UnitBase>> unit_ptrs;
  for (const auto& nu : named_units) unit_ptrs.push_back(nu.unit);

  // Which optimizer group holds each parameter; every optimizer parameter must be the model's.
  std::map<const void*, std::string> model_names;
  for (const auto& item : model.named_parameters(true)) model_names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  std::map<const void*, int> group_of;
  if (optimizer != nullptr) {
    const auto& groups = optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t j = 0; j < groups[g].params().size(); ++j) {
        const at::Tensor& p = groups[g].params()[j];
        if (!model_names.count(p.unsafeGetTensorImpl()))
          throw std::invalid_argument(
              "booster: torch_fsdp: optimizer parameter group " + std::to_string(g) + " position " + std::to_string(j) +
              " (shape " + c10::str(p.sizes()) + ") is not a parameter of the model being boosted; build the optimizer "
              "from this model's parameters (e.g. model->parameters())");
        group_of[p.unsafeGetTensorImpl()] = static_cast<int>(g);
      }
  }

  // The root unit first, then every Unit in pre-order.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, at::Tensor>>>> unit_params;
  unit_params.emplace_back("", nn::root_parameters(model, unit_ptrs));
  for (const auto& nu : named_units) {
    std::vector<std::pair<std::string, at::Tensor>> named;
    for (const auto& item : nu.unit->unit_module().named_parameters(true))
      named.emplace_back(join(nu.path, item.key()), item.value());
    unit_params.emplace_back(nu.path, std::move(named));
  }

  // BatchNorm parameters keep full precision under a param_dtype policy (PyTorch FSDP's
  // MixedPrecision._module_classes_to_ignore default): its running statistics stay fp32 too, and
  // batch_norm takes bf16 inputs with fp32 weights.
  std::set<const void*> full_precision;
  for (const auto& m : model.modules(true)) {
    const torch::nn::Module* mod = m.get();
    if (dynamic_cast<const torch::nn::BatchNorm1dImpl*>(mod) || dynamic_cast<const torch::nn::BatchNorm2dImpl*>(mod) ||
        dynamic_cast<const torch::nn::BatchNorm3dImpl*>(mod))
      for (const auto& p : m->parameters(false)) full_precision.insert(p.unsafeGetTensorImpl());
  }
  FlatParameterOptions mixed, full;
  mixed.compute_dtype = config_.param_dtype;
  mixed.reduce_dtype = config_.reduce_dtype;
  mixed.replicate_group = full.replicate_group = config_.replicate_group;
  mixed.fp8_communication = full.fp8_communication = config_.fp8_communication;
  for (size_t u = 0; u < unit_params.size(); ++u) {
    FsdpUnit unit;
    unit.path = unit_params[u].first;
    unit.unit = u == 0 ? nullptr : named_units[u - 1].unit.get();
    // One FlatParameter per (optimizer group or frozen, dtype, full precision), in first-appearance
    // order.
    using Key = std::tuple<int, at::ScalarType, bool>;
    std::vector<std::pair<Key, std::vector<std::pair<std::string, at::Tensor>>>> parts;
    for (auto& [name, p] : unit_params[u].second) {
      int group = -1;
      if (p.requires_grad()) {
        auto it = group_of.find(p.unsafeGetTensorImpl());
        if (optimizer != nullptr && it == group_of.end())
          throw std::invalid_argument("booster: torch_fsdp: parameter " + name +
                                      " requires grad but is not in the optimizer, so it would never be updated; add it "
                                      "to the optimizer or set requires_grad(false)");
        group = it == group_of.end() ? 0 : it->second;
      }
      Key key{group, p.scalar_type(), full_precision.count(p.unsafeGetTensorImpl()) > 0};
      auto part = std::find_if(parts.begin(), parts.end(), [&](const auto& x) { return x.first == key; });
      if (part == parts.end()) {
        parts.push_back({key, {}});
        part = parts.end() - 1;
      }
      part->second.emplace_back(name, p);
    }
    for (auto& [key, params] : parts) {
      unit.flats.push_back(
          std::make_unique<FlatParameter>(std::move(params), config_.shard_group, std::get<2>(key) ? full : mixed));
      unit.flat_group.push_back(std::get<0>(key));
      unit.arrived.emplace_back(unit.flats.back()->params().size(), 0);
      unit.arrived_count.push_back(0);
      unit.reduced.push_back(0);
    }
    if (unit.unit != nullptr) unit_index_[unit.unit] = units_.size();
    units_.push_back(std::move(unit));
  }
}

FsdpState::~FsdpState() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void FsdpState::install() {
  for (auto& unit : units_)
    if (unit.unit != nullptr) unit.unit->set_unit_hooks(shared_from_this());
  std::weak_ptr<FsdpState> weak = shared_from_this();
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t f = 0; f < units_[u].flats.size(); ++f) {
      if (units_[u].flat_group[f] < 0) continue;
      const auto& params = units_[u].flats[f]->params();
      for (size_t j = 0; j < params.size(); ++j) {
        auto acc = torch::autograd::impl::grad_accumulator(params[j].second);
        if (!acc) throw std::invalid_argument("booster: torch_fsdp: parameter " + params[j].first + " has no gradient "
                                              "accumulator (does it require grad?)");
        Location where{u, f, j};
        hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [weak, where](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
              if (auto s = weak.lock()) s->on_grad_accumulated(where);
              return outputs;
            })));
        accumulators_.push_back(std::move(acc));
      }
    }
}

size_t FsdpState::index_of(nn::UnitBase& unit) const {
  auto it = unit_index_.find(&unit);
  if (it == unit_index_.end())
    throw std::logic_error("booster: torch_fsdp: a Unit (" + unit.unit_block_type() +
                           ") that was not in the model at boost() time ran; add units before Booster::boost");
  return it->second;
}

size_t FsdpState::trainable_count(size_t u, size_t f) const { return units_[u].flats[f]->params().size(); }

bool FsdpState::reshards_after_forward() const {
  return config_.strategy == ShardingStrategy::kFullShard || config_.strategy == ShardingStrategy::kHybridShard;
}

// ---------------------------------------------------------------------------------------------
// Gathering and freeing

void FsdpState::note_gathered() {
  int64_t units = 0, bytes = 0;
  for (const auto& unit : units_) {
    bool any = false;
    for (const auto& f : unit.flats) {
      // Gathered or being gathered (a prefetch in flight holds its storage already).
      if (f->is_aliased() || (f->state() != FlatParameter::State::kUnsharded && !f->unshard_in_flight())) continue;
      any = true;
      bytes += f->unsharded_storage_bytes();
    }
    units += any ? 1 : 0;
  }
  max_gathered_units_ = std::max(max_gathered_units_, units);
  max_gathered_bytes_ = std::max(max_gathered_bytes_, bytes);
}

void FsdpState::unshard_unit(size_t u) {
  for (auto& f : units_[u].flats) {
    if (f->state() == FlatParameter::State::kSharded && !f->unshard_in_flight()) ++all_gathers_;
    f->unshard();
  }
  note_gathered();
}

void FsdpState::prefetch_unit(size_t u) {
  for (auto& f : units_[u].flats) {
    if (f->state() != FlatParameter::State::kSharded || f->unshard_in_flight()) continue;
    f->unshard_async();
    ++all_gathers_;
    ++prefetches_;
  }
  note_gathered();
}

void FsdpState::reshard_unit(size_t u) {
  for (auto& f : units_[u].flats) f->reshard();
}

void FsdpState::reshard_all() {
  for (size_t u = 0; u < units_.size(); ++u) reshard_unit(u);
}

// ---------------------------------------------------------------------------------------------
// Forward

void FsdpState::begin_forward() {
  if (!pending_backward_) {
    if (!forward_order_.empty()) previous_forward_order_ = forward_order_;
    forward_order_.clear();
    for (auto& unit : units_) unit.forward_calls = 0;
  }
  unshard_unit(0);
}

void FsdpState::end_forward() {
  if (torch::GradMode::is_enabled()) {
    pending_backward_ = true;
    return;
  }
  // No backward follows (evaluation): nothing stays gathered.
  reshard_all();
  if (!pending_backward_)
    for (auto& unit : units_) unit.forward_calls = 0;
}

void FsdpState::abort_forward() { reshard_all(); }

void FsdpState::pre_forward(nn::UnitBase& unit) {
  const size_t u = index_of(unit);
  if (units_[u].forward_calls++ == 0) forward_order_.push_back(u);
  unshard_unit(u);
  if (!config_.forward_prefetch) return;
  // The units that followed this one in the previous iteration's forward.
  const size_t pos = forward_order_.size() - 1;
  if (pos >= previous_forward_order_.size() || previous_forward_order_[pos] != u) return;
  const size_t ahead = config_.limit_all_gathers ? 1 : 2;
  for (size_t k = 1; k <= ahead && pos + k < previous_forward_order_.size(); ++k) prefetch_unit(previous_forward_order_[pos + k]);
}

void FsdpState::post_forward(nn::UnitBase& unit) {
  const size_t u = index_of(unit);
  if (reshards_after_forward()) reshard_unit(u);
}

// ---------------------------------------------------------------------------------------------
// Backward

void FsdpState::arm_final_callback() {
  if (in_backward_) return;
  in_backward_ = true;
  std::weak_ptr<FsdpState> weak = shared_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([weak]() {
    if (auto s = weak.lock()) s->finish_backward();
  });
}

void FsdpState::pre_backward(nn::UnitBase& unit) {
  arm_final_callback();
  const size_t u = index_of(unit);
  unshard_unit(u);
  if (config_.backward_prefetch != BackwardPrefetch::kBackwardPre) return;
  auto it = std::find(forward_order_.begin(), forward_order_.end(), u);
  const size_t pos = static_cast<size_t>(it - forward_order_.begin());
  const size_t ahead = config_.limit_all_gathers ? 1 : 2;
  for (size_t k = 1; k <= ahead && k <= pos && it != forward_order_.end(); ++k) prefetch_unit(forward_order_[pos - k]);
}

void FsdpState::on_grad_accumulated(const Location& where) {
  arm_final_callback();
  FsdpUnit& unit = units_[where.unit];
  auto& arrived = unit.arrived[where.flat];
  if (arrived[where.param]) return;  // a second gradient for it in this pass: left to the end
  arrived[where.param] = 1;
  if (++unit.arrived_count[where.flat] < trainable_count(where.unit, where.flat)) return;
  reduce_flat(where.unit, where.flat);
  maybe_post_backward(where.unit);
}

void FsdpState::reduce_flat(size_t u, size_t f) {
  FsdpUnit& unit = units_[u];
  if (require_sync_) {
    unit.flats[f]->reduce_gradients();
    ++reduce_scatters_;
  }
  unit.reduced[f] = 1;
  std::fill(unit.arrived[f].begin(), unit.arrived[f].end(), 0);
  unit.arrived_count[f] = 0;
}

void FsdpState::maybe_post_backward(size_t u) {
  FsdpUnit& unit = units_[u];
  if (unit.backward_done) return;
  for (size_t f = 0; f < unit.flats.size(); ++f) {
    if (unit.flat_group[f] >= 0 && !unit.reduced[f]) return;
    // Frozen parameters (a LoRA base layer) are still read by the input-gradient products after the
    // unit's last trainable gradient arrived; no gradient marks their last use, so such a unit
    // stays gathered until the backward pass ends (finish_backward reshards it).
    if (unit.flat_group[f] < 0) return;
  }
  if (unit.unit != nullptr) post_backward(*unit.unit);
}

void FsdpState::post_backward(nn::UnitBase& unit) {
  const size_t u = index_of(unit);
  units_[u].backward_done = true;
  if (units_[u].forward_calls <= 1) reshard_unit(u);
  if (config_.backward_prefetch != BackwardPrefetch::kBackwardPost) return;
  auto it = std::find(forward_order_.begin(), forward_order_.end(), u);
  if (it == forward_order_.end()) return;
  const size_t pos = static_cast<size_t>(it - forward_order_.begin());
  const size_t ahead = config_.limit_all_gathers ? 1 : 2;
  for (size_t k = 1; k <= ahead && k <= pos; ++k) prefetch_unit(forward_order_[pos - k]);
}

void FsdpState::finish_backward() {
  in_backward_ = false;
  pending_backward_ = false;
  for (size_t u = 0; u < units_.size(); ++u) {
    FsdpUnit& unit = units_[u];
    for (size_t f = 0; f < unit.flats.size(); ++f) {
      if (unit.flat_group[f] < 0) continue;
      bool leftover = unit.arrived_count[f] > 0;
      for (const auto& [name, p] : unit.flats[f]->params()) leftover = leftover || p.grad().defined();
      if (leftover && require_sync_) reduce_flat(u, f);
      std::fill(unit.arrived[f].begin(), unit.arrived[f].end(), 0);
      unit.arrived_count[f] = 0;
      unit.reduced[f] = 0;
    }
    unit.backward_done = false;
    unit.forward_calls = 0;
  }
  reshard_all();
}

std::map<std::string, int64_t> FsdpState::stats() const {
  int64_t flats = 0;
  for (const auto& unit : units_) flats += static_cast<int64_t>(unit.flats.size());
  return {{"all_gathers", all_gathers_},
          {"prefetches", prefetches_},
          {"reduce_scatters", reduce_scatters_},
          {"units", static_cast<int64_t>(units_.size())},
          {"flat_parameters", flats},
          {"max_gathered_units", max_gathered_units_},
          {"max_gathered_bytes", max_gathered_bytes_}};
}

}  // namespace booster::plugins::fsdp
