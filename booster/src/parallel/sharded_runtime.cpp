// sharded_runtime.cpp — the bookkeeping every ZeRO-3 layout shares (see
// booster/parallel/sharded_runtime.h).
#include "booster/parallel/sharded_runtime.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/nn/modules/batchnorm.h>

#include <algorithm>
#include <stdexcept>

namespace booster::parallel {

namespace {

std::string dotted(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

bool is_batch_norm(const torch::nn::Module* m) {
  return dynamic_cast<const torch::nn::BatchNorm1dImpl*>(m) || dynamic_cast<const torch::nn::BatchNorm2dImpl*>(m) ||
         dynamic_cast<const torch::nn::BatchNorm3dImpl*>(m);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

ShardedRuntime::ShardedRuntime(torch::nn::Module& model, torch::optim::Optimizer* optimizer, std::string owner)
    : owner_(std::move(owner)), model_(&model) {
  std::vector<nn::NamedUnit> named_units = nn::collect_named_units(model);  // throws: nested, shared
  std::vector<std::shared_ptr<nn::UnitBase>> unit_ptrs;
  for (const auto& nu : named_units) unit_ptrs.push_back(nu.unit);

  // Which optimizer group holds each parameter; every optimizer parameter must be the model's.
  std::set<const void*> model_params;
  for (const auto& item : model.named_parameters(true)) model_params.insert(item.value().unsafeGetTensorImpl());
  if (optimizer != nullptr) {
    const auto& groups = optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t j = 0; j < groups[g].params().size(); ++j) {
        const at::Tensor& p = groups[g].params()[j];
        if (!model_params.count(p.unsafeGetTensorImpl()))
          throw std::invalid_argument("booster: " + owner_ + ": optimizer parameter group " + std::to_string(g) +
                                      " position " + std::to_string(j) + " (shape " + c10::str(p.sizes()) +
                                      ") is not a parameter of the model being boosted; build the optimizer from this "
                                      "model's parameters (e.g. model->parameters())");
        group_of_[p.unsafeGetTensorImpl()] = static_cast<int>(g);
      }
  }

  // The root unit first, then every Unit in pre-order.
  units_.push_back(nullptr);
  unit_paths_.emplace_back();
  unit_params_.push_back(nn::root_parameters(model, unit_ptrs));
  for (const auto& nu : named_units) {
    unit_index_[nu.unit.get()] = units_.size();
    units_.push_back(nu.unit.get());
    unit_paths_.push_back(nu.path);
    NamedParameters named;
    for (const auto& item : nu.unit->unit_module().named_parameters(true))
      named.emplace_back(dotted(nu.path, item.key()), item.value());
    unit_params_.push_back(std::move(named));
  }
  for (const auto& params : unit_params_)
    for (const auto& [name, p] : params)
      if (p.requires_grad() && optimizer != nullptr && !group_of_.count(p.unsafeGetTensorImpl()))
        throw std::invalid_argument("booster: " + owner_ + ": parameter " + name +
                                    " requires grad but is not in the optimizer, so it would never be updated; add it "
                                    "to the optimizer or set requires_grad(false)");
  forward_calls_.assign(units_.size(), 0);

  for (const auto& m : model.modules(true))
    if (is_batch_norm(m.get()))
      for (const auto& p : m->parameters(false)) full_precision_.insert(p.unsafeGetTensorImpl());
}

ShardedRuntime::~ShardedRuntime() {
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

int ShardedRuntime::group_of(const at::Tensor& p) const {
  if (!p.requires_grad()) return -1;
  auto it = group_of_.find(p.unsafeGetTensorImpl());
  return it == group_of_.end() ? 0 : it->second;
}

void ShardedRuntime::set_flats(std::vector<ShardedFlat> flats) {
  finish_reductions();  // indices change
  flats_ = std::move(flats);
  where_.clear();
  for (size_t f = 0; f < flats_.size(); ++f) {
    ShardedFlat& s = flats_[f];
    s.units.clear();
    const auto& params = s.flat->params();
    s.arrived.assign(params.size(), 0);
    s.arrived_count = 0;
    s.reduced = false;
    for (size_t j = 0; j < params.size(); ++j) where_[params[j].second.unsafeGetTensorImpl()] = Location{f, j};
  }
  unit_flats_.assign(units_.size(), {});
  for (size_t u = 0; u < unit_params_.size(); ++u)
    for (const auto& [name, p] : unit_params_[u]) {
      auto it = where_.find(p.unsafeGetTensorImpl());
      if (it == where_.end())
        throw std::logic_error("booster: " + owner_ + ": parameter " + name + " is in no FlatParameter");
      const size_t f = it->second.flat;
      auto& list = unit_flats_[u];
      if (std::find(list.begin(), list.end(), f) == list.end()) list.push_back(f);
      auto& users = flats_[f].units;
      if (std::find(users.begin(), users.end(), u) == users.end()) users.push_back(u);
    }
}

void ShardedRuntime::install() {
  for (auto* unit : units_)
    if (unit != nullptr) unit->set_unit_hooks(shared_from_this());
  std::weak_ptr<ShardedRuntime> weak = shared_from_this();
  for (const auto& s : flats_) {
    if (s.group < 0) continue;
    for (const auto& [name, p] : s.flat->params()) {
      auto acc = torch::autograd::impl::grad_accumulator(p);
      if (!acc)
        throw std::invalid_argument("booster: " + owner_ + ": parameter " + name +
                                    " has no gradient accumulator (does it require grad?)");
      const void* key = p.unsafeGetTensorImpl();
      hook_keys_.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [weak, key](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
            if (auto s = weak.lock()) s->on_grad_accumulated(key);
            return outputs;
          })));
      accumulators_.push_back(std::move(acc));
    }
  }
  on_install();
}

size_t ShardedRuntime::unit_index(nn::UnitBase& unit) const {
  auto it = unit_index_.find(&unit);
  if (it == unit_index_.end())
    throw std::logic_error("booster: " + owner_ + ": a Unit (" + unit.unit_block_type() +
                           ") that was not in the model at boost() time ran; add units before Booster::boost");
  return it->second;
}

// ---------------------------------------------------------------------------------------------
// Gathering, freeing, reducing

bool ShardedRuntime::gather(size_t f) {
  FlatParameter& flat = *flats_[f].flat;
  bool started = false;
  if (flat.state() == FlatParameter::State::kSharded && !flat.unshard_in_flight()) {
    before_gather(f);
    ++all_gathers_;
    started = true;
  }
  flat.unshard();
  return started;
}

bool ShardedRuntime::prefetch(size_t f) {
  FlatParameter& flat = *flats_[f].flat;
  if (flat.state() != FlatParameter::State::kSharded || flat.unshard_in_flight()) return false;
  before_prefetch(f);
  flat.unshard_async();
  ++all_gathers_;
  ++prefetches_;
  return true;
}

void ShardedRuntime::release_all() {
  for (auto& s : flats_) s.flat->reshard();
}

void ShardedRuntime::finish_reductions() {
  if (!reducing_) return;
  const size_t f = *reducing_;
  reducing_.reset();
  flats_[f].flat->finish_reduce();
  on_reduced(f);
}

void ShardedRuntime::reduce(size_t f) {
  ShardedFlat& s = flats_[f];
  if (require_sync_) {
    if (reducing_) ++reduce_scatters_overlapped_;  // it ran while this one's backward computed
    finish_reductions();  // one reduce-scatter in flight at a time
    s.flat->reduce_gradients_async();
    reducing_ = f;
    ++reduce_scatters_;
  }
  s.reduced = true;
  std::fill(s.arrived.begin(), s.arrived.end(), 0);
  s.arrived_count = 0;
}

int64_t ShardedRuntime::gathered_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : flats_) {
    const FlatParameter& f = *s.flat;
    if (f.is_aliased() || (f.state() != FlatParameter::State::kUnsharded && !f.unshard_in_flight())) continue;
    bytes += f.unsharded_storage_bytes();
  }
  return bytes;
}

void ShardedRuntime::note_gathered_bytes() { max_gathered_bytes_ = std::max(max_gathered_bytes_, gathered_bytes()); }

// ---------------------------------------------------------------------------------------------
// Forward

void ShardedRuntime::begin_forward() {
  if (!pending_backward_) {
    if (!forward_order_.empty()) previous_forward_order_ = forward_order_;
    forward_order_.clear();
    std::fill(forward_calls_.begin(), forward_calls_.end(), 0);
    on_begin_iteration();
  }
  on_begin_forward();
}

void ShardedRuntime::end_forward() {
  if (torch::GradMode::is_enabled()) {
    pending_backward_ = true;
    return;
  }
  // No backward follows (evaluation): nothing stays gathered for it.
  on_forward_without_backward();
  if (!pending_backward_) {
    std::fill(forward_calls_.begin(), forward_calls_.end(), 0);
    on_end_iteration();
  }
}

void ShardedRuntime::abort_forward() { on_abort_forward(); }

void ShardedRuntime::pre_forward(nn::UnitBase& unit) {
  const size_t u = unit_index(unit);
  if (forward_calls_[u]++ == 0) forward_order_.push_back(u);
  on_pre_forward(u);
}

void ShardedRuntime::post_forward(nn::UnitBase& unit) { on_post_forward(unit_index(unit)); }

// ---------------------------------------------------------------------------------------------
// Backward

void ShardedRuntime::arm_final_callback() {
  if (in_backward_) return;
  on_backward_start();
  in_backward_ = true;
  std::weak_ptr<ShardedRuntime> weak = shared_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([weak]() {
    if (auto s = weak.lock()) s->finish_backward();
  });
}

void ShardedRuntime::pre_backward(nn::UnitBase& unit) {
  arm_final_callback();
  on_pre_backward(unit_index(unit));
}

void ShardedRuntime::post_backward(nn::UnitBase& unit) { on_post_backward(unit_index(unit)); }

void ShardedRuntime::on_grad_accumulated(const void* param) {
  arm_final_callback();
  const Location where = where_.at(param);
  ShardedFlat& s = flats_[where.flat];
  if (s.arrived[where.param]) return;  // a second gradient for it in this pass: left to the end
  s.arrived[where.param] = 1;
  if (++s.arrived_count < s.arrived.size()) return;
  on_gradients_ready(where.flat);
}

void ShardedRuntime::finish_backward() {
  in_backward_ = false;
  pending_backward_ = false;
  for (size_t f = 0; f < flats_.size(); ++f) {
    ShardedFlat& s = flats_[f];
    if (s.group < 0) continue;
    bool leftover = s.arrived_count > 0;
    for (const auto& [name, p] : s.flat->params()) leftover = leftover || p.grad().defined();
    if (leftover && require_sync_) reduce(f);
    std::fill(s.arrived.begin(), s.arrived.end(), 0);
    s.arrived_count = 0;
    s.reduced = false;
  }
  finish_reductions();
  std::fill(forward_calls_.begin(), forward_calls_.end(), 0);
  if (hold_) {
    finish_deferred_ = true;
    return;
  }
  on_finish_backward();
}

void ShardedRuntime::hold_gathered(bool hold) {
  hold_ = hold;
  if (hold || !finish_deferred_) return;
  finish_deferred_ = false;
  on_finish_backward();
}

void ShardedRuntime::reduce_accumulated() {
  const bool required = require_sync_;
  require_sync_ = true;
  for (size_t f = 0; f < flats_.size(); ++f) {
    ShardedFlat& s = flats_[f];
    if (s.group < 0) continue;
    bool any = false;
    for (const auto& [name, p] : s.flat->params()) any = any || p.grad().defined();
    if (any) reduce(f);
    s.reduced = false;
  }
  finish_reductions();
  require_sync_ = required;
}

std::map<std::string, int64_t> ShardedRuntime::stats() const {
  return {{"all_gathers", all_gathers_},
          {"prefetches", prefetches_},
          {"reduce_scatters", reduce_scatters_},
          {"reduce_scatters_overlapped", reduce_scatters_overlapped_},
          {"units", static_cast<int64_t>(units_.size())},
          {"max_gathered_bytes", max_gathered_bytes_}};
}

std::vector<checkpoint::FlatSource> ShardedRuntime::checkpoint_sources() {
  release_all();
  std::vector<checkpoint::FlatSource> sources;
  for (auto& s : flats_) {
    FlatParameter* flat = s.flat.get();
    sources.push_back({flat, flat->shard_dtype(), [flat] { return flat->gather_full(); },
                       [flat] {
                         flat->wait_shard_reads();  // the loader writes it (a host shard read by a queued copy)
                         return flat->local_shard();
                       }});
  }
  return sources;
}

// ---------------------------------------------------------------------------------------------
// Model hooks and checkpoint IO

ShardedModelHooks::ShardedModelHooks(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<ShardedRuntime> runtime)
    : model_(std::move(model)), runtime_(std::move(runtime)) {
  if (!model_ || !runtime_) throw std::invalid_argument("booster: ShardedModelHooks needs a model and its runtime");
}

}  // namespace booster::parallel

namespace booster::parallel {

ShardedCheckpointIO::ShardedCheckpointIO(std::shared_ptr<dist::ProcessGroup> world, std::weak_ptr<ShardedRuntime> runtime,
                                         std::string owner)
    : FlatCheckpointIO(std::move(world)), runtime_(std::move(runtime)), owner_(std::move(owner)) {}

std::shared_ptr<ShardedRuntime> ShardedCheckpointIO::runtime_for(torch::nn::Module& model) const {
  std::shared_ptr<ShardedRuntime> runtime = runtime_.lock();
  if (!runtime || &runtime->module() != &model)
    throw checkpoint::CheckpointError("booster: " + owner_ + ": the model given to save_model / load_model is not the "
                                      "model this plugin boosted; pass the boosted model (its parameters are sharded "
                                      "by the plugin)");
  return runtime;
}

std::vector<checkpoint::FlatSource> ShardedCheckpointIO::flat_sources(torch::nn::Module& model) {
  return runtime_for(model)->checkpoint_sources();
}

void ShardedCheckpointIO::after_load(torch::nn::Module& model) { runtime_for(model)->after_checkpoint_load(); }

ShardedModel make_sharded_model(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<ShardedRuntime> runtime,
                                std::shared_ptr<dist::ProcessGroup> world, const std::string& owner,
                                const HooksDecorator& decorate, const ShardOptimizerFactory& make_optimizer,
                                OptimizerWrapperOptions options) {
  ShardedModel out;
  runtime->install();
  out.runtime = runtime;
  out.hooks = std::make_shared<ShardedModelHooks>(model, runtime);
  if (decorate) out.hooks = decorate(out.hooks);
  out.checkpoint_io = std::make_shared<ShardedCheckpointIO>(world, runtime, owner);
  if (!make_optimizer) return out;
  options.group = world;
  out.optimizer = make_optimizer(out.hooks, options);
  std::map<const void*, std::string> names;
  for (const auto& item : model->named_parameters(true)) names[item.value().unsafeGetTensorImpl()] = item.key();
  std::vector<std::string> ordered;
  for (const auto& p : out.optimizer->parameters()) ordered.push_back(names.at(p.unsafeGetTensorImpl()));
  out.optimizer->set_parameter_names(std::move(ordered));
  return out;
}

}  // namespace booster::parallel
