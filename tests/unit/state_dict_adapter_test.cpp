// state_dict_adapter_test.cpp — the state-dict adapter mechanism (checkpoint/state_dict_adapter.h)
// on small modules: rule matching with {i}, planning by shape, split tensors, save and load through
// CheckpointIO, the built-in gpt2 / llama layouts against their definitions element by element, the
// config check and the registry. (The models against transformers: tests/hf/hf_interop_test.cpp.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <filesystem>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/checkpoint/state_dict_io.h"
#include "common/test_util.h"

namespace {

using booster::checkpoint::AdapterRule;
using booster::checkpoint::CheckpointError;
using booster::checkpoint::StateDictAdapter;
using booster::checkpoint::TensorSpec;
using json = nlohmann::json;
using ::testing::HasSubstr;

// Two "layers", each with a fused qkv [6, 4] (rows q|k|v, 2 each) and a norm weight [4].
struct FusedLayer : torch::nn::Module {
  FusedLayer() {
    qkv = register_parameter("qkv", torch::randn({6, 4}));
    norm = register_parameter("norm", torch::randn({4}));
  }
  torch::Tensor qkv, norm;
};
struct FusedNet : torch::nn::Module {
  FusedNet() {
    auto layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < 2; ++i) {
      auto layer = std::make_shared<FusedLayer>();
      layers->push_back(layer);
      qkv.push_back(layer->qkv);
      norm.push_back(layer->norm);
    }
  }
  std::vector<torch::Tensor> qkv, norm;
};

// Stores qkv split into q_proj / k_proj / v_proj and norm as ln.weight.
StateDictAdapter split_adapter() {
  AdapterRule split{"layers.{i}.qkv",
                    {"h.{i}.q_proj.weight", "h.{i}.k_proj.weight", "h.{i}.v_proj.weight"},
                    [](const at::Tensor& t) {
                      auto parts = t.split(t.size(0) / 3, 0);
                      return std::vector<at::Tensor>(parts.begin(), parts.end());
                    },
                    [](const std::vector<at::Tensor>& p) { return at::cat(p, 0); }};
  return StateDictAdapter("FusedForTest", json{{"model_type", "fused"}, {"hidden", 4}}, {"hidden"},
                          {split, AdapterRule::rename("layers.{i}.norm", "h.{i}.ln.weight")}, {"h.{i}.ignored"});
}

TEST(StateDictAdapter, PlansNamesAndShapesWithIndices) {
  StateDictAdapter a = split_adapter();
  auto plan = a.plan({{"layers.0.qkv", at::kFloat, {6, 4}}, {"layers.12.norm", at::kFloat, {4}}});
  ASSERT_EQ(plan.size(), 2u);
  ASSERT_EQ(plan[0].hf.size(), 3u);
  EXPECT_EQ(plan[0].hf[1].name, "h.0.k_proj.weight");
  EXPECT_EQ(plan[0].hf[1].shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(plan[1].hf.at(0).name, "h.12.ln.weight");
  EXPECT_TRUE(a.ignored_on_load("h.3.ignored"));
  EXPECT_FALSE(a.ignored_on_load("h.x.ignored"));  // {i} matches digits only
}

TEST(StateDictAdapter, PlanNamesUncoveredTensorsMisfitTransformsAndDuplicates) {
  StateDictAdapter a = split_adapter();
  try {
    a.plan({{"layers.0.qkv", at::kFloat, {5, 4}}, {"head.weight", at::kFloat, {2}}, {"layers.0.norm", at::kFloat, {4}}});
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensors no rule covers (1): head.weight"));
    EXPECT_THAT(e.what(), HasSubstr("layers.0.qkv [5, 4]"));  // 5 rows do not split into 3
  }
  StateDictAdapter dup("Dup", json::object(), {}, {AdapterRule::rename("a", "x"), AdapterRule::rename("b", "x")});
  EXPECT_THROW(dup.plan({{"a", at::kFloat, {1}}, {"b", at::kFloat, {1}}}), CheckpointError);
  EXPECT_THROW(StateDictAdapter("Bad", json::object(), {}, {AdapterRule{"a", {"x", "y"}, {}, {}}}), std::invalid_argument);
  EXPECT_THROW(StateDictAdapter("Bad", json::object(), {}, {AdapterRule::rename("a.{i}", "x")}), std::invalid_argument);
}

TEST(StateDictAdapter, SplitTensorsSaveAndLoadThroughCheckpointIO) {
  booster::testing::TempDir tmp;
  torch::manual_seed(1);
  FusedNet a, b;
  auto adapter = std::make_shared<StateDictAdapter>(split_adapter());
  booster::checkpoint::CheckpointIO io(nullptr);
  booster::checkpoint::ModelSaveOptions so;
  so.adapter = adapter;
  io.save_model(a, tmp.file("ckpt"), so);
  // The file holds the HuggingFace names, the parts of qkv as written by to_hf, and config.json.
  auto state = booster::checkpoint::load_state_dict(tmp.file("ckpt"));
  std::map<std::string, torch::Tensor> by_name(state.begin(), state.end());
  ASSERT_EQ(by_name.size(), 8u);
  EXPECT_TRUE(torch::equal(by_name.at("h.1.v_proj.weight"), a.qkv[1].narrow(0, 4, 2)));
  EXPECT_TRUE(torch::equal(by_name.at("h.0.ln.weight"), a.norm[0]));
  const json config = booster::checkpoint::read_config_json(tmp.file("ckpt"));
  EXPECT_EQ(config.at("architectures"), json::array({"FusedForTest"}));
  EXPECT_EQ(config.at("hidden"), 4);

  booster::checkpoint::ModelLoadOptions lo;
  lo.adapter = adapter;
  io.load_model(b, tmp.file("ckpt"), lo);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(torch::equal(a.qkv[i], b.qkv[i]));
    EXPECT_TRUE(torch::equal(a.norm[i], b.norm[i]));
  }
  // A part missing from the file is named under strict loading; the model is unchanged.
  booster::checkpoint::StateDict partial;
  for (auto& [n, t] : state)
    if (n != "h.0.k_proj.weight") partial.emplace_back(n, t);
  partial.emplace_back("h.1.ignored", torch::zeros({1}));  // dropped on load, not unexpected
  booster::checkpoint::save_state_dict(tmp.file("partial"), partial, {});
  FusedNet c;
  auto before = c.qkv[0].clone();
  try {
    io.load_model(c, tmp.file("partial"), lo);
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing keys (1): h.0.k_proj.weight"));
    EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("ignored")));
  }
  EXPECT_TRUE(torch::equal(before, c.qkv[0]));
}

// A partial format (PEFT's LoRA files are one): tensors no rule covers are left out of the save and
// not expected on load; the files take the format's names; with_format copies the rules.
TEST(StateDictAdapter, PartialFormatSavesAndLoadsTheCoveredTensorsOnly) {
  booster::testing::TempDir tmp;
  torch::manual_seed(2);
  FusedNet a, b;
  booster::checkpoint::AdapterFormat format;
  format.weights_name = "norms";
  format.config_file = "norms_config.json";
  format.partial = true;
  auto full = std::make_shared<StateDictAdapter>(
      "", json{{"kind", "norms"}}, std::vector<std::string>{},
      std::vector<AdapterRule>{AdapterRule::rename("layers.{i}.norm", "n.{i}")});
  auto partial = full->with_format(format);
  EXPECT_FALSE(full->format().partial);
  EXPECT_THROW(full->plan({{"layers.0.qkv", at::kFloat, {6, 4}}}), CheckpointError);
  auto plan = partial->plan({{"layers.0.qkv", at::kFloat, {6, 4}}, {"layers.0.norm", at::kFloat, {4}}});
  ASSERT_EQ(plan.size(), 2u);  // index j stays the model tensor j
  EXPECT_TRUE(plan[0].hf.empty());
  EXPECT_EQ(plan[0].rule, nullptr);
  ASSERT_EQ(plan[1].hf.size(), 1u);
  EXPECT_EQ(plan[1].hf[0].name, "n.0");

  booster::checkpoint::CheckpointIO io(nullptr);
  booster::checkpoint::ModelSaveOptions so;
  so.adapter = partial;
  io.save_model(a, tmp.file("ckpt"), so);
  EXPECT_TRUE(std::filesystem::exists(tmp.file("ckpt/norms.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(tmp.file("ckpt/model.safetensors")));
  // No architecture: the config text is the config alone.
  EXPECT_EQ(booster::checkpoint::read_config_json(tmp.file("ckpt"), "norms_config.json"), json({{"kind", "norms"}}));
  auto state = booster::checkpoint::load_state_dict(tmp.file("ckpt"), "norms");
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].first, "n.0");
  EXPECT_TRUE(torch::equal(state[1].second, a.norm[1]));

  booster::checkpoint::ModelLoadOptions lo;
  lo.adapter = partial;
  auto qkv_before = b.qkv[0].clone();
  io.load_model(b, tmp.file("ckpt"), lo);  // strict: qkv is not part of the format, so not missing
  EXPECT_TRUE(torch::equal(b.norm[0], a.norm[0]));
  EXPECT_TRUE(torch::equal(b.qkv[0], qkv_before));
  // Bad file names are refused at construction.
  format.config_file = "a/b.json";
  EXPECT_THROW(full->with_format(format), std::invalid_argument);
}

TEST(StateDictAdapter, ConfigCheckNamesArchitectureAndSizes) {
  StateDictAdapter a = split_adapter();
  a.check_config(json::object(), "dir");                               // no config.json: nothing to check
  a.check_config(json{{"model_type", "fused"}, {"hidden", 4.0}}, "dir");  // 4 == 4.0
  a.check_config(json{{"model_type", "fused"}}, "dir");                // a field the file omits is not compared
  try {
    a.check_config(json{{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}}}, "dir");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("LlamaForCausalLM (model_type llama)"));
    EXPECT_THAT(e.what(), HasSubstr("FusedForTest (model_type fused)"));
  }
  try {
    a.check_config(json{{"model_type", "fused"}, {"hidden", 8}}, "dir");
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("hidden = 8 in the checkpoint, 4 in the model"));
  }
}

// gpt2: c_attn [3C, C] rows [head, q|k|v, head_dim] -> Conv1D [C, 3C] columns [q|k|v, head, head_dim].
TEST(BuiltinAdapters, Gpt2LayoutMatchesItsDefinitionElementByElement) {
  const int64_t H = 2, D = 3, C = H * D;
  auto adapter = booster::checkpoint::make_state_dict_adapter(
      "gpt2", json{{"model_type", "gpt2"}, {"n_head", H}, {"n_embd", C}, {"n_layer", 1}});
  auto plan = adapter->plan({{"transformer.h.0.attn.c_attn.weight", at::kFloat, {3 * C, C}},
                             {"transformer.h.0.attn.c_attn.bias", at::kFloat, {3 * C}},
                             {"transformer.h.0.mlp.c_fc.weight", at::kFloat, {4 * C, C}}});
  auto w = torch::randn({3 * C, C}), b = torch::randn({3 * C}), fc = torch::randn({4 * C, C});
  auto hw = booster::checkpoint::to_hf(plan[0], w).at(0);
  auto hb = booster::checkpoint::to_hf(plan[1], b).at(0);
  EXPECT_EQ(hw.sizes(), (at::IntArrayRef{C, 3 * C}));
  for (int64_t h = 0; h < H; ++h)
    for (int64_t part = 0; part < 3; ++part)
      for (int64_t d = 0; d < D; ++d) {
        const int64_t ours = (h * 3 + part) * D + d, hf = part * C + h * D + d;
        EXPECT_TRUE(torch::equal(hw.select(1, hf), w.select(0, ours)));
        EXPECT_EQ(hb[hf].item<float>(), b[ours].item<float>());
      }
  EXPECT_TRUE(torch::equal(booster::checkpoint::to_hf(plan[2], fc).at(0), fc.t()));
  EXPECT_TRUE(torch::equal(booster::checkpoint::from_hf(plan[0], {hw}), w));
  EXPECT_TRUE(torch::equal(booster::checkpoint::from_hf(plan[1], {hb}), b));
  EXPECT_TRUE(adapter->ignored_on_load("lm_head.weight"));
  EXPECT_THROW(booster::checkpoint::make_state_dict_adapter(
                   "gpt2", json{{"model_type", "gpt2"}, {"n_head", 4}, {"n_embd", 6}, {"n_layer", 1}}),
               CheckpointError);
}

// llama: ours rotates interleaved pairs (2j, 2j+1) of each head; transformers rotates (j, j + D/2):
// HF row h D + r D/2 + j holds our row h D + 2 j + r.
TEST(BuiltinAdapters, LlamaRotaryPermutationMatchesItsDefinition) {
  const int64_t H = 4, KV = 2, D = 4, C = H * D;
  auto adapter = booster::checkpoint::make_state_dict_adapter(
      "llama", json{{"model_type", "llama"}, {"num_attention_heads", H}, {"num_key_value_heads", KV},
                    {"hidden_size", C}, {"num_hidden_layers", 1}});
  auto plan = adapter->plan({{"model.layers.0.self_attn.q_proj.weight", at::kFloat, {H * D, C}},
                             {"model.layers.0.self_attn.k_proj.weight", at::kFloat, {KV * D, C}},
                             {"model.layers.0.self_attn.v_proj.weight", at::kFloat, {KV * D, C}}});
  auto q = torch::randn({H * D, C}), k = torch::randn({KV * D, C}), v = torch::randn({KV * D, C});
  auto hq = booster::checkpoint::to_hf(plan[0], q).at(0), hk = booster::checkpoint::to_hf(plan[1], k).at(0);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t j = 0; j < D / 2; ++j)
      for (int64_t r = 0; r < 2; ++r) {
        EXPECT_TRUE(torch::equal(hq[h * D + r * D / 2 + j], q[h * D + 2 * j + r]));
        if (h < KV) EXPECT_TRUE(torch::equal(hk[h * D + r * D / 2 + j], k[h * D + 2 * j + r]));
      }
  EXPECT_TRUE(torch::equal(booster::checkpoint::from_hf(plan[0], {hq}), q));
  EXPECT_TRUE(torch::equal(booster::checkpoint::from_hf(plan[1], {hk}), k));
  EXPECT_TRUE(torch::equal(booster::checkpoint::to_hf(plan[2], v).at(0), v));
  EXPECT_THROW(booster::checkpoint::make_state_dict_adapter(
                   "llama", json{{"model_type", "llama"}, {"num_attention_heads", H}, {"hidden_size", C},
                                 {"num_hidden_layers", 1}, {"tie_word_embeddings", true}}),
               CheckpointError);
}

TEST(AdapterRegistry, NamesTheRegisteredOnesAndRefusesDuplicates) {
  auto names = booster::checkpoint::state_dict_adapter_names();
  EXPECT_THAT(names, ::testing::IsSupersetOf({"gpt2", "llama"}));
  try {
    booster::checkpoint::make_state_dict_adapter("gpt3", json::object());
    FAIL();
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("gpt3"));
    EXPECT_THAT(e.what(), HasSubstr("gpt2, llama"));
  }
  booster::checkpoint::register_state_dict_adapter(
      "fused_for_test", [](const json&) { return std::make_shared<StateDictAdapter>(split_adapter()); });
  EXPECT_EQ(booster::checkpoint::make_state_dict_adapter("fused_for_test", json::object())->architecture(),
            "FusedForTest");
  EXPECT_THROW(booster::checkpoint::register_state_dict_adapter("gpt2", [](const json&) { return nullptr; }),
               std::invalid_argument);
}

}  // namespace
