// unit_test.cpp — booster::nn::Unit: names unchanged (typed member, ModuleList, Sequential),
// bit-identical pass-through with null hooks, the hook call sequence over forward and backward,
// post_forward on a throwing block, collect_units / root_parameters and their errors, clone().

#include "booster/nn/unit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../examples/fashion_mnist/net.h"

using booster::nn::Unit;
using booster::nn::UnitBase;
using booster::nn::UnitHooks;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

// ---------------------------------------------------------------------------------------------
// Models: each built twice, with (kUnits = true) and without Units, from the same seed.

// A user's block (not Cloneable): a sub-module, a parameter of its own and a buffer.
struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t in, int64_t out) {
    fc = register_module("fc", torch::nn::Linear(in, out));
    scale = register_parameter("scale", torch::rand({out}) + 0.5);
    register_buffer("calls", torch::zeros({1}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(fc(x)) * scale; }
  torch::nn::Linear fc{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(Block);

template <bool kUnits, class B>
using MaybeUnit = std::conditional_t<kUnits, Unit<B>, B>;

// Typed members: a, b are units, head is in the root unit.
template <bool kUnits>
struct TypedNetImpl : torch::nn::Module {
  TypedNetImpl() {
    a = register_module("a", MaybeUnit<kUnits, Block>(6, 5));
    b = register_module("b", MaybeUnit<kUnits, torch::nn::Linear>(5, 4));
    head = register_module("head", torch::nn::Linear(4, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::relu(b(a->forward(x)))); }
  MaybeUnit<kUnits, Block> a{nullptr};
  MaybeUnit<kUnits, torch::nn::Linear> b{nullptr};
  torch::nn::Linear head{nullptr};
};

template <bool kUnits>
struct ListNetImpl : torch::nn::Module {
  ListNetImpl() {
    layers = register_module("layers", torch::nn::ModuleList());
    layers->push_back(MaybeUnit<kUnits, torch::nn::Linear>(6, 5));
    layers->push_back(MaybeUnit<kUnits, Block>(5, 5));
    layers->push_back(torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = layers->ptr<typename MaybeUnit<kUnits, torch::nn::Linear>::ContainedType>(0)->forward(x);
    x = layers->ptr<typename MaybeUnit<kUnits, Block>::ContainedType>(1)->forward(x);
    return layers->ptr<torch::nn::LinearImpl>(2)->forward(x);
  }
  torch::nn::ModuleList layers{nullptr};
};

// Three units in a Sequential (paths "0", "2", "4").
template <bool kUnits>
torch::nn::Sequential make_sequential() {
  return torch::nn::Sequential(MaybeUnit<kUnits, torch::nn::Linear>(6, 5), torch::nn::Tanh(),
                               MaybeUnit<kUnits, Block>(5, 5), torch::nn::Tanh(),
                               MaybeUnit<kUnits, torch::nn::Linear>(5, 3));
}

std::vector<std::string> keys(const torch::OrderedDict<std::string, torch::Tensor>& d) { return d.keys(); }

// Both models built from the same seed have the same names and values; then their outputs and
// gradients on the same input are bit-identical.
template <class Plain, class WithUnits>
void expect_same_names_outputs_grads(Plain plain, WithUnits units) {
  ASSERT_EQ(keys(plain->named_parameters()), keys(units->named_parameters()));
  ASSERT_EQ(keys(plain->named_buffers()), keys(units->named_buffers()));
  for (const auto& p : plain->named_parameters())
    ASSERT_TRUE(torch::equal(p.value(), units->named_parameters()[p.key()])) << p.key();
  torch::manual_seed(11);
  auto x = torch::randn({7, 6});
  auto y_plain = plain->forward(x), y_units = units->forward(x);
  EXPECT_TRUE(torch::equal(y_plain, y_units));
  (y_plain * y_plain).sum().backward();
  (y_units * y_units).sum().backward();
  for (const auto& p : plain->named_parameters()) {
    const torch::Tensor q = units->named_parameters()[p.key()];  // a copy: the dict is a temporary
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::equal(p.value().grad(), q.grad())) << p.key();
  }
}

// Records every call as "<call> <unit path>"; in pre_backward also whether the unit's first parameter
// already had a gradient (it must not: pre_backward runs before the unit's backward).
struct RecordingHooks : UnitHooks {
  std::map<const UnitBase*, std::string> paths;
  std::vector<std::string> calls;
  bool grad_seen_in_pre_backward = false;
  bool throw_in_post_forward = false;

  explicit RecordingHooks(torch::nn::Module& root) {
    for (auto& named : booster::nn::collect_named_units(root)) paths[named.unit.get()] = named.path;
  }
  std::string path(UnitBase& u) { return paths.count(&u) ? paths[&u] : "?"; }
  void pre_forward(UnitBase& u) override { calls.push_back("pre_forward " + path(u)); }
  void post_forward(UnitBase& u) override {
    calls.push_back("post_forward " + path(u));
    if (throw_in_post_forward) throw std::runtime_error("post_forward failed");
  }
  void pre_backward(UnitBase& u) override {
    calls.push_back("pre_backward " + path(u));
    for (const auto& p : u.unit_module().parameters())
      if (p.grad().defined()) grad_seen_in_pre_backward = true;
  }
  void post_backward(UnitBase& u) override { calls.push_back("post_backward " + path(u)); }
};

}  // namespace

// ---- names and pass-through

TEST(Unit, TypedMemberKeepsNamesAndIsBitIdentical) {
  torch::manual_seed(3);
  auto plain = std::make_shared<TypedNetImpl<false>>();
  torch::manual_seed(3);
  auto units = std::make_shared<TypedNetImpl<true>>();
  EXPECT_THAT(keys(units->named_parameters()),
              ElementsAre("a.scale", "a.fc.weight", "a.fc.bias", "b.weight", "b.bias", "head.weight", "head.bias"));
  EXPECT_THAT(keys(units->named_buffers()), ElementsAre("a.calls"));
  expect_same_names_outputs_grads(plain, units);
  // The block's members stay reachable, and the holder calls the typed forward.
  EXPECT_EQ(units->b->weight.sizes(), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(units->b->options.in_features(), 5);
  EXPECT_TRUE(torch::equal(units->b(torch::ones({1, 5})), units->b->forward(torch::ones({1, 5}))));
}

TEST(Unit, ModuleListKeepsNamesAndIsBitIdentical) {
  torch::manual_seed(4);
  auto plain = std::make_shared<ListNetImpl<false>>();
  torch::manual_seed(4);
  auto units = std::make_shared<ListNetImpl<true>>();
  EXPECT_THAT(keys(units->named_parameters()), ElementsAre("layers.0.weight", "layers.0.bias", "layers.1.scale",
                                                           "layers.1.fc.weight", "layers.1.fc.bias", "layers.2.weight",
                                                           "layers.2.bias"));
  expect_same_names_outputs_grads(plain, units);
}

TEST(Unit, SequentialKeepsNamesAndIsBitIdentical) {
  torch::manual_seed(5);
  auto plain = make_sequential<false>();
  torch::manual_seed(5);
  auto units = make_sequential<true>();
  EXPECT_THAT(keys(units->named_parameters()),
              ElementsAre("0.weight", "0.bias", "2.scale", "2.fc.weight", "2.fc.bias", "4.weight", "4.bias"));
  expect_same_names_outputs_grads(plain, units);
}

TEST(Unit, ExampleNetStateDictNamesUnchanged) {
  // The example CNN wraps its conv/linear layers in Units; its checkpoint names are those of the
  // plain model (the HF-layout files are keyed by these names).
  Net net;
  EXPECT_EQ(booster::nn::collect_units(*net).size(), 4u);
  EXPECT_THAT(keys(net->named_parameters()),
              ElementsAre("conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "conv2.weight", "conv2.bias",
                          "bn2.weight", "bn2.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"));
  EXPECT_THAT(keys(net->named_buffers()),
              ElementsAre("bn1.running_mean", "bn1.running_var", "bn1.num_batches_tracked", "bn2.running_mean",
                          "bn2.running_var", "bn2.num_batches_tracked"));
  EXPECT_EQ(net->forward(torch::zeros({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}));
}

TEST(Unit, FoundThroughDynamicPointerCast) {
  std::shared_ptr<torch::nn::Module> m = Unit<torch::nn::Linear>(3, 2).ptr();
  auto unit = std::dynamic_pointer_cast<UnitBase>(m);
  ASSERT_NE(unit, nullptr);
  EXPECT_EQ(&unit->unit_module(), m.get());
  EXPECT_EQ(unit->unit_block_type(), "torch::nn::LinearImpl");
  EXPECT_EQ(unit->unit_hooks(), nullptr);
  EXPECT_EQ(std::dynamic_pointer_cast<UnitBase>(torch::nn::Linear(3, 2).ptr()), nullptr);
}

TEST(Unit, PrettyPrintWrapsTheBlock) {
  std::ostringstream linear, block;
  linear << Unit<torch::nn::Linear>(3, 2);
  block << Unit<Block>(3, 2);
  EXPECT_EQ(linear.str(), "booster::nn::Unit(torch::nn::Linear(in_features=3, out_features=2, bias=true))");
  EXPECT_THAT(block.str(), AllOf(HasSubstr("booster::nn::Unit("), HasSubstr("BlockImpl)"),
                                 HasSubstr("(fc): torch::nn::Linear(in_features=3")));
}

// ---- hooks

TEST(Unit, HooksSeeForwardAndBackwardInOrder) {
  torch::manual_seed(6);
  auto net = make_sequential<true>();
  auto hooks = std::make_shared<RecordingHooks>(*net);
  EXPECT_EQ(booster::nn::set_unit_hooks(*net, hooks), 3u);
  for (int iteration = 0; iteration < 2; ++iteration) {
    hooks->calls.clear();
    net->forward(torch::randn({4, 6})).sum().backward();
    EXPECT_THAT(hooks->calls, ElementsAre("pre_forward 0", "post_forward 0", "pre_forward 2", "post_forward 2",
                                          "pre_forward 4", "post_forward 4", "pre_backward 4", "pre_backward 2",
                                          "pre_backward 0"))
        << "iteration " << iteration;
    net->zero_grad(/*set_to_none=*/true);
  }
  EXPECT_FALSE(hooks->grad_seen_in_pre_backward);

  // Cleared hooks: a pass-through again.
  booster::nn::set_unit_hooks(*net, nullptr);
  hooks->calls.clear();
  net->forward(torch::randn({4, 6})).sum().backward();
  EXPECT_TRUE(hooks->calls.empty());
}

TEST(Unit, HooksOnTypedMembersAndNoBackwardHooksWithoutGrad) {
  auto net = std::make_shared<TypedNetImpl<true>>();
  auto hooks = std::make_shared<RecordingHooks>(*net);
  booster::nn::set_unit_hooks(*net, hooks);
  {
    torch::NoGradGuard no_grad;
    net->forward(torch::randn({2, 6}));
  }
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward a", "post_forward a", "pre_forward b", "post_forward b"));
  hooks->calls.clear();
  net->forward(torch::randn({2, 6})).sum().backward();
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward a", "post_forward a", "pre_forward b", "post_forward b",
                                        "pre_backward b", "pre_backward a"));
}

TEST(Unit, ReusedUnitRunsPreBackwardOncePerBackward) {
  auto unit = Unit<torch::nn::Linear>(4, 4);
  auto hooks = std::make_shared<RecordingHooks>(*unit);
  booster::nn::set_unit_hooks(*unit, hooks);
  auto x = torch::randn({2, 4});
  auto y = unit(unit(x));  // two forwards, one backward
  y.sum().backward();
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward ", "post_forward ", "pre_forward ", "post_forward ",
                                        "pre_backward "));
  // Two backward passes through one forward's graph: once in each.
  hooks->calls.clear();
  auto z = unit(x);
  z.sum().backward(/*gradient=*/{}, /*retain_graph=*/true);
  z.sum().backward();
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward ", "post_forward ", "pre_backward ", "pre_backward "));
}

TEST(Unit, TupleOutputsTriggerPreBackwardOnce) {
  struct PairBlockImpl : torch::nn::Module {
    PairBlockImpl() { w = register_parameter("w", torch::ones({3})); }
    std::tuple<torch::Tensor, int, torch::Tensor> forward(const torch::Tensor& x) { return {x * w, 7, x + w}; }
    torch::Tensor w;
  };
  struct PairBlock : torch::nn::ModuleHolder<PairBlockImpl> {
    using torch::nn::ModuleHolder<PairBlockImpl>::ModuleHolder;
  };
  Unit<PairBlock> unit;
  auto hooks = std::make_shared<RecordingHooks>(*unit);
  unit->set_unit_hooks(hooks);
  auto [a, n, b] = unit(torch::randn({2, 3}));
  EXPECT_EQ(n, 7);
  (a.sum() + b.sum()).backward();
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward ", "post_forward ", "pre_backward "));
}

TEST(Unit, PostForwardRunsWhenTheBlockThrows) {
  auto unit = Unit<torch::nn::Linear>(3, 2);
  auto hooks = std::make_shared<RecordingHooks>(*unit);
  unit->set_unit_hooks(hooks);
  EXPECT_THROW(unit(torch::randn({2, 5})), c10::Error);  // wrong in_features
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward ", "post_forward "));
  // When post_forward throws too, the block's error is the one that propagates.
  hooks->calls.clear();
  hooks->throw_in_post_forward = true;
  EXPECT_THROW(unit(torch::randn({2, 5})), c10::Error);
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward ", "post_forward "));
  // A post_forward error after a successful forward propagates.
  EXPECT_THAT([&] { unit(torch::randn({2, 3})); }, ThrowsMessage<std::runtime_error>(HasSubstr("post_forward failed")));
}

TEST(Unit, OutputWithoutTensorsIsRefusedOnlyWhenBackwardMustBeHooked) {
  struct CountImpl : torch::nn::Module {
    CountImpl() { w = register_parameter("w", torch::ones({1})); }
    int64_t forward(const torch::Tensor& x) { return x.numel(); }
    torch::Tensor w;
  };
  struct Count : torch::nn::ModuleHolder<CountImpl> {
    using torch::nn::ModuleHolder<CountImpl>::ModuleHolder;
  };
  Unit<Count> unit;
  EXPECT_EQ(unit(torch::ones({2, 3})), 6);  // null hooks: anything goes
  auto hooks = std::make_shared<RecordingHooks>(*unit);
  unit->set_unit_hooks(hooks);
  EXPECT_THAT([&] { unit(torch::ones({2, 3})); },
              ThrowsMessage<std::logic_error>(AllOf(HasSubstr("returns long"), HasSubstr("UnitOutputTensors"))));
  EXPECT_TRUE(hooks->calls.empty());
  torch::NoGradGuard no_grad;
  EXPECT_EQ(unit(torch::ones({2, 3})), 6);
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward ", "post_forward "));
}

TEST(Unit, DestroyedUnitIgnoresLateGradients) {
  auto hooks = std::shared_ptr<RecordingHooks>();
  torch::Tensor y;
  {
    auto unit = Unit<torch::nn::Linear>(3, 2);
    hooks = std::make_shared<RecordingHooks>(*unit);
    unit->set_unit_hooks(hooks);
    y = unit(torch::randn({2, 3}));
  }
  y.sum().backward();
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward ", "post_forward "));
}

TEST(Unit, OverloadedForwardAndDefaultArguments) {
  // An overloaded forward cannot be named: the Unit's forward is a template, called as
  // unit->forward(...) (the holder's operator() needs one forward, for the plain block too).
  struct TwoWayImpl : torch::nn::Module {
    TwoWayImpl() { w = register_parameter("w", torch::full({2}, 2.0)); }
    torch::Tensor forward(const torch::Tensor& x) { return x * w; }
    torch::Tensor forward(const torch::Tensor& x, double shift) { return x * w + shift; }
    torch::Tensor w;
  };
  struct TwoWay : torch::nn::ModuleHolder<TwoWayImpl> {
    using torch::nn::ModuleHolder<TwoWayImpl>::ModuleHolder;
  };
  static_assert(std::is_same_v<booster::nn::ForwardSignature<TwoWayImpl>::type, booster::nn::UndeducibleForward>);
  static_assert(std::is_same_v<booster::nn::ForwardSignature<torch::nn::LinearImpl>::type,
                               torch::Tensor(const torch::Tensor&)>);
  Unit<TwoWay> unit;
  auto hooks = std::make_shared<RecordingHooks>(*unit);
  unit->set_unit_hooks(hooks);
  EXPECT_TRUE(torch::equal(unit->forward(torch::ones({2})), torch::full({2}, 2.0)));
  EXPECT_TRUE(torch::equal(unit->forward(torch::ones({2}), 1.0), torch::full({2}, 3.0)));
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward ", "post_forward ", "pre_forward ", "post_forward "));

  // ConvTranspose1d's forward has a default argument (output_size): Sequential fills it in.
  torch::manual_seed(9);
  auto plain = torch::nn::Sequential(torch::nn::ConvTranspose1d(2, 3, 3));
  torch::manual_seed(9);
  auto units = torch::nn::Sequential(Unit<torch::nn::ConvTranspose1d>(2, 3, 3));
  auto x = torch::randn({1, 2, 5});
  EXPECT_TRUE(torch::equal(plain->forward(x), units->forward(x)));
}

// ---- collect_units, root_parameters

TEST(Unit, CollectUnitsInRegistrationOrderAndRootParameters) {
  struct NetImpl : torch::nn::Module {
    NetImpl() {
      a = register_module("a", Unit<torch::nn::Linear>(4, 4));
      body = register_module("body", make_sequential<true>());
      head = register_module("head", torch::nn::Linear(3, 2));
      b = register_module("b", Unit<Block>(2, 2));
      alias = register_module("alias", b);  // the same unit at a second path: listed once
    }
    Unit<torch::nn::Linear> a{nullptr};
    torch::nn::Sequential body{nullptr};
    torch::nn::Linear head{nullptr};
    Unit<Block> b{nullptr}, alias{nullptr};
  };
  auto net = std::make_shared<NetImpl>();
  std::vector<std::string> paths;
  for (const auto& named : booster::nn::collect_named_units(*net)) paths.push_back(named.path);
  EXPECT_THAT(paths, ElementsAre("a", "body.0", "body.2", "body.4", "b"));
  auto units = booster::nn::collect_units(*net);
  ASSERT_EQ(units.size(), 5u);
  EXPECT_EQ(&units[0]->unit_module(), net->a.get());
  EXPECT_EQ(&units[4]->unit_module(), net->b.get());
  std::vector<std::string> root_names;
  for (const auto& [name, p] : booster::nn::root_parameters(*net, units)) root_names.push_back(name);
  EXPECT_THAT(root_names, ElementsAre("head.weight", "head.bias"));
  // A model without units is one root unit.
  auto plain = make_sequential<false>();
  EXPECT_TRUE(booster::nn::collect_units(*plain).empty());
  EXPECT_EQ(booster::nn::root_parameters(*plain, {}).size(), plain->parameters().size());
}

TEST(Unit, NestedUnitIsRefused) {
  struct OuterImpl : torch::nn::Module {
    OuterImpl() { inner = register_module("inner", Unit<torch::nn::Linear>(2, 2)); }
    torch::Tensor forward(const torch::Tensor& x) { return inner(x); }
    Unit<torch::nn::Linear> inner{nullptr};
  };
  struct Outer : torch::nn::ModuleHolder<OuterImpl> {
    using torch::nn::ModuleHolder<OuterImpl>::ModuleHolder;
  };
  auto net = torch::nn::Sequential(torch::nn::Linear(2, 2), Unit<Outer>());
  EXPECT_THAT([&] { booster::nn::collect_units(*net); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("unit '1.inner' is nested inside unit '1'")));
  auto hooks = std::make_shared<RecordingHooks>(*torch::nn::Linear(1, 1));
  EXPECT_THROW(booster::nn::set_unit_hooks(*net, hooks), std::invalid_argument);
  EXPECT_EQ(net->ptr<booster::nn::UnitImpl<OuterImpl>>(1)->unit_hooks(), nullptr);  // nothing changed
  // A root that is a unit encloses every unit below it.
  auto root = Unit<Outer>();
  EXPECT_THAT([&] { booster::nn::collect_units(*root); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("unit 'inner' is nested inside unit <root>")));
}

TEST(Unit, ParameterSharedByTwoUnitsIsRefused) {
  struct TiedImpl : torch::nn::Module {
    explicit TiedImpl(torch::Tensor w) { this->w = register_parameter("w", std::move(w)); }
    torch::Tensor forward(const torch::Tensor& x) { return x * w; }
    torch::Tensor w;
  };
  struct Tied : torch::nn::ModuleHolder<TiedImpl> {
    using torch::nn::ModuleHolder<TiedImpl>::ModuleHolder;
  };
  auto w = torch::ones({3});
  auto net = torch::nn::Sequential(Unit<Tied>(w), Unit<Tied>(torch::ones({3})), Unit<Tied>(w));
  EXPECT_THAT([&] { booster::nn::collect_units(*net); },
              ThrowsMessage<std::invalid_argument>(
                  HasSubstr("parameter '0.w' of unit '0' is the same tensor as '2.w' of unit '2'")));
  // Shared between a unit and the root unit: the unit has it, the root unit does not.
  auto mixed = torch::nn::Sequential(Unit<Tied>(w), Tied(w));
  auto units = booster::nn::collect_units(*mixed);
  EXPECT_EQ(units.size(), 1u);
  EXPECT_TRUE(booster::nn::root_parameters(*mixed, units).empty());
}

// ---- clone

TEST(Unit, CloneOfACloneableBlockIsAUnitWithNullHooks) {
  torch::manual_seed(8);
  auto unit = Unit<torch::nn::Linear>(3, 2);
  unit->set_unit_hooks(std::make_shared<RecordingHooks>(*unit));
  auto copy = std::dynamic_pointer_cast<booster::nn::UnitImpl<torch::nn::LinearImpl>>(unit->clone());
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->unit_hooks(), nullptr);
  EXPECT_EQ(keys(copy->named_parameters()), keys(unit->named_parameters()));
  EXPECT_TRUE(torch::equal(copy->weight, unit->weight));
  EXPECT_NE(copy->weight.data_ptr(), unit->weight.data_ptr());
  EXPECT_TRUE(copy->named_parameters()["weight"].is_same(copy->weight));  // registered = member

  // A Sequential (Cloneable) holding Units clones them as Units.
  auto seq = torch::nn::Sequential(Unit<torch::nn::Linear>(3, 3), torch::nn::Tanh(), Unit<torch::nn::Linear>(3, 2));
  auto seq_copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(seq->clone());
  ASSERT_NE(seq_copy, nullptr);
  EXPECT_EQ(booster::nn::collect_units(*seq_copy).size(), 2u);
  auto x = torch::randn({2, 3});
  EXPECT_TRUE(torch::equal(seq_copy->forward(x), seq->forward(x)));
  EXPECT_NE(seq_copy->parameters()[0].data_ptr(), seq->parameters()[0].data_ptr());
}

TEST(Unit, CloneOfANonCloneableBlockNamesTheFix) {
  auto unit = Unit<Block>(3, 2);
  EXPECT_THAT([&] { unit->clone(); },
              ThrowsMessage<std::logic_error>(AllOf(HasSubstr("BlockImpl"), HasSubstr("torch::nn::Cloneable"))));
}
