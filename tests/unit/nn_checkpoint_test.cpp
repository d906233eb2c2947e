// nn_checkpoint_test.cpp — activation checkpointing (booster/nn/checkpoint.h) on one process: the
// gradients of inputs and parameters bit-identical to the run without it (dropout included), the
// function run twice, the generators left as without it, a Unit checkpointing itself (pre_backward
// in the outer backward pass, before the recomputation), and the refusal of a block forward it cannot checkpoint.
// (Every plugin with `[booster] activation_checkpointing`: tests/dist/gpt_example_test.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "booster/nn/checkpoint.h"
#include "booster/nn/unit.h"

namespace {

using ::testing::ElementsAre;

// x [4, 8] -> dropout(gelu(x W1ᵀ)) W2ᵀ: activations worth recomputing, and randomness.
struct CkptMlpImpl : torch::nn::Module {
  CkptMlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    ++calls;
    return fc2(torch::dropout(torch::gelu(fc1(x)), 0.3, is_training()));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  int calls = 0;
};
TORCH_MODULE(CkptMlp);

struct Grads {
  torch::Tensor x, w1, b2, rng_after;
};

// loss = sum(block(x)^2) with or without checkpoint(); the gradients and the CPU generator's state
// after backward.
Grads run_mlp(bool checkpointed) {
  torch::manual_seed(7);
  CkptMlp mlp;
  torch::manual_seed(11);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  torch::Tensor y;
  if (checkpointed) {
    y = booster::nn::checkpoint([&](const std::vector<torch::Tensor>& in) { return mlp->forward(in[0]); }, {x},
                                mlp->parameters());
    EXPECT_EQ(mlp->calls, 1);
  } else {
    y = mlp->forward(x);
  }
  (y * y).sum().backward();
  EXPECT_EQ(mlp->calls, checkpointed ? 2 : 1);
  return {x.grad(), mlp->fc1->weight.grad(), mlp->fc2->bias.grad(), torch::rand({3})};
}

TEST(ActivationCheckpoint, GradientsAreBitIdenticalWithDropout) {
  Grads plain = run_mlp(false), ckpt = run_mlp(true);
  EXPECT_TRUE(torch::equal(plain.x, ckpt.x));
  EXPECT_TRUE(torch::equal(plain.w1, ckpt.w1));
  EXPECT_TRUE(torch::equal(plain.b2, ckpt.b2));
  // The recomputation drew the same dropout mask from the saved state and gave the generator its
  // state back: the next draw is the same as without checkpointing.
  EXPECT_TRUE(torch::equal(plain.rng_after, ckpt.rng_after));
}

// The zbv pipeline's split backward over a checkpointed block: B = grad w.r.t. the input with
// retain_graph, then W = backward into the parameters. The node keeps its inputs across the
// retained pass (released by the engine only when the graph is not kept) and recomputes again with
// the same dropout mask: input and weight gradients bit-identical to the plain whole backward.
TEST(ActivationCheckpoint, RetainedGraphSplitBackwardIsBitIdentical) {
  Grads plain = run_mlp(false);
  torch::manual_seed(7);
  CkptMlp mlp;
  torch::manual_seed(11);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto y = booster::nn::checkpoint([&](const std::vector<torch::Tensor>& in) { return mlp->forward(in[0]); }, {x},
                                   mlp->parameters());
  auto loss = (y * y).sum();
  auto dx = torch::autograd::grad({loss}, {x}, {}, /*retain_graph=*/true)[0];
  EXPECT_FALSE(mlp->fc1->weight.grad().defined());  // B leaves the weights alone
  torch::autograd::backward({loss}, {}, /*retain_graph=*/false, /*create_graph=*/false, mlp->parameters());
  EXPECT_EQ(mlp->calls, 3);  // forward, B's recomputation, W's recomputation
  EXPECT_TRUE(torch::equal(plain.x, dx));
  EXPECT_TRUE(torch::equal(plain.w1, mlp->fc1->weight.grad()));
  EXPECT_TRUE(torch::equal(plain.b2, mlp->fc2->bias.grad()));
}

TEST(ActivationCheckpoint, WithoutGradModeOrGradsTheFunctionJustRuns) {
  CkptMlp mlp;
  auto x = torch::randn({2, 8});
  {
    torch::NoGradGuard no_grad;
    auto y = booster::nn::checkpoint([&](const std::vector<torch::Tensor>& in) { return mlp->forward(in[0]); }, {x},
                                     mlp->parameters());
    EXPECT_FALSE(y.requires_grad());
  }
  EXPECT_EQ(mlp->calls, 1);
  EXPECT_THROW(booster::nn::checkpoint([](const std::vector<torch::Tensor>&) { return torch::Tensor(); }, {x}, {}),
               std::invalid_argument);
}

// A result that is the input itself gets its own storage (the edge must not rewrite x's history).
TEST(ActivationCheckpoint, IdentityFunctionPassesTheGradientThrough) {
  auto x = torch::randn({3}, torch::requires_grad());
  auto y = booster::nn::checkpoint([](const std::vector<torch::Tensor>& in) { return in[0]; }, {x}, {});
  (y * 2).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({3}, 2.0)));
}

// Records the unit protocol's calls.
struct RecordingHooks : booster::nn::UnitHooks {
  std::vector<std::string> calls;
  void pre_forward(booster::nn::UnitBase&) override { calls.push_back("pre_forward"); }
  void post_forward(booster::nn::UnitBase&) override { calls.push_back("post_forward"); }
  void pre_backward(booster::nn::UnitBase&) override { calls.push_back("pre_backward"); }
  void post_backward(booster::nn::UnitBase&) override { calls.push_back("post_backward"); }
};

struct TwoUnitsImpl : torch::nn::Module {
  TwoUnitsImpl() {
    a = register_module("a", booster::nn::Unit<CkptMlp>());
    b = register_module("b", booster::nn::Unit<CkptMlp>());
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(a(x)); }
  booster::nn::Unit<CkptMlp> a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoUnits);

std::vector<torch::Tensor> unit_grads(bool checkpoint_a, const std::shared_ptr<RecordingHooks>& hooks = nullptr) {
  torch::manual_seed(3);
  TwoUnits net;
  net->a->set_unit_checkpoint(checkpoint_a);
  if (hooks) net->a->set_unit_hooks(hooks);
  torch::manual_seed(5);
  auto x = torch::randn({4, 8}, torch::requires_grad());
  net->forward(x).pow(2).sum().backward();
  std::vector<torch::Tensor> out{x.grad()};
  for (const auto& p : net->parameters()) out.push_back(p.grad());
  EXPECT_EQ(net->a->calls, checkpoint_a ? 2 : 1);
  EXPECT_EQ(net->b->calls, 1);
  return out;
}

TEST(ActivationCheckpoint, UnitCheckpointsItselfBitIdentically) {
  auto plain = unit_grads(false), ckpt = unit_grads(true);
  ASSERT_EQ(plain.size(), ckpt.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], ckpt[i])) << "gradient " << i;
}

TEST(ActivationCheckpoint, UnitPreBackwardRunsBeforeTheRecomputation) {
  auto hooks = std::make_shared<RecordingHooks>();
  auto ckpt = unit_grads(true, hooks);
  auto plain = unit_grads(false);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(plain[i], ckpt[i])) << "gradient " << i;
  // The forward's protocol, then in backward pre_backward (in the outer pass, before the
  // recomputation, which runs the bare block on the gathered unit).
  EXPECT_THAT(hooks->calls, ElementsAre("pre_forward", "post_forward", "pre_backward"));
}

struct TwoInputsImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y) { return x + y; }
};
TORCH_MODULE(TwoInputs);

TEST(ActivationCheckpoint, UnitWithAnotherForwardSignatureIsRefusedByName) {
  booster::nn::Unit<TwoInputs> unit;
  unit->set_unit_checkpoint(true);
  auto x = torch::randn({2}, torch::requires_grad());
  try {
    unit->forward(x, x);
    FAIL() << "checkpointed a two-input block";
  } catch (const std::logic_error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("TwoInputsImpl"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("one tensor"));
  }
  torch::NoGradGuard no_grad;  // without grad mode nothing is checkpointed: it runs
  EXPECT_EQ(unit->forward(x, x).size(0), 2);
}

}  // namespace
