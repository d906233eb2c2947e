// hf_config.cpp — GPTConfig <-> transformers' GPT2Config (hf_config.h).
#include "hf_config.h"

#include <stdexcept>
#include <string>

namespace gpt {

namespace {

constexpr int64_t kNewline = 10;  // bos / eos: '\n' ends every verse of the corpus

[[noreturn]] void refuse(const std::string& what) {
  throw std::invalid_argument("gpt: config.json (GPT2Config): " + what);
}

// A required positive integer field.
int64_t size_field(const nlohmann::json& hf, const char* key, int64_t min = 1) {
  if (!hf.contains(key)) refuse("missing \"" + std::string(key) + "\" (a GPT2Config writes it)");
  const auto& v = hf.at(key);
  if (!v.is_number_integer()) refuse("\"" + std::string(key) + "\" is " + v.dump() + ", expected an integer");
  const int64_t n = v.get<int64_t>();
  if (n < min)
    refuse("\"" + std::string(key) + "\" is " + std::to_string(n) + ", expected at least " + std::to_string(min));
  return n;
}

// An optional boolean that must have the value `supported` (absent = transformers' default).
void require_bool(const nlohmann::json& hf, const char* key, bool supported, const std::string& why) {
  if (!hf.contains(key) || hf.at(key).is_null()) return;
  const auto& v = hf.at(key);
  if (!v.is_boolean()) refuse("\"" + std::string(key) + "\" is " + v.dump() + ", expected a boolean");
  if (v.get<bool>() != supported)
    refuse("\"" + std::string(key) + "\": " + v.dump() + " is not supported by this model (" + why + "); set it to " +
           (supported ? "true" : "false"));
}

}  // namespace

nlohmann::json to_hf_config(const GPTConfig& c) {
  nlohmann::json j;
  j["model_type"] = "gpt2";
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.n_ctx;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  j["n_inner"] = nullptr;  // 4 n_embd
  j["activation_function"] = c.gelu_tanh ? "gelu_new" : "gelu";
  j["resid_pdrop"] = c.dropout;
  j["embd_pdrop"] = c.dropout;
  j["attn_pdrop"] = c.dropout;
  j["layer_norm_epsilon"] = c.layer_norm_eps;
  j["initializer_range"] = 0.02;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["add_cross_attention"] = false;
  j["tie_word_embeddings"] = true;
  j["use_cache"] = true;
  j["bos_token_id"] = kNewline;
  j["eos_token_id"] = kNewline;
  j["pad_token_id"] = nullptr;
  // The sequence-summary head's fields (GPT2DoubleHeadsModel only; written by every GPT2Config).
  j["summary_type"] = "cls_index";
  j["summary_use_proj"] = true;
  j["summary_activation"] = nullptr;
  j["summary_proj_to_labels"] = true;
  j["summary_first_dropout"] = 0.1;
  return j;
}

GPTConfig from_hf_config(const nlohmann::json& hf) {
  if (!hf.is_object()) refuse("expected a JSON object, got " + std::string(hf.type_name()));
  const std::string model_type = hf.contains("model_type") && hf.at("model_type").is_string()
                                     ? hf.at("model_type").get<std::string>()
                                     : (hf.contains("model_type") ? hf.at("model_type").dump() : "");
  if (model_type != "gpt2")
    throw std::invalid_argument("gpt: config.json has model_type \"" + model_type +
                                "\", but this example's model is \"gpt2\" (GPT2LMHeadModel); use the example of "
                                "that model (a \"llama\" checkpoint: build/bin/llama)");
  GPTConfig c;
  c.n_layer = size_field(hf, "n_layer");
  c.n_head = size_field(hf, "n_head");
  c.n_embd = size_field(hf, "n_embd");
  c.n_ctx = size_field(hf, "n_positions", 2);
  c.vocab_size = size_field(hf, "vocab_size");
  if (c.vocab_size < 256)
    refuse("\"vocab_size\" is " + std::to_string(c.vocab_size) +
           "; this byte-level model needs at least 256 (ids 0..255 are the bytes)");
  if (c.n_embd % c.n_head != 0)
    refuse("\"n_embd\" " + std::to_string(c.n_embd) + " is not a multiple of \"n_head\" " + std::to_string(c.n_head));
  if (hf.contains("n_inner") && !hf.at("n_inner").is_null()) {
    const auto& v = hf.at("n_inner");
    if (!v.is_number_integer() || v.get<int64_t>() != 4 * c.n_embd)
      refuse("\"n_inner\" is " + v.dump() + "; this model's MLP width is 4 * n_embd = " + std::to_string(4 * c.n_embd) +
             " (set \"n_inner\": null)");
  }
  if (hf.contains("layer_norm_epsilon")) {
    const auto& v = hf.at("layer_norm_epsilon");
    if (!v.is_number() || v.get<double>() <= 0) refuse("\"layer_norm_epsilon\" is " + v.dump() + ", expected a positive number");
    c.layer_norm_eps = v.get<double>();
  }
  const std::string act = hf.contains("activation_function") ? (hf.at("activation_function").is_string()
                                                                    ? hf.at("activation_function").get<std::string>()
                                                                    : hf.at("activation_function").dump())
                                                              : "gelu_new";  // GPT2Config's default
  if (act == "gelu_new" || act == "gelu_pytorch_tanh")
    c.gelu_tanh = true;
  else if (act == "gelu")
    c.gelu_tanh = false;
  else
    refuse("\"activation_function\" is \"" + act +
           "\"; this model supports \"gelu_new\" / \"gelu_pytorch_tanh\" (tanh GELU) and \"gelu\" (exact GELU)");
  require_bool(hf, "tie_word_embeddings", true, "its LM head is the token embedding");
  require_bool(hf, "scale_attn_by_inverse_layer_idx", false, "attention scores are scaled by 1/sqrt(head_dim) only");
  require_bool(hf, "reorder_and_upcast_attn", false, "attention is computed in the model's dtype");
  require_bool(hf, "scale_attn_weights", true, "attention scores are scaled by 1/sqrt(head_dim)");
  require_bool(hf, "add_cross_attention", false, "it is a decoder without cross-attention");
  return c;
}

std::string describe(const GPTConfig& c) {
  std::string s = std::to_string(c.n_layer) + " layers, n_embd " + std::to_string(c.n_embd) + ", " +
                  std::to_string(c.n_head) + " heads, n_ctx " + std::to_string(c.n_ctx);
  if (c.vocab_size != 256) s += ", vocab " + std::to_string(c.vocab_size);
  return s;
}

}  // namespace gpt
