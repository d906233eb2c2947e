// hf_config.h — the gpt example's model configuration as a HuggingFace GPT2Config (config.json of
// transformers' GPT2LMHeadModel), both ways.
//
// to_hf_config writes every field transformers 5.24's GPT2Config.to_json_string() writes (checked
// against the venv's transformers), except "transformers_version" (this file is not written by
// transformers) and "dtype" (the tensors' dtype is the checkpoint's own); the state-dict adapter adds
// "architectures": ["GPT2LMHeadModel"]. Sizes: n_positions = n_ctx, n_inner null (= 4 n_embd),
// activation_function "gelu_new" (GPT-2's tanh GELU) or "gelu" (exact erf GELU),
// resid_pdrop = embd_pdrop = attn_pdrop = dropout, tie_word_embeddings true.
// bos_token_id = eos_token_id = 10 ('\n'): transformers requires ids inside the vocabulary (GPT-2's
// 50256 is not a byte), and in this byte-level corpus every verse ends with '\n', the natural end
// of a generation; generate() also starts from '\n' when the prompt is empty.
//
// from_hf_config reads n_layer, n_head, n_embd, n_positions (-> n_ctx), vocab_size,
// layer_norm_epsilon and activation_function; dropout keeps its default (a training choice, set by
// the trainer). It throws std::invalid_argument, naming the field, its value and the fix, for
// anything this model cannot represent: model_type other than "gpt2"; n_inner other than null or
// 4 n_embd; activation_function other than gelu_new / gelu_pytorch_tanh (tanh) or gelu (exact);
// tie_word_embeddings false; scale_attn_by_inverse_layer_idx or reorder_and_upcast_attn true;
// scale_attn_weights false; add_cross_attention true; vocab_size below 256 (the bytes are ids
// 0..255; a larger vocabulary is kept, only its first 256 ids are used); n_embd not a multiple of
// n_head; a missing or mistyped size.
#pragma once

#include <nlohmann/json.hpp>

#include "model.h"

namespace gpt {

nlohmann::json to_hf_config(const GPTConfig& config);
GPTConfig from_hf_config(const nlohmann::json& hf);

// "4 layers, n_embd 256, 4 heads, n_ctx 128" (+ ", vocab V" when V != 256, ", gelu exact" when
// not tanh): the trainer's log line.
std::string describe(const GPTConfig& config);

}  // namespace gpt
