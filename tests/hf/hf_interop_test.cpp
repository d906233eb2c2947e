// hf_interop_test.cpp — examples/gpt's GPT-2 and examples/llama's Llama against transformers 5.24
// (tests/hf/hf_reference.py, run with the venv's python3) on CPU, through the "gpt2" and "llama"
// state-dict adapters:
//  - a tiny random GPT2LMHeadModel / LlamaForCausalLM saved by transformers (safetensors, one file
//    and sharded) loads into our model, whose float32 logits on fixed text equal transformers'
//    within 1e-5;
//  - a model trained a few steps here, saved through the adapter, loads into transformers with no
//    missing or unexpected keys and gives our logits (1e-5);
//  - the same through a tp2 x pp2 checkpoint written by the examples under hybrid_parallel, and
//    `--score` equals transformers' loss / ln 2 (1e-5);
//  - bad input: another architecture's or another size's config.json, missing / unexpected keys and
//    wrong shapes under strict loading, an adapter that does not cover the model.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/checkpoint/state_dict_io.h"
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

namespace {

// hf_reference.py (transformers' side).
json reference(const std::vector<std::string>& args) { return run_script("hf_reference.py", args); }

std::string kGptExe() { return std::string(BOOSTER_BINARY_DIR) + "/bin/gpt"; }


// transformers' logits [T, V] on kText for the model in `dir`, and its loss summary.
struct Reference {
  torch::Tensor logits;
  json summary;
};
Reference transformers_logits(const std::string& dir, const TempDir& tmp) {
  const std::string out = tmp.file("logits.safetensors");
  Reference ref;
  ref.summary = reference({"logits", dir, kText, out});
  ref.logits = load_logits(out);
  return ref;
}


// max |ours - transformers| over the logits, printed for the record.
double max_abs_diff(const torch::Tensor& ours, const torch::Tensor& theirs) {
  EXPECT_EQ(ours.sizes(), theirs.sizes());
  const double d = (ours - theirs).abs().max().item<double>();
  std::cout << "max |logits - transformers' logits| = " << d << " (logits up to "
            << theirs.abs().max().item<double>() << ")" << std::endl;
  return d;
}



void load(torch::nn::Module& model, const std::string& dir, std::shared_ptr<const booster::checkpoint::StateDictAdapter> adapter,
          bool strict = true) {
  booster::checkpoint::CheckpointIO io(nullptr);
  booster::checkpoint::ModelLoadOptions o;
  o.strict = strict;
  o.adapter = std::move(adapter);
  io.load_model(model, dir, o);
}

void save(torch::nn::Module& model, const std::string& dir, std::shared_ptr<const booster::checkpoint::StateDictAdapter> adapter,
          bool shard = false) {
  booster::checkpoint::CheckpointIO io(nullptr);
  booster::checkpoint::ModelSaveOptions o;
  o.adapter = std::move(adapter);
  o.shard = shard;
  o.size_per_shard_mb = 1;
  io.save_model(model, dir, o);
}

// One of the two models, built from a HuggingFace config.json: "gpt2" (gpt::GPT) or "llama"
// (llama::Llama), type-erased for the tests below.
struct AnyModel {
  std::shared_ptr<torch::nn::Module> module;
  std::function<torch::Tensor(const torch::Tensor&)> forward;
  torch::Tensor logits(const std::string& text) {
    torch::NoGradGuard no_grad;
    module->eval();
    return forward(ids_of(text)).squeeze(0).to(torch::kFloat);  // [T, V]
  }
};
AnyModel build(const std::string& arch, const json& config) {
  if (arch == "gpt2") {
    gpt::GPT net(gpt_config_of(config));
    return {net.ptr(), [net](const torch::Tensor& x) mutable { return net->forward(x); }};
  }
  llama::Llama net(llama_config_of(config));
  return {net.ptr(), [net](const torch::Tensor& x) mutable { return net->forward(x); }};
}

// A few AdamW steps of next-byte prediction on kText, so no tensor is at its initial value.
void train_a_few_steps(AnyModel& net, int steps) {
  torch::optim::AdamW opt(net.module->parameters(), torch::optim::AdamWOptions(3e-3));
  auto ids = ids_of(kText);
  auto x = ids.narrow(1, 0, ids.size(1) - 1), y = ids.narrow(1, 1, ids.size(1) - 1);
  net.module->train();
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    auto logits = net.forward(x);
    torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1})).backward();
    opt.step();
  }
}

// ---- transformers -> ours

class FromTransformers : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};  // arch, sharded

TEST_P(FromTransformers, LogitsEqualTransformers) {
  const auto& [arch, sharded] = GetParam();
  TempDir tmp;
  const std::string dir = tmp.file(arch);
  std::vector<std::string> args{"make", arch, dir, "--seed", "1"};
  if (sharded) args.push_back("--sharded");
  reference(args);
  const json config = booster::checkpoint::read_config_json(dir);
  AnyModel net = build(arch, config);
  load(*net.module, dir, booster::checkpoint::make_state_dict_adapter(arch, config));
  Reference ref = transformers_logits(dir, tmp);
  ASSERT_TRUE(ref.logits.defined());
  EXPECT_LT(max_abs_diff(net.logits(kText), ref.logits), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Files, FromTransformers,
                         ::testing::Combine(::testing::Values("gpt2", "llama"), ::testing::Values(false, true)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + (std::get<1>(info.param) ? "_sharded" : "_one_file");
                         });

// ---- ours -> transformers

class ToTransformers : public ::testing::TestWithParam<std::string> {};  // arch

TEST_P(ToTransformers, TrainedModelLoadsWithOurLogits) {
  const std::string& arch = GetParam();
  TempDir tmp;
  const std::string src = tmp.file("src");
  reference({"make", arch, src, "--seed", "3"});
  const json config = booster::checkpoint::read_config_json(src);
  torch::manual_seed(0);
  AnyModel net = build(arch, config);
  train_a_few_steps(net, 5);
  // llama's save is sharded (several files + index), gpt2's one file.
  save(*net.module, tmp.file("ours"), booster::checkpoint::make_state_dict_adapter(arch, config), arch == "llama");
  EXPECT_TRUE(std::filesystem::exists(tmp.file("ours/config.json")));
  Reference ref = transformers_logits(tmp.file("ours"), tmp);
  EXPECT_EQ(ref.summary.value("architecture", ""), arch == "gpt2" ? "GPT2LMHeadModel" : "LlamaForCausalLM");
  EXPECT_EQ(ref.summary.value("missing", json::array()), json::array());
  EXPECT_EQ(ref.summary.value("unexpected", json::array()), json::array());
  ASSERT_TRUE(ref.logits.defined());
  EXPECT_LT(max_abs_diff(net.logits(kText), ref.logits), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Models, ToTransformers, ::testing::Values("gpt2", "llama"),
                         [](const auto& info) { return info.param; });

// ---- bad input

TEST(AdapterErrors, ConfigOfAnotherArchitectureNamesBoth) {
  TempDir tmp;
  reference({"make", "llama", tmp.file("llama")});
  reference({"make", "gpt2", tmp.file("gpt2")});
  const json gpt_config = booster::checkpoint::read_config_json(tmp.file("gpt2"));
  gpt::GPT net(gpt_config_of(gpt_config));
  try {
    load(*net, tmp.file("llama"), booster::checkpoint::make_state_dict_adapter("gpt2", gpt_config));
    FAIL() << "loaded a Llama checkpoint into GPT-2";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("LlamaForCausalLM"));
    EXPECT_THAT(e.what(), HasSubstr("GPT2LMHeadModel"));
  }
  // The llama factory refuses a GPT-2 config.
  EXPECT_THROW(booster::checkpoint::make_state_dict_adapter("llama", gpt_config), CheckpointError);
}

TEST(AdapterErrors, ConfigOfAnotherSizeNamesTheFieldAndBothValues) {
  TempDir tmp;
  reference({"make", "gpt2", tmp.file("gpt2")});
  json config = booster::checkpoint::read_config_json(tmp.file("gpt2"));
  config["n_embd"] = 64;
  gpt::GPT net(gpt_config_of(config));
  try {
    load(*net, tmp.file("gpt2"), booster::checkpoint::make_state_dict_adapter("gpt2", config));
    FAIL() << "loaded an n_embd 32 checkpoint into an n_embd 64 model";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("n_embd = 32 in the checkpoint, 64 in the model"));
  }
}

// --init_from builds the model from config.json: a config.json whose sizes are not the tensors'
// is named with the tensors' shapes.
TEST(AdapterErrors, ConfigJsonThatDoesNotMatchItsTensorsNamesBoth) {
  TempDir tmp;
  reference({"make", "gpt2", tmp.file("gpt2")});
  json config = booster::checkpoint::read_config_json(tmp.file("gpt2"));
  config["n_embd"] = 64;
  std::ofstream(tmp.file("gpt2/config.json")) << config.dump(2);
  ProcessResult r = run_process({kGptExe(), "--init_from", tmp.file("gpt2"), "--score", "In the beginning"}, {}, 120);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("transformer.wte.weight: shape [256, 32] in the checkpoint, [256, 64] in the model"));
  EXPECT_THAT(r.output, HasSubstr("n_embd = 64"));
}

TEST(AdapterErrors, StrictLoadNamesMissingUnexpectedAndMisshapenTensors) {
  TempDir tmp;
  reference({"make", "gpt2", tmp.file("gpt2")});
  const json config = booster::checkpoint::read_config_json(tmp.file("gpt2"));
  auto adapter = booster::checkpoint::make_state_dict_adapter("gpt2", config);
  auto state = booster::checkpoint::load_state_dict(tmp.file("gpt2"));
  booster::checkpoint::StateDict edited;
  for (auto& [name, t] : state) {
    if (name == "transformer.h.1.mlp.c_fc.bias") continue;                                   // missing
    if (name == "transformer.h.0.attn.c_attn.weight") t = t.narrow(1, 0, t.size(1) - 3);  // wrong shape
    edited.emplace_back(name, t);
  }
  edited.emplace_back("transformer.h.0.attn.rotary", torch::zeros({2}));  // unexpected
  edited.emplace_back("lm_head.weight", torch::zeros({256, 32}));       // tied head: dropped, not unexpected
  booster::checkpoint::save_state_dict(tmp.file("edited"), edited, {});
  gpt::GPT net(gpt_config_of(config));
  auto before = net->transformer->wte->weight.clone();
  try {
    load(*net, tmp.file("edited"), adapter);
    FAIL() << "strict load accepted an edited checkpoint";
  } catch (const CheckpointError& e) {
    const std::string msg = e.what();
    EXPECT_THAT(msg, HasSubstr("transformer.h.1.mlp.c_fc.bias"));
    EXPECT_THAT(msg, HasSubstr("transformer.h.0.attn.c_attn.weight: shape [32, 93]"));
    EXPECT_THAT(msg, HasSubstr("transformer.h.0.attn.rotary"));
    EXPECT_THAT(msg, ::testing::Not(HasSubstr("lm_head")));
  }
  EXPECT_TRUE(torch::equal(before, net->transformer->wte->weight)) << "a failed load changed the model";
}

TEST(AdapterErrors, AdapterThatDoesNotCoverTheModelFailsWhenRegistered) {
  gpt::GPTConfig c;
  c.n_layer = 1;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_ctx = 16;
  gpt::GPT net(c);
  std::vector<std::string> names;
  for (const auto& item : net->named_parameters()) names.push_back(item.key());
  booster::checkpoint::StateDictAdapter partial(
      "GPT2LMHeadModel", json{{"model_type", "gpt2"}}, {},
      {booster::checkpoint::AdapterRule::rename("transformer.h.{i}.ln_1.weight", "transformer.h.{i}.ln_1.weight")});
  try {
    partial.check_covers(names);
    FAIL() << "an adapter with one rule covered the whole model";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("transformer.wte.weight"));
    EXPECT_THAT(e.what(), HasSubstr("transformer.ln_f.bias"));
    EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("ln_1.weight,")));
  }
}

// ---- through the examples: a tp2 x pp2 checkpoint, --score

const std::string kGpt = std::string(BOOSTER_BINARY_DIR) + "/bin/gpt";
const std::string kLlama = std::string(BOOSTER_BINARY_DIR) + "/bin/llama";
const std::string kConfigs = std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/";

// A short corpus (the examples read the KJV text from a file; any text works).
std::string corpus(const TempDir& tmp) {
  const std::string path = tmp.file("corpus.txt");
  std::ofstream out(path);
  for (int i = 0; i < 400; ++i)
    out << "Ge1:" << i + 1 << " In the beginning God created the heaven and the earth " << i << ".\n"
        << "Ruth1:" << i + 1 << " And it came to pass in the days when the judges ruled.\n";
  return path;
}

double score(const std::string& exe, const std::string& dir) {
  ProcessResult r = run_process({exe, "--init_from", dir, "--score", kText}, {}, 120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::smatch m;
  const std::regex line("bits per byte: ([0-9.eE+-]+)");
  if (!std::regex_search(r.output, m, line)) {
    ADD_FAILURE() << "no 'bits per byte:' in: " << r.output;
    return NAN;
  }
  return std::stod(m[1]);
}

struct Example {
  std::string exe, config, adapter;
  std::vector<std::string> sizes;
};

class ThroughTp2Pp2 : public ::testing::TestWithParam<Example> {};

TEST_P(ThroughTp2Pp2, CheckpointLoadsInTransformersAndScoresAlike) {
  const Example& ex = GetParam();
  TempDir tmp;
  std::vector<std::string> argv{BOOSTER_CLI_PATH, "run", "--nproc_per_node", "4", "--master_port",
                                std::to_string(free_port()), ex.exe, "--config", kConfigs + ex.config,
                                "--output_dir", tmp.file("run")};
  std::vector<std::string> sets = ex.sizes;
  for (std::string s : {"train.batch_size=4", "train.max_steps=6", "train.eval_interval=6", "train.eval_windows=4",
                        "train.final_eval_windows=4", "train.warmup_steps=1", "train.sample_length=0",
                        "train.save_model=true", "plugin.num_microbatches=2"})
    sets.push_back(s);
  sets.push_back("train.corpus=\"" + corpus(tmp) + "\"");
  sets.push_back("train.val_books=\"Ruth\"");
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  ProcessResult r = run_process(argv, {}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string dir = tmp.file("run/model");
  const json config = booster::checkpoint::read_config_json(dir);
  ASSERT_FALSE(config.empty()) << "no config.json in " << dir;

  Reference ref = transformers_logits(dir, tmp);
  EXPECT_EQ(ref.summary.value("missing", json::array()), json::array());
  EXPECT_EQ(ref.summary.value("unexpected", json::array()), json::array());
  ASSERT_TRUE(ref.logits.defined());
  AnyModel net = build(ex.adapter, config);
  load(*net.module, dir, booster::checkpoint::make_state_dict_adapter(ex.adapter, config));
  EXPECT_LT(max_abs_diff(net.logits(kText), ref.logits), 1e-5);
  EXPECT_NEAR(score(ex.exe, dir), ref.summary.at("bits_per_byte").get<double>(), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Examples, ThroughTp2Pp2,
    ::testing::Values(Example{kGpt, "gpt_hybrid_tp2pp2.toml", "gpt2",
                              {"train.n_layer=2", "train.n_embd=32", "train.n_head=4", "train.n_ctx=80"}},
                      Example{kLlama, "llama_hybrid_tp2pp2.toml", "llama",
                              {"train.n_layer=2", "train.n_embd=32", "train.n_head=4", "train.n_kv_head=2",
                               "train.n_ctx=80"}}),
    [](const auto& info) { return info.param.adapter; });

TEST(Score, EqualsTransformersLossOverLn2) {
  TempDir tmp;
  reference({"make", "gpt2", tmp.file("gpt2"), "--seed", "5"});
  Reference g = transformers_logits(tmp.file("gpt2"), tmp);
  EXPECT_NEAR(score(kGpt, tmp.file("gpt2")), g.summary.at("bits_per_byte").get<double>(), 1e-5);
  reference({"make", "llama", tmp.file("llama"), "--seed", "6", "--sharded"});
  Reference l = transformers_logits(tmp.file("llama"), tmp);
  EXPECT_NEAR(score(kLlama, tmp.file("llama")), l.summary.at("bits_per_byte").get<double>(), 1e-5);
}

}  // namespace

namespace {

// `booster ckpt convert --adapter`: transformers' GPT-2 to the model's own layout and back is the
// same file, tensor for tensor.
TEST(ConvertTool, Gpt2FromHfAndBackIsTheSameCheckpoint) {
  TempDir tmp;
  reference({"make", "gpt2", tmp.file("hf"), "--seed", "7"});
  ProcessResult a = run_process({BOOSTER_CLI_PATH, "ckpt", "convert", tmp.file("hf"), tmp.file("ours"), "--to",
                                 "safetensors", "--adapter", "gpt2", "--direction", "from_hf"}, {}, 120);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  ProcessResult b = run_process({BOOSTER_CLI_PATH, "ckpt", "convert", tmp.file("ours"), tmp.file("back"), "--to",
                                 "safetensors", "--adapter", "gpt2", "--hf_config", tmp.file("hf/config.json")}, {}, 120);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  auto original = booster::checkpoint::load_state_dict(tmp.file("hf"));
  auto ours = booster::checkpoint::load_state_dict(tmp.file("ours"));
  auto back = booster::checkpoint::load_state_dict(tmp.file("back"));
  std::map<std::string, torch::Tensor> by_name(back.begin(), back.end()), our_names(ours.begin(), ours.end());
  ASSERT_EQ(by_name.size(), original.size());
  for (const auto& [name, t] : original) EXPECT_TRUE(torch::equal(t, by_name.at(name))) << name;
  // The model's own layout: c_attn is [3C, C].
  EXPECT_EQ(our_names.at("transformer.h.0.attn.c_attn.weight").sizes(), (at::IntArrayRef{96, 32}));
  // Without --hf_config and no config.json next to the tensors: a clear error.
  ProcessResult c = run_process({BOOSTER_CLI_PATH, "ckpt", "convert", tmp.file("ours"), tmp.file("x"), "--to",
                                 "safetensors", "--adapter", "gpt2"}, {}, 120);
  EXPECT_NE(c.exit_code, 0);
  EXPECT_THAT(c.output, HasSubstr("--hf_config"));
}

}  // namespace
