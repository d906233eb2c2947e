// booster_lora_test.cpp — the Booster's LoRA entry points on a world of one (torch_ddp):
// enable_lora before boost() and boost() leaving the frozen parameters out of the optimizer,
// save_lora_as_pretrained / load_lora through the checkpoint IO with the registered adapter, the
// base model loading through its HuggingFace adapter into a LoRA model, and the refusals (after
// boost(), no adapter registered, a full-model save through the adapter that would drop the
// adapters). Multi-rank plugins: tests/dist/gpt_example_test.cpp; against peft: tests/hf.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/optim/adamw.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "booster/booster.h"
#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/nn/lora.h"
#include "booster/nn/tensor_parallel.h"
#include "common/test_util.h"

namespace booster_lora_test {

using booster::checkpoint::AdapterRule;
using booster::checkpoint::CheckpointError;
using booster::checkpoint::StateDictAdapter;
using ::testing::HasSubstr;

booster::Booster make_ddp_booster() {
  booster::testing::ScopedEnv env;
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) env.unset(v);
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  return booster::Booster(booster::Config::from_string(
      "[booster]\nplugin = \"torch_ddp\"\nmixed_precision = \"fp32\"\n", "test.toml"));
}

// The layers' default tensor-parallel context: tp = 1 (torch_ddp's).
struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden = 6) {
    q = register_module("q", booster::nn::ColumnParallelLinear(6, hidden));
    o = register_module("o", booster::nn::RowParallelLinear(hidden, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return o(torch::tanh(q(x))); }
  booster::nn::ColumnParallelLinear q{nullptr};
  booster::nn::RowParallelLinear o{nullptr};
};
TORCH_MODULE(Net);

// A toy HuggingFace architecture: q -> attn.q_proj, o -> attn.o_proj, same layouts.
std::shared_ptr<StateDictAdapter> toy_adapter() {
  return std::make_shared<StateDictAdapter>(
      "ToyForTest", nlohmann::json{{"model_type", "toy"}}, std::vector<std::string>{},
      std::vector<AdapterRule>{AdapterRule::rename("q.weight", "attn.q_proj.weight"),
                               AdapterRule::rename("q.bias", "attn.q_proj.bias"),
                               AdapterRule::rename("o.weight", "attn.o_proj.weight"),
                               AdapterRule::rename("o.bias", "attn.o_proj.bias")});
}

booster::nn::LoraConfig lora_config() {
  booster::nn::LoraConfig c;
  c.r = 2;
  c.lora_alpha = 4;
  c.target_modules = {"q", "o"};
  return c;
}

TEST(BoosterLora, BoostTrainsTheAdaptersOnlyAndTheirFilesRoundTrip) {
  booster::testing::TempDir tmp;
  booster::Booster booster = make_ddp_booster();
  torch::manual_seed(5);
  auto net = std::make_shared<NetImpl>();
  // The base model, saved in the toy architecture before LoRA.
  {
    auto base = std::make_shared<NetImpl>();
    booster::checkpoint::CheckpointIO io(nullptr);
    booster::checkpoint::ModelSaveOptions so;
    so.adapter = toy_adapter();
    io.save_model(*base, tmp.file("base"), so);
  }
  auto report = booster.enable_lora(*net, lora_config());
  EXPECT_EQ(report.modules, (std::vector<std::string>{"q", "o"}));
  // The optimizer is built from every parameter; boost() keeps the four adapters.
  auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.05));
  auto boosted = booster.boost(net, adamw);
  auto& model = boosted.model;
  size_t held = 0;
  for (const auto& g : adamw->param_groups()) held += g.params().size();
  EXPECT_EQ(held, 4u);
  EXPECT_THROW(booster.enable_lora(*net, lora_config()), std::logic_error);  // after boost()

  // save_lora_as_pretrained needs the HuggingFace names of the registered adapter.
  EXPECT_THAT([&] { booster.save_lora_as_pretrained(model, tmp.file("none")); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("set_state_dict_adapter")));
  booster.set_state_dict_adapter(model, toy_adapter());  // LoRA tensors need no rule
  // The base weights load through the architecture's adapter; the adapters are not expected.
  booster.load_model(model, tmp.file("base"));

  torch::Tensor x = torch::randn({4, 6}), y = torch::randn({4, 3});
  torch::Tensor base_w = net->q->weight.detach().clone();
  for (int i = 0; i < 3; ++i) {
    auto loss = torch::mse_loss(model.forward(x), y);
    booster.backward(loss, *boosted.optimizer);
    boosted.optimizer->step();
    boosted.optimizer->zero_grad();
  }
  EXPECT_TRUE(torch::equal(net->q->weight, base_w));  // frozen
  EXPECT_GT(net->q->named_parameters()["lora_B.weight"].abs().max().item<double>(), 0.0);

  // A full save through the architecture would drop the adapters: refused.
  EXPECT_THAT([&] { booster.save_model(model, tmp.file("full")); },
              ::testing::ThrowsMessage<CheckpointError>(HasSubstr("save_lora_as_pretrained")));
  booster.save_lora_as_pretrained(model, tmp.file("lora"), "toy-base");
  auto state = booster::checkpoint::load_state_dict(tmp.file("lora"), "adapter_model");
  ASSERT_EQ(state.size(), 4u);
  EXPECT_EQ(state[0].first, "base_model.model.attn.q_proj.lora_A.weight");
  EXPECT_TRUE(torch::equal(state[1].second, net->q->named_parameters()["lora_B.weight"]));
  const auto config = booster::checkpoint::read_config_json(tmp.file("lora"), "adapter_config.json");
  EXPECT_EQ(config.at("base_model_name_or_path"), "toy-base");
  EXPECT_EQ(config.at("target_modules"), nlohmann::json({"o", "q"}));
  EXPECT_FALSE(config.contains("architectures"));

  // Back into a fresh LoRA model: the same outputs.
  torch::Tensor want = model.forward(x).detach();
  booster::Booster second = make_ddp_booster();
  torch::manual_seed(6);
  auto other = std::make_shared<NetImpl>();
  second.enable_lora(*other, lora_config());
  auto opt2 = std::make_shared<torch::optim::AdamW>(other->parameters(), torch::optim::AdamWOptions(0.05));
  auto b2 = second.boost(other, opt2);
  second.set_state_dict_adapter(b2.model, toy_adapter());
  second.load_model(b2.model, tmp.file("base"));
  second.load_lora(b2.model, tmp.file("lora"));
  EXPECT_TRUE(torch::allclose(b2.model.forward(x), want, 1e-6, 1e-6));
  // An adapter of another rank is refused before anything changes.
  auto mismatched = lora_config();
  mismatched.r = 3;
  auto third_net = std::make_shared<NetImpl>();
  booster::Booster third = make_ddp_booster();
  third.enable_lora(*third_net, mismatched);
  auto b3 = third.boost(third_net, std::make_shared<torch::optim::AdamW>(third_net->parameters()));
  third.set_state_dict_adapter(b3.model, toy_adapter());
  EXPECT_THAT([&] { third.load_lora(b3.model, tmp.file("lora")); },
              ::testing::ThrowsMessage<CheckpointError>(HasSubstr("r is 2 in the file but 3")));
  // Adapters of a base model of another size: the shapes are named, nothing changes.
  booster::Booster fourth = make_ddp_booster();
  auto wide = std::make_shared<NetImpl>(8);
  fourth.enable_lora(*wide, lora_config());
  auto b4 = fourth.boost(wide, std::make_shared<torch::optim::AdamW>(wide->parameters()));
  fourth.set_state_dict_adapter(b4.model, toy_adapter());
  const torch::Tensor a_before = wide->q->named_parameters()["lora_A.weight"].clone();
  EXPECT_THAT([&] { fourth.load_lora(b4.model, tmp.file("lora")); },
              ::testing::ThrowsMessage<CheckpointError>(
                  HasSubstr("base_model.model.attn.q_proj.lora_B.weight: shape [6, 2] in the checkpoint, [8, 2] in the model")));
  EXPECT_TRUE(torch::equal(wide->q->named_parameters()["lora_A.weight"], a_before));
}

TEST(BoosterLora, AnOptimizerOfFrozenParametersOnlyIsRefused) {
  booster::Booster booster = make_ddp_booster();
  auto net = std::make_shared<NetImpl>();
  for (auto& p : net->parameters()) p.set_requires_grad(false);
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_THAT([&] { booster.boost(net, sgd); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("every parameter the optimizer holds is frozen")));
}

}  // namespace booster_lora_test
