// optimizer_wrapper.cpp — loss scaling, overflow skip, fused unscale + clip, fp32 master weights.
#include "booster/wrappers/optimizer_wrapper.h"

#include <ATen/ATen.h>
#include <torch/optim/lbfgs.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <stdexcept>

#include "booster/core/flat_layout.h"
#include "booster/dist/process_group.h"
#include "booster/optim/device_kernels.h"
#include "booster/optim/optimizer_registry.h"

namespace booster {

// ---------------------------------------------------------------------------------------------
// Construction

OptimizerWrapper::OptimizerWrapper(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                   std::shared_ptr<ModelHooks> hooks, OptimizerWrapperOptions options)
    : OptimizerWrapper(std::move(optimizer), std::move(hooks), std::move(options), NoMasterCopies{}) {
  if (!options_.master_weights) return;
  size_t i = 0;
  auto& state = optimizer_->state();
  for (auto& group : optimizer_->param_groups()) {
    for (auto& p : group.params()) {
      if (p.is_floating_point() && p.scalar_type() != at::kFloat) {
        at::Tensor master = p.detach().to(at::kFloat).clone().set_requires_grad(true);
        // State the optimizer created eagerly (Adagrad's sum) moves to the master, in fp32.
        auto it = state.find(optimizer_state_key(p));
        if (it != state.end()) {
          const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
          ParamOptimState s = info.extract_state(*it->second);
          for (auto& [k, t] : s.tensors) t = t.to(at::kFloat);
          state.erase(it);
          state[optimizer_state_key(master)] = info.make_state(s);
        }
        p = master;  // the optimizer now updates the fp32 master copy
        master_params_[i] = p;
      }
      ++i;
    }
  }
}

OptimizerWrapper::OptimizerWrapper(std::shared_ptr<torch::optim::Optimizer> optimizer,
                                   std::shared_ptr<ModelHooks> hooks, OptimizerWrapperOptions options, NoMasterCopies)
    : optimizer_(std::move(optimizer)),
      hooks_(std::move(hooks)),
      options_(std::move(options)),
      last_grad_norm_(std::numeric_limits<double>::quiet_NaN()) {
  if (!optimizer_) throw std::invalid_argument("booster: OptimizerWrapper needs an optimizer");
  if (dynamic_cast<torch::optim::LBFGS*>(optimizer_.get()))
    throw std::invalid_argument("booster: LBFGS is not supported (its step needs a closure); use SGD, Adam, "
                                "AdamW, RMSprop, Adagrad or an optimizer registered with booster::register_optimizer");
  if (options_.max_norm < 0) throw std::invalid_argument("booster: max_norm must be >= 0 (0 = no clipping)");
  if (!(options_.norm_type > 0)) throw std::invalid_argument("booster: norm_type must be > 0 (2.0 or inf)");
  if (options_.scaler) loss_scaling_ = std::make_unique<mixed_precision::LossScaling>(options_.scaler, options_.group);
  for (auto& group : optimizer_->param_groups()) {
    group_sizes_.push_back(group.params().size());
    for (auto& p : group.params()) {
      model_params_.push_back(p);
      master_params_.push_back(p);
    }
  }
}

OptimizerWrapper::~OptimizerWrapper() = default;

// ---------------------------------------------------------------------------------------------
// Backward / step

void OptimizerWrapper::backward(const torch::Tensor& loss) {
  if (!loss.defined() || loss.numel() != 1)
    throw std::invalid_argument("booster: backward() needs a scalar loss (one element), got " +
                                std::string(loss.defined() ? std::to_string(loss.numel()) + " elements" : "undefined"));
  if (!loss.requires_grad())
    throw std::invalid_argument("booster: backward(): the loss does not require grad (computed under NoGradGuard, "
                                "or from a model in eval mode with frozen parameters?)");
  torch::Tensor scaled = loss_scaling_ ? loss_scaling_->scale_loss(loss) : loss;
  if (hooks_) hooks_->backward(scaled);
  else scaled.backward();
  unscaled_ = false;
}

double OptimizerWrapper::loss_scale() const { return loss_scaling_ ? loss_scaling_->scale() : 1.0; }

int64_t OptimizerWrapper::skipped_steps() const { return loss_scaling_ ? loss_scaling_->skipped_steps() : 0; }

std::vector<torch::Tensor> OptimizerWrapper::parameters() const { return model_params_; }

void OptimizerWrapper::set_parameter_names(std::vector<std::string> names) {
  if (names.size() != model_params_.size())
    throw std::invalid_argument("booster: set_parameter_names: " + std::to_string(names.size()) + " names for " +
                                std::to_string(model_params_.size()) + " parameters");
  param_names_ = std::move(names);
}

std::vector<torch::Tensor> OptimizerWrapper::local_gradients() const {
  std::vector<torch::Tensor> grads;
  for (const auto& p : model_params_)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

// The accumulator of one device's gradients for the p-norm (p = norm_type): the max of |g| (inf),
// else the sum of norm^p, as a 0-dim float64 tensor on the group's device (undefined for an empty
// group). For p = 2 the tensors the device's registered kernels take (CUDA float32 / bfloat16) get one
// multi-tensor L2 norm; every other tensor (all of them on the CPU, where nothing is registered) one
// norm each in its dtype, as torch.nn.utils.clip_grad_norm_, combined in float64. Queues work only:
// no host synchronisation.
static at::Tensor norm_accumulator(optim::DeviceTensorGroup& g, double norm_type) {
  const bool inf = std::isinf(norm_type);
  const bool two = norm_type == 2.0;
  std::vector<at::Tensor> aten = g.other;
  if (!two) aten.insert(aten.end(), g.kernel_tensors.begin(), g.kernel_tensors.end());
  at::Tensor acc;
  if (!aten.empty()) {
    std::vector<at::Tensor> per;
    per.reserve(aten.size());
    for (const auto& t : aten) per.push_back(inf ? t.abs().max() : t.norm(norm_type));
    at::Tensor all = at::stack(per).to(at::kDouble);
    acc = inf ? all.max() : all.pow(norm_type).sum();
  }
  if (two && !g.kernel_tensors.empty()) {
    at::Tensor total = g.kernels->l2norm(g.kernel_tensors, /*per_tensor=*/false).total.to(at::kDouble);
    total = total * total;
    acc = acc.defined() ? acc + total : total;
  }
  return acc;
}

double OptimizerWrapper::global_grad_norm(double norm_type) {
  // Per device, one host sync each (norm_accumulator).
  at::NoGradGuard no_grad;
  auto grads = norm_gradients();
  dist::ProcessGroup* group = norm_group();
  bool inf = std::isinf(norm_type);
  double local = 0;
  bool first = true;
  for (optim::DeviceTensorGroup& g : optim::group_by_device_kernels(grads)) {
    at::Tensor acc = norm_accumulator(g, norm_type);
    if (!acc.defined()) continue;
    const double v = acc.item<double>();
    if (first) local = v;
    else if (inf) local = (std::isnan(v) || v > local) ? v : local;
    else local += v;
    first = false;
  }
  if (inf) return group ? group->allreduce_scalar(local, dist::ReduceOp::MAX) : local;
  if (group) local = group->allreduce_scalar(local, dist::ReduceOp::SUM);
  return std::pow(local, 1.0 / norm_type);
}

namespace detail {

at::Tensor clip_coefficient(const at::Tensor& total, double inv_scale, double max_norm) {
  const at::Tensor unscaled_coef = at::full_like(total, inv_scale);
  if (!(max_norm > 0)) return unscaled_coef;
  const at::Tensor clip = at::full_like(total, max_norm).div_(total + 1e-6);
  const at::Tensor clipped = at::where(clip < 1.0, clip * inv_scale, unscaled_coef);
  return at::where(at::isfinite(total), clipped, unscaled_coef);
}

void scale_gradients(const std::vector<at::Tensor>& grads, const at::Tensor& coef) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> floats;
  at::Tensor coef_float;
  for (const auto& g : grads) {
    if (g.scalar_type() == at::kFloat) {
      floats.push_back(g);
    } else if (g.scalar_type() == at::kDouble) {
      g.mul_(coef.to(g.device()));
    } else {  // bfloat16 / float16: multiplied in float, rounded once (as mul_ by a double scalar)
      if (!coef_float.defined() || coef_float.device() != g.device()) coef_float = coef.to(g.device(), at::kFloat);
      g.copy_(g.to(at::kFloat).mul_(coef_float));
    }
  }
  if (floats.empty()) return;
  std::vector<std::pair<c10::Device, std::vector<at::Tensor>>> by_device;
  for (auto& t : floats) {
    auto it = std::find_if(by_device.begin(), by_device.end(), [&](const auto& d) { return d.first == t.device(); });
    if (it == by_device.end()) by_device.emplace_back(t.device(), std::vector<at::Tensor>{t});
    else it->second.push_back(t);
  }
  for (auto& [device, list] : by_device) at::_foreach_mul_(list, coef.to(device, at::kFloat));
}

}  // namespace detail

bool OptimizerWrapper::clip_on_device(double max_norm, double norm_type, double inv_scale) {
  at::NoGradGuard no_grad;
  const std::vector<torch::Tensor> grads = norm_gradients();
  const std::vector<torch::Tensor> local = local_gradients();
  if (grads.empty()) return false;
  const c10::Device device = grads.front().device();
  if (device.is_cpu()) return false;
  for (const auto* list : {&grads, &local})
    for (const auto& t : *list)
      if (t.device() != device) return false;
  auto groups = optim::group_by_device_kernels(grads);
  if (groups.size() != 1) return false;
  at::Tensor acc = norm_accumulator(groups.front(), norm_type);
  const bool inf = std::isinf(norm_type);
  if (dist::ProcessGroup* group = norm_group()) group->allreduce(acc, inf ? dist::ReduceOp::MAX : dist::ReduceOp::SUM).wait();
  const at::Tensor norm = inf ? acc : acc.pow(1.0 / norm_type);
  const at::Tensor total = norm * inv_scale;
  detail::scale_gradients(local, detail::clip_coefficient(total, inv_scale, max_norm));
  last_grad_norm_device_ = total;
  return true;
}

double OptimizerWrapper::last_grad_norm() const {
  if (last_grad_norm_device_.defined()) {
    last_grad_norm_ = last_grad_norm_device_.item<double>();
    last_grad_norm_device_ = at::Tensor();
  }
  return last_grad_norm_;
}

// Multiplies every gradient by inv_scale (if not yet unscaled) and by the clip coefficient, in one
// pass (ColossalAI fuses unscale and clip the same way). Returns the unscaled total norm. Per device,
// the registered kernels' multi-tensor scale for the tensors they take (bit-identical to mul_), mul_
// for the rest (every CPU tensor).
static double fused_unscale_clip(const std::vector<torch::Tensor>& grads, double scaled_norm, double inv_scale,
                                 double max_norm) {
  double total = scaled_norm * inv_scale;
  double coef = inv_scale;
  if (std::isfinite(total) && max_norm > 0) {
    double clip = max_norm / (total + 1e-6);
    if (clip < 1.0) coef *= clip;
  }
  if (coef != 1.0) {
    at::NoGradGuard no_grad;
    for (optim::DeviceTensorGroup& g : optim::group_by_device_kernels(grads)) {
      if (!g.kernel_tensors.empty()) g.kernels->scale(g.kernel_tensors, g.kernel_tensors, coef, at::Tensor());
      for (const auto& t : g.other) t.mul_(coef);
    }
  }
  return total;
}

void OptimizerWrapper::unscale_once() {
  if (!loss_scaling_ || unscaled_) return;
  mixed_precision::unscale_grads(local_gradients(), 1.0 / loss_scaling_->scale());
  unscaled_ = true;
}

double OptimizerWrapper::clip_grad_by_norm(double max_norm, double norm_type) {
  if (!(max_norm > 0)) throw std::invalid_argument("booster: clip_grad_by_norm: max_norm must be > 0");
  if (!(norm_type > 0)) throw std::invalid_argument("booster: clip_grad_by_norm: norm_type must be > 0 (2.0 or inf)");
  double inv_scale = (loss_scaling_ && !unscaled_) ? 1.0 / loss_scaling_->scale() : 1.0;
  double scaled = global_grad_norm(norm_type);
  last_grad_norm_ = fused_unscale_clip(local_gradients(), scaled, inv_scale, max_norm);
  last_grad_norm_device_ = at::Tensor();
  unscaled_ = true;
  return last_grad_norm_;
}

void OptimizerWrapper::clip_grad_by_value(double clip_value) {
  if (!(clip_value > 0)) throw std::invalid_argument("booster: clip_grad_by_value: clip_value must be > 0");
  unscale_once();
  at::NoGradGuard no_grad;
  for (const auto& g : local_gradients()) g.clamp_(-clip_value, clip_value);
}

bool OptimizerWrapper::step() {
  return step_with([](torch::optim::Optimizer& optimizer) { optimizer.step(); });
}

bool OptimizerWrapper::step_with(const std::function<void(torch::optim::Optimizer&)>& update) {
  at::NoGradGuard no_grad;
  if (!loss_scaling_) {
    clip_and_update(1.0, update);
    return true;
  }
  // The loss scaler decorates the step: overflow agreed over the group, skip or run with 1/scale.
  return loss_scaling_->step(
      local_gradients(), unscaled_, [&](double inv_scale) { clip_and_update(inv_scale, update); },
      [&] {
        zero_grad();
        unscaled_ = false;
      });
}

void OptimizerWrapper::clip_and_update(double inv_scale, const std::function<void(torch::optim::Optimizer&)>& update) {
  if (options_.max_norm > 0) {
    // On a device: without a host synchronisation (the norm stays there until last_grad_norm()).
    if (clip_on_device(options_.max_norm, options_.norm_type, inv_scale)) unscaled_ = true;
    else clip_grad_by_norm(options_.max_norm, options_.norm_type);
  } else {
    unscale_once();
  }
  for (size_t i = 0; i < model_params_.size(); ++i) {
    if (master_params_[i].unsafeGetTensorImpl() == model_params_[i].unsafeGetTensorImpl()) continue;
    at::Tensor g = model_params_[i].grad();
    if (g.defined()) master_params_[i].mutable_grad() = g.to(at::kFloat);
    else master_params_[i].mutable_grad() = at::Tensor();
  }
  update(*optimizer_);
  for (size_t i = 0; i < model_params_.size(); ++i)
    if (master_params_[i].unsafeGetTensorImpl() != model_params_[i].unsafeGetTensorImpl())
      model_params_[i].detach().copy_(master_params_[i]);
  unscaled_ = false;
}

void OptimizerWrapper::zero_grad() {
  // As torch.optim.Optimizer.zero_grad(set_to_none=False): LibTorch 1.13's C++ zero_grad calls
  // detach_() unconditionally, which fails on gradients that are views (gradient_as_bucket_view).
  // The gradients are zeroed by one torch._foreach_zero_ (one launch per device and dtype on CUDA).
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  auto collect = [&grads](const at::Tensor& p) {
    at::Tensor g = p.grad();
    if (!g.defined()) return;
    if (g.grad_fn()) p.mutable_grad() = g.detach();
    grads.push_back(p.grad());
  };
  for (const auto& p : model_params_) collect(p);
  for (size_t i = 0; i < master_params_.size(); ++i)
    if (master_params_[i].unsafeGetTensorImpl() != model_params_[i].unsafeGetTensorImpl()) collect(master_params_[i]);
  if (!grads.empty()) at::_foreach_zero_(grads);
  unscaled_ = false;
}

// ---------------------------------------------------------------------------------------------
// State

OptimizerWrapperState OptimizerWrapper::state_dict() const {
  OptimizerWrapperState s;
  if (loss_scaling_) {
    s.scaler = loss_scaling_->scaler_state();
    s.skipped_steps = loss_scaling_->skipped_steps();
  }
  return s;
}

void OptimizerWrapper::load_state_dict(const OptimizerWrapperState& state) {
  if (state.scaler.has_value() != static_cast<bool>(options_.scaler))
    throw std::invalid_argument(std::string("booster: optimizer state ") +
                                (state.scaler ? "has loss-scaler state but this optimizer has no loss scaler"
                                              : "has no loss-scaler state but this optimizer uses a loss scaler") +
                                " (saved with another mixed_precision setting?)");
  if (state.scaler) loss_scaling_->load(*state.scaler, state.skipped_steps);
}

// ---------------------------------------------------------------------------------------------
// State by parameter, master sync, memory

at::Tensor OptimizerWrapper::read_state_range(const StateRangeReader& read, size_t param, const std::string& key,
                                              int64_t offset, int64_t length) {
  at::Tensor values = read(param, key, offset, length);
  if (!values.defined() || values.dim() != 1 || values.numel() != length)
    throw std::invalid_argument("booster: load_state_ranges: the reader returned " +
                                (values.defined() ? std::to_string(values.numel()) + " elements in " +
                                                        std::to_string(values.dim()) + " dimensions"
                                                  : std::string("an undefined tensor")) +
                                " for state '" + key + "' of parameter " + std::to_string(param) + ", elements [" +
                                std::to_string(offset) + ", " + std::to_string(offset + length) + ") (1-D expected)");
  return values;
}

std::vector<ParamOptimState> OptimizerWrapper::gather_param_states() {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);  // throws for an unregistered type
  std::vector<ParamOptimState> out(master_params_.size());
  auto& state = optimizer_->state();
  for (size_t i = 0; i < master_params_.size(); ++i) {
    auto it = state.find(optimizer_state_key(master_params_[i]));
    if (it != state.end()) out[i] = info.extract_state(*it->second);
  }
  return out;
}

void OptimizerWrapper::load_param_states(const std::vector<ParamOptimState>& states) {
  if (states.size() != model_params_.size())
    throw std::invalid_argument("booster: load_param_states: " + std::to_string(states.size()) + " states for " +
                                std::to_string(model_params_.size()) + " parameters");
  std::vector<ParamStateSource> sources(states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    for (const auto& [k, t] : states[i].tensors) sources[i].tensor_keys.push_back(k);
    sources[i].scalars = states[i].scalars;
  }
  load_state_ranges(sources, [&](size_t i, const std::string& key, int64_t offset, int64_t length) {
    return states[i].tensors.at(key).reshape({-1}).narrow(0, offset, length);
  });
}

std::vector<checkpoint::StatePiece> OptimizerWrapper::local_state_pieces() {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<checkpoint::StatePiece> pieces;
  if (options_.group && options_.group->rank() != 0) return pieces;  // replicated: rank 0 saves
  auto& state = optimizer_->state();
  for (size_t i = 0; i < master_params_.size(); ++i) {
    auto it = state.find(optimizer_state_key(master_params_[i]));
    if (it == state.end()) continue;
    for (auto& [key, t] : info.extract_state(*it->second).tensors)
      pieces.push_back({checkpoint_name(i) + "." + key, model_params_[i].sizes().vec(), 0, t.detach().reshape({-1})});
  }
  return pieces;
}

const std::string& OptimizerWrapper::checkpoint_name(size_t i) const {
  if (param_names_.size() != model_params_.size())
    throw std::invalid_argument("booster: the optimizer's state is saved by parameter name, and this optimizer "
                                "wrapper has none (set_parameter_names; Booster::boost sets them)");
  return param_names_.at(i);
}

std::vector<checkpoint::StatePiece> OptimizerWrapper::slice_state_pieces(const ParamOptimState& slice,
                                                                         const FlatLayout& layout, int rank,
                                                                         const std::vector<size_t>& indices) const {
  std::vector<checkpoint::StatePiece> pieces;
  for (const auto& [key, t] : slice.tensors) {
    at::Tensor flat = t.detach().reshape({-1});
    for (size_t j = 0; j < indices.size(); ++j) {
      const FlatLayout::Piece piece = layout.piece(j, rank);  // {0, 0, 0} when it holds none
      pieces.push_back({checkpoint_name(indices[j]) + "." + key, model_params_.at(indices[j]).sizes().vec(),
                        piece.tensor_offset, flat.narrow(0, piece.shard_offset, piece.length)});
    }
  }
  return pieces;
}

void OptimizerWrapper::gather_slice_state(const ParamOptimState& slice, const FlatLayout& layout,
                                          dist::ProcessGroup& group, const std::vector<size_t>& indices,
                                          std::vector<ParamOptimState>& out) const {
  for (const auto& [key, t] : slice.tensors) {
    at::Tensor full = t.reshape({-1}).contiguous();
    if (group.size() > 1) {
      at::Tensor part = full;
      full = at::empty({layout.padded_numel}, t.options());
      group.all_gather_into_tensor(full, part).wait();
    }
    for (size_t j = 0; j < indices.size(); ++j)
      out[indices[j]].tensors[key] =
          full.narrow(0, layout.offsets[j], layout.numels[j]).view(model_params_.at(indices[j]).sizes());
  }
  for (size_t idx : indices) out[idx].scalars = slice.scalars;
}

ParamOptimState OptimizerWrapper::read_slice_state(const std::vector<ParamStateSource>& sources,
                                                   const StateRangeReader& read, const FlatLayout& layout, int rank,
                                                   const std::vector<size_t>& indices,
                                                   const at::TensorOptions& options) {
  ParamOptimState slice;
  std::set<std::string> keys;
  for (size_t idx : indices) {
    keys.insert(sources.at(idx).tensor_keys.begin(), sources[idx].tensor_keys.end());
    // Per-parameter step counts can differ in a DDP checkpoint (a parameter unused in some steps);
    // the slice takes the largest.
    for (const auto& [k, v] : sources[idx].scalars) slice.scalars[k] = std::max(slice.scalars[k], v);
  }
  at::NoGradGuard no_grad;
  for (const auto& key : keys) {
    at::Tensor part = at::zeros({layout.shard_numel}, options);
    for (size_t j = 0; j < indices.size(); ++j) {
      const FlatLayout::Piece piece = layout.piece(j, rank);
      const auto& held = sources[indices[j]].tensor_keys;
      if (piece.length == 0 || std::find(held.begin(), held.end(), key) == held.end()) continue;
      part.narrow(0, piece.shard_offset, piece.length)
          .copy_(read_state_range(read, indices[j], key, piece.tensor_offset, piece.length));
    }
    slice.tensors[key] = part;
  }
  return slice;
}

std::vector<std::map<std::string, int64_t>> OptimizerWrapper::local_state_scalars() {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<std::map<std::string, int64_t>> out(master_params_.size());
  auto& state = optimizer_->state();
  for (size_t i = 0; i < master_params_.size(); ++i) {
    auto it = state.find(optimizer_state_key(master_params_[i]));
    if (it != state.end()) out[i] = info.extract_state(*it->second).scalars;
  }
  return out;
}

void OptimizerWrapper::load_state_ranges(const std::vector<ParamStateSource>& sources, const StateRangeReader& read) {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  if (sources.size() != master_params_.size())
    throw std::invalid_argument("booster: load_state_ranges: " + std::to_string(sources.size()) + " sources for " +
                                std::to_string(master_params_.size()) + " parameters");
  std::vector<std::pair<OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>>> fresh;
  for (size_t i = 0; i < sources.size(); ++i) {
    if (sources[i].empty()) continue;
    const at::Tensor& master = master_params_[i];
    ParamOptimState s;
    s.scalars = sources[i].scalars;
    for (const auto& key : sources[i].tensor_keys) {
      at::Tensor values = read_state_range(read, i, key, 0, master.numel());
      s.tensors[key] = values.to(master.options(), false, /*copy=*/true).view_as(master);
    }
    fresh.emplace_back(optimizer_state_key(master), info.make_state(s));
  }
  optimizer_->state().clear();
  for (auto& [k, st] : fresh) optimizer_->state()[k] = std::move(st);
}

void OptimizerWrapper::sync_master_from_model() {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < model_params_.size(); ++i)
    if (master_params_[i].unsafeGetTensorImpl() != model_params_[i].unsafeGetTensorImpl())
      master_params_[i].copy_(model_params_[i].detach());
}

void OptimizerWrapper::visit_memory(MemoryVisitor& visitor) const {
  const bool accelerator = std::any_of(model_params_.begin(), model_params_.end(),
                                       [](const at::Tensor& p) { return !p.device().is_cpu(); });
  for (size_t i = 0; i < model_params_.size(); ++i) {
    const at::Tensor& p = model_params_[i];
    if (p.requires_grad())
      visitor.visit_planned(MemoryCategory::kGradients, p.numel() * static_cast<int64_t>(p.element_size()),
                            !p.device().is_cpu());
    if (master_params_[i].unsafeGetTensorImpl() != p.unsafeGetTensorImpl())
      visitor.visit(MemoryCategory::kMasterWeights, master_params_[i], accelerator);
  }
  visitor.visit(MemoryCategory::kOptimizerStates, optimizer_state_places(*optimizer_, accelerator, false));
}

MemoryReport OptimizerWrapper::memory_report() const {
  MemoryReportBuilder builder;
  visit_memory(builder);
  return builder.report();
}

}  // namespace booster
