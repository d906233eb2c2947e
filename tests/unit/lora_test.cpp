// lora_test.cpp — booster/nn/lora.h on one process: enable_lora keeps the outputs at init (B = 0),
// trains only A and B, merge_lora reproduces the unmerged outputs, bad configs are refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "booster/nn/lora.h"
#include "booster/nn/tensor_parallel.h"

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
  booster::nn::set_tensor_parallel_context(booster::nn::TensorParallelContext{});
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
  std::vector<torch::Tensor> trainable;
  for (auto& p : net->parameters())
    if (p.requires_grad()) trainable.push_back(p);
  torch::optim::SGD opt(trainable, torch::optim::SGDOptions(0.1));
  for (int i = 0; i < 5; ++i) {
    opt.zero_grad();
    torch::mse_loss(net->forward(x), y).backward();
    opt.step();
  }
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
  EXPECT_THAT(error_of([&] { booster::nn::enable_lora(*net, config_of({"head"})); }), HasSubstr("torch::nn::Linear"));
  // Nothing was changed by the refusals.
  for (const auto& p : net->parameters()) EXPECT_TRUE(p.requires_grad());
  booster::nn::enable_lora(*net, config_of({"fc1"}));
  EXPECT_THAT(error_of([&] { booster::nn::enable_lora(*net, config_of({"fc1"})); }), HasSubstr("already has LoRA"));
}

}  // namespace lora_unit_test

namespace lora_unit_test {

// A clone of a LoRA layer does not share the original's adapters behind its back: cloning it, or
// running the clone, is refused.
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
