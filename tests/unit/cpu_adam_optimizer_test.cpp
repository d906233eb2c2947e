// cpu_adam_optimizer_test.cpp — booster::optim::CPUAdam / HybridAdam (booster/optim/cpu_adam.h):
// equal to torch::optim::AdamW / Adam within kAdamMaxUlp float32 ulps over several steps under an LR
// scheduler; step_parameter with a bf16 gradient and a bf16 output copy; the registry entries and a
// checkpoint round trip through CheckpointIO (and an AdamW checkpoint loaded into CPUAdam); the kernel
// step of LibTorch's own Adam / AdamW (step_with_cpu_adam_kernel); refused options and parameters.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/dist/process_group.h"
#include "booster/lr_scheduler.h"
#include "booster/optim/cpu_adam.h"
#include "common/adam_ulps.h"
#include "booster/optim/optimizer_registry.h"
#include "booster/wrappers/optimizer_wrapper.h"
#include "common/small_net.h"
#include "common/test_util.h"
#include "common/tensor_test_util.h"

using namespace booster;
using booster::optim::CPUAdam;
using booster::optim::CPUAdamOptions;
using booster::optim::CPUAdamParamState;
using booster::optim::HybridAdam;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

using booster::testing::world_of_one;

// The kernel's measure and bound against LibTorch: tests/common/adam_ulps.h.
using booster::testing::adam_max_ulp;
using booster::testing::kAdamMaxUlp;

std::vector<at::Tensor> make_params(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> v;
  for (auto shape : std::vector<std::vector<int64_t>>{{17, 33}, {7}, {1000, 101}, {1}})
    v.push_back(at::randn(shape, gen).set_requires_grad(true));
  return v;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> v;
  for (const auto& p : ps) v.push_back(p.detach().clone().set_requires_grad(true));
  return v;
}

void set_grads(std::vector<at::Tensor>& ps, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (auto& p : ps) p.mutable_grad() = at::randn(p.sizes(), gen);
}

template <class State>
const State& state_of(torch::optim::Optimizer& opt, const at::Tensor& p) {
  return static_cast<const State&>(*opt.state().at(optimizer_state_key(p)));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Against LibTorch, with a scheduler and two parameter groups

TEST(CPUAdam, EqualsTorchAdamWAndAdamUnderScheduler) {
  for (bool adamw : {true, false}) {
    auto ours = make_params(1), theirs = clones(ours);
    std::unique_ptr<torch::optim::Optimizer> ref;
    std::unique_ptr<CPUAdam> opt;
    auto second = CPUAdamOptions(3e-3).weight_decay(0.2).adamw_mode(adamw).betas({0.8, 0.99});
    std::vector<torch::optim::OptimizerParamGroup> groups{
        torch::optim::OptimizerParamGroup({ours[0], ours[1]}),
        torch::optim::OptimizerParamGroup({ours[2], ours[3]}, std::make_unique<CPUAdamOptions>(second))};
    auto defaults = CPUAdamOptions(1e-2).weight_decay(0.01).adamw_mode(adamw);
    if (adamw) {
      opt = std::make_unique<CPUAdam>(std::move(groups), defaults);
      std::vector<torch::optim::OptimizerParamGroup> tg{
          torch::optim::OptimizerParamGroup({theirs[0], theirs[1]}),
          torch::optim::OptimizerParamGroup({theirs[2], theirs[3]}, std::make_unique<torch::optim::AdamWOptions>(
                                                                         torch::optim::AdamWOptions(3e-3).weight_decay(0.2).betas({0.8, 0.99})))};
      ref = std::make_unique<torch::optim::AdamW>(std::move(tg), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
    } else {
      opt = std::make_unique<HybridAdam>(std::move(groups), defaults);
      std::vector<torch::optim::OptimizerParamGroup> tg{
          torch::optim::OptimizerParamGroup({theirs[0], theirs[1]}),
          torch::optim::OptimizerParamGroup({theirs[2], theirs[3]}, std::make_unique<torch::optim::AdamOptions>(
                                                                         torch::optim::AdamOptions(3e-3).weight_decay(0.2).betas({0.8, 0.99})))};
      ref = std::make_unique<torch::optim::Adam>(std::move(tg), torch::optim::AdamOptions(1e-2).weight_decay(0.01));
    }
    CosineAnnealingLR sched_ours(*opt, 5, 1e-4), sched_theirs(*ref, 5, 1e-4);
    int64_t worst = 0;
    for (int step = 0; step < 6; ++step) {
      set_grads(ours, 40 + step);
      set_grads(theirs, 40 + step);
      opt->step();
      ref->step();
      sched_ours.step();
      sched_theirs.step();
      for (size_t i = 0; i < ours.size(); ++i) worst = std::max(worst, adam_max_ulp(ours[i].detach(), theirs[i].detach()));
    }
    EXPECT_LE(worst, kAdamMaxUlp) << (adamw ? "CPUAdam vs AdamW" : "HybridAdam (adamw_mode false) vs Adam");
    std::cout << "[ measured ] " << (adamw ? "CPUAdam vs AdamW" : "HybridAdam vs Adam")
              << " over 6 steps with CosineAnnealingLR: max " << worst << " ulp\n";
    EXPECT_EQ(opt->param_groups()[1].options().get_lr(), ref->param_groups()[1].options().get_lr());
    EXPECT_EQ(state_of<CPUAdamParamState>(*opt, ours[2]).step(), 6);
    EXPECT_FALSE(at::equal(ours[2], make_params(1)[2]));  // it moved
  }
}

// step_parameter: a bf16 gradient with a div_scale equals the fp32 step on the exactly widened,
// divided gradient; the bf16 output is the updated parameter rounded.
TEST(CPUAdam, StepParameterWithBf16GradientAndOutput) {
  auto a = make_params(2), b = clones(a);
  CPUAdam oa(a, CPUAdamOptions(1e-3).weight_decay(0.01)), ob(b, CPUAdamOptions(1e-3).weight_decay(0.01));
  for (int step = 0; step < 3; ++step) {
    set_grads(b, 70 + step);
    for (size_t i = 0; i < a.size(); ++i) {
      auto g16 = (b[i].grad() * 512).to(at::kBFloat16);
      b[i].mutable_grad() = g16.to(at::kFloat) / 512;  // exact: 512 is a power of two
      auto out = at::empty({a[i].numel()}, at::kBFloat16);
      oa.step_parameter(a[i], g16, 512.0, out);
      EXPECT_TRUE(at::equal(out.view(at::kShort), a[i].detach().reshape({-1}).to(at::kBFloat16).view(at::kShort)));
    }
    ob.step();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << "param " << i << " step " << step;
  }
  auto stranger = at::zeros({3});
  EXPECT_THAT([&] { oa.step_parameter(stranger, at::zeros({3})); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("not a parameter of this optimizer")));
  EXPECT_THAT([&] { oa.step_parameter(a[1], at::zeros({5})); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("float32 or bfloat16 CPU tensor of 7 elements")));
  EXPECT_THAT([&] { oa.step_parameter(a[1], at::zeros({7}), 0.0); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("div_scale must be finite and > 0")));
  EXPECT_THAT([&] { oa.step_parameter(a[1], at::zeros({7}), 1.0, at::empty({7})); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("param_bf16_out must be a contiguous bfloat16")));
}

TEST(CPUAdam, RefusesAmsgradAndWrongParameters) {
  auto p = make_params(3);
  EXPECT_THAT([&] { CPUAdam(p, CPUAdamOptions().amsgrad(true)); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("amsgrad is not supported"), HasSubstr("torch::optim::AdamW"))));
  EXPECT_THAT([&] { HybridAdam(p, CPUAdamOptions().betas({0.9, 1.0})); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("betas must be in [0, 1)")));
  for (auto dtype : {at::kDouble, at::kBFloat16}) {
    auto q = at::zeros({4}, dtype).set_requires_grad(true);
    q.mutable_grad() = at::ones({4}, dtype);
    CPUAdam opt({q});
    EXPECT_THAT([&] { opt.step(); }, ThrowsMessage<std::invalid_argument>(AllOf(
                                         HasSubstr("contiguous float32 CPU parameters"), HasSubstr(c10::toString(dtype)))));
  }
  auto strided = at::zeros({4, 4}).t().set_requires_grad(true);
  strided.mutable_grad() = at::ones({4, 4});
  CPUAdam opt({strided});
  EXPECT_THAT([&] { opt.step(); }, ThrowsMessage<std::invalid_argument>(HasSubstr("not contiguous")));
}

// ---------------------------------------------------------------------------------------------
// Registry and checkpoints

TEST(CPUAdam, RegisteredWithAdamWKeys) {
  auto p = make_params(4);
  CPUAdam c(p);
  HybridAdam h(p);
  EXPECT_EQ(optimizer_type_info(c).name(), "CPUAdam");
  EXPECT_EQ(optimizer_type_info(h).name(), "HybridAdam");
  EXPECT_EQ(optimizer_type_info("HybridAdam").tensor_keys(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  const auto& info = optimizer_type_info(c);
  auto j = info.options_to_json(c.param_groups()[0].options());
  EXPECT_EQ(j.dump(), R"({"adamw_mode":true,"betas":[0.9,0.999],"bias_correction":true,"eps":1e-08,"lr":0.001,"weight_decay":0.0})");
  CPUAdamOptions o;
  info.options_from_json(nlohmann::json::parse(R"({"lr":0.5,"betas":[0.5,0.6],"eps":1e-3,"weight_decay":0.1,"amsgrad":false})"), o);
  EXPECT_EQ(o.lr(), 0.5);
  EXPECT_TRUE(o.adamw_mode());  // absent (an AdamW group): unchanged
  EXPECT_THAT([&] { info.options_from_json(nlohmann::json::parse(R"({"lr":0.5,"betas":[0.5,0.6],"eps":1e-3,"weight_decay":0.1,"amsgrad":true})"), o); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("amsgrad = true")));
  EXPECT_EQ(info.state_tensors_per_element(o), 2);
}

namespace {

struct CpuAdamTrainer : booster::testing::NetTrainer {
  CpuAdamTrainer() {
    torch::manual_seed(3);
    net = booster::testing::Net();
    opt = std::make_shared<CPUAdam>(net->parameters(), CPUAdamOptions(1e-2).weight_decay(0.1));
    wrap();
  }
};

}  // namespace

// Save after 3 steps, load into a fresh CPUAdam: the gathered state is equal, and 2 more steps equal
// the uninterrupted run bit for bit.
TEST(CPUAdam, CheckpointRoundTripThroughRegistry) {
  booster::testing::TempDir dir;
  checkpoint::CheckpointIO io(world_of_one());
  CpuAdamTrainer full, first, resumed;
  full.steps(5, 0);
  first.steps(3, 0);
  io.save_model(*first.net, dir.file("model"), {});
  io.save_optimizer(*first.wrapper, dir.file("opt"), {});
  io.load_model(*resumed.net, dir.file("model"));
  io.load_optimizer(*resumed.wrapper, dir.file("opt"));
  auto saved = first.wrapper->gather_param_states(), loaded = resumed.wrapper->gather_param_states();
  ASSERT_EQ(saved.size(), loaded.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(saved[i].scalars, loaded[i].scalars);
    EXPECT_EQ(loaded[i].scalars.at("step"), 3);
    for (const auto& key : {"exp_avg", "exp_avg_sq"}) EXPECT_TRUE(at::equal(saved[i].tensor(key), loaded[i].tensor(key)));
  }
  resumed.steps(2, 3);
  auto pf = full.net->parameters(), pr = resumed.net->parameters();
  for (size_t i = 0; i < pf.size(); ++i) EXPECT_TRUE(at::equal(pf[i], pr[i])) << "param " << i;

}

// LibTorch's own Adam / AdamW stepped through the kernel: the same result as their step() within
// kAdamMaxUlp, the state stays theirs; amsgrad and non-fp32 parameters are declined (nothing changed).
TEST(CPUAdam, StepWithKernelOnTorchOptimizers) {
  auto a = make_params(5), b = clones(a);
  torch::optim::AdamW oa(a, torch::optim::AdamWOptions(1e-2)), ob(b, torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 3; ++step) {
    set_grads(a, 90 + step);
    set_grads(b, 90 + step);
    EXPECT_TRUE(optim::step_with_cpu_adam_kernel(oa));
    ob.step();
  }
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(adam_max_ulp(a[i].detach(), b[i].detach()), kAdamMaxUlp);
  EXPECT_EQ(state_of<torch::optim::AdamWParamState>(oa, a[0]).step(), 3);

  auto c = make_params(6);
  torch::optim::Adam ams(c, torch::optim::AdamOptions().amsgrad(true));
  set_grads(c, 1);
  auto before = c[0].detach().clone();
  EXPECT_FALSE(optim::step_with_cpu_adam_kernel(ams));
  EXPECT_TRUE(at::equal(before, c[0]));
  torch::optim::SGD sgd(c, torch::optim::SGDOptions(0.1));
  EXPECT_FALSE(optim::step_with_cpu_adam_kernel(sgd));
  auto d = at::zeros({3}, at::kDouble).set_requires_grad(true);
  d.mutable_grad() = at::ones({3}, at::kDouble);
  torch::optim::Adam dbl({d}, torch::optim::AdamOptions());
  EXPECT_FALSE(optim::step_with_cpu_adam_kernel(dbl));
  EXPECT_TRUE(dbl.state().empty());
}

// The fused per-parameter step (Gemini's bf16 chunks): a bf16 gradient read as it is and the bf16
// copy written in the same pass equal, bit for bit, LibTorch's own step on grad.to(float32) followed
// by a cast of the parameter; param.grad() is untouched; refused optimizers change nothing.
TEST(CPUAdam, StepParameterWithKernelEqualsTorchStepThenCast) {
  for (bool adamw : {true, false}) {
    auto a = make_params(11), b = clones(a);
    std::unique_ptr<torch::optim::Optimizer> oa, ob;
    if (adamw) {
      oa = std::make_unique<torch::optim::AdamW>(a, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
      ob = std::make_unique<torch::optim::AdamW>(b, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    } else {
      oa = std::make_unique<torch::optim::Adam>(a, torch::optim::AdamOptions(1e-2).weight_decay(0.1));
      ob = std::make_unique<torch::optim::Adam>(b, torch::optim::AdamOptions(1e-2).weight_decay(0.1));
    }
    for (int step = 0; step < 3; ++step) {
      set_grads(b, 120 + step);
      for (size_t i = 0; i < a.size(); ++i) {
        auto g16 = b[i].grad().to(at::kBFloat16);
        b[i].mutable_grad() = g16.to(at::kFloat);
        auto out = at::empty({a[i].numel()}, at::kBFloat16);
        EXPECT_TRUE(optim::step_parameter_with_cpu_adam_kernel(*oa, a[i], g16, out));
        EXPECT_FALSE(a[i].grad().defined());
        EXPECT_TRUE(at::equal(out.view(at::kShort), a[i].detach().reshape({-1}).to(at::kBFloat16).view(at::kShort)))
            << "param " << i << " step " << step;
      }
      ob->step();
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_LE(adam_max_ulp(a[i].detach(), b[i].detach()), kAdamMaxUlp) << (adamw ? "AdamW" : "Adam") << " param " << i;
    }
    EXPECT_THAT([&] { optim::step_parameter_with_cpu_adam_kernel(*oa, at::zeros({3}), at::zeros({3})); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("not a parameter of this")));
    EXPECT_THAT([&] { optim::step_parameter_with_cpu_adam_kernel(*oa, a[1], at::zeros({5})); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("float32 or bfloat16 CPU tensor of 7 elements")));
    EXPECT_THAT([&] { optim::step_parameter_with_cpu_adam_kernel(*oa, a[1], at::zeros({7}), at::empty({7})); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("param_bf16_out must be a contiguous bfloat16")));
  }
  auto c = make_params(12);
  CPUAdam cpu(c, CPUAdamOptions(1e-2));
  auto out = at::empty({c[1].numel()}, at::kBFloat16);
  EXPECT_TRUE(optim::step_parameter_with_cpu_adam_kernel(cpu, c[1], at::ones({7}, at::kBFloat16), out));
  EXPECT_EQ(state_of<CPUAdamParamState>(cpu, c[1]).step(), 1);
  torch::optim::Adam ams(c, torch::optim::AdamOptions().amsgrad(true));
  auto before = c[0].detach().clone();
  EXPECT_FALSE(optim::step_parameter_with_cpu_adam_kernel(ams, c[0], at::ones_like(c[0])));
  EXPECT_TRUE(at::equal(before, c[0]));
  EXPECT_TRUE(ams.state().empty());
  torch::optim::SGD sgd(c, torch::optim::SGDOptions(0.1));
  EXPECT_FALSE(optim::step_parameter_with_cpu_adam_kernel(sgd, c[0], at::ones_like(c[0])));
}
