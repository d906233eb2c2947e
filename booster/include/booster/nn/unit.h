// unit.h — booster::nn::Unit, the shard-unit holder: the model author marks a block (a sub-module)
// as one unit of a sharded plugin, as PyTorch FSDP's manual wrapping does; plugins that shard
// parameters per unit (FSDP / ZeRO-3) find the units and install hooks around each unit's forward
// and backward. LibTorch's C++ modules have no forward hooks, so the holder is the hook point.
//
//     struct NetImpl : torch::nn::Module {
//       NetImpl() {
//         fc1 = register_module("fc1", booster::nn::Unit<torch::nn::Linear>(784, 128));
//         body = register_module("body", torch::nn::Sequential(
//             booster::nn::Unit<torch::nn::Linear>(128, 128), torch::nn::ReLU(),
//             booster::nn::Unit<MyBlock>(128)));                   // a user's TORCH_MODULE(MyBlock)
//         head = register_module("head", torch::nn::Linear(128, 10));   // outside every unit
//       }
//       torch::Tensor forward(const torch::Tensor& x) { return head(body->forward(fc1(x))); }
//       booster::nn::Unit<torch::nn::Linear> fc1{nullptr};
//       torch::nn::Sequential body{nullptr};
//       torch::nn::Linear head{nullptr};
//     };
//
// Invariants (the contract):
//  - A Unit adds no level to names. UnitImpl<BlockImpl> *derives from* BlockImpl: it is the block,
//    its parameters, buffers and sub-modules are registered on it directly. named_parameters(),
//    named_buffers() and checkpoints of a model are identical with and without Units, and the
//    block's members (`unit->weight`, `unit->options`) are reachable as before.
//  - With null hooks (the default) a Unit is a pass-through: forward calls the block's forward and
//    nothing else, so outputs and gradients are bit-identical to the bare block. DDP and ZeRO-1/2
//    leave the hooks null, so one model definition runs under every plugin.
//  - With hooks set, one forward call is: hooks->pre_forward(unit) → block forward →
//    hooks->post_forward(unit). post_forward also runs when the block's forward throws (the block's
//    exception then propagates; should post_forward throw too, its error is logged and dropped).
//    post_forward does not run when pre_forward threw. Then, when grad mode is on, a
//    Tensor::register_hook on each output tensor that requires grad makes hooks->pre_backward(unit)
//    run when the first of those outputs' gradients arrives, before the unit's own backward: once
//    per backward pass per unit, however many times the unit ran in the forward (a flag reset at the
//    end of that backward, through the autograd engine's final callback, and by the next forward).
//  - hooks->post_backward(unit) is never called by a Unit: its trigger (every parameter gradient of
//    the unit has arrived) is known to the plugin, which owns the gradient-accumulator hooks.
//  - The hooks a forward started with are the ones its pre_backward uses (set_unit_hooks during a
//    forward or before the backward changes later calls only).
//  - Thread safety: none; a model is used by one thread at a time. pre_backward runs on the thread
//    that runs the backward pass.
// Errors: exceptions of the hooks propagate (from pre_backward: out of the backward call); a forward
// output without tensors under hooks and grad mode is std::logic_error; collect_units refuses nested
// units and parameters shared by two units (std::invalid_argument naming the paths); clone() of a
// block that is not Cloneable is std::logic_error.
// Design from PyTorch FSDP: manual wrapping (each FullyShardedDataParallel(block) is a unit, the
// parameters outside every unit belong to the root unit), its forward pre/post hooks, and its
// pre-backward hook registered on the forward's output tensors. Unlike FSDP's wrapper, a Unit keeps
// names unchanged (no `_fsdp_wrapped_module` level).
//
// Outputs. pre_backward needs the forward's output tensors: a torch::Tensor, a std::tuple or
// std::pair of them (elements that are not tensors are skipped, nesting allowed), or a
// std::vector<torch::Tensor>. For another output type specialise booster::nn::UnitOutputTensors<T>
// (below). A forward returning anything else (or void) works with null hooks and under no-grad; with
// hooks and grad mode on it throws std::logic_error before pre_forward (the backward could not be
// hooked).
//
// Forward signatures. When `&BlockImpl::forward` names one non-template member function, UnitImpl
// has a non-template forward with exactly that signature (deduced by MemberSignature), so a Unit can
// be called typed (`unit(x)`, `unit->forward(x)`) and lives in torch::nn::Sequential and AnyModule.
// A block whose forward is overloaded or a template gets a variadic template forward instead:
// `unit->forward(...)` works (the holder's operator() does not, as for the plain block), and
// Sequential/AnyModule refuse it at compile time ("Can only add modules with a forward() method").
// Default arguments of the block's forward are filled in by Sequential (FORWARD_HAS_DEFAULT_ARGS is
// inherited) but not in typed calls of the deduced forward: pass every argument there.
//
// clone(). When BlockImpl derives from torch::nn::Cloneable<BlockImpl> (every LibTorch layer does),
// unit->clone() and the clone of a Cloneable model holding Units give a deep copy whose Units are
// Units again, with null hooks. Otherwise clone() throws std::logic_error naming the block type.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <c10/util/Type.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "booster/export.h"

namespace booster::nn {

class UnitBase;

// ---------------------------------------------------------------------------------------------
// Hooks a sharding plugin installs on units. Every call gets the unit it is about; its parameters
// are unit.unit_module().parameters() (sub-modules included).

class BOOSTER_API UnitHooks {
 public:
  virtual ~UnitHooks();
  // Before the block's forward (FSDP: all-gather the unit's parameters).
  virtual void pre_forward(UnitBase& unit) = 0;
  // After the block's forward, also when it threw (FSDP: free the gathered parameters).
  virtual void post_forward(UnitBase& unit) = 0;
  // When the first gradient of the unit's outputs arrives in a backward pass, before the unit's
  // backward (FSDP: all-gather again). Once per backward pass per unit.
  virtual void pre_backward(UnitBase& unit) = 0;
  // After the unit's backward (FSDP: reduce-scatter the gradients, free the parameters). Called by
  // the plugin, not by Unit: only the plugin knows when every parameter gradient has arrived.
  virtual void post_backward(UnitBase& unit) = 0;
};

// ---------------------------------------------------------------------------------------------
// Output tensors of a forward, for the pre-backward hook. Specialise for your own output type:
//     template <> struct booster::nn::UnitOutputTensors<MyOut> {
//       static constexpr bool supported = true;
//       static void collect(const MyOut& o, std::vector<torch::Tensor>& out) { out.push_back(o.y); }
//     };

template <class T, class = void>
struct UnitOutputTensors {
  static constexpr bool supported = false;
  static void collect(const T&, std::vector<torch::Tensor>&) {}
};
template <>
struct UnitOutputTensors<torch::Tensor> {
  static constexpr bool supported = true;
  static void collect(const torch::Tensor& t, std::vector<torch::Tensor>& out) { out.push_back(t); }
};
template <class... Ts>
struct UnitOutputTensors<std::tuple<Ts...>> {
  static constexpr bool supported = (UnitOutputTensors<std::decay_t<Ts>>::supported || ... || false);
  static void collect(const std::tuple<Ts...>& t, std::vector<torch::Tensor>& out) {
    std::apply([&](const auto&... e) { (UnitOutputTensors<std::decay_t<decltype(e)>>::collect(e, out), ...); }, t);
  }
};
template <class A, class B>
struct UnitOutputTensors<std::pair<A, B>> {
  static constexpr bool supported =
      UnitOutputTensors<std::decay_t<A>>::supported || UnitOutputTensors<std::decay_t<B>>::supported;
  static void collect(const std::pair<A, B>& p, std::vector<torch::Tensor>& out) {
    UnitOutputTensors<std::decay_t<A>>::collect(p.first, out);
    UnitOutputTensors<std::decay_t<B>>::collect(p.second, out);
  }
};
template <>
struct UnitOutputTensors<std::vector<torch::Tensor>> {
  static constexpr bool supported = true;
  static void collect(const std::vector<torch::Tensor>& v, std::vector<torch::Tensor>& out) {
    out.insert(out.end(), v.begin(), v.end());
  }
};

// ---------------------------------------------------------------------------------------------
// Forward signature deduction: `R(A...)` for `R (C::*)(A...)` (const / noexcept too); any other
// (overloaded or template forward: `&BlockImpl::forward` is ill-formed) is UndeducibleForward.

struct UndeducibleForward {};

template <class F>
struct MemberSignature {
  using type = UndeducibleForward;
};
template <class R, class C, class... A>
struct MemberSignature<R (C::*)(A...)> {
  using type = R(A...);
};
template <class R, class C, class... A>
struct MemberSignature<R (C::*)(A...) const> {
  using type = R(A...);
};
template <class R, class C, class... A>
struct MemberSignature<R (C::*)(A...) noexcept> {
  using type = R(A...);
};
template <class R, class C, class... A>
struct MemberSignature<R (C::*)(A...) const noexcept> {
  using type = R(A...);
};

template <class BlockImpl, class = void>
struct ForwardSignature {
  using type = UndeducibleForward;
};
template <class BlockImpl>
struct ForwardSignature<BlockImpl, std::void_t<decltype(&BlockImpl::forward)>> {
  using type = typename MemberSignature<decltype(&BlockImpl::forward)>::type;
};

template <class BlockImpl, class Signature = typename ForwardSignature<BlockImpl>::type>
class UnitImpl;

// ---------------------------------------------------------------------------------------------
// The common, non-template base of every UnitImpl<BlockImpl>. Plugins find units with
// std::dynamic_pointer_cast<UnitBase>(module) (collect_units below does it). Not copyable: a copy of
// a unit is made by clone(). Its members are prefixed unit_ so that they do not collide with the
// block's own members (UnitImpl derives from both).

class BOOSTER_API UnitBase {
 public:
  virtual ~UnitBase();
  UnitBase(const UnitBase&) = delete;
  UnitBase& operator=(const UnitBase&) = delete;

  // The unit as a module (the block itself): its parameters are the unit's parameters.
  virtual torch::nn::Module& unit_module() = 0;
  // The block's type, demangled ("torch::nn::LinearImpl"), for messages.
  virtual std::string unit_block_type() const = 0;

  // Installs hooks (null: pass-through). Takes effect from the next forward.
  void set_unit_hooks(std::shared_ptr<UnitHooks> hooks) { unit_hooks_ = std::move(hooks); }
  const std::shared_ptr<UnitHooks>& unit_hooks() const { return unit_hooks_; }

  // Activation checkpointing (checkpoint.h) of this unit, off by default: with it on, a forward in
  // grad mode runs the unit protocol's forward (pre_forward, the block, post_forward) under
  // no-grad and keeps only its input; in the backward pass pre_backward runs when the output's
  // gradient arrives (in the outer backward pass, as without checkpointing: a sharding plugin
  // gathers the unit there), then the block's forward runs again, with no hooks, on the gathered
  // parameters, and its backward follows. The parameters' gradients reach their accumulators once,
  // in the outer backward, so the plugin's post-backward hooks see what they see without it. Bit-identical gradients on CPU (dropout included). Supported for a block
  // whose forward takes one tensor (`const torch::Tensor&` or `torch::Tensor`) and returns one;
  // for any other signature a forward in grad mode with it on throws std::logic_error. Set by
  // `[booster] activation_checkpointing` at boost(); takes effect from the next forward.
  void set_unit_checkpoint(bool on) { unit_checkpoint_ = on; }
  bool unit_checkpoint() const { return unit_checkpoint_; }

 protected:
  UnitBase();

 private:
  template <class BlockImpl, class Signature>
  friend class UnitImpl;
  struct BackwardState;

  // The forward protocol around `block_forward` (a callable returning R); see the header comment.
  template <class R, class F>
  R unit_run_forward(F&& block_forward);
  // Throws std::logic_error: `type` (the forward's return type) has no tensors a Unit can hook.
  [[noreturn]] void unit_unsupported_output(const char* type) const;
  // Runs hooks.post_forward(*this) while the block's exception propagates (logs its own error).
  void unit_post_forward_after_throw(UnitHooks& hooks) noexcept;
  // Registers the pre-backward trigger on the outputs that require grad (none: nothing to do).
  void unit_arm_pre_backward(const std::shared_ptr<UnitHooks>& hooks, const std::vector<torch::Tensor>& outputs);
  // run(x) (the protocol around the block) under booster::nn::checkpoint with the unit's parameters.
  torch::Tensor unit_run_checkpointed(const torch::Tensor& x, const std::function<torch::Tensor(const torch::Tensor&)>& run);
  // Throws std::logic_error: checkpointing is on and the block's forward is not Tensor(Tensor).
  [[noreturn]] void unit_checkpoint_unsupported() const;

  std::shared_ptr<UnitHooks> unit_hooks_;
  std::shared_ptr<BackwardState> unit_backward_state_;  // shared with the output hooks; never null
  bool unit_checkpoint_ = false;
};

// Whether a block forward R(A...) can be checkpointed by a Unit: one tensor in, one tensor out.
template <class R, class... A>
constexpr bool unit_checkpointable() {
  if constexpr (sizeof...(A) != 1) {
    return false;
  } else {
    return std::is_same_v<std::decay_t<R>, torch::Tensor> &&
           ((std::is_same_v<A, const torch::Tensor&> || std::is_same_v<A, torch::Tensor>) && ...);
  }
}

template <class R, class F>
R UnitBase::unit_run_forward(F&& block_forward) {
  std::shared_ptr<UnitHooks> hooks = unit_hooks_;
  if (!hooks) return block_forward();
  const bool track = torch::GradMode::is_enabled();
  using Out = std::decay_t<R>;
  if constexpr (std::is_void_v<R> || !UnitOutputTensors<Out>::supported) {
    if (track) unit_unsupported_output(c10::demangle_type<R>());
  }
  hooks->pre_forward(*this);
  if constexpr (std::is_void_v<R>) {
    try {
      block_forward();
    } catch (...) {
      unit_post_forward_after_throw(*hooks);
      throw;
    }
    hooks->post_forward(*this);
  } else {
    R out = [&]() -> R {
      try {
        return block_forward();
      } catch (...) {
        unit_post_forward_after_throw(*hooks);
        throw;
      }
    }();
    hooks->post_forward(*this);
    if constexpr (UnitOutputTensors<Out>::supported) {
      if (track) {
        std::vector<torch::Tensor> tensors;
        UnitOutputTensors<Out>::collect(out, tensors);
        unit_arm_pre_backward(hooks, tensors);
      }
    }
    return out;
  }
}

// ---------------------------------------------------------------------------------------------
// UnitImpl<BlockImpl>: the block with the unit protocol around its forward. Constructed with the
// block's own constructor arguments. Use it through its holder Unit<Block>. Its forward is declared
// in UnitImpl itself (AnyModule::get<T> / Sequential::ptr<T> need `&UnitImpl::forward` to name it):
// one specialisation per kind of Signature, sharing detail::UnitCore.

namespace detail {

struct FromClone {};

template <class Derived, class BlockImpl>
class UnitCore : public BlockImpl, public UnitBase {
  static_assert(std::is_base_of_v<torch::nn::Module, BlockImpl>,
                "booster::nn::UnitImpl<BlockImpl>: BlockImpl must derive from torch::nn::Module");

 public:
  using BlockImpl::BlockImpl;

  torch::nn::Module& unit_module() override { return *this; }
  std::string unit_block_type() const override { return c10::demangle(typeid(BlockImpl).name()); }

  // A deep copy that is a Unit again (null hooks); see "clone()" in the header comment.
  std::shared_ptr<torch::nn::Module> clone(
      const torch::optional<torch::Device>& device = torch::nullopt) const override {
    if constexpr (std::is_base_of_v<torch::nn::Cloneable<BlockImpl>, BlockImpl>) {
      auto copy = BlockImpl::clone(device);
      return std::make_shared<Derived>(FromClone{}, dynamic_cast<const BlockImpl&>(*copy));
    } else {
      const std::string block = unit_block_type();
      throw std::logic_error("booster::nn::Unit<" + block + ">::clone(): the block type does not derive from " +
                             "torch::nn::Cloneable<" + block +
                             ">; derive it from Cloneable (registering its members in reset()) to clone it");
    }
  }

  // "booster::nn::Unit(<the block's own pretty_print>)".
  void pretty_print(std::ostream& stream) const override {
    stream << "booster::nn::Unit(";
    if constexpr (std::is_same_v<decltype(&BlockImpl::pretty_print), void (torch::nn::Module::*)(std::ostream&) const>)
      stream << unit_block_type();  // Module's default would print UnitImpl's own type name
    else
      BlockImpl::pretty_print(stream);
    stream << ")";
  }

 protected:
  UnitCore(FromClone, const BlockImpl& block) : BlockImpl(block) {}
};

}  // namespace detail

// The block's forward has one signature R(A...): a non-template forward with exactly it.
template <class BlockImpl, class R, class... A>
class UnitImpl<BlockImpl, R(A...)> : public detail::UnitCore<UnitImpl<BlockImpl, R(A...)>, BlockImpl> {
  using Core = detail::UnitCore<UnitImpl<BlockImpl, R(A...)>, BlockImpl>;

 public:
  using Core::Core;
  // For clone(): `block` is a deep copy made by Cloneable<BlockImpl> (whose Module base is not
  // virtual in LibTorch 2.x, so the block's copy constructor copies it).
  UnitImpl(detail::FromClone tag, const BlockImpl& block) : Core(tag, block) {}

  // Hides BlockImpl::forward: every call goes through the unit protocol.
  R forward(A... args) {
    if (this->unit_checkpoint() && torch::GradMode::is_enabled()) {
      if constexpr (unit_checkpointable<R, A...>()) {
        // Under no-grad (the checkpointed forward): the protocol; in grad mode (the recomputation
        // in backward, after pre_backward gathered the unit): the bare block.
        return this->unit_run_checkpointed(args..., [this](const torch::Tensor& x) -> torch::Tensor {
          if (torch::GradMode::is_enabled()) return BlockImpl::forward(x);
          return this->template unit_run_forward<R>([&]() -> R { return BlockImpl::forward(x); });
        });
      } else {
        this->unit_checkpoint_unsupported();
      }
    }
    return this->template unit_run_forward<R>([&]() -> R { return BlockImpl::forward(std::forward<A>(args)...); });
  }
};

// The block's forward is overloaded or a template: a variadic template forward (no Sequential).
template <class BlockImpl>
class UnitImpl<BlockImpl, UndeducibleForward>
    : public detail::UnitCore<UnitImpl<BlockImpl, UndeducibleForward>, BlockImpl> {
  using Core = detail::UnitCore<UnitImpl<BlockImpl, UndeducibleForward>, BlockImpl>;

 public:
  using Core::Core;
  UnitImpl(detail::FromClone tag, const BlockImpl& block) : Core(tag, block) {}

  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    if (this->unit_checkpoint() && torch::GradMode::is_enabled()) this->unit_checkpoint_unsupported();
    using R = decltype(std::declval<BlockImpl&>().forward(std::forward<Args>(args)...));
    return this->template unit_run_forward<R>([&]() -> R { return BlockImpl::forward(std::forward<Args>(args)...); });
  }
};

// The holder: Unit<torch::nn::Linear>, Unit<MyBlock> (any ModuleHolder whose module is the block).
template <class Block>
class Unit : public torch::nn::ModuleHolder<UnitImpl<typename Block::ContainedType>> {
 public:
  using torch::nn::ModuleHolder<UnitImpl<typename Block::ContainedType>>::ModuleHolder;
  using Impl = UnitImpl<typename Block::ContainedType>;
};

// ---------------------------------------------------------------------------------------------
// Finding units (what a sharding plugin calls at configure time).

struct NamedUnit {
  std::string path;  // dotted module path from the root ("" when the root itself is a unit)
  std::shared_ptr<UnitBase> unit;
};

// The units under `root` (root included) in pre-order over registered sub-modules, with their paths. A unit module
// registered at several paths is listed once (first path). Throws std::invalid_argument, naming the
// paths, for a unit nested inside another unit and for a parameter (the same TensorImpl) shared by
// two units: FSDP assigns every parameter to exactly one unit. A root that is itself a unit must be
// owned by a std::shared_ptr (its holder), or std::invalid_argument.
BOOSTER_API std::vector<NamedUnit> collect_named_units(torch::nn::Module& root);
// collect_named_units without the paths.
BOOSTER_API std::vector<std::shared_ptr<UnitBase>> collect_units(torch::nn::Module& root);

// The "root unit": root's parameters that belong to no unit in `units`, with their dotted names, in
// root.named_parameters() order, each tensor once (first name). FSDP shards these as the outermost
// unit. A model without Units is one root unit.
BOOSTER_API std::vector<std::pair<std::string, torch::Tensor>> root_parameters(
    const torch::nn::Module& root, const std::vector<std::shared_ptr<UnitBase>>& units);

// Installs `hooks` on every unit of collect_units(root) (null: clears them); throws as
// collect_units, before changing any unit. Returns the number of units.
BOOSTER_API size_t set_unit_hooks(torch::nn::Module& root, const std::shared_ptr<UnitHooks>& hooks);

}  // namespace booster::nn
