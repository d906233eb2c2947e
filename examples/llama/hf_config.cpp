// hf_config.cpp — LlamaConfig <-> transformers' LlamaConfig (hf_config.h).
#include "hf_config.h"

#include <stdexcept>
#include <string>

namespace llama {

namespace {

constexpr int64_t kNewline = 10;  // bos / eos: '\n' ends every verse of the corpus

[[noreturn]] void refuse(const std::string& what) {
  throw std::invalid_argument("llama: config.json (LlamaConfig): " + what);
}

std::string quoted(const nlohmann::json& hf, const char* key) { return "\"" + std::string(key) + "\" " + hf.at(key).dump(); }

// A required integer field (>= min).
int64_t size_field(const nlohmann::json& hf, const char* key, int64_t min = 1) {
  if (!hf.contains(key)) refuse("missing \"" + std::string(key) + "\" (a LlamaConfig writes it)");
  const auto& v = hf.at(key);
  if (!v.is_number_integer()) refuse(quoted(hf, key) + " is not an integer");
  const int64_t n = v.get<int64_t>();
  if (n < min) refuse(quoted(hf, key) + " is below " + std::to_string(min));
  return n;
}

// A positive number (TOML-like: integers accepted).
double positive_number(const nlohmann::json& v, const std::string& where) {
  if (!v.is_number() || v.get<double>() <= 0) refuse(where + " is " + v.dump() + ", expected a positive number");
  return v.get<double>();
}

// An optional boolean that must have the value `supported` (absent or null = transformers' default,
// which is the supported value for every key checked here).
void require_bool(const nlohmann::json& hf, const char* key, bool supported, const std::string& why) {
  if (!hf.contains(key) || hf.at(key).is_null()) return;
  const auto& v = hf.at(key);
  if (!v.is_boolean()) refuse(quoted(hf, key) + " is not a boolean");
  if (v.get<bool>() != supported)
    refuse("\"" + std::string(key) + "\": " + v.dump() + " is not supported by this model (" + why + "); set it to " +
           (supported ? "true" : "false"));
}

// rope_type "default" (or absent) in a rope_parameters / rope_scaling object.
void require_default_rope(const nlohmann::json& rope, const char* key) {
  if (!rope.is_object()) refuse("\"" + std::string(key) + "\" is " + rope.dump() + ", expected an object");
  for (const char* type_key : {"rope_type", "type"}) {
    if (!rope.contains(type_key)) continue;
    const auto& t = rope.at(type_key);
    if (!t.is_string() || t.get<std::string>() != "default")
      refuse("\"" + std::string(key) + "\".\"" + type_key + "\" is " + t.dump() +
             "; this model implements the plain rotary embedding only (rope_type \"default\": no scaling)");
  }
}

}  // namespace

nlohmann::json to_hf_config(const LlamaConfig& c) {
  nlohmann::json j;
  j["model_type"] = "llama";
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.n_embd;
  j["intermediate_size"] = intermediate_size(c);
  j["num_hidden_layers"] = c.n_layer;
  j["num_attention_heads"] = c.n_head;
  j["num_key_value_heads"] = c.n_kv_head;
  j["head_dim"] = c.n_embd / c.n_head;
  j["max_position_embeddings"] = c.n_ctx;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["hidden_act"] = "silu";
  j["initializer_range"] = 0.02;
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  j["tie_word_embeddings"] = false;
  j["use_cache"] = true;
  j["bos_token_id"] = kNewline;
  j["eos_token_id"] = kNewline;
  j["pad_token_id"] = nullptr;
  return j;
}

LlamaConfig from_hf_config(const nlohmann::json& hf) {
  if (!hf.is_object()) refuse("expected a JSON object, got " + std::string(hf.type_name()));
  const std::string model_type = hf.contains("model_type") && hf.at("model_type").is_string()
                                     ? hf.at("model_type").get<std::string>()
                                     : (hf.contains("model_type") ? hf.at("model_type").dump() : "");
  if (model_type != "llama")
    throw std::invalid_argument("llama: config.json has model_type \"" + model_type +
                                "\", but this example's model is \"llama\" (LlamaForCausalLM); use the example of "
                                "that model (a \"gpt2\" checkpoint: build/bin/gpt)");
  LlamaConfig c;
  c.n_embd = size_field(hf, "hidden_size");
  c.n_layer = size_field(hf, "num_hidden_layers");
  c.n_head = size_field(hf, "num_attention_heads");
  c.n_kv_head = hf.contains("num_key_value_heads") && !hf.at("num_key_value_heads").is_null()
                    ? size_field(hf, "num_key_value_heads")
                    : c.n_head;
  c.intermediate_size = size_field(hf, "intermediate_size");
  c.n_ctx = size_field(hf, "max_position_embeddings", 2);
  c.vocab_size = size_field(hf, "vocab_size");
  if (c.vocab_size < 256)
    refuse("\"vocab_size\" is " + std::to_string(c.vocab_size) +
           "; this byte-level model needs at least 256 (ids 0..255 are the bytes)");
  if (hf.contains("head_dim") && !hf.at("head_dim").is_null()) {
    const auto& v = hf.at("head_dim");
    if (!v.is_number_integer() || c.n_embd % c.n_head != 0 || v.get<int64_t>() != c.n_embd / c.n_head)
      refuse("\"head_dim\" is " + v.dump() + "; this model's head_dim is hidden_size / num_attention_heads (" +
             std::to_string(c.n_embd) + " / " + std::to_string(c.n_head) + "); set \"head_dim\": null");
  }
  c.rms_norm_eps = hf.contains("rms_norm_eps") ? positive_number(hf.at("rms_norm_eps"), "\"rms_norm_eps\"") : 1e-6;
  c.rope_theta = 10000.0;  // transformers' default
  if (hf.contains("rope_theta") && !hf.at("rope_theta").is_null())
    c.rope_theta = positive_number(hf.at("rope_theta"), "\"rope_theta\"");
  if (hf.contains("rope_scaling") && !hf.at("rope_scaling").is_null())
    require_default_rope(hf.at("rope_scaling"), "rope_scaling");
  if (hf.contains("rope_parameters") && !hf.at("rope_parameters").is_null()) {
    const auto& rope = hf.at("rope_parameters");
    require_default_rope(rope, "rope_parameters");
    if (rope.contains("rope_theta")) c.rope_theta = positive_number(rope.at("rope_theta"), "\"rope_parameters\".\"rope_theta\"");
  }
  const std::string act = hf.contains("hidden_act")
                              ? (hf.at("hidden_act").is_string() ? hf.at("hidden_act").get<std::string>()
                                                                 : hf.at("hidden_act").dump())
                              : "silu";
  if (act != "silu")
    refuse("\"hidden_act\" is \"" + act + "\"; this model's MLP is SwiGLU with \"silu\"");
  require_bool(hf, "tie_word_embeddings", false, "its lm_head is a separate matrix");
  require_bool(hf, "attention_bias", false, "its attention projections have no bias");
  require_bool(hf, "mlp_bias", false, "its MLP projections have no bias");
  try {
    validate(c);
  } catch (const std::invalid_argument& e) {
    refuse(std::string("these sizes do not fit the model: ") + e.what());
  }
  return c;
}

std::string describe(const LlamaConfig& c) {
  std::string s = std::to_string(c.n_layer) + " layers, n_embd " + std::to_string(c.n_embd) + ", " +
                  std::to_string(c.n_head) + " heads, " + std::to_string(c.n_kv_head) + " kv heads, intermediate " +
                  std::to_string(intermediate_size(c)) + ", n_ctx " + std::to_string(c.n_ctx);
  if (c.vocab_size != 256) s += ", vocab " + std::to_string(c.vocab_size);
  return s;
}

}  // namespace llama
