// hf_config.h — the llama example's model configuration as a HuggingFace LlamaConfig (config.json of
// transformers' LlamaForCausalLM), both ways.
//
// to_hf_config writes every field transformers 5.24's LlamaConfig.to_json_string() writes (checked
// against the venv's transformers), except "transformers_version" (this file is not written by
// transformers) and "dtype" (the tensors' dtype is the checkpoint's own); the state-dict adapter adds
// "architectures": ["LlamaForCausalLM"]. hidden_size = n_embd, intermediate_size = the resolved
// SwiGLU width (llama::intermediate_size: never 0), num_hidden_layers = n_layer,
// num_attention_heads = n_head, num_key_value_heads = n_kv_head, head_dim = n_embd / n_head,
// max_position_embeddings = n_ctx, rms_norm_eps, hidden_act "silu", rope as transformers 5 writes it:
// "rope_parameters": {"rope_type": "default", "rope_theta": ...}; tie_word_embeddings,
// attention_bias and mlp_bias false; attention_dropout 0.
// bos_token_id = eos_token_id = 10 ('\n'): transformers requires ids inside the vocabulary, and in
// this byte-level corpus every verse ends with '\n', the natural end of a generation; generate()
// also starts from '\n' when the prompt is empty.
//
// from_hf_config reads hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads
// (absent or null: = num_attention_heads, transformers' rule), intermediate_size,
// max_position_embeddings, vocab_size, rms_norm_eps (absent: transformers' 1e-6) and rope_theta from
// "rope_parameters" (transformers 5) or a top-level "rope_theta" (transformers 4; absent in both:
// 10000, transformers' default). It throws std::invalid_argument, naming the field, its value and the
// fix, for anything this model cannot represent: model_type other than "llama"; hidden_act other
// than "silu"; tie_word_embeddings, attention_bias or mlp_bias true; a rope_type (in
// rope_parameters, or a non-null rope_scaling) other than "default"; head_dim other than null or
// hidden_size / num_attention_heads; vocab_size below 256 (the bytes are ids 0..255; a larger
// vocabulary is kept, only its first 256 ids are used); sizes llama::validate refuses; a missing or
// mistyped size.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "model.h"

namespace llama {

nlohmann::json to_hf_config(const LlamaConfig& config);
LlamaConfig from_hf_config(const nlohmann::json& hf);

// "4 layers, n_embd 256, 4 heads, 2 kv heads, intermediate 704, n_ctx 128" (+ ", vocab V" when
// V != 256): the trainer's log line.
std::string describe(const LlamaConfig& config);

}  // namespace llama
