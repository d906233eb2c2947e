// lora_test.cpp — booster/nn/lora.h: enable_lora keeps the outputs at init (B = 0), trains only A
// and B, merge_lora reproduces the unmerged outputs, bad configs are refused, lora_layers describes
// the layers; tensor-parallel adapters (tp = 2 as thread ranks) train like the dense ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>

#include <torch/torch.h>

#include <map>
#include <mutex>

#include "booster/nn/lora.h"
#include "booster/nn/tensor_parallel.h"
#include "common/thread_ranks.h"

namespace lora_unit_test {

using ::testing::HasSubstr;

// Two-layer MLP with tp = 1 parallel layers (= torch::nn::Linear) and a plain Linear head.
struct LoraNetImpl : torch::nn::Module {
  LoraNetImpl() {
    fc1 = register_module("fc1", booster::nn::ColumnParallelLinear(8, 16));
    fc2 = register_module("fc2", booster::nn::RowParallelLinear(16, 8));
    head = register_module("head", torch::nn::Linear(8, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(torch::relu(fc2(torch::relu(fc1(x))))); }
  booster::nn::ColumnParallelLinear fc1{nullptr};
  booster::nn::RowParallelLinear fc2{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(LoraNet);

LoraNet make_net() {
  torch::manual_seed(3);
  return LoraNet();
}

booster::nn::LoraConfig config_of(std::vector<std::string> targets, int64_t r = 4, double alpha = 8) {
  booster::nn::LoraConfig c;
  c.r = r;
  c.lora_alpha = alpha;
  c.target_modules = std::move(targets);
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument)";
}

// `steps` SGD steps (learning rate lr) on the parameters of `net` that require grad (the adapters
// after enable_lora), each minimising loss().
void train_trainable(torch::nn::Module& net, double lr, int steps, const std::function<torch::Tensor()>& loss) {
  std::vector<torch::Tensor> trainable;
  for (auto& p : net.parameters())
    if (p.requires_grad()) trainable.push_back(p);
  torch::optim::SGD opt(trainable, torch::optim::SGDOptions(lr));
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    loss().backward();
    opt.step();
  }
}

TEST(Lora, InitKeepsOutputsAndOnlyAdaptersTrain) {
  LoraNet net = make_net();
  torch::Tensor x = torch::randn({5, 8});
  torch::Tensor before = net->forward(x).detach();
  auto report = booster::nn::enable_lora(*net, config_of({"fc1", "fc2"}));
  EXPECT_EQ(report.modules, (std::vector<std::string>{"fc1", "fc2"}));
  EXPECT_EQ(report.trainable_parameters, 4 * 8 + 16 * 4 + 4 * 16 + 8 * 4);
  EXPECT_TRUE(torch::equal(net->forward(x), before));
  std::vector<std::string> trainable;
  for (const auto& p : net->named_parameters())
    if (p.value().requires_grad()) trainable.push_back(p.key());
  EXPECT_EQ(trainable, (std::vector<std::string>{"fc1.lora_A.weight", "fc1.lora_B.weight", "fc2.lora_A.weight",
                                                 "fc2.lora_B.weight"}));
  // A is Kaiming-uniform(a = sqrt(5)) on [r, in]: bound 1 / sqrt(in); B zero.
  auto params = net->named_parameters();
  EXPECT_LE(params["fc1.lora_A.weight"].abs().max().item<double>(), 1.0 / std::sqrt(8.0));
  EXPECT_GT(params["fc1.lora_A.weight"].abs().max().item<double>(), 0.0);
  EXPECT_EQ(params["fc1.lora_B.weight"].abs().max().item<double>(), 0.0);
  EXPECT_EQ(params["fc1.weight"].sizes(), (std::vector<int64_t>{16, 8}));  // base names unchanged
  EXPECT_EQ(booster::nn::lora_modules(*net), (std::vector<std::string>{"fc1", "fc2"}));
}

TEST(Lora, TrainingChangesOutputsAndMergeMatches) {
  LoraNet net = make_net();
  torch::Tensor x = torch::randn({6, 8}), y = torch::randn({6, 4});
  torch::Tensor before = net->forward(x).detach();
  auto base = net->named_parameters();
  std::map<std::string, torch::Tensor> base_copy;
  for (const auto& p : base) base_copy[p.key()] = p.value().detach().clone();
  booster::nn::enable_lora(*net, config_of({"fc1", "fc2"}, 4, 16));
  train_trainable(*net, 0.1, 5, [&] { return torch::mse_loss(net->forward(x), y); });
  torch::Tensor after = net->forward(x).detach();
  EXPECT_GT((after - before).abs().max().item<double>(), 1e-3);
  for (const auto& p : net->named_parameters())  // base parameters untouched
    if (base_copy.count(p.key())) EXPECT_TRUE(torch::equal(p.value(), base_copy[p.key()])) << p.key();
  auto merged = booster::nn::merge_lora(*net);
  EXPECT_EQ(merged, (std::vector<std::string>{"fc1", "fc2"}));
  EXPECT_TRUE(booster::nn::lora_modules(*net).empty());
  EXPECT_EQ(net->named_parameters().size(), base_copy.size());  // adapters gone: the base model's names
  const double d = (net->forward(x).detach() - after).abs().max().item<double>();
  std::cout << "max |merged - unmerged| = " << d << std::endl;
  EXPECT_LT(d, 1e-6);
}

TEST(Lora, DropoutOnlyInTraining) {
  LoraNet net = make_net();
  auto c = config_of({"fc1"});
  c.lora_dropout = 0.5;
  booster::nn::enable_lora(*net, c);
  {
    torch::NoGradGuard g;
    net->named_parameters()["fc1.lora_B.weight"].normal_();
  }
  torch::Tensor x = torch::randn({4, 8});
  net->eval();
  EXPECT_TRUE(torch::equal(net->forward(x), net->forward(x)));
  net->train();
  EXPECT_FALSE(torch::equal(net->forward(x), net->forward(x)));
}

TEST(Lora, BadInput) {
  LoraNet net = make_net();
  EXPECT_THAT(error_of([&] { booster::nn::enable_lora(*net, config_of({"fc1"}, 0)); }), HasSubstr("r = 0 must be >= 1"));
  EXPECT_THAT(error_of([&] { booster::nn::enable_lora(*net, config_of({"fc1"}, 4, 0)); }), HasSubstr("lora_alpha"));
  auto c = config_of({"fc1"});
  c.lora_dropout = 1.0;
  EXPECT_THAT(error_of([&] { booster::nn::enable_lora(*net, c); }), HasSubstr("lora_dropout"));
  c = config_of({"fc1"});
  c.bias = "all";
  EXPECT_THAT(error_of([&] { booster::nn::enable_lora(*net, c); }), HasSubstr("bias"));
  EXPECT_THAT(error_of([&] { booster::nn::enable_lora(*net, config_of({})); }), HasSubstr("target_modules is empty"));
  const std::string none = error_of([&] { booster::nn::enable_lora(*net, config_of({"q_proj"})); });
  EXPECT_THAT(none, HasSubstr("match no module"));
  EXPECT_THAT(none, HasSubstr("fc1, fc2, head"));
  // "c1" is not a suffix after a dot: PEFT's rule.
  EXPECT_THAT(error_of([&] { booster::nn::enable_lora(*net, config_of({"c1"})); }), HasSubstr("match no module"));
  EXPECT_THAT(error_of([&] { booster::nn::enable_lora(*net, config_of({"head"})); }),
              HasSubstr("is a torch::nn::Linear, whose forward has no hook point in LibTorch, so LoRA cannot be added to "
                        "it: build it as booster::nn::Linear"));
  // Nothing was changed by the refusals.
  for (const auto& p : net->parameters()) EXPECT_TRUE(p.requires_grad());
  booster::nn::enable_lora(*net, config_of({"fc1"}));
  EXPECT_THAT(error_of([&] { booster::nn::enable_lora(*net, config_of({"fc1"})); }), HasSubstr("already has LoRA"));
}

// lora_layers: each LoRA layer's description (names, config, the adapters' modules, the dense
// shapes), the shared config, and the refusals (no LoRA; layers with different r).
TEST(Lora, LoraLayersDescribesTheLayers) {
  LoraNet net = make_net();
  EXPECT_THAT(error_of([&] { booster::nn::lora_layers(*net, "caller: "); }),
              HasSubstr("caller: the model has no LoRA layers"));
  booster::nn::enable_lora(*net, config_of({"fc2", "fc1"}, 4, 16));
  const booster::nn::ModelLoraInfo info = booster::nn::lora_layers(*net);
  EXPECT_EQ(info.r, 4);
  EXPECT_EQ(info.lora_alpha, 16);
  EXPECT_EQ(info.lora_dropout, 0);
  EXPECT_EQ(info.targets, (std::vector<std::string>{"fc1", "fc2"}));
  ASSERT_EQ(info.layers.size(), 2u);
  const auto& c = info.layers[0];
  const auto& r = info.layers[1];
  EXPECT_EQ(c.name, "fc1");
  EXPECT_EQ(c.module, net->fc1.get());
  EXPECT_EQ(c.target, "fc1");
  EXPECT_FALSE(c.tensor_parallel);
  EXPECT_FALSE(c.row_parallel);
  EXPECT_EQ(c.full_out, 16);
  EXPECT_EQ(c.full_in, 8);
  EXPECT_TRUE(c.lora_A->weight.is_same(net->named_parameters()["fc1.lora_A.weight"]));
  EXPECT_TRUE(c.lora_B->weight.is_same(net->named_parameters()["fc1.lora_B.weight"]));
  EXPECT_EQ(r.name, "fc2");
  EXPECT_TRUE(r.row_parallel);
  EXPECT_EQ(r.lora_A->weight.sizes(), (std::vector<int64_t>{4, 16}));
  EXPECT_EQ(r.lora_B->weight.sizes(), (std::vector<int64_t>{8, 4}));

  LoraNet mixed = make_net();
  booster::nn::enable_lora(*mixed, config_of({"fc1"}, 4));
  booster::nn::enable_lora(*mixed, config_of({"fc2"}, 2));
  EXPECT_THAT(error_of([&] { booster::nn::lora_layers(*mixed); }),
              HasSubstr("booster::nn::lora_layers: the LoRA layers fc1 and fc2 have different r"));
}

}  // namespace lora_unit_test

namespace lora_unit_test {

// A clone of a LoRA layer does not share the original's adapters behind its back: cloning it, or
// running the clone, is refused.
// One layer `lin` of type L (booster::nn::Linear or ColumnParallelLinear at tp = 1).
template <class L>
struct OneLayer : torch::nn::Module {
  OneLayer() { lin = register_module("lin", L(6, 5)); }
  torch::Tensor forward(const torch::Tensor& x) { return lin(x); }
  L lin{nullptr};
};

TEST(Lora, BoosterLinearIsTorchLinearWithAHookPointAndTakesLora) {
  // Without LoRA: torch::nn::Linear's names, initial values and outputs, bit for bit.
  torch::manual_seed(11);
  torch::nn::Linear plain(torch::nn::LinearOptions(6, 5));
  torch::manual_seed(11);
  booster::nn::Linear ours(torch::nn::LinearOptions(6, 5));
  const torch::Tensor x = torch::randn({7, 6});
  EXPECT_EQ(ours->named_parameters().keys(), plain->named_parameters().keys());
  EXPECT_TRUE(torch::equal(ours->weight, plain->weight));
  EXPECT_TRUE(torch::equal(ours->bias, plain->bias));
  EXPECT_TRUE(torch::equal(ours(x), plain(x)));
  booster::nn::Linear no_bias(torch::nn::LinearOptions(6, 5).bias(false));
  EXPECT_EQ(no_bias->named_parameters().size(), 1u);
  EXPECT_THROW(booster::nn::Linear(0, 5), std::invalid_argument);
  // With LoRA: the same training as LoRA on a ColumnParallelLinear (tp = 1) from the same seeds.
  auto train = [&](auto net) {
    torch::manual_seed(12);
    booster::nn::enable_lora(*net, config_of({"lin"}, 2, 4));
    int64_t trainable = 0;
    for (auto& p : net->parameters()) trainable += p.requires_grad();
    EXPECT_EQ(trainable, 2);  // A and B
    train_trainable(*net, 0.1, 3, [&] { return net->forward(x).pow(2).mean(); });
    torch::Tensor y = net->forward(x).detach();
    EXPECT_EQ(booster::nn::merge_lora(*net).size(), 1u);
    EXPECT_LT((net->forward(x) - y).abs().max().template item<double>(), 1e-6);  // merged = unmerged
    return y;
  };
  torch::manual_seed(13);
  auto dense = std::make_shared<OneLayer<booster::nn::Linear>>();
  torch::manual_seed(13);
  auto column = std::make_shared<OneLayer<booster::nn::ColumnParallelLinear>>();
  const torch::Tensor a = train(dense), b = train(column);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::equal(a, column->forward(x).detach() * 0));  // it trained to something
}

TEST(Lora, CloneOfALoraLayerIsRefused) {
  LoraNet net = make_net();
  booster::nn::enable_lora(*net, config_of({"fc1"}));
  torch::Tensor x = torch::randn({2, 8});
  EXPECT_ANY_THROW({
    auto copy = std::dynamic_pointer_cast<booster::nn::ColumnParallelLinearImpl>(net->fc1->clone());
    copy->forward(x);
  });
}

}  // namespace lora_unit_test

namespace lora_unit_test {

// Column (split output) -> row (split input) -> column with gather_output -> row with a full
// input: every tensor-parallel branch of the LoRA hook.
struct TpNetImpl : torch::nn::Module {
  explicit TpNetImpl(std::shared_ptr<booster::dist::ProcessGroup> g) {
    using booster::nn::LinearParallelOptions;
    fc1 = register_module("fc1", booster::nn::ColumnParallelLinear(LinearParallelOptions(8, 16).group(g)));
    fc2 = register_module("fc2", booster::nn::RowParallelLinear(LinearParallelOptions(16, 8).group(g)));
    fc3 = register_module("fc3", booster::nn::ColumnParallelLinear(LinearParallelOptions(8, 12).group(g).gather_output(true)));
    fc4 = register_module("fc4", booster::nn::RowParallelLinear(LinearParallelOptions(12, 4).group(g).input_is_parallel(false)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc4(torch::relu(fc3(torch::relu(fc2(torch::relu(fc1(x)))))));
  }
  booster::nn::ColumnParallelLinear fc1{nullptr}, fc3{nullptr};
  booster::nn::RowParallelLinear fc2{nullptr}, fc4{nullptr};
};
TORCH_MODULE(TpNet);

struct TpRun {
  torch::Tensor out;                          // forward after training
  std::map<std::string, torch::Tensor> lora;  // this rank's adapter tensors
};

// Seeded model (built under a lock: the global generator is shared by the thread ranks), LoRA on
// every layer, 3 SGD steps on a fixed batch.
TpRun train_tp(const std::shared_ptr<booster::dist::ProcessGroup>& g) {
  static std::mutex build;
  TpNet net{nullptr};
  {
    std::lock_guard<std::mutex> lock(build);
    torch::manual_seed(11);
    net = TpNet(g);
    booster::nn::enable_lora(*net, config_of({"fc1", "fc2", "fc3", "fc4"}, 2, 4));
  }
  torch::Tensor x = torch::linspace(-1, 1, 6 * 8).reshape({6, 8}), y = torch::cos(torch::arange(24.0)).reshape({6, 4});
  train_trainable(*net, 0.5, 3, [&] { return torch::mse_loss(net->forward(x), y); });
  TpRun r;
  r.out = net->forward(x).detach();
  for (const auto& p : net->named_parameters())
    if (p.key().find("lora_") != std::string::npos) r.lora[p.key()] = p.value().detach().clone();
  return r;
}

// tp = 2 (thread ranks) against tp = 1: the same outputs and adapters (each rank's adapters are the
// tp = 1 adapters split like the base weight: B's rows of a column-parallel layer, A's columns of a
// row-parallel one), within float32 reassociation.
TEST(Lora, TensorParallelAdaptersTrainLikeTheDenseModel) {
  TpRun dense = train_tp(nullptr);
  EXPECT_GT(dense.lora.at("fc1.lora_B.weight").abs().max().item<double>(), 0.0);
  std::vector<TpRun> ranks(2);
  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
    ranks[g->rank()] = train_tp(g);
  });
  ASSERT_EQ(errors, std::vector<std::string>(2, ""));
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE("tp rank " + std::to_string(r));
    EXPECT_LT((ranks[r].out - dense.out).abs().max().item<double>(), 1e-5);
    for (const auto& [name, full] : dense.lora) {
      const bool row = name.rfind("fc2", 0) == 0 || name.rfind("fc4", 0) == 0;
      const bool is_a = name.find("lora_A") != std::string::npos;
      torch::Tensor want = full;
      if (row && is_a) want = full.narrow(1, r * full.size(1) / 2, full.size(1) / 2);
      if (!row && !is_a) want = full.narrow(0, r * full.size(0) / 2, full.size(0) / 2);
      ASSERT_EQ(ranks[r].lora.at(name).sizes(), want.sizes()) << name;
      EXPECT_LT((ranks[r].lora.at(name) - want).abs().max().item<double>(), 1e-5) << name;
    }
  }
}

}  // namespace lora_unit_test
