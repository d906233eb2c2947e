// unit.cpp — the non-template part of booster::nn::Unit: the pre-backward trigger on a forward's
// outputs, and finding units in a model (collect_units, root_parameters, set_unit_hooks).
#include "booster/nn/unit.h"

#include "booster/nn/checkpoint.h"

#include <torch/csrc/autograd/engine.h>

#include <atomic>
#include <unordered_map>
#include <unordered_set>

#include "booster/logging.h"

namespace booster::nn {

UnitHooks::~UnitHooks() = default;

torch::Tensor UnitBase::unit_run_checkpointed(const torch::Tensor& x,
                                              const std::function<torch::Tensor(const torch::Tensor&)>& run) {
  std::vector<torch::Tensor> params;
  for (const auto& p : unit_module().parameters())
    if (p.requires_grad()) params.push_back(p);
  std::shared_ptr<UnitHooks> hooks = unit_hooks_;
  torch::Tensor out = checkpoint([run](const std::vector<torch::Tensor>& in) { return run(in.at(0)); }, {x}, params);
  // pre_backward on the checkpointed output: it runs in the outer backward pass, before the
  // recomputation (which then finds the unit gathered).
  if (hooks) unit_arm_pre_backward(hooks, {out});
  return out;
}

void UnitBase::unit_checkpoint_unsupported() const {
  throw std::logic_error("booster::nn::Unit<" + unit_block_type() +
                         ">: activation checkpointing needs a block forward that takes one tensor and returns one; "
                         "turn it off for this unit (set_unit_checkpoint(false)) or checkpoint inside the block "
                         "with booster::nn::checkpoint");
}

// ---------------------------------------------------------------------------------------------
// The unit protocol

// Shared by a unit and the hooks on its outputs, so that a hook firing after the unit was destroyed
// does nothing (unit == nullptr).
struct UnitBase::BackwardState {
  UnitBase* unit = nullptr;
  std::atomic<bool> ran{false};  // pre_backward ran in the current backward pass
};

UnitBase::UnitBase() : unit_backward_state_(std::make_shared<BackwardState>()) { unit_backward_state_->unit = this; }

UnitBase::~UnitBase() { unit_backward_state_->unit = nullptr; }

void UnitBase::unit_unsupported_output(const char* type) const {
  throw std::logic_error("booster::nn::Unit<" + unit_block_type() + ">: the block's forward returns " + type +
                         ", in which a Unit finds no tensor to run pre_backward on, and unit hooks are set with grad "
                         "mode on; return a torch::Tensor, a std::tuple or std::pair of tensors or a "
                         "std::vector<torch::Tensor>, or specialise booster::nn::UnitOutputTensors for this type");
}

void UnitBase::unit_post_forward_after_throw(UnitHooks& hooks) noexcept {
  try {
    hooks.post_forward(*this);
  } catch (const std::exception& e) {
    log::warn_all("booster::nn::Unit<" + unit_block_type() + ">: post_forward failed while the block's forward " +
                  "was throwing; the block's exception propagates, this one is dropped: " + e.what());
  } catch (...) {
    log::warn_all("booster::nn::Unit<" + unit_block_type() + ">: post_forward failed with an unknown exception " +
                  "while the block's forward was throwing; the block's exception propagates");
  }
}

void UnitBase::unit_arm_pre_backward(const std::shared_ptr<UnitHooks>& hooks,
                                     const std::vector<torch::Tensor>& outputs) {
  std::shared_ptr<BackwardState> state = unit_backward_state_;
  state->ran = false;  // a new forward: the next backward pass through it runs pre_backward again
  for (const auto& t : outputs) {
    if (!t.defined() || !t.requires_grad()) continue;
    t.register_hook([state, hooks](const torch::Tensor&) {
      UnitBase* unit = state->unit;
      if (unit == nullptr || state->ran.exchange(true)) return;
      // Re-armed when this backward pass ends (the engine runs final callbacks once per pass).
      torch::autograd::Engine::get_default_engine().queue_callback([state]() { state->ran = false; });
      try {
        hooks->pre_backward(*unit);
      } catch (...) {
        state->ran = false;
        throw;
      }
    });
  }
}

// ---------------------------------------------------------------------------------------------
// Finding units

namespace {

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string describe(const std::string& path) { return path.empty() ? "<root>" : "'" + path + "'"; }

struct UnitWalker {
  std::vector<NamedUnit> units;
  std::unordered_set<const UnitBase*> seen;

  // Adds `unit` at `path` unless listed already; false when it was (its subtree was walked then).
  bool add(std::shared_ptr<UnitBase> unit, const std::string& path, const std::string* enclosing) {
    if (enclosing != nullptr)
      throw std::invalid_argument("booster::nn::collect_units: unit " + describe(path) + " is nested inside unit " +
                                  describe(*enclosing) +
                                  "; every parameter belongs to exactly one unit: remove one of the two Units "
                                  "(wrap the inner blocks one by one, or only their parent)");
    if (!seen.insert(unit.get()).second) return false;
    units.push_back({path, std::move(unit)});
    return true;
  }

  // Walks the children of `module` (at `path`); `enclosing` is the path of the unit they are in.
  void walk(const torch::nn::Module& module, const std::string& path, const std::string* enclosing) {
    for (const auto& item : module.named_children()) {
      const std::string child_path = join(path, item.key());
      const std::shared_ptr<torch::nn::Module>& child = item.value();
      if (auto unit = std::dynamic_pointer_cast<UnitBase>(child)) {
        if (add(std::move(unit), child_path, enclosing)) walk(*child, child_path, &child_path);
      } else {
        walk(*child, child_path, enclosing);
      }
    }
  }

  void check_shared_parameters() const {
    std::unordered_map<const c10::TensorImpl*, std::pair<size_t, std::string>> owner;  // -> (unit, full name)
    for (size_t i = 0; i < units.size(); ++i) {
      for (const auto& p : units[i].unit->unit_module().named_parameters(/*recurse=*/true)) {
        if (!p.value().defined()) continue;
        std::string name = join(units[i].path, p.key());
        auto [it, inserted] = owner.emplace(p.value().unsafeGetTensorImpl(), std::make_pair(i, name));
        if (!inserted && it->second.first != i)
          throw std::invalid_argument(
              "booster::nn::collect_units: parameter '" + it->second.second + "' of unit " +
              describe(units[it->second.first].path) + " is the same tensor as '" + name + "' of unit " +
              describe(units[i].path) +
              "; a parameter belongs to exactly one unit: put the modules that share it into one Unit");
      }
    }
  }
};

}  // namespace

std::vector<NamedUnit> collect_named_units(torch::nn::Module& root) {
  UnitWalker walker;
  if (dynamic_cast<UnitBase*>(&root) != nullptr) {
    auto owner = std::dynamic_pointer_cast<UnitBase>(root.weak_from_this().lock());
    if (!owner)
      throw std::invalid_argument("booster::nn::collect_units: the root module is a Unit that is not owned by a "
                                  "std::shared_ptr; create it through its holder booster::nn::Unit<Block>");
    walker.add(std::move(owner), "", nullptr);
    const std::string root_path;
    walker.walk(root, "", &root_path);
  } else {
    walker.walk(root, "", nullptr);
  }
  walker.check_shared_parameters();
  return std::move(walker.units);
}

std::vector<std::shared_ptr<UnitBase>> collect_units(torch::nn::Module& root) {
  std::vector<std::shared_ptr<UnitBase>> out;
  for (auto& named : collect_named_units(root)) out.push_back(std::move(named.unit));
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> root_parameters(
    const torch::nn::Module& root, const std::vector<std::shared_ptr<UnitBase>>& units) {
  std::unordered_set<const c10::TensorImpl*> taken;
  for (const auto& unit : units)
    for (const auto& p : unit->unit_module().parameters(/*recurse=*/true))
      if (p.defined()) taken.insert(p.unsafeGetTensorImpl());
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : root.named_parameters(/*recurse=*/true)) {
    if (!p.value().defined()) continue;
    if (taken.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), p.value());
  }
  return out;
}

size_t set_unit_hooks(torch::nn::Module& root, const std::shared_ptr<UnitHooks>& hooks) {
  auto units = collect_units(root);
  for (auto& unit : units) unit->set_unit_hooks(hooks);
  return units.size();
}

}  // namespace booster::nn
