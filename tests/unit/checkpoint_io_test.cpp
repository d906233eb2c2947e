// checkpoint_io_test.cpp — CheckpointIO on a world of one: optimizer state by parameter name for
// every supported optimizer (save, load into fresh objects, continue == uninterrupted, bit-exact),
// validation errors before any change, LR scheduler state, and the `booster ckpt` tool.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/dist/process_group.h"
#include "booster/lr_scheduler.h"
#include "booster/wrappers/optimizer_wrapper.h"
#include "common/test_util.h"

using namespace booster;
using namespace booster::checkpoint;
using booster::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

std::shared_ptr<dist::ProcessGroup> world_of_one() {
  static auto pg = dist::ProcessGroup::rendezvous({});
  return pg;
}

struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", torch::nn::Linear(6, 5));
    b = register_module("b", torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(torch::tanh(a(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Net);

std::shared_ptr<torch::optim::Optimizer> make_opt(const std::string& kind, std::vector<torch::Tensor> p) {
  using namespace torch::optim;
  if (kind == "sgd") return std::make_shared<SGD>(p, SGDOptions(0.05).momentum(0.9).nesterov(true));
  if (kind == "adam") return std::make_shared<Adam>(p, AdamOptions(1e-2).amsgrad(true));
  if (kind == "adamw") return std::make_shared<AdamW>(p, AdamWOptions(1e-2).weight_decay(0.1));
  if (kind == "rmsprop") return std::make_shared<RMSprop>(p, RMSpropOptions(1e-3).momentum(0.5).centered(true));
  return std::make_shared<Adagrad>(p, AdagradOptions(0.1));
}

// A model + its optimizer wrapper with parameter names, as Booster::boost makes them.
struct Trainer {
  Net net;
  std::shared_ptr<torch::optim::Optimizer> opt;
  std::unique_ptr<OptimizerWrapper> wrapper;
  explicit Trainer(const std::string& kind) {
    torch::manual_seed(3);
    net = Net();
    opt = make_opt(kind, net->parameters());
    wrapper = std::make_unique<OptimizerWrapper>(opt, nullptr);
    std::vector<std::string> names;
    for (auto& item : net->named_parameters()) names.push_back(item.key());
    wrapper->set_parameter_names(names);
  }
  void steps(int n, int offset) {
    for (int s = 0; s < n; ++s) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + offset + s);
      auto x = at::randn({4, 6}, gen), y = at::randn({4, 3}, gen);
      wrapper->backward(torch::mse_loss(net->forward(x), y));
      wrapper->step();
      wrapper->zero_grad();
    }
  }
};

class CheckpointIOOptimizers : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(CheckpointIOOptimizers, SaveLoadContinueEqualsUninterrupted) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Trainer full(GetParam()), first(GetParam()), resumed(GetParam());
  full.steps(5, 0);
  first.steps(3, 0);
  io.save_model(*first.net, dir.file("model"), {});
  io.save_optimizer(*first.wrapper, dir.file("opt"), {});
  io.load_model(*resumed.net, dir.file("model"));
  io.load_optimizer(*resumed.wrapper, dir.file("opt"));
  resumed.steps(2, 3);
  auto p = full.net->parameters(), q = resumed.net->parameters();
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(torch::equal(p[i], q[i])) << GetParam() << " param " << i;
}

INSTANTIATE_TEST_SUITE_P(CheckpointIO, CheckpointIOOptimizers,
                         ::testing::Values("sgd", "adam", "adamw", "rmsprop", "adagrad"));

TEST(CheckpointIO, OptimizerFileHasNameKeyedStateAndGroups) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Trainer t("adamw");
  t.steps(2, 0);
  io.save_optimizer(*t.wrapper, dir.file("opt"), {});
  auto state = load_safetensors(dir.file("opt/optimizer.safetensors"));
  std::vector<std::string> names;
  for (auto& [n, v] : state) names.push_back(n);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("a.weight.exp_avg", "a.weight.exp_avg_sq", "a.bias.exp_avg",
                                                      "a.bias.exp_avg_sq", "b.weight.exp_avg", "b.weight.exp_avg_sq",
                                                      "b.bias.exp_avg", "b.bias.exp_avg_sq"));
  std::string groups = booster::testing::read_file(dir.file("opt/optimizer_groups.json"));
  EXPECT_THAT(groups, HasSubstr("\"optimizer\": \"AdamW\""));
  EXPECT_THAT(groups, HasSubstr("\"step\": 2"));
  EXPECT_THAT(groups, HasSubstr("\"a.weight\""));
}

TEST(CheckpointIO, LoadOptimizerValidatesBeforeChangingAnything) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Trainer adamw("adamw"), sgd("sgd");
  adamw.steps(1, 0);
  sgd.steps(1, 0);
  io.save_optimizer(*adamw.wrapper, dir.file("opt"), {});
  auto before = sgd.opt->state().size();
  EXPECT_THAT([&] { io.load_optimizer(*sgd.wrapper, dir.file("opt")); },
              ThrowsMessage<CheckpointError>(HasSubstr("holds AdamW state but the optimizer is SGD")));
  EXPECT_EQ(sgd.opt->state().size(), before);
  // Different parameter names.
  Trainer other("adamw");
  auto names = other.wrapper->parameter_names();
  names[0] = "renamed.weight";
  other.wrapper->set_parameter_names(names);
  EXPECT_THAT([&] { io.load_optimizer(*other.wrapper, dir.file("opt")); },
              ThrowsMessage<CheckpointError>(HasSubstr("renamed.weight")));
  // A wrapper not made by boost() has no names.
  auto bare = OptimizerWrapper(make_opt("sgd", other.net->parameters()), nullptr);
  EXPECT_THROW(io.save_optimizer(bare, dir.file("x"), {}), CheckpointError);
  EXPECT_THROW(io.load_optimizer(*adamw.wrapper, dir.file("missing")), CheckpointError);
}

TEST(CheckpointIO, StrictLoadReportsEveryProblemTogetherAndChangesNothing) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Net saved;
  io.save_model(*saved, dir.file("m"), {});
  struct OtherImpl : torch::nn::Module {
    OtherImpl() {
      a = register_module("a", torch::nn::Linear(6, 4));  // wrong shape
      c = register_module("c", torch::nn::Linear(2, 2));  // missing in the file
    }
    torch::nn::Linear a{nullptr}, c{nullptr};
  };
  auto other = std::make_shared<OtherImpl>();
  auto w = other->a->weight.detach().clone();
  try {
    io.load_model(*other, dir.file("m"));
    FAIL() << "expected CheckpointError";
  } catch (const CheckpointError& e) {
    std::string m = e.what();
    EXPECT_THAT(m, HasSubstr("a.weight: shape [5, 6] in the checkpoint, [4, 6] in the model"));
    EXPECT_THAT(m, HasSubstr("missing keys (2): c.weight, c.bias"));
    EXPECT_THAT(m, HasSubstr("unexpected keys (2): b.weight, b.bias"));
  }
  EXPECT_TRUE(torch::equal(other->a->weight, w));
}

TEST(CheckpointIO, TiedWeightsAreWrittenOnceAndRestoredToBothNames) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  struct TiedImpl : torch::nn::Module {
    TiedImpl() {
      w = register_parameter("emb_weight", torch::randn({7, 4}));
      register_parameter("head_weight", w);  // the same tensor under a second name (weight tying)
    }
    torch::Tensor w;
  };
  auto saved = std::make_shared<TiedImpl>();
  io.save_model(*saved, dir.file("m"), {});
  auto file = load_safetensors(dir.file("m/model.safetensors"));
  ASSERT_EQ(file.size(), 1u);  // written once, as HF does
  EXPECT_EQ(file[0].first, "emb_weight");
  auto loaded = std::make_shared<TiedImpl>();
  io.load_model(*loaded, dir.file("m"));  // strict: head_weight is satisfied through the tie
  EXPECT_TRUE(torch::equal(loaded->named_parameters()["head_weight"], saved->w));
}

TEST(CheckpointIO, LrSchedulerRoundTrip) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Trainer a("sgd"), b("sgd");
  booster::CosineAnnealingLR sa(*a.opt, 20), sb(*b.opt, 20);
  for (int i = 0; i < 7; ++i) sa.step();
  io.save_lr_scheduler(sa, dir.file("sched/lr_scheduler.json"));
  io.load_lr_scheduler(sb, dir.file("sched/lr_scheduler.json"));
  for (int i = 0; i < 5; ++i) {
    sa.step();
    sb.step();
    EXPECT_EQ(sa.get_last_lr(), sb.get_last_lr());
  }
}

TEST(CheckpointIO, BoosterCkptInspectAndConvert) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  Net net;
  io.save_model(*net, dir.file("m"), {});
  auto r = booster::testing::run_process({BOOSTER_CLI_PATH, "ckpt", "inspect", dir.file("m")});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("format: safetensors"));
  EXPECT_THAT(r.output, HasSubstr("tensors: 4"));
  EXPECT_THAT(r.output, HasSubstr("total tensor bytes: 212"));  // (30 + 5 + 15 + 3) float32 = 212 bytes
  EXPECT_THAT(r.output, HasSubstr("a.weight  F32  [5, 6]"));
  auto c = booster::testing::run_process({BOOSTER_CLI_PATH, "ckpt", "convert", dir.file("m"), dir.file("bin"), "--to", "bin"});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_TRUE(std::filesystem::exists(dir.file("bin/pytorch_model.bin")));
  auto x = load_state_dict(dir.file("m")), y = load_state_dict(dir.file("bin"));
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(torch::equal(x[i].second, y[i].second));
  auto bad = booster::testing::run_process({BOOSTER_CLI_PATH, "ckpt", "inspect", dir.file("nope")});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("does not exist"));
}
