// loss_scaling_test.cpp — the loss scaler as a decorator of a step (mixed_precision/loss_scaling.h):
// the scaled loss, a clean step run with 1/scale (or 1 once the caller unscaled), an overflowing one
// skipped and counted with the scale backed off, the overflow agreed across ranks (one rank's inf
// skips the step on both), the state and count restored; and OptimizerWrapper's fp16 step through
// it equals the loop written out (scale the loss, check, divide, step).
#include "booster/mixed_precision/loss_scaling.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <limits>
#include <memory>
#include <vector>

#include "booster/dist/process_group.h"
#include "booster/wrappers/optimizer_wrapper.h"
#include "common/thread_ranks.h"

using booster::mixed_precision::DynamicGradScaler;
using booster::mixed_precision::DynamicGradScalerOptions;
using booster::mixed_precision::LossScaling;

namespace {

std::shared_ptr<DynamicGradScaler> scaler(double initial, int64_t hysteresis = 1, int64_t growth_interval = 2) {
  DynamicGradScalerOptions o;
  o.initial_scale = initial;
  o.hysteresis = hysteresis;
  o.growth_interval = growth_interval;
  return std::make_shared<DynamicGradScaler>(o);
}

}  // namespace

TEST(LossScaling, ScalesTheLossAndRunsACleanStepWithTheInverseScale) {
  LossScaling ls(scaler(1024.0), nullptr);
  auto loss = torch::tensor(0.5);
  EXPECT_EQ(ls.scale_loss(loss).item<double>(), 512.0);
  std::vector<double> seen;
  int skips = 0;
  auto grads = std::vector<at::Tensor>{torch::ones({3})};
  EXPECT_TRUE(ls.step(grads, false, [&](double inv) { seen.push_back(inv); }, [&] { ++skips; }));
  EXPECT_TRUE(ls.step(grads, true, [&](double inv) { seen.push_back(inv); }, [&] { ++skips; }));
  EXPECT_EQ(seen, (std::vector<double>{1.0 / 1024.0, 1.0}));
  EXPECT_EQ(skips, 0);
  EXPECT_EQ(ls.skipped_steps(), 0);
  EXPECT_EQ(ls.scale(), 2048.0);  // two clean steps: growth_interval 2, growth_factor 2
}

TEST(LossScaling, AnOverflowSkipsTheStepCountsItAndBacksOff) {
  LossScaling ls(scaler(1024.0), nullptr);
  int steps = 0, skips = 0;
  auto bad = std::vector<at::Tensor>{torch::tensor({1.0f, std::numeric_limits<float>::infinity()})};
  EXPECT_FALSE(ls.step(bad, false, [&](double) { ++steps; }, [&] { ++skips; }));
  auto nan = std::vector<at::Tensor>{torch::tensor({std::numeric_limits<float>::quiet_NaN()})};
  EXPECT_FALSE(ls.step(nan, false, [&](double) { ++steps; }, [&] { ++skips; }));
  EXPECT_EQ(steps, 0);
  EXPECT_EQ(skips, 2);
  EXPECT_EQ(ls.skipped_steps(), 2);
  EXPECT_EQ(ls.scale(), 256.0);  // hysteresis 1: each overflow halves
  const auto state = ls.scaler_state();
  LossScaling other(scaler(1024.0), nullptr);
  other.load(state, ls.skipped_steps());
  EXPECT_EQ(other.scale(), 256.0);
  EXPECT_EQ(other.skipped_steps(), 2);
  EXPECT_THROW(LossScaling(nullptr, nullptr), std::invalid_argument);
}

TEST(LossScaling, OneRanksOverflowSkipsTheStepOnEveryRank) {
  std::atomic<int> steps{0}, skips{0};
  const auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
    LossScaling ls(scaler(8.0), g);
    const float v = g->rank() == 1 ? std::numeric_limits<float>::infinity() : 1.0f;
    const bool stepped = ls.step({torch::tensor({v})}, false, [&](double) { ++steps; }, [&] { ++skips; });
    if (stepped || ls.skipped_steps() != 1 || ls.scale() != 4.0) throw std::runtime_error("rank did not skip");
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
  EXPECT_EQ(steps.load(), 0);
  EXPECT_EQ(skips.load(), 2);
}

// OptimizerWrapper with a scaler: its step is the stepper's decorated by LossScaling, and equals
// the fp16-style loop written out on fp32 parameters: backward of loss x scale, gradients divided
// by the scale, SGD step; an overflow leaves the weights unchanged and zeroes the gradients.
TEST(LossScaling, TheWrapperStepEqualsTheScaledLoopWrittenOut) {
  torch::manual_seed(3);
  torch::nn::Linear a(4, 2), b(4, 2);
  {
    torch::NoGradGuard ng;
    for (size_t i = 0; i < a->parameters().size(); ++i) b->parameters()[i].copy_(a->parameters()[i]);
  }
  booster::OptimizerWrapperOptions o;
  o.scaler = scaler(64.0);
  booster::OptimizerWrapper w(std::make_shared<torch::optim::SGD>(a->parameters(), torch::optim::SGDOptions(0.1)),
                              nullptr, o);
  torch::optim::SGD ref(b->parameters(), torch::optim::SGDOptions(0.1));
  auto x = torch::randn({3, 4});
  w.backward(a->forward(x).pow(2).mean());
  EXPECT_TRUE(w.step());
  (b->forward(x).pow(2).mean() * 64.0).backward();
  {
    torch::NoGradGuard ng;
    for (auto& p : b->parameters()) p.grad().div_(64.0);
  }
  ref.step();
  for (size_t i = 0; i < a->parameters().size(); ++i)
    EXPECT_TRUE(torch::equal(a->parameters()[i], b->parameters()[i])) << "parameter " << i;
  // An overflow: weights kept, gradients zeroed, the skip counted, the scale halved.
  w.zero_grad();
  const auto before = a->weight.detach().clone();
  w.backward(a->forward(x * std::numeric_limits<float>::infinity()).sum());
  EXPECT_FALSE(w.step());
  EXPECT_TRUE(torch::equal(a->weight.detach(), before));
  EXPECT_EQ(a->weight.grad().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(w.skipped_steps(), 1);
  EXPECT_EQ(w.loss_scale(), 32.0);
}
