// hf_adapters.cpp — the built-in state-dict adapters (state_dict_adapter.h): "gpt2" and "llama",
// the reference decoders of examples/gpt and examples/llama <-> transformers' GPT2LMHeadModel and
// LlamaForCausalLM.
//
// gpt2 (transformers' modeling_gpt2.py): the model keeps torch::nn::Linear's [out, in] weights and
// orders c_attn's output rows [head, q|k|v, head_dim] (so a column split gives each tp rank whole
// heads, Megatron-LM's layout). GPT-2's Conv1D stores [in, out] with c_attn's columns ordered
// [q|k|v, head, head_dim]. So c_attn is reordered and transposed, c_proj / c_fc transposed, the rest
// renamed to itself. The LM head is tied to wte: GPT2LMHeadModel.save_pretrained omits
// lm_head.weight, and a file that has it (older saves), or GPT-2's legacy attn.bias / masked_bias
// buffers, loads with them dropped.
//
// llama (transformers' modeling_llama.py and convert_llama_weights_to_hf.py): the model applies
// rotary embeddings to interleaved pairs (2j, 2j+1) of each head, as Meta's reference; transformers
// rotates halves (j, j + D/2), and its conversion permutes q_proj / k_proj rows with
// permute(w, n) = w.view(n, D/2, 2, C).transpose(1, 2).reshape(n D, C). to_hf applies that
// permutation, from_hf its inverse; every other tensor keeps its name and layout.
#include <ATen/ATen.h>

#include <map>

#include "booster/checkpoint/state_dict_adapter.h"

namespace booster::checkpoint {

namespace {

int64_t int_field(const nlohmann::json& c, const std::string& key, const std::string& arch) {
  if (!c.contains(key) || !c[key].is_number_integer())
    throw CheckpointError("booster: the " + arch + " adapter needs an integer \"" + key + "\" in config.json, got " +
                          (c.contains(key) ? c[key].dump() : std::string("none")));
  return c[key].get<int64_t>();
}

void require_model_type(const nlohmann::json& c, const std::string& type, const std::string& adapter) {
  const std::string got = c.contains("model_type") && c["model_type"].is_string() ? c["model_type"].get<std::string>()
                                                                                   : std::string("(none)");
  if (got != type)
    throw CheckpointError("booster: the '" + adapter + "' state-dict adapter needs a config.json with model_type \"" +
                          type + "\", got " + got + "; use the adapter of that architecture");
}

// [3C, C] rows [H, 3, D]  <->  [3C, C] rows [3, H, D] (then Conv1D's transpose for the weight).
at::Tensor heads_major_to_qkv_major(const at::Tensor& t, int64_t H) {
  const int64_t rows = t.size(0), D = rows / 3 / H;
  std::vector<int64_t> v{H, 3, D}, out{rows};
  for (int64_t d = 1; d < t.dim(); ++d) {
    v.push_back(t.size(d));
    out.push_back(t.size(d));
  }
  return t.reshape(v).transpose(0, 1).reshape(out);
}
at::Tensor qkv_major_to_heads_major(const at::Tensor& t, int64_t H) {
  const int64_t rows = t.size(0), D = rows / 3 / H;
  std::vector<int64_t> v{3, H, D}, out{rows};
  for (int64_t d = 1; d < t.dim(); ++d) {
    v.push_back(t.size(d));
    out.push_back(t.size(d));
  }
  return t.reshape(v).transpose(0, 1).reshape(out);
}

std::shared_ptr<StateDictAdapter> gpt2_adapter(const nlohmann::json& c) {
  require_model_type(c, "gpt2", "gpt2");
  const int64_t H = int_field(c, "n_head", "gpt2"), C = int_field(c, "n_embd", "gpt2");
  int_field(c, "n_layer", "gpt2");
  if (H <= 0 || C % H != 0)
    throw CheckpointError("booster: gpt2 config.json: n_embd (" + std::to_string(C) + ") must be a multiple of n_head (" +
                          std::to_string(H) + ")");
  if (c.contains("tie_word_embeddings") && c["tie_word_embeddings"] == false)
    throw CheckpointError("booster: gpt2 config.json has tie_word_embeddings = false; this GPT-2 ties its LM head "
                          "to wte (GPT-2's own layout): use a checkpoint with tied embeddings");
  const std::string h = "transformer.h.{i}.";
  std::vector<AdapterRule> rules{
      AdapterRule::rename("transformer.wte.weight", "transformer.wte.weight"),
      AdapterRule::rename("transformer.wpe.weight", "transformer.wpe.weight"),
      AdapterRule::rename("transformer.ln_f.weight", "transformer.ln_f.weight"),
      AdapterRule::rename("transformer.ln_f.bias", "transformer.ln_f.bias"),
      AdapterRule{h + "attn.c_attn.weight", {h + "attn.c_attn.weight"},
                  [H](const at::Tensor& w) { return std::vector<at::Tensor>{heads_major_to_qkv_major(w, H).t()}; },
                  [H](const std::vector<at::Tensor>& p) { return qkv_major_to_heads_major(p.at(0).t(), H); }},
      AdapterRule{h + "attn.c_attn.bias", {h + "attn.c_attn.bias"},
                  [H](const at::Tensor& b) { return std::vector<at::Tensor>{heads_major_to_qkv_major(b, H)}; },
                  [H](const std::vector<at::Tensor>& p) { return qkv_major_to_heads_major(p.at(0), H); }},
      AdapterRule::transposed(h + "attn.c_proj.weight", h + "attn.c_proj.weight"),
      AdapterRule::transposed(h + "mlp.c_fc.weight", h + "mlp.c_fc.weight"),
      AdapterRule::transposed(h + "mlp.c_proj.weight", h + "mlp.c_proj.weight"),
  };
  for (const char* name : {"ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias", "attn.c_proj.bias", "mlp.c_fc.bias",
                           "mlp.c_proj.bias"})
    rules.push_back(AdapterRule::rename(h + name, h + name));
  return std::make_shared<StateDictAdapter>(
      "GPT2LMHeadModel", c,
      std::vector<std::string>{"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
                               "activation_function", "layer_norm_epsilon"},
      std::move(rules),
      std::vector<std::string>{"lm_head.weight", h + "attn.bias", h + "attn.masked_bias"});
}

// HF's rotary row permutation of q_proj / k_proj ([n D, C]) and its inverse.
at::Tensor interleaved_to_halves(const at::Tensor& w, int64_t n) {
  const int64_t rows = w.size(0), C = w.size(1), D = rows / n;
  return w.reshape({n, D / 2, 2, C}).transpose(1, 2).reshape({rows, C});
}
at::Tensor halves_to_interleaved(const at::Tensor& w, int64_t n) {
  const int64_t rows = w.size(0), C = w.size(1), D = rows / n;
  return w.reshape({n, 2, D / 2, C}).transpose(1, 2).reshape({rows, C});
}

std::shared_ptr<StateDictAdapter> llama_adapter(const nlohmann::json& c) {
  require_model_type(c, "llama", "llama");
  const int64_t H = int_field(c, "num_attention_heads", "llama");
  const int64_t KV = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                         ? int_field(c, "num_key_value_heads", "llama")
                         : H;
  const int64_t C = int_field(c, "hidden_size", "llama");
  const int64_t D = c.contains("head_dim") && !c["head_dim"].is_null() ? int_field(c, "head_dim", "llama")
                                                                          : (H > 0 ? C / H : 0);
  int_field(c, "num_hidden_layers", "llama");
  if (H <= 0 || KV <= 0 || H % KV != 0 || D <= 0 || D % 2 != 0)
    throw CheckpointError("booster: llama config.json: num_attention_heads (" + std::to_string(H) +
                          ") must be a positive multiple of num_key_value_heads (" + std::to_string(KV) +
                          ") and head_dim (" + std::to_string(D) + ") positive and even");
  if (c.contains("tie_word_embeddings") && c["tie_word_embeddings"] == true)
    throw CheckpointError("booster: llama config.json has tie_word_embeddings = true; this Llama has an untied "
                          "lm_head (Llama 3 8B's layout): use a checkpoint with tie_word_embeddings = false");
  const std::string l = "model.layers.{i}.";
  auto rotary = [](const std::string& name, int64_t n) {
    return AdapterRule{name, {name},
                       [n](const at::Tensor& w) { return std::vector<at::Tensor>{interleaved_to_halves(w, n)}; },
                       [n](const std::vector<at::Tensor>& p) { return halves_to_interleaved(p.at(0), n); }};
  };
  std::vector<AdapterRule> rules{rotary(l + "self_attn.q_proj.weight", H), rotary(l + "self_attn.k_proj.weight", KV)};
  for (const std::string name : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"})
    rules.push_back(AdapterRule::rename(name, name));
  for (const char* name : {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.v_proj.weight",
                           "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                           "mlp.down_proj.weight"})
    rules.push_back(AdapterRule::rename(l + name, l + name));
  return std::make_shared<StateDictAdapter>(
      "LlamaForCausalLM", c,
      std::vector<std::string>{"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps"},
      std::move(rules),
      std::vector<std::string>{l + "self_attn.rotary_emb.inv_freq", "model.rotary_emb.inv_freq"});
}

}  // namespace

void register_builtin_state_dict_adapters(std::map<std::string, StateDictAdapterFactory>& into) {
  into.emplace("gpt2", gpt2_adapter);
  into.emplace("llama", llama_adapter);
}

}  // namespace booster::checkpoint
