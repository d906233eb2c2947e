// booster_test.cpp — Booster on a world of one: config checks, boost(), torch_ddp, OptimizerWrapper, dataloaders.

#include "booster/booster.h"
#include "booster/device.h"
#include "booster/core/host_allocator.h"
#include "booster/core/host_cache.h"
#include "booster/nn/unit.h"
#include "booster/wrappers/zero_optimizer.h"

#include <torch/optim/adamw.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/tensor_test_util.h"
#include "common/test_util.h"

using booster::Booster;
using booster::Config;
using booster::ConfigError;
using booster::PluginError;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

using booster::testing::ScopedEnv;

namespace {

const std::string kMinimalPath = std::string(BOOSTER_TEST_PLUGIN_DIR) + "/booster_plugin_test_minimal.so";


// A Booster from TOML text. The first one in the process launches a world of one: no launcher
// variables may be visible then, and plugins are searched in the build's plugin directory.
Booster make_booster(const std::string& toml) {
  ScopedEnv env;
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) env.unset(v);
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  return Booster(Config::from_string(toml, "test.toml"));
}

std::string minimal_toml(const std::string& extra = "") {
  return "[booster]\nplugin = \"test_minimal\"\n" + extra + "\n[plugin]\npath = \"" + kMinimalPath + "\"\n";
}

const std::string kDdpToml = "[booster]\nplugin = \"torch_ddp\"\n";

at::Tensor mse(const at::Tensor& out, const at::Tensor& target) { return at::mse_loss(out, target); }

void copy_parameters(torch::nn::Module& from, torch::nn::Module& to) {
  at::NoGradGuard no_grad;
  auto src = from.parameters();
  auto dst = to.parameters();
  ASSERT_EQ(src.size(), dst.size());
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
}

// Two linear layers with the same weights and the same (large) gradients.
struct TwinGrads {
  torch::nn::Linear a{6, 5}, b{6, 5};
  TwinGrads() {
    at::manual_seed(7);
    copy_parameters(*a, *b);
    auto pa = a->parameters();
    auto pb = b->parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      at::Tensor g = at::randn(pa[i].sizes()) * 3;
      pa[i].mutable_grad() = g.clone();
      pb[i].mutable_grad() = g.clone();
    }
  }
};

}  // namespace

// ---- construction and config checks

TEST(Booster, BoostsModelWithTestMinimalPlugin) {
  Booster booster = make_booster(minimal_toml());
  EXPECT_EQ(booster.plugin().name(), "test_minimal");
  EXPECT_EQ(booster.mixed_precision(), "fp32");
  EXPECT_EQ(booster.world().size(), 1);
  EXPECT_EQ(booster.world().rank(), 0);
  EXPECT_EQ(&booster.world(), booster::dist::world().get());
  EXPECT_EQ(booster::dist::current_env().world_size, 1);
  EXPECT_EQ(booster.config().source(), "test.toml");

  at::manual_seed(1);
  torch::nn::Linear net(4, 3);
  auto boosted = booster.boost(net);
  EXPECT_EQ(boosted.model.module(), net.ptr());
  EXPECT_EQ(boosted.optimizer, nullptr);
  EXPECT_FALSE(boosted.criterion);
  EXPECT_EQ(boosted.dataloader, nullptr);
  EXPECT_EQ(boosted.lr_scheduler, nullptr);
  EXPECT_EQ(&boosted.model.hooks().module(), net.ptr().get());
  at::Tensor x = at::randn({5, 4});
  EXPECT_TRUE(at::equal(boosted.model.forward(x), net->forward(x)));
  EXPECT_TRUE(at::equal(boosted.model(x), net->forward(x)));
}

TEST(Booster, BoostWithOptimizerReturnsCoreOptimizerWrapper) {
  Booster booster = make_booster(minimal_toml());
  torch::nn::Linear net(3, 2);
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer, criterion, loader, scheduler] = booster.boost(net, sgd, mse);
  ASSERT_NE(optimizer, nullptr);
  EXPECT_EQ(optimizer->optimizer_ptr(), sgd);
  EXPECT_EQ(optimizer->parameters().size(), 2u);
  ASSERT_TRUE(criterion);
  at::Tensor x = at::randn({4, 3}), y = at::randn({4, 2});
  at::Tensor loss = criterion(model.forward(x), y);
  booster.backward(loss, *optimizer);
  for (const auto& p : net->parameters()) EXPECT_TRUE(p.grad().defined());
  optimizer->zero_grad();
  for (const auto& p : net->parameters()) EXPECT_EQ(p.grad().abs().sum().item<float>(), 0.f);
}

TEST(Booster, NoSyncUnsupportedByTestMinimal) {
  Booster booster = make_booster(minimal_toml());
  torch::nn::Linear net(2, 2);
  auto boosted = booster.boost(net);
  EXPECT_THAT([&] { booster.no_sync(boosted.model); },
              ThrowsMessage<PluginError>(HasSubstr("plugin test_minimal does not support no_sync")));
}

TEST(Booster, UnknownSectionSuggestsTrain) {
  EXPECT_THAT([] { make_booster(minimal_toml() + "[trian]\nepochs = 2\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml"), HasSubstr("unknown section [trian]"),
                                               HasSubstr("did you mean [train]"), HasSubstr("known sections: "))));
}

TEST(Booster, UnknownKeyInBoosterSection) {
  EXPECT_THAT([] { make_booster(minimal_toml("plugn = \"x\"\n")); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:3:1"), HasSubstr("unknown key booster.plugn"),
                                               HasSubstr("did you mean 'plugin'"))));
}

TEST(Booster, MixedPrecisionChoiceAndPluginSupport) {
  // test_minimal keeps the default traits().precisions {"fp32"}.
  EXPECT_THAT([] { make_booster(minimal_toml("mixed_precision = \"bf16\"\n")); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr("plugin test_minimal does not support mixed_precision = "
                                                         "\"bf16\""),
                                               HasSubstr("(it supports: fp32)"))));
  EXPECT_THAT([] { make_booster(minimal_toml("mixed_precision = \"fp8\"\n")); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:3"),
                                               HasSubstr("booster.mixed_precision = \"fp8\" is not one of "
                                                         "\"fp32\", \"fp16\", \"bf16\""))));
  EXPECT_EQ(make_booster(minimal_toml("mixed_precision = \"fp32\"\n")).mixed_precision(), "fp32");
  EXPECT_EQ(make_booster(kDdpToml + "mixed_precision = \"bf16\"\n").mixed_precision(), "bf16");
}

TEST(Booster, MixedPrecisionAndCheckpointSectionKeys) {
  EXPECT_THAT([] { make_booster(minimal_toml() + "[mixed_precision]\ninitial_scal = 1024\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:7:1"),
                                               HasSubstr("unknown key mixed_precision.initial_scal"),
                                               HasSubstr("did you mean 'initial_scale'"))));
  // [checkpoint] is reserved: any key is an error.
  EXPECT_THAT([] { make_booster(minimal_toml() + "[checkpoint]\nshard = true\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:7:1"), HasSubstr("unknown key checkpoint.shard"),
                                               HasSubstr("[checkpoint] has no options yet"))));
  // Loss-scaler options, an empty [checkpoint], [distributed] and the program's [train] are fine.
  EXPECT_NO_THROW(make_booster(minimal_toml() + "[mixed_precision]\ninitial_scale = 1024\n[checkpoint]\n"
                                                "[train]\nepochs = 3\n[distributed]\nbackend = \"gloo\"\n"));
}

// [booster] malloc = "cache" (every in-tree plugin's default): the bound is set at boost() from the
// model states, or from malloc_cache_mb; memory_report shows the held free bytes; malloc_cache_mb
// with another mode is an error rather than ignored.
TEST(Booster, HostCacheBoundAndReport) {
  EXPECT_THAT([] { make_booster(kDdpToml + "malloc = \"retain\"\nmalloc_cache_mb = 8\n"); },
              ThrowsMessage<ConfigError>(HasSubstr("malloc = \"retain\" has none")));
  EXPECT_THAT([] { make_booster(kDdpToml + "malloc_cache_mb = -1\n"); }, ThrowsMessage<ConfigError>(HasSubstr("malloc_cache_mb")));
  EXPECT_THAT([] { make_booster(kDdpToml + "malloc = \"jemalloc\"\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("jemalloc"), HasSubstr("\"cache\""), HasSubstr("\"retain\""))));
#if !defined(__SANITIZE_ADDRESS__)
  {
    Booster booster = make_booster(kDdpToml + "malloc_cache_mb = 20\n");
    torch::nn::Linear net(64, 64);
    auto boosted = booster.boost(net);
    EXPECT_EQ(booster::host_cache_stats().limit_bytes, 20 << 20);
  }
  Booster booster = make_booster(kDdpToml);
  torch::nn::Linear net(2048, 1024);  // 8 MiB of weights: a cached block
  auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto boosted = booster.boost(net, opt);
  const booster::MemoryReport report = booster.memory_report(boosted.model, boosted.optimizer.get());
  EXPECT_EQ(booster::host_cache_stats().limit_bytes, booster::default_host_cache_limit(report.model_states()));
  { at::Tensor scratch = at::empty({2 << 20}); }  // 8 MiB freed into the cache
  const booster::MemoryReport after = booster.memory_report(boosted.model, boosted.optimizer.get());
  EXPECT_EQ(after.host_cache_held, booster::host_cache_stats().held_bytes);
  EXPECT_GE(after.host_cache_held, 8 << 20);
  EXPECT_THAT(after.to_string(), HasSubstr("host cache holds"));
#endif
}

TEST(Booster, UnknownPluginNameListsPluginsFound) {
  EXPECT_THAT([] { make_booster("[booster]\nplugin = \"torch_dpp\"\n"); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr("plugin 'torch_dpp' not found"),
                                               HasSubstr(BOOSTER_PLUGIN_DIR), HasSubstr("torch_ddp ("),
                                               HasSubstr("Set [booster] plugin to one of them"))));
}

TEST(Booster, LaunchOnlyOnce) {
  Booster booster = make_booster(minimal_toml());
  ASSERT_NE(booster::dist::world(), nullptr);
  EXPECT_THAT([] { booster::dist::launch(0, 1, "127.0.0.1", 29500); },
              ThrowsMessage<booster::dist::EnvError>(HasSubstr("already launched (launch once per process)")));
  // launch_from_config returns the existing world and leaves the arguments alone.
  std::vector<std::string> args{"--rank", "0", "--world_size", "1", "x"};
  EXPECT_EQ(booster::launch_from_config(booster.config(), args), booster::dist::world());
  EXPECT_EQ(args.size(), 5u);
}

TEST(Booster, BoostRejectsBadArguments) {
  Booster booster = make_booster(minimal_toml());
  EXPECT_THAT([&] { booster.boost(std::shared_ptr<torch::nn::LinearImpl>()); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("boost() needs a model (got null)")));
  torch::nn::Linear net(2, 2), other(2, 2);
  auto params = net->parameters();
  params.push_back(other->parameters()[0]);
  auto sgd = std::make_shared<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1));
  EXPECT_THAT([&] { booster.boost(net, sgd); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("the optimizer holds a parameter that is not in "
                                                                   "the model"),
                                                         HasSubstr("build the optimizer from model->parameters()"))));
  booster::ModelWrapper<torch::nn::LinearImpl> unboosted;
  EXPECT_THAT([&] { unboosted.forward(at::ones({1, 2})); },
              ThrowsMessage<std::logic_error>(HasSubstr("ModelWrapper used before Booster::boost()")));
}

// ---- torch_ddp on a world of one

TEST(Booster, TorchDdpTrainingEqualsPlainLibTorch) {
  Booster booster = make_booster(kDdpToml);
  EXPECT_EQ(booster.plugin().name(), "torch_ddp");
  at::manual_seed(3);
  booster::nn::Unit<torch::nn::Linear> net(5, 3);  // a shard unit: a pass-through here
  torch::nn::Linear ref(5, 3);
  copy_parameters(*net, *ref);
  const auto options = torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3);
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), options);
  torch::optim::SGD ref_sgd(ref->parameters(), options);
  auto [model, optimizer, criterion, loader, scheduler] = booster.boost(net, sgd, mse);
  ASSERT_NE(optimizer, nullptr);
  EXPECT_EQ(model.hooks().stats(), (std::map<std::string, int64_t>{{"buckets", 0}}));

  for (int step = 0; step < 3; ++step) {
    at::Tensor x = at::randn({8, 5}), y = at::randn({8, 3});
    at::Tensor loss = criterion(model.forward(x), y);
    booster.backward(loss, *optimizer);
    optimizer->step();
    optimizer->zero_grad();

    at::Tensor ref_loss = mse(ref->forward(x), y);
    ref_loss.backward();
    ref_sgd.step();
    ref_sgd.zero_grad();
    EXPECT_TRUE(at::equal(loss, ref_loss)) << "step " << step;
  }
  auto got = net->named_parameters();
  auto want = ref->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (const auto& item : got) {
    EXPECT_TRUE(at::equal(item.value(), want[item.key()])) << item.key();
    EXPECT_FALSE(at::equal(item.value(), at::zeros_like(item.value()))) << item.key();
  }

  // torch_ddp supports no_sync: the guard restores synchronisation when it ends.
  {
    booster::ScopeGuard guard = booster.no_sync(model, optimizer.get());
    booster.backward(criterion(model.forward(at::randn({2, 5})), at::randn({2, 3})), *optimizer);
  }
}

TEST(Booster, TorchDdpFromFileWithOverrides) {
  booster::testing::TempDir dir;
  booster::testing::write_file(dir.file("ddp.toml"), kDdpToml + "[plugin]\nbucket_cap_mb = 25\n");
  ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  Booster booster = Booster::from_file(dir.file("ddp.toml"), {"plugin.bucket_cap_mb=4", "plugin.static_graph=true"});
  EXPECT_EQ(booster.plugin().name(), "torch_ddp");
  EXPECT_EQ(booster.config().source(), dir.file("ddp.toml"));
  EXPECT_THAT([&] { Booster::from_file(dir.file("ddp.toml"), {"plugin.bucket_cap_mb=big"}); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("--set plugin.bucket_cap_mb: "),
                                               HasSubstr("plugin.bucket_cap_mb must be a number"))));
}

TEST(Booster, TorchDdpOptionErrors) {
  EXPECT_THAT([] { make_booster(kDdpToml + "[plugin]\nbucket_cap_mb = \"big\"\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:4:17"), HasSubstr("plugin.bucket_cap_mb must be a "
                                                                                      "number, got string \"big\""))));
  EXPECT_THAT([] { make_booster(kDdpToml + "[plugin]\nbucket_cap_mb = -1\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("plugin.bucket_cap_mb = -1.0 is out of range [1e-06, 1000000.0]"),
                                               HasSubstr("leave it out for the default (25.0)"))));
  EXPECT_THAT([] { make_booster(kDdpToml + "[plugin]\nfind_unused_paramters = true\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:4:1"),
                                               HasSubstr("unknown key plugin.find_unused_paramters"),
                                               HasSubstr("did you mean 'find_unused_parameters'"))));
  EXPECT_THAT([] { make_booster(kDdpToml + "[plugin]\nbroadcast_buffers = 1\n"); },
              ThrowsMessage<ConfigError>(HasSubstr("plugin.broadcast_buffers must be")));
}

// ---- LowLevelZero (ZeRO) in one process; multi-rank equivalence is in tests/dist/zero_test.cpp

const std::string kZeroToml = "[booster]\nplugin = \"low_level_zero\"\n";

TEST(Booster, LowLevelZeroDefaultFp16OnCpuIsAClearError) {
  EXPECT_THAT([] { make_booster(kZeroToml); },
              ThrowsMessage<booster::PluginError>(AllOf(HasSubstr("precision = \"fp16\""), HasSubstr("needs a CUDA device"),
                                                        HasSubstr("plugin.precision = \"bf16\""))));
  EXPECT_THAT([] { make_booster(kZeroToml + "[plugin]\nprecision = \"fp32\"\nstage = 3\n"); },
              ThrowsMessage<ConfigError>(HasSubstr("plugin.stage = 3 is out of range [1, 2]")));
  EXPECT_THAT([] { make_booster(kZeroToml + "[plugin]\nprecision = \"fp32\"\nreduce_bucket_size_in_mb = 5\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("unknown key plugin.reduce_bucket_size_in_mb"),
                                               HasSubstr("did you mean 'reduce_bucket_size_in_m'"))));
}

// A Booster-level setting that the plugin replaces is one setting: it may repeat the plugin's value,
// and any other value is an error naming both keys (never silently ignored).
TEST(Booster, SettingsAPluginReplacesAreOneSetting) {
  const std::string zero = "[booster]\nplugin = \"low_level_zero\"\n";
  EXPECT_THAT([&] { make_booster(zero + "max_norm = 1.0\n[plugin]\nprecision = \"fp32\"\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:3:1"), HasSubstr("booster.max_norm = 1 is set"),
                                               HasSubstr("replaces it with plugin.max_norm (= 0)"),
                                               HasSubstr("set plugin.max_norm instead and remove booster.max_norm"))));
  EXPECT_THAT([&] { make_booster(zero + "norm_type = inf\n[plugin]\nprecision = \"fp32\"\n"); },
              ThrowsMessage<ConfigError>(HasSubstr("booster.norm_type = inf is set")));
  EXPECT_THAT([&] { make_booster(zero + "mixed_precision = \"bf16\"\n[plugin]\nprecision = \"fp32\"\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("booster.mixed_precision = bf16 is set"),
                                               HasSubstr("plugin.precision (= fp32)"))));
  EXPECT_THAT([&] { make_booster(zero + "[plugin]\nprecision = \"fp32\"\n[mixed_precision]\ninitial_scale = 1024\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:6:1"), HasSubstr("mixed_precision.initial_scale is set"),
                                               HasSubstr("replaces every [mixed_precision] setting"))));
  // The same value under both names is one setting.
  EXPECT_NO_THROW(make_booster(zero + "mixed_precision = \"fp32\"\nmax_norm = 0.5\nnorm_type = 2\n"
                                      "[plugin]\nprecision = \"fp32\"\nmax_norm = 0.5\n"));
  // A plugin that does not replace them reads them itself.
  EXPECT_NO_THROW(make_booster(kDdpToml + "max_norm = 1.0\nnorm_type = inf\nmixed_precision = \"bf16\"\n"));
}

TEST(Booster, NcclBackendOnTheCpuDeviceIsRefusedWhenTheConfigIsRead) {
  EXPECT_THAT([] { make_booster(kDdpToml + "[distributed]\nbackend = \"nccl\"\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("test.toml:4:11"), HasSubstr("reduces CUDA tensors only"),
                                               HasSubstr("booster.device = \"cuda\""), HasSubstr("backend = \"gloo\""))));
}

TEST(Booster, DeviceSettingIsCheckedBeforeAnyRendezvous) {
  EXPECT_THAT([] { make_booster(kDdpToml + "device = \"tpu\"\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("device"), HasSubstr("\"tpu\""), HasSubstr("\"cuda\""))));
  if (booster::cuda_device_count() > 0) GTEST_SKIP() << "this machine has a CUDA device (the GPU tests cover it)";
  // No GPU here: a clear error, raised before the rendezvous (a world of 2 would otherwise wait for
  // a second rank).
  EXPECT_THAT([] { make_booster(kDdpToml + "device = \"cuda\"\n[distributed]\nport = 1\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("booster.device = \"cuda\""),
                                               HasSubstr("set booster.device = \"cpu\""))));
}

// Booster(config, world): the given group is the Booster's world (no launch, no rendezvous), and
// [distributed] is still read and checked.
TEST(Booster, GivenWorldIsUsedAndTheDistributedSectionIsStillChecked) {
  ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  const auto group = booster::testing::world_of_one();
  Booster b(Config::from_string(kDdpToml, "given.toml"), group);
  EXPECT_EQ(&b.world(), group.get());
  EXPECT_EQ(b.data_parallel_group(), group);
  torch::nn::Linear net(3, 2);
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto boosted = b.boost(net, sgd);
  b.backward(boosted.model.forward(at::ones({4, 3})).sum(), *boosted.optimizer);
  boosted.optimizer->step();  // a step over the given group
  EXPECT_THAT([&] { Booster(Config::from_string(kDdpToml + "[distributed]\nbackend = \"nccl\"\n", "given.toml"), group); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("given.toml:4:11"), HasSubstr("reduces CUDA tensors only"))));
  EXPECT_THAT([&] { Booster(Config::from_string(kDdpToml + "[distributed]\nbackend_typo = 1\n", "given.toml"), group); },
              ThrowsMessage<ConfigError>(HasSubstr("backend_typo")));
}

TEST(Booster, LowLevelZeroStage2OnOneRankEqualsPlainLibTorch) {
  Booster booster = make_booster(kZeroToml + "[plugin]\nprecision = \"fp32\"\nstage = 2\n");
  at::manual_seed(3);
  booster::nn::Unit<torch::nn::Linear> net(5, 3);  // a shard unit: a pass-through here
  torch::nn::Linear ref(5, 3);
  copy_parameters(*net, *ref);
  const auto options = torch::optim::AdamWOptions(0.01).weight_decay(0.01);
  auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), options);
  torch::optim::AdamW ref_adamw(ref->parameters(), options);
  auto [model, optimizer, criterion, loader, scheduler] = booster.boost(net, adamw, mse);
  auto zero = std::dynamic_pointer_cast<booster::ZeroOptimizer>(optimizer);
  ASSERT_NE(zero, nullptr);
  EXPECT_EQ(zero->stage(), 2);
  EXPECT_EQ(zero->layout(0).numel, 18);
  for (int step = 0; step < 3; ++step) {
    at::Tensor x = at::randn({8, 5}), y = at::randn({8, 3});
    booster.backward(criterion(model.forward(x), y), *optimizer);
    optimizer->step();
    optimizer->zero_grad();
    mse(ref->forward(x), y).backward();
    ref_adamw.step();
    ref_adamw.zero_grad();
  }
  auto want = ref->named_parameters();
  for (const auto& item : net->named_parameters())
    EXPECT_TRUE(at::allclose(item.value(), want[item.key()], 1e-6, 1e-7)) << item.key();
  // Steady-state memory: 18 fp32 params, gradient shard 18, AdamW 2 x 18 states.
  auto report = booster.memory_report(model, optimizer.get());
  EXPECT_EQ(report.parameters, 18 * 4);
  EXPECT_EQ(report.gradients, 18 * 4);
  EXPECT_EQ(report.optimizer_states, 2 * 18 * 4);
  EXPECT_EQ(report.master_weights, 0);
  EXPECT_THAT(report.to_string(), HasSubstr("optimizer states 0.0 MiB"));
  // Stage 2 refuses no_sync with the reason and the fix.
  EXPECT_THAT([&] { booster.no_sync(model, optimizer.get()); },
              ThrowsMessage<booster::PluginError>(HasSubstr("no_sync is not supported with stage = 2")));
}

TEST(Booster, LowLevelZeroBadOptimizersAreClearErrors) {
  Booster booster = make_booster(kZeroToml + "[plugin]\nprecision = \"fp32\"\n");
  // A trainable parameter left out of the optimizer would never be synchronised.
  torch::nn::Linear a(4, 2);
  auto partial = std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{a->weight}, torch::optim::SGDOptions(0.1));
  EXPECT_THAT([&] { booster.boost(a, partial, mse); },
              ThrowsMessage<booster::PluginError>(AllOf(HasSubstr("parameter bias requires grad but is not in the optimizer"),
                                                        HasSubstr("requires_grad(false)"))));
  // One flat buffer per group needs one dtype.
  torch::nn::Linear b(4, 2);
  b->bias.set_data(b->bias.detach().to(at::kDouble));
  auto mixed = std::make_shared<torch::optim::SGD>(b->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THAT([&] { booster.boost(b, mixed, mse); },
              ThrowsMessage<booster::PluginError>(AllOf(HasSubstr("need one dtype"), HasSubstr("parameter group 0"),
                                                        HasSubstr("separate parameter groups"))));
  // Values are untouched by the failed boost.
  EXPECT_EQ(b->bias.scalar_type(), at::kDouble);
}

TEST(Booster, LowLevelZeroCpuOffloadKeepsASeparateHostMasterSlice) {
  Booster booster = make_booster(kZeroToml + "[plugin]\nprecision = \"fp32\"\ncpu_offload = true\n");
  torch::nn::Linear net(4, 2);
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer, criterion, loader, scheduler] = booster.boost(net, sgd, mse);
  auto zero = std::dynamic_pointer_cast<booster::ZeroOptimizer>(optimizer);
  ASSERT_NE(zero, nullptr);
  // Offloaded: the optimizer steps a host copy, not the model's flat buffer, even for fp32.
  EXPECT_TRUE(zero->master_slice(0).device().is_cpu());
  EXPECT_NE(zero->master_slice(0).data_ptr(), zero->flat_parameters(0).data_ptr());
  EXPECT_EQ(booster.memory_report(model, optimizer.get()).master_weights, 10 * 4);
  at::Tensor before = zero->flat_parameters(0).clone();
  booster.backward(criterion(model.forward(at::randn({3, 4})), at::randn({3, 2})), *optimizer);
  optimizer->step();
  // The step reached the model through the copy-back, and the master equals the new weights.
  EXPECT_FALSE(at::equal(zero->flat_parameters(0), before));
  EXPECT_TRUE(at::equal(zero->master_slice(0), zero->flat_parameters(0)));
}

TEST(Booster, LowLevelZeroBf16LoadModelRefreshesTheFp32MasterSlice) {
  booster::testing::TempDir dir;
  Booster booster = make_booster(kZeroToml + "[plugin]\nprecision = \"bf16\"\n");
  at::manual_seed(4);
  torch::nn::Linear net(4, 2);
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto [model, optimizer, criterion, loader, scheduler] = booster.boost(net, sgd, mse);
  auto zero = std::dynamic_pointer_cast<booster::ZeroOptimizer>(optimizer);
  ASSERT_NE(zero, nullptr);
  EXPECT_EQ(net->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(zero->master_slice(0).scalar_type(), at::kFloat);
  EXPECT_EQ(booster.memory_report(model, optimizer.get()).master_weights, 10 * 4);
  booster.save_model(model, dir.file("m"));
  at::Tensor saved = zero->flat_parameters(0).clone();
  booster.backward(criterion(model.forward(at::randn({3, 4})), at::randn({3, 2})), *optimizer);
  optimizer->step();
  EXPECT_FALSE(at::equal(zero->flat_parameters(0), saved));
  booster.load_model(model, dir.file("m"));
  EXPECT_TRUE(at::equal(zero->flat_parameters(0), saved));
  EXPECT_TRUE(at::equal(zero->master_slice(0), saved.to(at::kFloat)));  // not the stepped fp32 values
}

// ---- OptimizerWrapper

TEST(Booster, ClipGradByNormMatchesLibTorch) {
  for (double norm_type : {2.0, std::numeric_limits<double>::infinity()}) {
    for (double max_norm : {0.5, 1e6}) {
      TwinGrads t;
      auto sgd = std::make_shared<torch::optim::SGD>(t.a->parameters(), torch::optim::SGDOptions(0.1));
      booster::OptimizerWrapper wrapper(sgd, nullptr);
      const double ours = wrapper.clip_grad_by_norm(max_norm, norm_type);
      const double theirs = torch::nn::utils::clip_grad_norm_(t.b->parameters(), max_norm, norm_type);
      EXPECT_NEAR(ours, theirs, 1e-5 * theirs) << "norm_type " << norm_type << " max_norm " << max_norm;
      EXPECT_GT(ours, 1.0);
      auto pa = t.a->parameters();
      auto pb = t.b->parameters();
      for (size_t i = 0; i < pa.size(); ++i)
        EXPECT_TRUE(at::allclose(pa[i].grad(), pb[i].grad(), 1e-5, 1e-7))
            << "norm_type " << norm_type << " max_norm " << max_norm << " param " << i;
    }
  }
  TwinGrads t;
  booster::OptimizerWrapper wrapper(
      std::make_shared<torch::optim::SGD>(t.a->parameters(), torch::optim::SGDOptions(0.1)), nullptr);
  EXPECT_THAT([&] { wrapper.clip_grad_by_norm(0); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("max_norm must be > 0")));
  EXPECT_THAT([&] { wrapper.clip_grad_by_norm(1.0, -2); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("norm_type must be > 0")));
}

TEST(Booster, ClipGradByValueClamps) {
  TwinGrads t;
  booster::OptimizerWrapper wrapper(
      std::make_shared<torch::optim::SGD>(t.a->parameters(), torch::optim::SGDOptions(0.1)), nullptr);
  wrapper.clip_grad_by_value(0.75);
  torch::nn::utils::clip_grad_value_(t.b->parameters(), 0.75);
  auto pa = t.a->parameters();
  auto pb = t.b->parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(at::equal(pa[i].grad(), pb[i].grad())) << "param " << i;
    EXPECT_LE(pa[i].grad().abs().max().item<float>(), 0.75f);
  }
  EXPECT_EQ(pa[0].grad().abs().max().item<float>(), 0.75f);  // the 3-sigma gradients do get clipped
  EXPECT_THAT([&] { wrapper.clip_grad_by_value(0); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("clip_value must be > 0")));
}

TEST(Booster, BackwardNeedsAScalarLossThatRequiresGrad) {
  Booster booster = make_booster(minimal_toml());
  torch::nn::Linear net(3, 2);
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto boosted = booster.boost(net, sgd);
  at::Tensor out = boosted.model.forward(at::randn({4, 3}));
  EXPECT_THAT([&] { booster.backward(out, *boosted.optimizer); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("needs a scalar loss (one element)"),
                                                         HasSubstr("got 8 elements"))));
  EXPECT_THAT([&] { booster.backward(at::ones({}), *boosted.optimizer); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("the loss does not require grad")));
  EXPECT_THAT([&] { booster.backward(at::Tensor(), *boosted.optimizer); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("got undefined")));
}

// ---- prepare_dataloader

TEST(Booster, PrepareDataloaderOnWorldOfOne) {
  Booster booster = make_booster(minimal_toml());
  auto dataset = std::make_shared<booster::data::TensorDataset>(at::arange(10, at::kFloat).view({10, 1}),
                                                                at::arange(10, at::kLong));
  auto loader = booster.prepare_dataloader(dataset, 3);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->num_batches(), 4);  // ceil(10 / 3)
  std::vector<int64_t> sizes, targets;
  for (const auto& batch : *loader) {
    sizes.push_back(batch.data.size(0));
    for (int64_t i = 0; i < batch.target.numel(); ++i) targets.push_back(batch.target[i].item<int64_t>());
  }
  EXPECT_THAT(sizes, ElementsAre(3, 3, 3, 1));
  EXPECT_THAT(targets, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9));  // unshuffled by default

  auto dropped = booster.prepare_dataloader(dataset, 3, /*shuffle=*/true, /*seed=*/5, /*drop_last=*/true);
  EXPECT_EQ(dropped->num_batches(), 3);
  EXPECT_EQ(dropped->options().seed, 5u);
  EXPECT_EQ(booster.prepare_dataloader(dataset, 10)->num_batches(), 1);
  EXPECT_EQ(booster.prepare_dataloader(dataset, 64)->num_batches(), 1);

  EXPECT_THAT([&] { booster.prepare_dataloader(dataset, 0); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("batch_size must be >= 1")));
  EXPECT_THAT([&] { booster.prepare_dataloader(nullptr, 2); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("needs a dataset (got null)")));
}
