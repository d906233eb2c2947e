// peft_interop_test.cpp — LoRA (booster/nn/lora.h) and its PEFT files (booster/checkpoint/
// peft_lora.h) against peft 0.21.2 on CPU, with examples/llama's Llama loaded from hf_reference.py's
// tiny random LlamaForCausalLM through the "llama" state-dict adapter (tests/hf/peft_reference.py is
// peft's side):
//  - ours -> peft: LoRA on q/k/v/o_proj (r 4), B random, save_lora_as_pretrained; peft's
//    PeftModel.from_pretrained(base, dir) finds every key and gives our float32 logits within 1e-5
//    (q_proj / k_proj's B rows go through the rotary permutation of the base weight);
//  - peft -> ours: adapters made by get_peft_model(init_lora_weights=False) and saved by peft load
//    with load_lora and give peft's logits within 1e-5;
//  - bad input: another r, missing / unexpected keys;
//  - the llama example's adapters, fine-tuned under hybrid tp2 x pp2, load into peft.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iostream>
#include <sstream>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/checkpoint/peft_lora.h"
#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/nn/lora.h"
#include "booster/nn/tensor_parallel.h"
#include "common/test_util.h"
#include "hf/hf_test_util.h"
#include "gpt/model.h"
#include "llama/model.h"

using namespace booster::testing;
using booster::checkpoint::CheckpointError;
using ::testing::HasSubstr;
using json = nlohmann::json;
using namespace booster::testing::hf;

namespace peft_interop_test {

// One of the two models loaded from a HuggingFace directory, type-erased.
struct Base {
  std::string dir;
  std::shared_ptr<torch::nn::Module> net;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  std::shared_ptr<booster::checkpoint::StateDictAdapter> adapter;
  torch::Tensor logits() {
    torch::NoGradGuard no_grad;
    net->eval();
    return forward(ids_of(kText)).squeeze(0).to(torch::kFloat);
  }
};

// hf_reference.py's tiny random model `arch` ("llama" or "gpt2") in `dir`, loaded into ours.
Base make_base(const TempDir& tmp, const std::string& arch, int seed) {
  Base b;
  b.dir = tmp.file("base_" + arch);
  if (!std::filesystem::exists(b.dir)) run_script("hf_reference.py", {"make", arch, b.dir, "--seed", std::to_string(seed)});
  const json config = booster::checkpoint::read_config_json(b.dir);
  if (arch == "gpt2") {
    gpt::GPT net(gpt_config_of(config));
    b.net = net.ptr();
    b.forward = [net](const torch::Tensor& x) mutable { return net->forward(x); };
  } else {
    llama::Llama net(llama_config_of(config));
    b.net = net.ptr();
    b.forward = [net](const torch::Tensor& x) mutable { return net->forward(x); };
  }
  b.adapter = booster::checkpoint::make_state_dict_adapter(arch, config);
  booster::checkpoint::CheckpointIO io(nullptr);
  booster::checkpoint::ModelLoadOptions o;
  o.adapter = b.adapter;
  io.load_model(*b.net, b.dir, o);
  return b;
}

std::vector<std::string> targets_of(const std::string& arch) {
  if (arch == "gpt2") return {"c_attn", "c_proj", "c_fc"};  // Conv1D in transformers: fan_in_fan_out
  return {"q_proj", "k_proj", "v_proj", "o_proj"};
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& t : v) s += (s.empty() ? "" : ",") + t;
  return s;
}

booster::nn::LoraConfig lora_config(const std::string& arch = "llama") {
  booster::nn::LoraConfig c;
  c.r = 4;
  c.lora_alpha = 8;
  c.target_modules = targets_of(arch);
  return c;
}

double max_abs_diff(const torch::Tensor& ours, const torch::Tensor& theirs) {
  EXPECT_EQ(ours.sizes(), theirs.sizes());
  const double d = (ours - theirs).abs().max().item<double>();
  std::cout << "max |logits - peft's logits| = " << d << " (logits up to " << theirs.abs().max().item<double>() << ")"
            << std::endl;
  return d;
}

class PeftInterop : public ::testing::TestWithParam<std::string> {};  // arch

TEST_P(PeftInterop, OursLoadsIntoPeft) {
  const std::string arch = GetParam();
  TempDir tmp;
  Base base = make_base(tmp, arch, 11);
  const torch::Tensor base_logits = base.logits();
  auto report = booster::nn::enable_lora(*base.net, lora_config(arch));
  EXPECT_EQ(report.modules.size(), 8u);  // 2 layers x 4 projections
  torch::manual_seed(5);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : base.net->named_parameters())
      if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0.0, 0.2);
  }
  const torch::Tensor ours = base.logits();
  EXPECT_GT((ours - base_logits).abs().max().item<double>(), 1e-2);  // the adapters do something
  const std::string dir = tmp.file("lora");
  booster::checkpoint::save_lora_as_pretrained(*base.net, dir, base.dir, *base.adapter);
  const json cfg = json::parse(std::ifstream(dir + "/adapter_config.json"));
  EXPECT_EQ(cfg.at("peft_type"), "LORA");
  EXPECT_EQ(cfg.at("r"), 4);
  auto sorted_targets = targets_of(arch);
  std::sort(sorted_targets.begin(), sorted_targets.end());
  EXPECT_EQ(cfg.at("target_modules"), json(sorted_targets));
  EXPECT_EQ(cfg.at("fan_in_fan_out"), arch == "gpt2");
  const json info = run_script("peft_reference.py", {"logits", base.dir, dir, kText, tmp.file("peft.safetensors")});
  EXPECT_EQ(info.value("lora_modules", 0), 8);
  EXPECT_EQ(info.value("missing", json::array()), json::array());
  EXPECT_EQ(info.value("unexpected", json::array()), json::array());
  EXPECT_LT(max_abs_diff(ours, load_logits(tmp.file("peft.safetensors"))), 1e-5);

  // Round trip through our own loader, and merge gives the same logits.
  Base again = make_base(tmp, arch, 11);
  booster::nn::enable_lora(*again.net, lora_config(arch));
  booster::checkpoint::load_lora(*again.net, dir, *again.adapter);
  EXPECT_LT((again.logits() - ours).abs().max().item<double>(), 1e-6);
  booster::nn::merge_lora(*again.net);
  EXPECT_LT((again.logits() - ours).abs().max().item<double>(), 1e-5);
}

TEST_P(PeftInterop, PeftLoadsIntoOurs) {
  const std::string arch = GetParam();
  TempDir tmp;
  Base base = make_base(tmp, arch, 12);
  const std::string dir = tmp.file("peft_lora");
  const json info = run_script("peft_reference.py", {"make", base.dir, dir, "4", "8", joined(targets_of(arch)), kText,
                                                tmp.file("peft.safetensors"), "--seed", "3"});
  EXPECT_EQ(info.value("lora_modules", 0), 8);
  const torch::Tensor base_logits = base.logits();
  booster::nn::enable_lora(*base.net, lora_config(arch));
  booster::checkpoint::load_lora(*base.net, dir, *base.adapter);
  const torch::Tensor theirs = load_logits(tmp.file("peft.safetensors"));
  EXPECT_GT((theirs - base_logits).abs().max().item<double>(), 1e-2);  // B is not zero
  EXPECT_LT(max_abs_diff(base.logits(), theirs), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Models, PeftInterop, ::testing::Values("llama", "gpt2"),
                         [](const auto& info) { return info.param; });

TEST(PeftInteropErrors, BadAdapterFiles) {
  TempDir tmp;
  Base base = make_base(tmp, "llama", 13);
  booster::nn::enable_lora(*base.net, lora_config());
  const std::string dir = tmp.file("lora");
  booster::checkpoint::save_lora_as_pretrained(*base.net, dir, base.dir, *base.adapter);

  // Another r in the model.
  {
    Base other = make_base(tmp, "llama", 13);
    auto c = lora_config();
    c.r = 2;
    booster::nn::enable_lora(*other.net, c);
    try {
      booster::checkpoint::load_lora(*other.net, dir, *other.adapter);
      ADD_FAILURE() << "no error";
    } catch (const CheckpointError& e) {
      EXPECT_THAT(e.what(), HasSubstr("r is 4 in the file but 2"));
    }
  }
  // Fewer targets in the model than in the file.
  {
    Base other = make_base(tmp, "llama", 13);
    auto c = lora_config();
    c.target_modules = {"q_proj", "k_proj", "v_proj"};
    booster::nn::enable_lora(*other.net, c);
    EXPECT_THROW(booster::checkpoint::load_lora(*other.net, dir, *other.adapter), CheckpointError);
  }
  // A missing and an unexpected tensor.
  auto state = booster::checkpoint::load_state_dict(dir, "adapter_model");
  const std::string dropped = state.back().first;
  state.pop_back();
  state.emplace_back("base_model.model.model.layers.0.self_attn.x_proj.lora_A.weight", torch::zeros({4, 32}));
  const std::string cfg = [&] {
    std::ifstream f(dir + "/adapter_config.json");
    return std::string(std::istreambuf_iterator<char>(f), {});
  }();
  booster::checkpoint::save_state_dict(tmp.file("bad"), state, {}, "adapter_model", {{"adapter_config.json", cfg}});
  try {
    booster::checkpoint::load_lora(*base.net, tmp.file("bad"), *base.adapter);
    ADD_FAILURE() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing " + dropped));
    EXPECT_THAT(e.what(), HasSubstr("unexpected base_model.model.model.layers.0.self_attn.x_proj.lora_A.weight"));
  }
}

// The llama example fine-tunes LoRA adapters under hybrid_parallel tp2 x pp2 (4 ranks, float32,
// --init_from hf_reference.py's tiny LlamaForCausalLM) and saves them with
// booster.save_lora_as_pretrained: q/k/v_proj's B split by rows across tp, o_proj's A by columns,
// each pipeline stage's layers, merged into PEFT's one file. PeftModel.from_pretrained finds every
// key, and its logits equal ours with the same files (1e-5).
TEST(PeftInteropExample, LlamaAdaptersTrainedUnderTp2Pp2LoadIntoPeft) {
  TempDir tmp;
  Base base = make_base(tmp, "llama", 14);
  const std::string corpus = tmp.file("corpus.txt");
  {
    std::ofstream out(corpus);
    for (int i = 0; i < 400; ++i)
      out << "Ge1:" << i + 1 << " In the beginning God created the heaven and the earth " << i << ".\n"
          << "Ruth1:" << i + 1 << " And it came to pass in the days when the judges ruled.\n";
  }
  std::vector<std::string> argv{BOOSTER_CLI_PATH, "run", "--nproc_per_node", "4", "--master_port",
                                std::to_string(free_port()), std::string(BOOSTER_BINARY_DIR) + "/bin/llama", "--config",
                                std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/llama_hybrid_tp2pp2.toml",
                                "--output_dir", tmp.file("run"), "--init_from", base.dir};
  for (std::string s : {"train.batch_size=4", "train.max_steps=6", "train.eval_interval=6", "train.eval_windows=4",
                        "train.final_eval_windows=4", "train.warmup_steps=1", "train.sample_length=0", "train.lr=1e-2",
                        "train.save_model=true", "plugin.num_microbatches=2", "plugin.precision=\"fp32\"",
                        "train.lora_r=4", "train.lora_alpha=8", "train.lora_target_modules=\"q_proj,k_proj,v_proj,o_proj\"",
                        "train.val_books=\"Ruth\""})
    argv.insert(argv.end(), {"--set", s});
  argv.insert(argv.end(), {"--set", "train.corpus=\"" + corpus + "\""});
  ProcessResult r = run_process(argv, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string dir = tmp.file("run/lora");
  EXPECT_TRUE(std::filesystem::exists(dir + "/adapter_model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/adapter_model.safetensors.index.json"));
  const json info = run_script("peft_reference.py", {"logits", base.dir, dir, kText, tmp.file("peft.safetensors")});
  EXPECT_EQ(info.value("lora_modules", 0), 8);
  EXPECT_EQ(info.value("missing", json::array()), json::array());
  EXPECT_EQ(info.value("unexpected", json::array()), json::array());
  const torch::Tensor base_logits = base.logits();
  booster::nn::enable_lora(*base.net, lora_config());
  booster::checkpoint::load_lora(*base.net, dir, *base.adapter);
  const torch::Tensor ours = base.logits();
  EXPECT_GT((ours - base_logits).abs().max().item<double>(), 1e-3);  // 6 steps moved the adapters
  EXPECT_LT(max_abs_diff(ours, load_logits(tmp.file("peft.safetensors"))), 1e-5);
}

}  // namespace peft_interop_test
