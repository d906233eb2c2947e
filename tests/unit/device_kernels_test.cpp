// device_kernels_test.cpp — the device optimizer kernel registry (booster/optim/device_kernels.h) and
// FusedAdam (booster/optim/fused_adam.h) without a GPU: fake kernels registered for the meta device
// (tensors without data) receive FusedAdam's and HybridAdam's multi-tensor calls, and fakes registered
// for the CPU receive the gradient code's (unscale, inf/nan check, clip norm), through the same code a
// CUDA device takes; the errors when no kernels are registered; FusedAdam's refusal of CPU parameters;
// its registry entry "FusedAdam" and its archive layout against torch::optim::AdamW's. The CUDA
// kernels themselves: tests/gpu/gpu_optim_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "booster/device.h"
#include "booster/mixed_precision/grad_scaler.h"
#include "booster/optim/cpu_adam.h"
#include "booster/optim/device_kernels.h"
#include "booster/optim/fused_adam.h"
#include "booster/optim/optimizer_registry.h"
#include "booster/wrappers/optimizer_wrapper.h"

// Everything in a named namespace: the unit tests are a unity build, whose batches put other test
// files (and their helpers) in the same translation unit.
namespace device_kernels_test {

using booster::optim::DeviceAdamConfig;
using booster::optim::DeviceAdamTensors;
using booster::optim::DeviceNorms;
using booster::optim::DeviceOptimizerKernels;
using booster::optim::FusedAdam;
using booster::optim::FusedAdamOptions;
using booster::optim::FusedAdamParamState;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

// What the fakes saw.
struct Log {
  std::vector<DeviceAdamConfig> adam_configs;
  std::vector<DeviceAdamTensors> adam_tensors;
  std::vector<std::vector<at::Tensor>> scale_in;
  std::vector<double> scale_factors;
  std::vector<std::vector<at::Tensor>> norm_in;
};

// Fakes that record their calls; with `compute` (CPU tensors) scale and l2norm also do the work with
// ATen: the scale as mul, the norm summed in float32 (so a sum of squares can overflow, as the CUDA
// kernel's chunk sums can). adam only records (FusedAdam / HybridAdam never pass CPU parameters).
DeviceOptimizerKernels fake_kernels(std::shared_ptr<Log> log, bool compute) {
  DeviceOptimizerKernels k;
  k.name = "fake kernels";
  k.adam = [log](const DeviceAdamConfig& c, const DeviceAdamTensors& t, const at::Tensor&) {
    log->adam_configs.push_back(c);
    log->adam_tensors.push_back(t);
  };
  k.scale = [log, compute](const std::vector<at::Tensor>& in, const std::vector<at::Tensor>& out, double s,
                           const at::Tensor& found_inf) {
    log->scale_in.push_back(in);
    log->scale_factors.push_back(s);
    if (!compute) return;
    for (size_t i = 0; i < in.size(); ++i) {
      if (found_inf.defined() && !at::isfinite(in[i]).all().item<bool>()) found_inf.fill_(1);
      out[i].copy_(in[i].mul(s));
    }
  };
  k.l2norm = [log, compute](const std::vector<at::Tensor>& in, bool per_tensor) {
    log->norm_in.push_back(in);
    DeviceNorms r;
    r.total = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(in.empty() ? at::kCPU : in[0].device().type()));
    if (!compute) return r;
    for (const auto& t : in) r.total.add_(t.to(at::kFloat).pow(2).sum());
    r.total.sqrt_();
    return r;
  };
  return k;
}

// Registers kernels for a device type for the life of the object.
struct Registered {
  c10::DeviceType type;
  Registered(c10::DeviceType t, DeviceOptimizerKernels k) : type(t) {
    booster::optim::register_device_optimizer_kernels(t, std::move(k));
  }
  ~Registered() { booster::optim::unregister_device_optimizer_kernels(type); }
};

at::Tensor meta(std::vector<int64_t> shape) {
  return at::empty(shape, at::TensorOptions().device(at::kMeta)).set_requires_grad(true);
}

void set_meta_grads(const std::vector<at::Tensor>& ps) {
  for (auto p : ps) p.mutable_grad() = at::empty(p.sizes(), at::TensorOptions().device(at::kMeta));
}

std::vector<at::Tensor> cpu_params(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  std::vector<at::Tensor> v;
  for (auto shape : std::vector<std::vector<int64_t>>{{5, 7}, {3}, {64}})
    v.push_back(at::randn(shape, gen).set_requires_grad(true));
  return v;
}

std::vector<at::Tensor> cpu_clones(const std::vector<at::Tensor>& ps) {
  std::vector<at::Tensor> v;
  for (const auto& p : ps) {
    v.push_back(p.detach().clone().set_requires_grad(true));
    if (p.grad().defined()) v.back().mutable_grad() = p.grad().clone();
  }
  return v;
}


// ---------------------------------------------------------------------------------------------
// The registry

TEST(DeviceKernels, RegistrationNeedsAllThreeKernels) {
  auto k = fake_kernels(std::make_shared<Log>(), false);
  k.l2norm = nullptr;
  EXPECT_THAT([&] { booster::optim::register_device_optimizer_kernels(c10::kMeta, k); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("meta"), HasSubstr("l2norm"))));
  EXPECT_EQ(booster::optim::find_device_optimizer_kernels(c10::kMeta), nullptr);
}

TEST(DeviceKernels, NoneRegisteredIsAClearError) {
  EXPECT_EQ(booster::optim::find_device_optimizer_kernels(c10::kMeta), nullptr);
  EXPECT_THAT([] { booster::optim::device_optimizer_kernels(c10::kMeta); },
              ThrowsMessage<std::runtime_error>(
                  AllOf(HasSubstr("no optimizer kernels are registered for meta"),
                        HasSubstr("booster::optim::register_device_optimizer_kernels"))));
  EXPECT_EQ(booster::optim::find_device_optimizer_kernels(c10::kCPU), nullptr);
  EXPECT_THAT([] { booster::optim::device_optimizer_kernels(c10::kCPU); },
              ThrowsMessage<std::runtime_error>(AllOf(HasSubstr("CPU"), HasSubstr("HybridAdam"), HasSubstr("CPUAdam"))));
}

// CUDA's kernels come with CUDA support: present exactly when libbooster_cuda.so loads (here: when the
// CUDA toolkit was found at build time and LibTorch's CUDA libraries load, which needs no GPU).
TEST(DeviceKernels, CudaKernelsComeWithCudaSupport) {
  auto found = booster::optim::find_device_optimizer_kernels(c10::kCUDA);
  EXPECT_EQ(found != nullptr, booster::cuda_support_loaded());
  if (found) {
    EXPECT_THAT(found->name, HasSubstr("libbooster_cuda.so"));
    EXPECT_EQ(booster::optim::device_optimizer_kernels(c10::kCUDA), found);
  } else {
    EXPECT_THAT([] { booster::optim::device_optimizer_kernels(c10::kCUDA); },
                ThrowsMessage<std::runtime_error>(HasSubstr("no optimizer kernels for CUDA tensors")));
  }
}

TEST(DeviceKernels, LastRegistrationWinsAndUnregisterRemoves) {
  auto first = std::make_shared<Log>(), second = std::make_shared<Log>();
  booster::optim::register_device_optimizer_kernels(c10::kMeta, fake_kernels(first, false));
  auto k2 = fake_kernels(second, false);
  k2.name = "second";
  Registered reg(c10::kMeta, k2);
  auto looked_up = booster::optim::device_optimizer_kernels(c10::kMeta);
  EXPECT_EQ(looked_up->name, "second");
  looked_up->l2norm({}, false);
  EXPECT_TRUE(first->norm_in.empty());
  EXPECT_EQ(second->norm_in.size(), 1u);
  booster::optim::unregister_device_optimizer_kernels(c10::kMeta);
  EXPECT_EQ(booster::optim::find_device_optimizer_kernels(c10::kMeta), nullptr);
  EXPECT_EQ(looked_up->name, "second");  // a looked-up entry outlives its removal
}

TEST(DeviceKernels, GroupByDeviceKernelsSplitsPerDevice) {
  Registered reg(c10::kMeta, fake_kernels(std::make_shared<Log>(), false));
  auto m32 = at::empty({4}, at::TensorOptions().device(at::kMeta));
  auto mbf = at::empty({4}, at::TensorOptions().device(at::kMeta).dtype(at::kBFloat16));
  auto mhalf = at::empty({4}, at::TensorOptions().device(at::kMeta).dtype(at::kHalf));
  auto mstrided = at::empty({4, 4}, at::TensorOptions().device(at::kMeta)).t();
  auto c32 = at::zeros({3});
  auto groups = booster::optim::group_by_device_kernels({c32, m32, at::Tensor(), mhalf, mbf, mstrided});
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_TRUE(groups[0].device.is_cpu());
  EXPECT_EQ(groups[0].kernels, nullptr);
  EXPECT_TRUE(groups[0].kernel_tensors.empty());
  ASSERT_EQ(groups[0].other.size(), 1u);
  EXPECT_TRUE(groups[0].other[0].is_same(c32));
  EXPECT_TRUE(groups[1].device.is_meta());
  ASSERT_NE(groups[1].kernels, nullptr);
  ASSERT_EQ(groups[1].kernel_tensors.size(), 2u);  // float32 and bfloat16, contiguous
  EXPECT_TRUE(groups[1].kernel_tensors[0].is_same(m32));
  EXPECT_TRUE(groups[1].kernel_tensors[1].is_same(mbf));
  ASSERT_EQ(groups[1].other.size(), 2u);  // float16, and a transposed view
  EXPECT_TRUE(groups[1].other[0].is_same(mhalf));
  EXPECT_TRUE(groups[1].other[1].is_same(mstrided));
}

// ---------------------------------------------------------------------------------------------
// FusedAdam and HybridAdam through fake kernels on the meta device

TEST(FusedAdam, OneCallPerGroupWithTheGroupsOptionsAndAdamWState) {
  auto log = std::make_shared<Log>();
  Registered reg(c10::kMeta, fake_kernels(log, false));
  std::vector<at::Tensor> a{meta({3, 4}), meta({5})}, b{meta({7}), meta({2, 2})};
  std::vector<torch::optim::OptimizerParamGroup> groups{
      torch::optim::OptimizerParamGroup(a),
      torch::optim::OptimizerParamGroup(b, std::make_unique<FusedAdamOptions>(
                                               FusedAdamOptions(0.5).betas({0.8, 0.99}).eps(1e-6).weight_decay(0.1)
                                                   .adamw_mode(false).bias_correction(false)))};
  FusedAdam opt(std::move(groups), FusedAdamOptions(1e-2).weight_decay(0.01));
  set_meta_grads({a[0], a[1], b[0]});  // b[1] has no gradient
  opt.step();
  opt.step();
  ASSERT_EQ(log->adam_configs.size(), 4u);  // 2 groups x 2 steps
  const DeviceAdamConfig& c0 = log->adam_configs[0];
  EXPECT_EQ(c0.lr, 1e-2);
  EXPECT_EQ(c0.weight_decay, 0.01);
  EXPECT_EQ(c0.beta1, 0.9);
  EXPECT_EQ(c0.beta2, 0.999);
  EXPECT_EQ(c0.eps, 1e-8);
  EXPECT_TRUE(c0.adamw_mode);
  EXPECT_TRUE(c0.bias_correction);
  EXPECT_EQ(c0.step, 1);
  EXPECT_EQ(c0.div_scale, 1.0);
  const DeviceAdamConfig& c1 = log->adam_configs[1];
  EXPECT_EQ(c1.lr, 0.5);
  EXPECT_EQ(c1.beta1, 0.8);
  EXPECT_EQ(c1.beta2, 0.99);
  EXPECT_EQ(c1.eps, 1e-6);
  EXPECT_FALSE(c1.adamw_mode);
  EXPECT_FALSE(c1.bias_correction);
  EXPECT_EQ(log->adam_configs[2].step, 2);
  ASSERT_EQ(log->adam_tensors[0].params.size(), 2u);
  EXPECT_TRUE(log->adam_tensors[0].params[0].is_same(a[0]));
  EXPECT_TRUE(log->adam_tensors[0].grads[1].is_same(a[1].grad()));
  ASSERT_EQ(log->adam_tensors[1].params.size(), 1u);  // b[1] has no gradient
  EXPECT_TRUE(log->adam_tensors[1].params[0].is_same(b[0]));
  // State: AdamW's keys, moments of the parameter's shape on its device, the same tensors each step.
  const auto& st = static_cast<const FusedAdamParamState&>(*opt.state().at(booster::optimizer_state_key(a[0])));
  EXPECT_EQ(st.step(), 2);
  EXPECT_TRUE(st.exp_avg().is_meta());
  EXPECT_EQ(st.exp_avg().sizes(), a[0].sizes());
  EXPECT_TRUE(log->adam_tensors[2].exp_avgs[0].is_same(st.exp_avg()));
  EXPECT_EQ(opt.state().count(booster::optimizer_state_key(b[1])), 0u);
  // div_scale reaches the kernel.
  opt.step_with_div_scale(4.0);
  EXPECT_EQ(log->adam_configs.back().div_scale, 4.0);
  EXPECT_THAT([&] { opt.step_with_div_scale(0.0); }, ThrowsMessage<std::invalid_argument>(HasSubstr("div_scale")));
}

// Parameters of one group with different step counts take one call per count.
TEST(FusedAdam, DifferentStepCountsTakeSeparateCalls) {
  auto log = std::make_shared<Log>();
  Registered reg(c10::kMeta, fake_kernels(log, false));
  std::vector<at::Tensor> ps{meta({3}), meta({4})};
  FusedAdam opt(ps);
  set_meta_grads({ps[0]});
  opt.step();
  set_meta_grads(ps);
  opt.step();
  ASSERT_EQ(log->adam_configs.size(), 3u);
  EXPECT_EQ(log->adam_configs[1].step, 2);
  EXPECT_TRUE(log->adam_tensors[1].params[0].is_same(ps[0]));
  EXPECT_EQ(log->adam_configs[2].step, 1);
  EXPECT_TRUE(log->adam_tensors[2].params[0].is_same(ps[1]));
}

TEST(FusedAdam, RefusedGradientChangesNothing) {
  auto log = std::make_shared<Log>();
  Registered reg(c10::kMeta, fake_kernels(log, false));
  auto p = meta({3, 4});
  FusedAdam opt({p});
  p.mutable_grad() = at::empty({5}, at::TensorOptions().device(at::kMeta));
  EXPECT_THAT([&] { opt.step(); }, ThrowsMessage<std::invalid_argument>(AllOf(
                                       HasSubstr("FusedAdam"), HasSubstr("12 elements"), HasSubstr("meta"))));
  EXPECT_TRUE(opt.state().empty());
  EXPECT_TRUE(log->adam_configs.empty());
  p.mutable_grad() = at::empty({12}, at::TensorOptions().device(at::kMeta).dtype(at::kHalf));
  EXPECT_THAT([&] { opt.step(); }, ThrowsMessage<std::invalid_argument>(HasSubstr("float32 or bfloat16")));
  auto half = at::empty({2}, at::TensorOptions().device(at::kMeta).dtype(at::kHalf)).set_requires_grad(true);
  half.mutable_grad() = at::empty({2}, at::TensorOptions().device(at::kMeta));
  FusedAdam h({half});
  EXPECT_THAT([&] { h.step(); }, ThrowsMessage<std::invalid_argument>(HasSubstr("contiguous float32 parameters")));
}

TEST(FusedAdam, NoKernelsForTheDeviceIsAClearError) {
  auto p = meta({3});
  FusedAdam opt({p});
  set_meta_grads({p});
  EXPECT_THAT([&] { opt.step(); }, ThrowsMessage<std::runtime_error>(HasSubstr("no optimizer kernels are registered for meta")));
}

TEST(FusedAdam, RefusesCpuParametersNamingHybridAdam) {
  auto hint = AllOf(HasSubstr("FusedAdam"), HasSubstr("CPU"), HasSubstr("booster::optim::HybridAdam"),
                    HasSubstr("booster::optim::CPUAdam"));
  EXPECT_THAT([] { FusedAdam opt({at::zeros({3}).set_requires_grad(true)}); },
              ThrowsMessage<std::invalid_argument>(hint));
  // A CPU parameter added after construction: refused at step, before anything changes.
  auto log = std::make_shared<Log>();
  Registered reg(c10::kMeta, fake_kernels(log, false));
  auto m = meta({3});
  FusedAdam opt({m});
  auto c = at::zeros({3}).set_requires_grad(true);
  opt.add_param_group(torch::optim::OptimizerParamGroup({c}));
  set_meta_grads({m});
  c.mutable_grad() = at::ones({3});
  EXPECT_THAT([&] { opt.step(); }, ThrowsMessage<std::invalid_argument>(hint));
  EXPECT_TRUE(log->adam_configs.empty());
}

TEST(FusedAdam, OptionsAreColossalAIsAndChecked) {
  FusedAdamOptions o;
  EXPECT_EQ(o.lr(), 1e-3);
  EXPECT_EQ(std::get<0>(o.betas()), 0.9);
  EXPECT_EQ(std::get<1>(o.betas()), 0.999);
  EXPECT_EQ(o.eps(), 1e-8);
  EXPECT_EQ(o.weight_decay(), 0.0);
  EXPECT_TRUE(o.bias_correction());
  EXPECT_TRUE(o.adamw_mode());
  EXPECT_FALSE(o.amsgrad());
  auto p = meta({2});
  EXPECT_THAT([&] { FusedAdam({p}, FusedAdamOptions().amsgrad(true)); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("amsgrad")));
  EXPECT_THAT([&] { FusedAdam({p}, FusedAdamOptions(-1)); }, ThrowsMessage<std::invalid_argument>(HasSubstr("lr")));
  EXPECT_THAT([&] { FusedAdam({p}, FusedAdamOptions().betas({0.9, 1.0})); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("betas")));
}

// HybridAdam: device parameters in one call per group, CPU ones through the CPU kernel, unchanged.
TEST(HybridAdam, DeviceParametersTakeTheDeviceKernels) {
  auto log = std::make_shared<Log>();
  Registered reg(c10::kMeta, fake_kernels(log, false));
  auto cpu = cpu_params(3);
  for (auto& p : cpu) p.mutable_grad() = at::randn(p.sizes());
  auto alone = cpu_clones(cpu);
  std::vector<at::Tensor> dev{meta({6}), meta({2, 3})};
  set_meta_grads(dev);
  booster::optim::HybridAdam mixed({cpu[0], dev[0], cpu[1], dev[1], cpu[2]},
                                   booster::optim::CPUAdamOptions(1e-2).weight_decay(0.1));
  booster::optim::CPUAdam reference(alone, booster::optim::CPUAdamOptions(1e-2).weight_decay(0.1));
  for (int s = 0; s < 3; ++s) {
    mixed.step();
    reference.step();
  }
  ASSERT_EQ(log->adam_configs.size(), 3u);
  EXPECT_EQ(log->adam_configs[2].step, 3);
  EXPECT_EQ(log->adam_configs[0].lr, 1e-2);
  EXPECT_EQ(log->adam_configs[0].weight_decay, 0.1);
  ASSERT_EQ(log->adam_tensors[0].params.size(), 2u);
  EXPECT_TRUE(log->adam_tensors[0].params[0].is_same(dev[0]));
  EXPECT_TRUE(log->adam_tensors[0].params[1].is_same(dev[1]));
  for (size_t i = 0; i < cpu.size(); ++i) EXPECT_TRUE(at::equal(cpu[i], alone[i])) << "CPU parameter " << i;
  const auto& st = static_cast<const booster::optim::CPUAdamParamState&>(
      *mixed.state().at(booster::optimizer_state_key(dev[1])));
  EXPECT_EQ(st.step(), 3);
  EXPECT_TRUE(st.exp_avg_sq().is_meta());
}

// ---------------------------------------------------------------------------------------------
// The gradient code over CPU fakes (the path a CUDA device takes)

TEST(DeviceKernels, UnscaleAndInfCheckTakeTheKernelsPerDevice) {
  auto log = std::make_shared<Log>();
  at::Tensor f32 = at::randn({100}), bf = at::randn({9}).to(at::kBFloat16), half = at::randn({5}).to(at::kHalf);
  at::Tensor strided = at::randn({4, 4}).t();
  std::vector<at::Tensor> grads{f32, bf, half, strided};
  std::vector<at::Tensor> want;
  for (const auto& g : grads) want.push_back(g.mul(0.125));
  {
    Registered reg(c10::kCPU, fake_kernels(log, true));
    booster::mixed_precision::unscale_grads(grads, 0.125);
    ASSERT_EQ(log->scale_in.size(), 1u);
    ASSERT_EQ(log->scale_in[0].size(), 2u);
    EXPECT_TRUE(log->scale_in[0][0].is_same(f32));
    EXPECT_TRUE(log->scale_in[0][1].is_same(bf));
    EXPECT_EQ(log->scale_factors[0], 0.125);
    for (size_t i = 0; i < grads.size(); ++i) EXPECT_TRUE(at::equal(grads[i], want[i])) << i;

    EXPECT_FALSE(booster::mixed_precision::has_inf_or_nan(grads));
    EXPECT_EQ(log->norm_in.size(), 1u);
    // Large finite values overflow the float sum of squares: the exact check clears them.
    at::Tensor large = at::full({8}, 1e30f);
    EXPECT_FALSE(booster::mixed_precision::has_inf_or_nan({large, half}));
    EXPECT_EQ(log->norm_in.size(), 2u);
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      at::Tensor g = at::ones({1000});
      g[777] = bad;
      EXPECT_TRUE(booster::mixed_precision::has_inf_or_nan({half, g}));
      at::Tensor b = at::ones({10}).to(at::kBFloat16);
      b[3] = bad;
      EXPECT_TRUE(booster::mixed_precision::has_inf_or_nan({b}));
    }
  }
  // Unregistered: ATen's path again.
  const size_t calls = log->scale_in.size();
  booster::mixed_precision::unscale_grads(grads, 2.0);
  EXPECT_EQ(log->scale_in.size(), calls);
}

TEST(DeviceKernels, ClipNormTakesTheKernelsForNormTypeTwo) {
  auto log = std::make_shared<Log>();
  auto run = [&](bool fakes, double norm_type, std::vector<at::Tensor>& grads_out) {
    auto ps = cpu_params(9);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(10);
    for (auto& p : ps) p.mutable_grad() = at::randn(p.sizes(), gen) * 3;
    std::unique_ptr<Registered> reg;
    if (fakes) reg = std::make_unique<Registered>(c10::kCPU, fake_kernels(log, true));
    auto opt = std::make_shared<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1));
    booster::OptimizerWrapper w(opt, nullptr, {});
    double norm = w.clip_grad_by_norm(1.0, norm_type);
    grads_out.clear();
    for (auto& p : ps) grads_out.push_back(p.grad().clone());
    return norm;
  };
  std::vector<at::Tensor> aten_grads, kernel_grads;
  const double aten_norm = run(false, 2.0, aten_grads);
  EXPECT_TRUE(log->norm_in.empty());
  const double kernel_norm = run(true, 2.0, kernel_grads);
  ASSERT_EQ(log->norm_in.size(), 1u);
  EXPECT_EQ(log->norm_in[0].size(), 3u);
  ASSERT_EQ(log->scale_in.size(), 1u);
  EXPECT_NEAR(kernel_norm, aten_norm, 1e-5 * aten_norm);
  for (size_t i = 0; i < aten_grads.size(); ++i)
    EXPECT_TRUE(at::allclose(kernel_grads[i], aten_grads[i], 1e-5, 1e-7)) << i;
  // Other norm types keep ATen's norms (the scale still takes the kernels).
  std::vector<at::Tensor> inf_grads;
  run(true, std::numeric_limits<double>::infinity(), inf_grads);
  EXPECT_EQ(log->norm_in.size(), 1u);
  EXPECT_EQ(log->scale_in.size(), 2u);
}

// ---------------------------------------------------------------------------------------------
// Registry entry and archives

TEST(FusedAdam, RegisteredAsFusedAdamWithAdamWKeys) {
  const auto& info = booster::optimizer_type_info("FusedAdam");
  EXPECT_EQ(info.name(), "FusedAdam");
  EXPECT_EQ(info.tensor_keys(), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  EXPECT_EQ(info.scalar_keys(), (std::vector<std::string>{"step"}));
  FusedAdam opt({meta({2})});
  EXPECT_EQ(&booster::optimizer_type_info(opt), &info);
  EXPECT_EQ(&booster::optimizer_type_info_for_options(opt.param_groups()[0].options()), &info);
  EXPECT_EQ(info.options_to_json(opt.param_groups()[0].options()).dump(),
            R"({"adamw_mode":true,"betas":[0.9,0.999],"bias_correction":true,"eps":1e-08,"lr":0.001,"weight_decay":0.0})");
  FusedAdamOptions o;
  info.options_from_json(nlohmann::json::parse(R"({"lr":0.5,"betas":[0.5,0.6],"eps":1e-3,"weight_decay":0.1,"amsgrad":false})"), o);
  EXPECT_EQ(o.lr(), 0.5);
  EXPECT_EQ(std::get<1>(o.betas()), 0.6);
  EXPECT_TRUE(o.adamw_mode());
  EXPECT_THAT([&] { info.options_from_json(nlohmann::json::parse(R"({"lr":0.5,"betas":[0.5,0.6],"eps":1e-3,"weight_decay":0.1,"amsgrad":true})"), o); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("amsgrad = true")));
  EXPECT_EQ(info.state_tensors_per_element(o), 2);
  EXPECT_THAT(booster::registered_optimizer_names(), ::testing::Contains("FusedAdam"));
}

// Options and state archives interchange with torch::optim::AdamW's (the whole optimizer's round
// trip runs on a GPU: gpu_optim_test.cpp).
TEST(FusedAdam, ArchivesInterchangeWithAdamW) {
  auto through = [](const auto& from, auto& to) {
    torch::serialize::OutputArchive out;
    from.serialize(out);
    std::stringstream ss;
    out.save_to(ss);
    torch::serialize::InputArchive in;
    in.load_from(ss);
    to.serialize(in);
  };
  torch::optim::AdamWOptions adamw(0.25);
  adamw.betas({0.5, 0.75}).eps(1e-4).weight_decay(0.125);
  FusedAdamOptions fused(0);
  fused.adamw_mode(false).bias_correction(false);
  through(adamw, fused);
  EXPECT_EQ(fused.lr(), 0.25);
  EXPECT_EQ(std::get<0>(fused.betas()), 0.5);
  EXPECT_EQ(fused.eps(), 1e-4);
  EXPECT_EQ(fused.weight_decay(), 0.125);
  EXPECT_FALSE(fused.adamw_mode());  // absent from AdamW's archive: unchanged (true in a fresh load)
  FusedAdamOptions fresh(0);
  through(adamw, fresh);
  EXPECT_TRUE(fresh.adamw_mode());
  EXPECT_TRUE(fresh.bias_correction());
  torch::optim::AdamWOptions back(0);
  through(FusedAdamOptions(0.5).weight_decay(0.0625), back);
  EXPECT_EQ(back.lr(), 0.5);
  EXPECT_EQ(back.weight_decay(), 0.0625);
  EXPECT_FALSE(back.amsgrad());

  torch::optim::AdamWParamState ws;
  ws.step(7);
  ws.exp_avg(at::arange(4.0f));
  ws.exp_avg_sq(at::arange(4.0f) * 2);
  FusedAdamParamState fs;
  through(ws, fs);
  EXPECT_EQ(fs.step(), 7);
  EXPECT_TRUE(at::equal(fs.exp_avg(), ws.exp_avg()));
  EXPECT_TRUE(at::equal(fs.exp_avg_sq(), ws.exp_avg_sq()));
  torch::optim::AdamWParamState ws2;
  through(fs, ws2);
  EXPECT_EQ(ws2.step(), 7);
  EXPECT_TRUE(at::equal(ws2.exp_avg_sq(), ws.exp_avg_sq()));
  EXPECT_FALSE(ws2.max_exp_avg_sq().defined());
}

}  // namespace device_kernels_test
