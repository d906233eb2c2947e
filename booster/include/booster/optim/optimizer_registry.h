// optimizer_registry.h — the one table of optimizer types whose per-parameter state Booster can
// shard (ZeRO), checkpoint (state keyed by parameter name) and plan memory for.
//
// An entry maps an optimizer's C++ type to:
//   - its name: the "optimizer" field of a checkpoint's optimizer_groups.json ("SGD", "AdamW", ...);
//   - its per-parameter state keys (PyTorch's state_dict keys): tensor keys, each a tensor shaped
//     like the parameter, and integer scalar keys (e.g. "step");
//   - the conversion between its ParamState class and ParamOptimState, both ways;
//   - the conversion between its per-group Options class and JSON, both ways;
//   - the number of state tensors per parameter element it allocates once it has stepped.
// SGD, Adam, AdamW, RMSprop and Adagrad (LibTorch's C++ API), CPUAdam and HybridAdam (booster/optim/
// cpu_adam.h) and FusedAdam (booster/optim/fused_adam.h) are registered built in. Anyone can register another type, once, typically at
// start-up before boost() (in every rank's process):
//
//   booster::OptimizerSpec<MyOptions, MyParamState> spec;
//   spec.name = "MyOpt";  spec.tensor_keys = {"momentum"};  spec.scalar_keys = {"step"};
//   spec.get_state = [](const MyParamState& st, booster::ParamOptimState& s) { ... };  // and the others
//   booster::register_optimizer<MyOpt>(spec);   // Options and ParamState deduced from the spec
//
// Requirement for ZeRO: the update must be elementwise (each state tensor element depends only on the
// same element of the parameter, its gradient and the group's options), because ZeRO steps the
// optimizer on one flat slice per group and concatenates the state slices for checkpoints. Integer
// scalars are per group in ZeRO: a slice carries one value (the largest of its parameters').
//
// Dependency: this header includes <nlohmann/json.hpp> (header-only); no other public header of the
// core includes this one.
//
// Thread-safety: the table is guarded by a mutex. Entries are never removed or changed, so a
// reference returned by a lookup stays valid for the life of the process.
#pragma once

#include <torch/optim/optimizer.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeindex>
#include <vector>

#include "booster/export.h"
#include "booster/optim/optimizer_state.h"

namespace booster {

// What a registration states, in the optimizer's own Options and ParamState types. Every field is
// required except scalar_keys / tensor_keys, which may be empty (SGD has no scalar).
template <class Options, class ParamState>
struct OptimizerSpec {
  // Unique among registrations; written into checkpoints, so it must never change for a type.
  std::string name;
  // Every key get_state may write and set_state may read. Tensor keys and scalar keys are disjoint.
  std::vector<std::string> tensor_keys;
  std::vector<std::string> scalar_keys;
  // Copies one parameter's state into `out` (tensors not copied). Undefined tensors may be written;
  // they are dropped (an undefined tensor is a missing key, as in PyTorch).
  std::function<void(const ParamState& state, ParamOptimState& out)> get_state;
  // Fills a default-constructed ParamState from `in`. `in` holds only declared keys but any of them
  // may be missing (ParamOptimState::tensor() / scalar() then give an undefined tensor / 0).
  std::function<void(const ParamOptimState& in, ParamState& state)> set_state;
  // One parameter group's options as a JSON object, and back. The keys are the checkpoint format.
  // options_from_json may throw nlohmann::json::exception for a missing or mistyped key.
  std::function<nlohmann::json(const Options& options)> options_to_json;
  std::function<void(const nlohmann::json& json, Options& options)> options_from_json;
  // State tensors (of the parameter's dtype) per parameter element after the first step, for a group
  // with these options: e.g. 2 for Adam, 3 with amsgrad. Used for memory planning before any step.
  std::function<int64_t(const Options& options)> state_tensors_per_element;
};

// A registered optimizer type, type-erased. The methods check the dynamic type of their argument
// against the registered one and throw std::invalid_argument (naming both types) on a mismatch.
class BOOSTER_API OptimizerTypeInfo {
 public:
  // The spec's functions over LibTorch's base classes; register_optimizer<> builds them (each casts
  // to the registered type, which the methods have checked).
  struct Functions {
    std::function<void(const torch::optim::OptimizerParamState&, ParamOptimState&)> get_state;
    std::function<std::unique_ptr<torch::optim::OptimizerParamState>(const ParamOptimState&)> make_state;
    std::function<nlohmann::json(const torch::optim::OptimizerOptions&)> options_to_json;
    std::function<void(const nlohmann::json&, torch::optim::OptimizerOptions&)> options_from_json;
    std::function<int64_t(const torch::optim::OptimizerOptions&)> state_tensors_per_element;
  };

  // Throws std::invalid_argument for an empty name, an empty or repeated key (tensor and scalar keys
  // together), or an empty function.
  OptimizerTypeInfo(std::string name, std::vector<std::string> tensor_keys, std::vector<std::string> scalar_keys,
                    std::type_index optimizer_type, std::type_index options_type, std::type_index param_state_type,
                    Functions functions);

  const std::string& name() const { return name_; }
  const std::vector<std::string>& tensor_keys() const { return tensor_keys_; }
  const std::vector<std::string>& scalar_keys() const { return scalar_keys_; }
  std::type_index optimizer_type() const { return optimizer_type_; }
  std::type_index options_type() const { return options_type_; }
  std::type_index param_state_type() const { return param_state_type_; }

  // One parameter's state (undefined tensors dropped). Throws std::logic_error if get_state wrote a
  // key that was not declared (the registration is inconsistent).
  ParamOptimState extract_state(const torch::optim::OptimizerParamState& state) const;
  // A new ParamState holding `state`'s values. Throws std::invalid_argument, before calling
  // set_state, for a key that is not declared (e.g. loading another optimizer's state).
  std::unique_ptr<torch::optim::OptimizerParamState> make_state(const ParamOptimState& state) const;
  nlohmann::json options_to_json(const torch::optim::OptimizerOptions& options) const;
  // Sets `options` from `json`; exceptions of options_from_json (nlohmann::json::exception) pass through.
  void options_from_json(const nlohmann::json& json, torch::optim::OptimizerOptions& options) const;
  int64_t state_tensors_per_element(const torch::optim::OptimizerOptions& options) const;

 private:
  std::string name_;
  std::vector<std::string> tensor_keys_, scalar_keys_;
  std::type_index optimizer_type_, options_type_, param_state_type_;
  Functions functions_;
};

// Adds `info` to the table. Throws std::invalid_argument if its name or its optimizer type is already
// registered (registering twice is an error, also with the same spec; the table is unchanged).
// Options and ParamState types may be shared by several registrations (see
// optimizer_type_info_for_options).
BOOSTER_API void register_optimizer_type(OptimizerTypeInfo info);

// The entry for the optimizer's dynamic type (typeid, exact: a subclass of a registered type is
// its own type and needs its own registration). Throws std::invalid_argument naming the type
// (demangled), the registered names, and register_optimizer as the way to add it.
BOOSTER_API const OptimizerTypeInfo& optimizer_type_info(const torch::optim::Optimizer& optimizer);
// The entry registered under `name`. Throws std::invalid_argument listing the registered names.
BOOSTER_API const OptimizerTypeInfo& optimizer_type_info(const std::string& name);
// The first registered entry whose Options type is the dynamic type of `options` (the built-ins
// come first); for code that holds a group's options without its optimizer. Registrations sharing
// an Options type must therefore serialise it identically. Throws std::invalid_argument as above.
BOOSTER_API const OptimizerTypeInfo& optimizer_type_info_for_options(const torch::optim::OptimizerOptions& options);
// Registered names, sorted.
BOOSTER_API std::vector<std::string> registered_optimizer_names();

// The entry register_optimizer<Optimizer> would add, without adding it. Throws as OptimizerTypeInfo's
// constructor.
template <class Optimizer, class Options, class ParamState>
OptimizerTypeInfo make_optimizer_type_info(OptimizerSpec<Options, ParamState> spec) {
  static_assert(std::is_base_of_v<torch::optim::Optimizer, Optimizer>, "Optimizer must derive from torch::optim::Optimizer");
  static_assert(std::is_base_of_v<torch::optim::OptimizerOptions, Options>,
                "Options must derive from torch::optim::OptimizerOptions");
  static_assert(std::is_base_of_v<torch::optim::OptimizerParamState, ParamState>,
                "ParamState must derive from torch::optim::OptimizerParamState");
  static_assert(std::is_default_constructible_v<ParamState>, "ParamState must be default-constructible");
  OptimizerTypeInfo::Functions f;
  if (spec.get_state)
    f.get_state = [g = std::move(spec.get_state)](const torch::optim::OptimizerParamState& st, ParamOptimState& out) {
      g(static_cast<const ParamState&>(st), out);
    };
  if (spec.set_state)
    f.make_state = [s = std::move(spec.set_state)](const ParamOptimState& in) {
      auto st = std::make_unique<ParamState>();
      s(in, *st);
      return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(st));
    };
  if (spec.options_to_json)
    f.options_to_json = [g = std::move(spec.options_to_json)](const torch::optim::OptimizerOptions& o) {
      return g(static_cast<const Options&>(o));
    };
  if (spec.options_from_json)
    f.options_from_json = [s = std::move(spec.options_from_json)](const nlohmann::json& j,
                                                                  torch::optim::OptimizerOptions& o) {
      s(j, static_cast<Options&>(o));
    };
  if (spec.state_tensors_per_element)
    f.state_tensors_per_element = [g = std::move(spec.state_tensors_per_element)](
                                      const torch::optim::OptimizerOptions& o) { return g(static_cast<const Options&>(o)); };
  return OptimizerTypeInfo(std::move(spec.name), std::move(spec.tensor_keys), std::move(spec.scalar_keys),
                           typeid(Optimizer), typeid(Options), typeid(ParamState), std::move(f));
}

// Typed registration: Optimizer, Options and ParamState derive from LibTorch's Optimizer,
// OptimizerOptions and OptimizerParamState; ParamState is default-constructible. Throws as
// OptimizerTypeInfo's constructor and register_optimizer_type.
template <class Optimizer, class Options, class ParamState>
void register_optimizer(OptimizerSpec<Options, ParamState> spec) {
  register_optimizer_type(make_optimizer_type_info<Optimizer>(std::move(spec)));
}

}  // namespace booster
