// precision_test.cpp — mixed precision components and the optimizer wrapper's scaling logic in one
// process: fp16 refused on CPU, bf16 autocast, fp32 master weights, overflow skip with a dynamic
// loss scaler (injected inf), fused unscale + clip, wrapper state.
#include <ATen/autocast_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>

#include "booster/booster.h"
#include "booster/mixed_precision/grad_scaler.h"
#include "booster/mixed_precision/precision.h"

using namespace booster;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

Booster ddp_booster(const std::string& precision) {
  ::unsetenv("RANK");
  ::setenv("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR, 1);
  return Booster(Config::from_string("[booster]\nplugin = \"torch_ddp\"\nmixed_precision = \"" + precision + "\"\n"));
}

struct Thrower : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor&) { throw std::runtime_error("forward failed"); }
};

std::shared_ptr<mixed_precision::DynamicGradScaler> scaler(double initial, int64_t hysteresis = 1) {
  mixed_precision::DynamicGradScalerOptions o;
  o.initial_scale = initial;
  o.hysteresis = hysteresis;
  return std::make_shared<mixed_precision::DynamicGradScaler>(o);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Precision components through the Booster

TEST(Precision, Fp16OnCpuFailsAtBoostWithAHintToUseBf16) {
  auto booster = ddp_booster("fp16");
  auto net = torch::nn::Linear(4, 2);
  EXPECT_THAT([&] { booster.boost(net); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr("needs a CUDA device"), HasSubstr("booster.device = \"cuda\""),
                                               HasSubstr("\"bf16\""))));
  EXPECT_EQ(net->weight.scalar_type(), torch::kFloat);  // nothing was cast
}

TEST(Precision, Bf16RunsForwardUnderCpuAutocastWithFloat32WeightsAndLoss) {
  auto booster = ddp_booster("bf16");
  torch::manual_seed(0);
  auto net = torch::nn::Linear(8, 3);
  auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  booster::Criterion mse = [](const torch::Tensor& y, const torch::Tensor& t) { return torch::mse_loss(y, t); };
  auto b = booster.boost(net, opt, mse);
  auto x = torch::randn({5, 8});
  auto y = b.model.forward(x);
  EXPECT_EQ(y.scalar_type(), torch::kBFloat16);             // linear ran in bf16
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));              // and autocast ended with forward
  // The bf16 result equals the float computation within bf16 rounding (8 bits of mantissa).
  EXPECT_TRUE(torch::allclose(y.to(torch::kFloat), net->forward(x), 0.02, 0.02));
  auto loss = b.criterion(y, torch::zeros({5, 3}));
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);             // the boosted criterion computes in fp32
  booster.backward(loss, *b.optimizer);
  EXPECT_EQ(net->weight.scalar_type(), torch::kFloat);      // weights stay fp32: they are the masters
  EXPECT_EQ(net->weight.grad().scalar_type(), torch::kFloat);
  EXPECT_TRUE(b.optimizer->step());
}

TEST(Precision, Bf16AutocastEndsWhenForwardThrows) {
  auto booster = ddp_booster("bf16");
  auto b = booster.boost(std::make_shared<Thrower>());
  EXPECT_THROW(b.model.forward(torch::ones({1})), std::runtime_error);
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
}

TEST(Precision, UnknownPrecisionAndBadScalerOptionsAreConfigErrors) {
  Options empty("mixed_precision");
  EXPECT_THROW(mixed_precision::make_mixed_precision("fp8", empty), ConfigError);
  auto c = Config::from_string("[mixed_precision]\ninitial_scale = 8.0\nmin_scale = 16.0\n");
  EXPECT_THAT([&] { mixed_precision::make_mixed_precision("fp16", c.section("mixed_precision")); },
              ThrowsMessage<ConfigError>(HasSubstr("[mixed_precision]")));
}

// ---------------------------------------------------------------------------------------------
// Optimizer wrapper: master weights

TEST(OptimizerWrapper, Fp32MasterWeightsKeepUpdatesThatBf16WeightsWouldLose) {
  // w = 1 in bf16, gradient 1, lr 1e-4: 1 - 1e-4 rounds back to 1 in bf16 (8-bit mantissa), so plain
  // bf16 SGD never moves; with fp32 master weights the master reaches 1 - 100 * 1e-4 = 0.99.
  auto w = torch::ones({4}, torch::kBFloat16).set_requires_grad(true);
  auto opt = std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{w}, torch::optim::SGDOptions(1e-4));
  OptimizerWrapper wrapper(opt, nullptr);
  for (int i = 0; i < 100; ++i) {
    wrapper.backward(w.to(torch::kFloat).sum());
    ASSERT_TRUE(wrapper.step());
    wrapper.zero_grad();
  }
  auto master = opt->param_groups()[0].params()[0];
  EXPECT_EQ(master.scalar_type(), torch::kFloat);
  EXPECT_NEAR(master[0].item<double>(), 0.99, 1e-5);  // 100 float32 subtractions
  EXPECT_TRUE(torch::equal(w.detach(), master.detach().to(torch::kBFloat16)));  // model = rounded master
  EXPECT_LT(w[0].item<double>(), 1.0);

  auto w2 = torch::ones({4}, torch::kBFloat16).set_requires_grad(true);
  auto opt2 = std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{w2}, torch::optim::SGDOptions(1e-4));
  OptimizerWrapperOptions no_master;
  no_master.master_weights = false;
  OptimizerWrapper plain(opt2, nullptr, no_master);
  for (int i = 0; i < 100; ++i) {
    plain.backward(w2.to(torch::kFloat).sum());
    plain.step();
    plain.zero_grad();
  }
  EXPECT_EQ(w2[0].item<double>(), 1.0);  // the update was lost every time
}

// ---------------------------------------------------------------------------------------------
// Optimizer wrapper: loss scaling

TEST(OptimizerWrapper, OverflowSkipsTheStepZeroesGradsAndBacksOffThenTrainingProceeds) {
  torch::manual_seed(1);
  auto net = torch::nn::Linear(3, 2), ref = torch::nn::Linear(3, 2);
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < ref->parameters().size(); ++i) ref->parameters()[i].copy_(net->parameters()[i]);
  }
  auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto ref_opt = std::make_shared<torch::optim::SGD>(ref->parameters(), torch::optim::SGDOptions(0.1));
  OptimizerWrapperOptions o;
  o.scaler = scaler(1024);
  OptimizerWrapper wrapper(opt, nullptr, o);
  auto x = torch::randn({6, 3});

  // Step 1: an inf gradient (injected) -> skipped, parameters unchanged, grads zeroed, scale halved.
  auto before = net->weight.detach().clone();
  wrapper.backward(net->forward(x).pow(2).mean());
  EXPECT_NEAR(net->weight.grad().abs().sum().item<double>(),
              1024 * [&] { auto l = ref->forward(x).pow(2).mean(); l.backward(); auto s = ref->weight.grad().abs().sum().item<double>(); ref_opt->zero_grad(); return s; }(),
              1e-2);  // the loss was scaled by 1024
  net->bias.grad()[0] = std::nan("");
  EXPECT_FALSE(wrapper.step());
  EXPECT_TRUE(torch::equal(net->weight.detach(), before));
  EXPECT_EQ(net->weight.grad().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(wrapper.loss_scale(), 512.0);
  EXPECT_EQ(wrapper.skipped_steps(), 1);

  // Step 2: clean -> the update equals unscaled SGD exactly (power-of-two scale).
  wrapper.zero_grad();
  wrapper.backward(net->forward(x).pow(2).mean());
  EXPECT_TRUE(wrapper.step());
  ref->forward(x).pow(2).mean().backward();
  ref_opt->step();
  EXPECT_TRUE(torch::equal(net->weight.detach(), ref->weight.detach()));
  EXPECT_TRUE(torch::equal(net->bias.detach(), ref->bias.detach()));
}

TEST(OptimizerWrapper, ClipByNormUnderLossScalingReturnsTheUnscaledNormAndClipsLikeLibTorch) {
  torch::manual_seed(2);
  auto net = torch::nn::Linear(5, 4), ref = torch::nn::Linear(5, 4);
  {
    torch::NoGradGuard g;
    for (size_t i = 0; i < ref->parameters().size(); ++i) ref->parameters()[i].copy_(net->parameters()[i]);
  }
  auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  OptimizerWrapperOptions o;
  o.scaler = scaler(65536);
  OptimizerWrapper wrapper(opt, nullptr, o);
  auto x = torch::randn({7, 5});
  for (double norm_type : {2.0, static_cast<double>(INFINITY)}) {
    wrapper.zero_grad();
    for (auto& p : ref->parameters()) p.mutable_grad() = torch::Tensor();
    wrapper.backward(net->forward(x).pow(2).sum());
    ref->forward(x).pow(2).sum().backward();
    double want = torch::nn::utils::clip_grad_norm_(ref->parameters(), 0.1, norm_type);
    double got = wrapper.clip_grad_by_norm(0.1, norm_type);
    EXPECT_NEAR(got, want, 1e-5 * want) << "norm_type " << norm_type;
    EXPECT_GT(want, 0.1);
    EXPECT_EQ(wrapper.last_grad_norm(), got);
    for (size_t i = 0; i < ref->parameters().size(); ++i)
      EXPECT_TRUE(torch::allclose(net->parameters()[i].grad(), ref->parameters()[i].grad(), 1e-5, 1e-7));
  }
}

// The arithmetic step() runs on a device (OptimizerWrapper::clip_on_device: detail::clip_coefficient
// and detail::scale_gradients, no host synchronisation), here on CPU tensors: the same bits as the
// host path's coefficient (computed in double) and products, for float32, float64 and bfloat16
// gradients, clipped, not clipped, non-finite and unscale-only.
TEST(OptimizerWrapper, DeviceClipArithmeticEqualsTheHostPathBitForBit) {
  torch::manual_seed(3);
  const double inv_scale = 1.0 / 1024;
  struct Case {
    double total, max_norm;
  };
  for (const Case c : {Case{5.0, 1.0}, Case{0.25, 1.0}, Case{INFINITY, 1.0}, Case{NAN, 1.0}, Case{5.0, 0.0}}) {
    double want_coef = inv_scale;  // the host path (fused_unscale_clip)
    if (std::isfinite(c.total) && c.max_norm > 0) {
      const double clip = c.max_norm / (c.total + 1e-6);
      if (clip < 1.0) want_coef *= clip;
    }
    const at::Tensor coef = booster::detail::clip_coefficient(torch::full({}, c.total, torch::kDouble), inv_scale, c.max_norm);
    ASSERT_EQ(coef.scalar_type(), at::kDouble);
    ASSERT_EQ(coef.dim(), 0);
    EXPECT_EQ(coef.item<double>(), want_coef) << "total " << c.total << " max_norm " << c.max_norm;

    std::vector<at::Tensor> grads{torch::randn({37}) * 100, torch::randn({3, 5}, torch::kDouble),
                                  torch::randn({64}).to(at::kBFloat16), torch::randn({2, 2})};
    std::vector<at::Tensor> want;
    for (const auto& g : grads) {
      // float32 / float64: mul_ by the double (the host path's CPU arithmetic); bfloat16: the product
      // in float32 rounded once (the CUDA multi-tensor scale's arithmetic, the host path on a GPU).
      if (g.scalar_type() == at::kBFloat16)
        want.push_back(g.to(at::kFloat).mul_(static_cast<float>(want_coef)).to(at::kBFloat16));
      else
        want.push_back(g.clone().mul_(want_coef));
    }
    booster::detail::scale_gradients(grads, coef);
    for (size_t i = 0; i < grads.size(); ++i)
      EXPECT_TRUE(at::equal(grads[i], want[i])) << "gradient " << i << " (" << grads[i].scalar_type() << "), total "
                                                 << c.total << ", max |diff| "
                                                 << (grads[i] - want[i]).abs().max().item<double>();
  }
}

TEST(OptimizerWrapper, StateRoundTripAndMismatchErrors) {
  auto w = torch::ones({2}, torch::kFloat).set_requires_grad(true);
  auto make = [&](bool with_scaler) {
    auto opt = std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{w}, torch::optim::SGDOptions(0.1));
    OptimizerWrapperOptions o;
    if (with_scaler) o.scaler = scaler(256, 2);
    return std::make_unique<OptimizerWrapper>(opt, nullptr, o);
  };
  auto a = make(true);
  a->backward(w.sum());
  w.grad()[0] = INFINITY;
  a->step();  // overflow 1 (absorbed by hysteresis 2)
  a->backward(w.sum());
  w.grad()[0] = INFINITY;
  a->step();  // overflow 2 -> 128
  auto state = a->state_dict();
  ASSERT_TRUE(state.scaler.has_value());
  EXPECT_EQ(state.scaler->scale, 128.0);
  EXPECT_EQ(state.skipped_steps, 2);
  auto b = make(true);
  b->load_state_dict(state);
  EXPECT_EQ(b->loss_scale(), 128.0);
  EXPECT_EQ(b->skipped_steps(), 2);
  EXPECT_THAT([&] { make(false)->load_state_dict(state); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("has loss-scaler state but this optimizer has no loss scaler")));
}

TEST(OptimizerWrapper, RejectsLbfgsAndBadOptions) {
  auto w = torch::ones({2}).set_requires_grad(true);
  auto lbfgs = std::make_shared<torch::optim::LBFGS>(std::vector<torch::Tensor>{w});
  EXPECT_THAT([&] { OptimizerWrapper x(lbfgs, nullptr); }, ThrowsMessage<std::invalid_argument>(HasSubstr("LBFGS")));
  auto sgd = std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{w}, torch::optim::SGDOptions(0.1));
  OptimizerWrapperOptions bad;
  bad.max_norm = -1;
  EXPECT_THROW(OptimizerWrapper(sgd, nullptr, bad), std::invalid_argument);
}

TEST(Precision, CastFloatingPointKeepsIntegerBuffersAndIdentity) {
  torch::nn::BatchNorm1d bn(3);
  torch::nn::Linear fc(3, 2);
  const at::Tensor weight = fc->weight;  // the same tensor before and after
  booster::mixed_precision::cast_floating_point(*bn, at::kBFloat16);
  booster::mixed_precision::cast_floating_point(*fc, at::kBFloat16);
  EXPECT_EQ(bn->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(bn->running_mean.scalar_type(), at::kBFloat16);
  EXPECT_EQ(bn->num_batches_tracked.scalar_type(), at::kLong) << "a counter stays an integer";
  EXPECT_EQ(fc->named_parameters()["weight"].unsafeGetTensorImpl(), weight.unsafeGetTensorImpl());
  EXPECT_EQ(weight.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(weight.requires_grad());
  EXPECT_THROW(booster::mixed_precision::cast_floating_point(*fc, at::kInt), std::invalid_argument);
}

TEST(Precision, DtypeFromNameMapsConfigNames) {
  using booster::mixed_precision::dtype_from_name;
  EXPECT_EQ(dtype_from_name("fp32"), at::kFloat);
  EXPECT_EQ(dtype_from_name("bf16"), at::kBFloat16);
  EXPECT_EQ(dtype_from_name("fp16"), at::kHalf);
  EXPECT_EQ(dtype_from_name(""), at::ScalarType::Undefined);
  EXPECT_THROW(dtype_from_name("float32"), std::invalid_argument);
}

TEST(Precision, CommunicationDtypeOptionAcceptsColossalAIsAliasAndRefusesDisagreement) {
  using booster::mixed_precision::communication_dtype_option;
  using booster::mixed_precision::dtype_from_name;
  EXPECT_EQ(dtype_from_name("fp8"), at::kFloat8_e4m3fn);
  const std::vector<std::string> choices{"", "fp32", "bf16", "fp8"};
  auto section = [](const std::string& body) { return Config::from_string("[plugin]\n" + body).section("plugin"); };
  EXPECT_EQ(communication_dtype_option(section(""), choices), "");
  EXPECT_EQ(communication_dtype_option(section("communication_dtype = \"bf16\"\n"), choices), "bf16");
  EXPECT_EQ(communication_dtype_option(section("fp8_communication = true\n"), choices), "fp8");
  EXPECT_EQ(communication_dtype_option(section("fp8_communication = true\ncommunication_dtype = \"fp8\"\n"), choices), "fp8");
  EXPECT_EQ(communication_dtype_option(section("fp8_communication = false\ncommunication_dtype = \"bf16\"\n"), choices),
            "bf16");
  try {
    communication_dtype_option(section("fp8_communication = true\ncommunication_dtype = \"bf16\"\n"), choices);
    ADD_FAILURE() << "no error";
  } catch (const booster::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("plugin.fp8_communication = true"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("set only one of them"), std::string::npos) << e.what();
  }
  try {
    communication_dtype_option(section("fp8_communication = false\ncommunication_dtype = \"fp8\"\n"), choices);
    ADD_FAILURE() << "no error";
  } catch (const booster::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("remove fp8_communication or set it to true"), std::string::npos) << e.what();
  }
  EXPECT_THROW(communication_dtype_option(section("communication_dtype = \"fp16\"\n"), choices), booster::ConfigError);
}
