// optimizer_registry.cpp — the optimizer type table, LibTorch's five elementwise optimizers and
// Booster's CPUAdam / HybridAdam (booster/optim/cpu_adam.h) and FusedAdam (booster/optim/fused_adam.h).
#include "booster/optim/optimizer_registry.h"

#include <c10/util/Type.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "booster/optim/cpu_adam.h"
#include "booster/optim/fused_adam.h"

namespace booster {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// OptimizerTypeInfo

namespace {

std::string type_name(std::type_index t) { return c10::demangle(t.name()); }

void check_type(const std::string& optimizer, const char* what, std::type_index expected, std::type_index got) {
  if (expected != got)
    throw std::invalid_argument("booster: optimizer " + optimizer + " was given " + what + " of type " + type_name(got) +
                                ", but it is registered with " + type_name(expected));
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s.empty() ? "none" : s;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

OptimizerTypeInfo::OptimizerTypeInfo(std::string name, std::vector<std::string> tensor_keys,
                                     std::vector<std::string> scalar_keys, std::type_index optimizer_type,
                                     std::type_index options_type, std::type_index param_state_type, Functions functions)
    : name_(std::move(name)),
      tensor_keys_(std::move(tensor_keys)),
      scalar_keys_(std::move(scalar_keys)),
      optimizer_type_(optimizer_type),
      options_type_(options_type),
      param_state_type_(param_state_type),
      functions_(std::move(functions)) {
  if (name_.empty()) throw std::invalid_argument("booster: register_optimizer: the name is empty");
  std::set<std::string> keys;
  for (const auto* list : {&tensor_keys_, &scalar_keys_})
    for (const auto& k : *list)
      if (k.empty() || !keys.insert(k).second)
        throw std::invalid_argument("booster: register_optimizer: optimizer " + name_ + ": state key '" + k +
                                    "' is empty or declared twice");
  const Functions& f = functions_;
  if (!f.get_state || !f.make_state || !f.options_to_json || !f.options_from_json || !f.state_tensors_per_element)
    throw std::invalid_argument("booster: register_optimizer: optimizer " + name_ +
                                ": every function of the spec is required (get_state, set_state, options_to_json, "
                                "options_from_json, state_tensors_per_element)");
}

ParamOptimState OptimizerTypeInfo::extract_state(const torch::optim::OptimizerParamState& state) const {
  check_type(name_, "a parameter state", param_state_type_, typeid(state));
  ParamOptimState s;
  functions_.get_state(state, s);
  for (auto it = s.tensors.begin(); it != s.tensors.end();) {
    if (!contains(tensor_keys_, it->first))
      throw std::logic_error("booster: the registration of optimizer " + name_ + " wrote state tensor '" + it->first +
                             "', which is not among its tensor keys (" + join(tensor_keys_) + ")");
    it = it->second.defined() ? std::next(it) : s.tensors.erase(it);
  }
  for (const auto& [k, v] : s.scalars)
    if (!contains(scalar_keys_, k))
      throw std::logic_error("booster: the registration of optimizer " + name_ + " wrote state scalar '" + k +
                             "', which is not among its scalar keys (" + join(scalar_keys_) + ")");
  return s;
}

std::unique_ptr<torch::optim::OptimizerParamState> OptimizerTypeInfo::make_state(const ParamOptimState& state) const {
  for (const auto& [k, t] : state.tensors)
    if (!contains(tensor_keys_, k))
      throw std::invalid_argument("booster: '" + k + "' is not a state tensor of optimizer " + name_ + " (its tensors: " +
                                  join(tensor_keys_) + ")");
  for (const auto& [k, v] : state.scalars)
    if (!contains(scalar_keys_, k))
      throw std::invalid_argument("booster: '" + k + "' is not a state scalar of optimizer " + name_ + " (its scalars: " +
                                  join(scalar_keys_) + ")");
  return functions_.make_state(state);
}

json OptimizerTypeInfo::options_to_json(const torch::optim::OptimizerOptions& options) const {
  check_type(name_, "options", options_type_, typeid(options));
  return functions_.options_to_json(options);
}

void OptimizerTypeInfo::options_from_json(const json& j, torch::optim::OptimizerOptions& options) const {
  check_type(name_, "options", options_type_, typeid(options));
  functions_.options_from_json(j, options);
}

int64_t OptimizerTypeInfo::state_tensors_per_element(const torch::optim::OptimizerOptions& options) const {
  check_type(name_, "options", options_type_, typeid(options));
  return functions_.state_tensors_per_element(options);
}

// ---------------------------------------------------------------------------------------------
// The five elementwise optimizers of LibTorch's C++ API (keys and JSON as PyTorch's state_dict)

namespace {

json betas_json(const std::tuple<double, double>& b) { return {std::get<0>(b), std::get<1>(b)}; }

// Adam and AdamW: the same fields in unrelated types.
template <class Opt, class Options, class State>
OptimizerTypeInfo adam_like(const char* name) {
  OptimizerSpec<Options, State> s;
  s.name = name;
  s.tensor_keys = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  s.scalar_keys = {"step"};
  s.get_state = [](const State& st, ParamOptimState& out) {
    out.scalars["step"] = st.step();
    out.tensors["exp_avg"] = st.exp_avg();
    out.tensors["exp_avg_sq"] = st.exp_avg_sq();
    out.tensors["max_exp_avg_sq"] = st.max_exp_avg_sq();
  };
  s.set_state = [](const ParamOptimState& in, State& st) {
    st.step(in.scalar("step"));
    st.exp_avg(in.tensor("exp_avg"));
    st.exp_avg_sq(in.tensor("exp_avg_sq"));
    st.max_exp_avg_sq(in.tensor("max_exp_avg_sq"));
  };
  s.options_to_json = [](const Options& o) {
    return json{{"lr", o.lr()}, {"betas", betas_json(o.betas())}, {"eps", o.eps()},
                {"weight_decay", o.weight_decay()}, {"amsgrad", o.amsgrad()}};
  };
  s.options_from_json = [](const json& j, Options& o) {
    o.lr(j.at("lr").get<double>())
        .betas({j.at("betas").at(0).get<double>(), j.at("betas").at(1).get<double>()})
        .eps(j.at("eps").get<double>())
        .weight_decay(j.at("weight_decay").get<double>())
        .amsgrad(j.at("amsgrad").get<bool>());
  };
  s.state_tensors_per_element = [](const Options& o) -> int64_t { return o.amsgrad() ? 3 : 2; };
  return make_optimizer_type_info<Opt>(std::move(s));
}

OptimizerTypeInfo sgd() {
  using namespace torch::optim;
  OptimizerSpec<SGDOptions, SGDParamState> s;
  s.name = "SGD";
  s.tensor_keys = {"momentum_buffer"};
  s.get_state = [](const SGDParamState& st, ParamOptimState& out) { out.tensors["momentum_buffer"] = st.momentum_buffer(); };
  s.set_state = [](const ParamOptimState& in, SGDParamState& st) { st.momentum_buffer(in.tensor("momentum_buffer")); };
  s.options_to_json = [](const SGDOptions& o) {
    return json{{"lr", o.lr()}, {"momentum", o.momentum()}, {"dampening", o.dampening()},
                {"weight_decay", o.weight_decay()}, {"nesterov", o.nesterov()}};
  };
  s.options_from_json = [](const json& j, SGDOptions& o) {
    o.lr(j.at("lr").get<double>())
        .momentum(j.at("momentum").get<double>())
        .dampening(j.at("dampening").get<double>())
        .weight_decay(j.at("weight_decay").get<double>())
        .nesterov(j.at("nesterov").get<bool>());
  };
  s.state_tensors_per_element = [](const SGDOptions& o) -> int64_t { return o.momentum() != 0 ? 1 : 0; };
  return make_optimizer_type_info<SGD>(std::move(s));
}

OptimizerTypeInfo rmsprop() {
  using namespace torch::optim;
  OptimizerSpec<RMSpropOptions, RMSpropParamState> s;
  s.name = "RMSprop";
  s.tensor_keys = {"square_avg", "momentum_buffer", "grad_avg"};
  s.scalar_keys = {"step"};
  s.get_state = [](const RMSpropParamState& st, ParamOptimState& out) {
    out.scalars["step"] = st.step();
    out.tensors["square_avg"] = st.square_avg();
    out.tensors["momentum_buffer"] = st.momentum_buffer();
    out.tensors["grad_avg"] = st.grad_avg();
  };
  s.set_state = [](const ParamOptimState& in, RMSpropParamState& st) {
    st.step(in.scalar("step"));
    st.square_avg(in.tensor("square_avg"));
    st.momentum_buffer(in.tensor("momentum_buffer"));
    st.grad_avg(in.tensor("grad_avg"));
  };
  s.options_to_json = [](const RMSpropOptions& o) {
    return json{{"lr", o.lr()}, {"alpha", o.alpha()}, {"eps", o.eps()}, {"weight_decay", o.weight_decay()},
                {"momentum", o.momentum()}, {"centered", o.centered()}};
  };
  s.options_from_json = [](const json& j, RMSpropOptions& o) {
    o.lr(j.at("lr").get<double>())
        .alpha(j.at("alpha").get<double>())
        .eps(j.at("eps").get<double>())
        .weight_decay(j.at("weight_decay").get<double>())
        .momentum(j.at("momentum").get<double>())
        .centered(j.at("centered").get<bool>());
  };
  s.state_tensors_per_element = [](const RMSpropOptions& o) -> int64_t {
    return 1 + (o.momentum() > 0 ? 1 : 0) + (o.centered() ? 1 : 0);
  };
  return make_optimizer_type_info<RMSprop>(std::move(s));
}

OptimizerTypeInfo adagrad() {
  using namespace torch::optim;
  OptimizerSpec<AdagradOptions, AdagradParamState> s;
  s.name = "Adagrad";
  s.tensor_keys = {"sum"};
  s.scalar_keys = {"step"};
  s.get_state = [](const AdagradParamState& st, ParamOptimState& out) {
    out.scalars["step"] = st.step();
    out.tensors["sum"] = st.sum();
  };
  s.set_state = [](const ParamOptimState& in, AdagradParamState& st) {
    st.step(in.scalar("step"));
    st.sum(in.tensor("sum"));
  };
  s.options_to_json = [](const AdagradOptions& o) {
    return json{{"lr", o.lr()}, {"lr_decay", o.lr_decay()}, {"weight_decay", o.weight_decay()},
                {"initial_accumulator_value", o.initial_accumulator_value()}, {"eps", o.eps()}};
  };
  s.options_from_json = [](const json& j, AdagradOptions& o) {
    o.lr(j.at("lr").get<double>())
        .lr_decay(j.at("lr_decay").get<double>())
        .weight_decay(j.at("weight_decay").get<double>())
        .initial_accumulator_value(j.at("initial_accumulator_value").get<double>())
        .eps(j.at("eps").get<double>());
  };
  s.state_tensors_per_element = [](const AdagradOptions&) -> int64_t { return 1; };
  return make_optimizer_type_info<Adagrad>(std::move(s));
}

// CPUAdam, HybridAdam and FusedAdam: AdamW's state keys without max_exp_avg_sq (no amsgrad),
// ColossalAI's option names. bias_correction and adamw_mode are optional on load (an Adam/AdamW group
// has neither); an "amsgrad": true (from an Adam/AdamW group) is refused, as the optimizers refuse it.
// `kernel` names the kernel in that error.
template <class Opt, class CPUAdamOptions, class CPUAdamParamState>
OptimizerTypeInfo fused_adam_like(const char* name, const char* kernel) {
  OptimizerSpec<CPUAdamOptions, CPUAdamParamState> s;
  s.name = name;
  s.tensor_keys = {"exp_avg", "exp_avg_sq"};
  s.scalar_keys = {"step"};
  s.get_state = [](const CPUAdamParamState& st, ParamOptimState& out) {
    out.scalars["step"] = st.step();
    out.tensors["exp_avg"] = st.exp_avg();
    out.tensors["exp_avg_sq"] = st.exp_avg_sq();
  };
  s.set_state = [](const ParamOptimState& in, CPUAdamParamState& st) {
    st.step(in.scalar("step"));
    st.exp_avg(in.tensor("exp_avg"));
    st.exp_avg_sq(in.tensor("exp_avg_sq"));
  };
  s.options_to_json = [](const CPUAdamOptions& o) {
    return json{{"lr", o.lr()}, {"betas", betas_json(o.betas())}, {"eps", o.eps()}, {"weight_decay", o.weight_decay()},
                {"bias_correction", o.bias_correction()}, {"adamw_mode", o.adamw_mode()}};
  };
  s.options_from_json = [name, kernel](const json& j, CPUAdamOptions& o) {
    if (j.contains("amsgrad") && j.at("amsgrad").get<bool>())
      throw std::invalid_argument(std::string("booster: ") + name + " cannot take a parameter group with amsgrad = true "
                                  "(the " + kernel + " has no amsgrad); load it into torch::optim::AdamW");
    o.lr(j.at("lr").get<double>())
        .betas({j.at("betas").at(0).get<double>(), j.at("betas").at(1).get<double>()})
        .eps(j.at("eps").get<double>())
        .weight_decay(j.at("weight_decay").get<double>());
    if (j.contains("bias_correction")) o.bias_correction(j.at("bias_correction").get<bool>());
    if (j.contains("adamw_mode")) o.adamw_mode(j.at("adamw_mode").get<bool>());
  };
  s.state_tensors_per_element = [](const CPUAdamOptions&) -> int64_t { return 2; };
  return make_optimizer_type_info<Opt>(std::move(s));
}

// ---------------------------------------------------------------------------------------------
// The table

class Registry {
 public:
  Registry() {
    using namespace torch::optim;
    add(sgd());
    add(adam_like<Adam, AdamOptions, AdamParamState>("Adam"));
    add(adam_like<AdamW, AdamWOptions, AdamWParamState>("AdamW"));
    add(rmsprop());
    add(adagrad());
    using optim::CPUAdamOptions;
    using optim::CPUAdamParamState;
    add(fused_adam_like<optim::CPUAdam, CPUAdamOptions, CPUAdamParamState>("CPUAdam", "CPU Adam kernel"));
    add(fused_adam_like<optim::HybridAdam, CPUAdamOptions, CPUAdamParamState>("HybridAdam", "CPU Adam kernel"));
    add(fused_adam_like<optim::FusedAdam, optim::FusedAdamOptions, optim::FusedAdamParamState>("FusedAdam",
                                                                                               "fused Adam kernel"));
  }

  void add(OptimizerTypeInfo info) {
    std::lock_guard<std::mutex> lock(mutex_);
    validate(info);
    entries_.push_back(std::make_unique<const OptimizerTypeInfo>(std::move(info)));
    const OptimizerTypeInfo* e = entries_.back().get();
    by_name_[e->name()] = e;
    by_optimizer_[e->optimizer_type()] = e;
    by_options_.emplace(e->options_type(), e);  // keeps the first entry of a shared Options type
  }

  const OptimizerTypeInfo& by_optimizer(std::type_index t) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_optimizer_.find(t);
    if (it == by_optimizer_.end()) throw_unregistered(type_name(t));
    return *it->second;
  }

  const OptimizerTypeInfo& by_options(std::type_index t) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_options_.find(t);
    if (it == by_options_.end())
      throw std::invalid_argument("booster: no registered optimizer has options of type " + type_name(t) +
                                  " (registered: " + join(names_locked()) +
                                  "); register its optimizer with booster::register_optimizer<Optimizer>(spec) "
                                  "(booster/optim/optimizer_registry.h)");
    return *it->second;
  }

  const OptimizerTypeInfo& by_name(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_name_.find(name);
    if (it == by_name_.end())
      throw std::invalid_argument("booster: no optimizer is registered under the name '" + name + "' (registered: " +
                                  join(names_locked()) + ")");
    return *it->second;
  }

  std::vector<std::string> names() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return names_locked();
  }

 private:
  std::vector<std::string> names_locked() const {
    std::vector<std::string> v;
    for (const auto& [name, e] : by_name_) v.push_back(name);
    return v;  // sorted: by_name_ is a std::map
  }

  [[noreturn]] void throw_unregistered(const std::string& type) const {
    throw std::invalid_argument("booster: optimizer type " + type +
                                " is not registered, so its state cannot be sharded, checkpointed or planned "
                                "(registered: " + join(names_locked()) + "); register it once at start-up with "
                                "booster::register_optimizer<" + type + ">(spec) from "
                                "booster/optim/optimizer_registry.h");
  }

  void validate(const OptimizerTypeInfo& info) const {
    if (auto it = by_name_.find(info.name()); it != by_name_.end())
      throw std::invalid_argument("booster: register_optimizer: the name '" + info.name() +
                                  "' is already registered (for " + type_name(it->second->optimizer_type()) + ")");
    if (auto it = by_optimizer_.find(info.optimizer_type()); it != by_optimizer_.end())
      throw std::invalid_argument("booster: register_optimizer: optimizer type " + type_name(info.optimizer_type()) +
                                  " is already registered (as '" + it->second->name() + "')");
  }

  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<const OptimizerTypeInfo>> entries_;  // stable addresses, never removed
  std::map<std::string, const OptimizerTypeInfo*> by_name_;
  std::unordered_map<std::type_index, const OptimizerTypeInfo*> by_optimizer_;
  std::unordered_map<std::type_index, const OptimizerTypeInfo*> by_options_;
};

Registry& registry() {
  static Registry r;  // built-ins registered on first use
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public functions

void register_optimizer_type(OptimizerTypeInfo info) { registry().add(std::move(info)); }

const OptimizerTypeInfo& optimizer_type_info(const torch::optim::Optimizer& optimizer) {
  return registry().by_optimizer(typeid(optimizer));
}

const OptimizerTypeInfo& optimizer_type_info(const std::string& name) { return registry().by_name(name); }

const OptimizerTypeInfo& optimizer_type_info_for_options(const torch::optim::OptimizerOptions& options) {
  return registry().by_options(typeid(options));
}

std::vector<std::string> registered_optimizer_names() { return registry().names(); }

}  // namespace booster
