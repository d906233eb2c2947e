// optimizer_state.cpp — per-parameter optimizer state for SGD, Adam, AdamW, RMSprop, Adagrad.
#include "booster/wrappers/optimizer_state.h"

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <stdexcept>

namespace booster {

std::string optimizer_type_name(const torch::optim::Optimizer& o) {
  if (dynamic_cast<const torch::optim::AdamW*>(&o)) return "AdamW";
  if (dynamic_cast<const torch::optim::Adam*>(&o)) return "Adam";
  if (dynamic_cast<const torch::optim::SGD*>(&o)) return "SGD";
  if (dynamic_cast<const torch::optim::RMSprop*>(&o)) return "RMSprop";
  if (dynamic_cast<const torch::optim::Adagrad*>(&o)) return "Adagrad";
  throw std::invalid_argument("booster: unsupported optimizer type (supported: SGD, Adam, AdamW, RMSprop, Adagrad)");
}

namespace {
void put(ParamOptimState& s, const char* key, const at::Tensor& t) {
  if (t.defined()) s.tensors[key] = t;
}
at::Tensor get(const ParamOptimState& s, const char* key) {
  auto it = s.tensors.find(key);
  return it == s.tensors.end() ? at::Tensor() : it->second;
}
int64_t get_scalar(const ParamOptimState& s, const char* key) {
  auto it = s.scalars.find(key);
  return it == s.scalars.end() ? 0 : it->second;
}
}  // namespace

ParamOptimState extract_param_state(const torch::optim::OptimizerParamState& st) {
  ParamOptimState s;
  auto adam = [&s](const auto& a) {  // AdamParamState and AdamWParamState: same fields, unrelated types
    s.scalars["step"] = a.step();
    put(s, "exp_avg", a.exp_avg());
    put(s, "exp_avg_sq", a.exp_avg_sq());
    put(s, "max_exp_avg_sq", a.max_exp_avg_sq());
  };
  if (auto* a = dynamic_cast<const torch::optim::AdamWParamState*>(&st)) {
    adam(*a);
  } else if (auto* a = dynamic_cast<const torch::optim::AdamParamState*>(&st)) {
    adam(*a);
  } else if (auto* g = dynamic_cast<const torch::optim::SGDParamState*>(&st)) {
    put(s, "momentum_buffer", g->momentum_buffer());
  } else if (auto* r = dynamic_cast<const torch::optim::RMSpropParamState*>(&st)) {
    s.scalars["step"] = r->step();
    put(s, "square_avg", r->square_avg());
    put(s, "momentum_buffer", r->momentum_buffer());
    put(s, "grad_avg", r->grad_avg());
  } else if (auto* d = dynamic_cast<const torch::optim::AdagradParamState*>(&st)) {
    s.scalars["step"] = d->step();
    put(s, "sum", d->sum());
  }
  return s;
}

std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(const std::string& type,
                                                                    const ParamOptimState& s) {
  if (type == "AdamW" || type == "Adam") {
    auto fill = [&](auto st) {
      st->step(get_scalar(s, "step"));
      st->exp_avg(get(s, "exp_avg"));
      st->exp_avg_sq(get(s, "exp_avg_sq"));
      st->max_exp_avg_sq(get(s, "max_exp_avg_sq"));
      return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(st));
    };
    if (type == "AdamW") return fill(std::make_unique<torch::optim::AdamWParamState>());
    return fill(std::make_unique<torch::optim::AdamParamState>());
  }
  if (type == "SGD") {
    auto st = std::make_unique<torch::optim::SGDParamState>();
    st->momentum_buffer(get(s, "momentum_buffer"));
    return st;
  }
  if (type == "RMSprop") {
    auto st = std::make_unique<torch::optim::RMSpropParamState>();
    st->step(get_scalar(s, "step"));
    st->square_avg(get(s, "square_avg"));
    st->momentum_buffer(get(s, "momentum_buffer"));
    st->grad_avg(get(s, "grad_avg"));
    return st;
  }
  if (type == "Adagrad") {
    auto st = std::make_unique<torch::optim::AdagradParamState>();
    st->step(get_scalar(s, "step"));
    st->sum(get(s, "sum"));
    return st;
  }
  throw std::invalid_argument("booster: make_param_state: unknown optimizer type " + type);
}

std::string optimizer_state_key(const at::Tensor& p) { return c10::guts::to_string(p.unsafeGetTensorImpl()); }

int64_t state_tensors_per_element(const torch::optim::Optimizer& optimizer,
                                  const torch::optim::OptimizerParamGroup& group) {
  const auto& o = const_cast<torch::optim::OptimizerParamGroup&>(group).options();
  std::string type = optimizer_type_name(optimizer);
  if (type == "AdamW") return static_cast<const torch::optim::AdamWOptions&>(o).amsgrad() ? 3 : 2;
  if (type == "Adam") return static_cast<const torch::optim::AdamOptions&>(o).amsgrad() ? 3 : 2;
  if (type == "SGD") return static_cast<const torch::optim::SGDOptions&>(o).momentum() != 0 ? 1 : 0;
  if (type == "RMSprop") {
    const auto& r = static_cast<const torch::optim::RMSpropOptions&>(o);
    return 1 + (r.momentum() > 0 ? 1 : 0) + (r.centered() ? 1 : 0);
  }
  return 1;  // Adagrad: sum
}

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  auto& state = optimizer.state();
  int64_t bytes = 0;
  if (!state.empty()) {
    for (auto& [k, st] : state)
      for (auto& [name, t] : extract_param_state(*st).tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
    return bytes;
  }
  for (auto& group : optimizer.param_groups()) {
    int64_t per = state_tensors_per_element(optimizer, group);
    for (auto& p : group.params()) bytes += per * p.numel() * static_cast<int64_t>(p.element_size());
  }
  return bytes;
}

}  // namespace booster
