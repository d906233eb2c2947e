// torch_fsdp_plugin_test.cpp — the torch_fsdp plugin on a world of one: configuration and model
// errors (each names the problem and the fix), bf16 compute against single-process autocast, and
// the model checkpoint round trip. The multi-rank behaviour is in tests/dist/fsdp_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "booster/booster.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/mixed_precision/precision.h"
#include "booster/nn/unit.h"
#include "common/test_util.h"

using booster::Booster;
using booster::Config;
using booster::ConfigError;
using booster::PluginError;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

Booster make_fsdp(const std::string& plugin_table = "") {
  booster::testing::ScopedEnv env;
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) env.unset(v);
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  return Booster(Config::from_string("[booster]\nplugin = \"torch_fsdp\"\n[plugin]\n" + plugin_table, "test.toml"));
}

at::Tensor mse(const at::Tensor& out, const at::Tensor& target) { return at::mse_loss(out, target); }

using Layer = booster::nn::Unit<torch::nn::Linear>;

// Two units and a root parameter (scale), values from a formula.
struct TwoUnitsImpl : torch::nn::Module {
  TwoUnitsImpl() {
    a = register_module("a", Layer(6, 5));
    b = register_module("b", Layer(5, 3));
    scale = register_parameter("scale", torch::ones({3}));
    torch::NoGradGuard g;
    int k = 0;
    for (auto& p : parameters()) p.copy_(at::sin(at::arange(p.numel(), at::kFloat) + (k++)).reshape(p.sizes()) * 0.5);
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(torch::tanh(a(x))) * scale; }
  Layer a{nullptr}, b{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(TwoUnits);

struct NestedImpl : torch::nn::Module {
  NestedImpl() { outer = register_module("outer", booster::nn::Unit<torch::nn::Sequential>(Layer(4, 4))); }
  torch::Tensor forward(const torch::Tensor& x) { return outer->forward(x); }
  booster::nn::Unit<torch::nn::Sequential> outer{nullptr};
};
TORCH_MODULE(Nested);

// A block holding a given weight tensor: two of them with one tensor tie a parameter across units.
struct TiedBlockImpl : torch::nn::Module {
  explicit TiedBlockImpl(torch::Tensor w) { weight = register_parameter("weight", std::move(w)); }
  torch::Tensor forward(const torch::Tensor& x) { return x.matmul(weight); }
  torch::Tensor weight;
};
TORCH_MODULE(TiedBlock);

struct SharedImpl : torch::nn::Module {
  SharedImpl() {
    torch::Tensor w = torch::eye(4);
    a = register_module("a", booster::nn::Unit<TiedBlock>(w));
    b = register_module("b", booster::nn::Unit<TiedBlock>(w));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(a(x)); }
  booster::nn::Unit<TiedBlock> a{nullptr}, b{nullptr};
};
TORCH_MODULE(Shared);

}  // namespace

TEST(TorchFsdpPlugin, OptionErrorsNameTheKeyAndTheFix) {
  EXPECT_THAT([] { make_fsdp("sharding_strategy = \"FULL_SHARDS\"\n"); },
              ThrowsMessage<ConfigError>(AllOf(HasSubstr("sharding_strategy"), HasSubstr("FULL_SHARD"))));
  EXPECT_THAT([] { make_fsdp("sharding_strategy = \"HYBRID_SHARD\"\nshard_group_size = 2\n"); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr("shard_group_size = 2 does not divide the world size 1"),
                                               HasSubstr("set plugin.shard_group_size to a divisor of 1"))));
  EXPECT_THAT([] { make_fsdp("shard_group_size = 2\n"); },
              ThrowsMessage<ConfigError>(HasSubstr("shard_group_size applies to sharding_strategy = \"HYBRID_SHARD\"")));
  // fp16 needs CUDA: refused at boost() for a CPU model, naming the fix; a bad loss-scaler value at once.
  EXPECT_THAT([] {
    Booster b = make_fsdp("[plugin.mixed_precision]\nparam_dtype = \"fp16\"\n");
    TwoUnits net;
    b.boost(net);
  }, ThrowsMessage<PluginError>(AllOf(HasSubstr("fp16 needs the model on a CUDA device"), HasSubstr("bf16"))));
  EXPECT_THAT([] { make_fsdp("[plugin.mixed_precision]\nparam_dtype = \"fp16\"\ninitial_scale = -1.0\n"); },
              ThrowsMessage<ConfigError>(HasSubstr("initial_scale")));
  EXPECT_THAT([] { make_fsdp("backward_prefetch = \"BACKWARD_PREE\"\n"); },
              ThrowsMessage<ConfigError>(HasSubstr("BACKWARD_PRE")));
  EXPECT_THAT([] { make_fsdp("[plugin.mixed_precision]\nparm_dtype = \"bf16\"\n"); },
              ThrowsMessage<ConfigError>(HasSubstr("param_dtype")));
}

TEST(TorchFsdpPlugin, ModelErrorsNameThePaths) {
  Booster booster = make_fsdp();
  Nested nested;
  EXPECT_THAT([&] { booster.boost(nested); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr("torch_fsdp"), HasSubstr("'outer.0' is nested inside unit 'outer'"))));
  Shared shared;
  EXPECT_THAT([&] { booster.boost(shared); }, ThrowsMessage<PluginError>(AllOf(HasSubstr("'a'"), HasSubstr("'b'"))));
  TwoUnits net;
  auto partial = std::make_shared<torch::optim::SGD>(std::vector<torch::Tensor>{net->a->weight, net->a->bias},
                                                     torch::optim::SGDOptions(0.1));
  EXPECT_THAT([&] { booster.boost(net, partial, mse); },
              ThrowsMessage<PluginError>(AllOf(HasSubstr("parameter scale requires grad but is not in the optimizer"),
                                               HasSubstr("requires_grad(false)"))));
  TwoUnits other;
  auto foreign = std::make_shared<torch::optim::SGD>(other->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THAT([&] { booster.boost(net, foreign, mse); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("the optimizer holds a parameter that is not in the model")));
}

// param_dtype = bf16 with reduce_dtype = fp32 on one rank computes exactly what single-process
// LibTorch computes with a bf16 copy of fp32 master weights (PyTorch FSDP's MixedPrecision: every
// parameter is bf16 in forward and backward, under CPU autocast; the bf16 gradients, widened, update
// the fp32 master). Tolerance: 1e-6 absolute after 3 SGD steps.
TEST(TorchFsdpPlugin, Bf16ComputeWithFp32ShardsEqualsSingleProcessAutocast) {
  auto batch = [](int s) {
    return std::make_pair(at::cos(at::arange(24, at::kFloat) * (s + 1)).reshape({4, 6}),
                          at::sin(at::arange(12, at::kFloat) * (s + 2)).reshape({4, 3}));
  };
  TwoUnits ref;  // the fp32 master weights
  torch::optim::SGD ref_opt(ref->parameters(), torch::optim::SGDOptions(0.1));
  for (int s = 0; s < 3; ++s) {
    auto [x, y] = batch(s);
    TwoUnits work;  // this step's bf16 copy
    {
      torch::NoGradGuard g;
      auto src = ref->parameters(), dst = work->parameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].set_data(src[i].detach().to(at::kBFloat16));
    }
    at::Tensor out;
    {
      booster::mixed_precision::CpuAutocastGuard autocast(at::kBFloat16);
      out = work->forward(x);
    }
    at::mse_loss(out.to(at::kFloat), y).backward();
    auto src = work->parameters(), dst = ref->parameters();
    for (size_t i = 0; i < src.size(); ++i) dst[i].mutable_grad() = src[i].grad().to(at::kFloat);
    ref_opt.step();
    ref_opt.zero_grad();
  }

  Booster booster = make_fsdp("[plugin.mixed_precision]\nparam_dtype = \"bf16\"\nreduce_dtype = \"fp32\"\n");
  TwoUnits net;
  auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  auto boosted = booster.boost(net, opt, mse);
  EXPECT_EQ(net->a->weight.scalar_type(), at::kBFloat16);  // the gathered parameters compute in bf16
  for (int s = 0; s < 3; ++s) {
    auto [x, y] = batch(s);
    booster.backward(boosted.criterion(boosted.model.forward(x), y), *boosted.optimizer);
    boosted.optimizer->step();
    boosted.optimizer->zero_grad();
  }
  booster::testing::TempDir dir;
  booster.save_model(boosted.model, dir.file("model"));
  auto saved = booster::checkpoint::load_state_dict(dir.file("model"));
  ASSERT_EQ(saved.size(), 5u);
  std::map<std::string, at::Tensor> by_name(saved.begin(), saved.end());
  for (const auto& item : ref->named_parameters()) {
    const at::Tensor& got = by_name.at(item.key());
    EXPECT_EQ(got.scalar_type(), at::kFloat) << item.key() << ": saved from the fp32 shard";
    EXPECT_TRUE(at::allclose(got, item.value(), 0, 1e-6))
        << item.key() << " max |diff| " << (got - item.value()).abs().max().item<double>();
  }
}

// A model save streams the units into the HF layout with unchanged names; loading it back into a
// freshly boosted model restores every shard, so the next forward equals the saved model's.
TEST(TorchFsdpPlugin, ModelCheckpointRoundTripKeepsNames) {
  booster::testing::TempDir dir;
  const at::Tensor x = at::linspace(-1, 1, 18).reshape({3, 6});
  at::Tensor before;
  {
    Booster booster = make_fsdp();
    TwoUnits net;
    {
      torch::NoGradGuard g;
      for (auto& p : net->parameters()) p.mul_(1.5);
    }
    auto boosted = booster.boost(net);
    before = boosted.model.forward(x).detach().clone();
    booster::checkpoint::ModelSaveOptions so;
    so.shard = true;
    so.size_per_shard_mb = 1;
    booster.save_model(boosted.model, dir.file("model"), so);
  }
  std::vector<std::string> names;
  for (const auto& info : booster::checkpoint::list_checkpoint_tensors(dir.file("model"))) names.push_back(info.name);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("scale", "a.weight", "a.bias", "b.weight", "b.bias"));
  Booster booster = make_fsdp();
  TwoUnits fresh;
  auto boosted = booster.boost(fresh);
  EXPECT_FALSE(at::equal(boosted.model.forward(x), before));
  booster.load_model(boosted.model, dir.file("model"));
  EXPECT_TRUE(at::equal(boosted.model.forward(x), before));
  // A model the plugin did not boost is refused (its parameters are not the plugin's shards).
  TwoUnits stranger;
  booster::ModelWrapper<TwoUnitsImpl> wrapped(stranger.ptr(), boosted.model.hooks_ptr());
  EXPECT_THAT([&] { booster.save_model(wrapped, dir.file("other")); },
              ThrowsMessage<booster::checkpoint::CheckpointError>(HasSubstr("not the model this plugin boosted")));
}
