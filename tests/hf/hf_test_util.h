// hf_test_util.h — what the tests against transformers and peft (tests/hf) share: the text they
// score, the Python reference runner, logits files, and our models' configs from a HuggingFace
// config.json. Header-only (tests/hf/*_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "booster/checkpoint/state_dict_io.h"
#include "booster/nn/tensor_parallel.h"
#include "common/test_util.h"
#include "gpt/model.h"
#include "llama/model.h"

namespace booster::testing::hf {

using json = nlohmann::json;

// 72 bytes: shorter than the tiny models' 128 positions and the examples' n_ctx 80 in the tests.
inline const std::string kText = "In the beginning God created the heaven and the earth. And the earth was";

inline std::string script_path(const std::string& name) { return std::string(BOOSTER_SOURCE_DIR) + "/tests/hf/" + name; }

// Runs a reference script (tests/hf/<name>) with the venv's python; returns its last output line
// that is a JSON object (a failure is recorded when the script fails or prints none).
inline json run_script(const std::string& name, const std::vector<std::string>& args) {
  std::vector<std::string> argv{BOOSTER_PYTHON, script_path(name)};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessResult r = run_process(argv, {}, 300);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::string last;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line[0] == '{') last = line;
  if (last.empty()) ADD_FAILURE() << "no JSON from " << name << ": " << r.output;
  return last.empty() ? json::object() : json::parse(last);
}

// The "logits" tensor of a safetensors file the scripts wrote ([T, V] float32).
inline torch::Tensor load_logits(const std::string& file) {
  for (const auto& [name, t] : booster::checkpoint::load_state_dict(file))
    if (name == "logits") return t;
  ADD_FAILURE() << "no logits in " << file;
  return {};
}

// The bytes of `text` as token ids, int64 [1, T].
inline torch::Tensor ids_of(const std::string& text) {
  std::vector<int64_t> ids(text.begin(), text.end());
  for (auto& id : ids) id &= 0xff;
  return torch::tensor(ids, torch::kLong).unsqueeze(0);
}

inline gpt::GPTConfig gpt_config_of(const json& c) {
  gpt::GPTConfig g;
  g.vocab_size = c.at("vocab_size");
  g.n_ctx = c.at("n_positions");
  g.n_layer = c.at("n_layer");
  g.n_head = c.at("n_head");
  g.n_embd = c.at("n_embd");
  g.layer_norm_eps = c.at("layer_norm_epsilon");
  g.gelu_tanh = c.at("activation_function") == "gelu_new";
  return g;
}

inline llama::LlamaConfig llama_config_of(const json& c) {
  llama::LlamaConfig l;
  l.vocab_size = c.at("vocab_size");
  l.n_ctx = c.at("max_position_embeddings");
  l.n_layer = c.at("num_hidden_layers");
  l.n_head = c.at("num_attention_heads");
  l.n_kv_head = c.at("num_key_value_heads");
  l.n_embd = c.at("hidden_size");
  l.intermediate_size = c.at("intermediate_size");
  l.rms_norm_eps = c.at("rms_norm_eps");
  l.rope_theta = c.at("rope_parameters").at("rope_theta");
  return l;
}

}  // namespace booster::testing::hf
