// model.h — a Llama-3-style byte-level decoder language model for the llama example.
//
// Architecture (Llama; Touvron et al. 2023, "LLaMA"; Grattafiori et al. 2024, "The Llama 3 Herd of
// Models"; Meta's reference implementation, github.com/meta-llama/llama3 model.py): a token embedding
// (no position embedding), n_layer pre-RMSNorm decoder layers (grouped-query causal self-attention
// with rotary position embeddings, then a SwiGLU MLP, each added to the residual stream), a final
// RMSNorm and an UNTIED LM head (logits = norm(x) · lm_head.weightᵀ). No biases anywhere, no dropout.
// Numerically it is transformers' LlamaForCausalLM (eager attention, rope_type "default",
// attention_bias = mlp_bias = False, hidden_act "silu", tie_word_embeddings = False) once the q/k
// weights are permuted (below): float32 logits agree to ~1e-6, bfloat16 logits bit for bit (against
// transformers with its rotary inv_freq buffer in float32, as from_pretrained(dtype=bfloat16) keeps
// it; model.to(bfloat16) also casts that buffer, which shifts its rotary angles).
//  - RMSNorm (LlamaRMSNorm): h = x.float(); h = h · rsqrt(mean(h², -1) + eps); weight · h.to(x.dtype).
//  - Rotary embedding in Meta's INTERLEAVED convention (llama's apply_rotary_emb with complex
//    numbers): within each head of head_dim D, dimensions (2j, 2j+1) are pair j, rotated by the angle
//    pos · inv_freq[j], inv_freq[j] = 1 / rope_theta^(2j / D); pos = 0 .. T-1. cos / sin are computed
//    in float32 (as transformers' LlamaRotaryEmbedding) and cast to the dtype of the attention's input
//    (the residual stream's dtype); the rotation itself runs in the q/k dtype with type promotion,
//    exactly as transformers' apply_rotary_pos_emb does (Meta's reference rotates in float32 instead;
//    the two differ only by bf16 rounding).
//  - Attention: q·kᵀ / sqrt(D), causal mask, softmax in float32 cast back to the query's dtype,
//    · v (transformers' eager_attention_forward). Grouped-query: n_kv_head key/value heads, each
//    serving n_head / n_kv_head consecutive query heads (query head h uses kv head h / (n_head /
//    n_kv_head), transformers' repeat_kv).
//  - MLP (SwiGLU): down_proj(silu(gate_proj(x)) · up_proj(x)).
//
// Parameter names are transformers' LlamaForCausalLM's:
//   model.embed_tokens.weight [V, C]
//   model.layers.<i>.input_layernorm.weight [C]        model.layers.<i>.post_attention_layernorm.weight [C]
//   model.layers.<i>.self_attn.q_proj.weight [H·D, C]  model.layers.<i>.self_attn.k_proj.weight [KV·D, C]
//   model.layers.<i>.self_attn.v_proj.weight [KV·D, C] model.layers.<i>.self_attn.o_proj.weight [C, H·D]
//   model.layers.<i>.mlp.gate_proj.weight [I, C]       model.layers.<i>.mlp.up_proj.weight [I, C]
//   model.layers.<i>.mlp.down_proj.weight [C, I]
//   model.norm.weight [C]                              lm_head.weight [V, C]
// (V vocab_size, C n_embd, H n_head, KV n_kv_head, D = C / H, I intermediate_size; torch::nn::Linear's
// [out_features, in_features] layout, as transformers.)
// Rotary layout of q_proj / k_proj: their output rows are in Meta's order [head, D/2 pairs, 2]
// (interleaved), transformers' are [head, 2 halves, D/2] (rotate_half). Converting a checkpoint:
//   HF -> ours: w.view(n, 2, D/2, C).transpose(1, 2).reshape(n·D, C)
//   ours -> HF: w.view(n, D/2, 2, C).transpose(1, 2).reshape(n·D, C)   (transformers'
//               convert_llama_weights_to_hf.py permute())
// with n = n_head for q_proj and n = n_kv_head for k_proj; every other tensor is copied as is. The
// permutation stays within each head, so a tensor-parallel split of whole heads is the same heads in
// both layouts.
//
// Shard units: every decoder layer is a booster::nn::Unit<DecoderLayer>, so a parameter-sharding
// plugin (FSDP) gathers and frees one layer at a time; embed_tokens, norm and lm_head form the root
// unit. Units add no level to the names.
//
// Parallelism: the same model runs under every plugin.
//  - Tensor parallelism (hybrid_parallel tp_size > 1, Megatron-LM's layout): q_proj, k_proj, v_proj,
//    gate_proj and up_proj are ColumnParallelLinear, o_proj and down_proj RowParallelLinear, so each
//    rank holds n_head / tp query heads, n_kv_head / tp key/value heads (its query heads' own kv
//    heads) and I / tp MLP columns; tp must divide n_head, n_kv_head and intermediate_size
//    (std::invalid_argument otherwise). embed_tokens is a VocabParallelEmbedding and so is lm_head:
//    an untied second vocabulary-split table used only through lm_logits (never looked up), giving
//    this rank's vocabulary columns of the logits [B, T, Vp / tp] (Vp: the vocabulary padded as
//    VocabParallelEmbedding pads it when tp does not divide V; Vp = V otherwise), exactly what
//    lm::lm_loss (common/lm_trainer.h; vocab_parallel_cross_entropy) takes. The RMSNorm weights are replicated. The layers
//    shard over the group of the TensorParallelContext the model is built with (LlamaImpl's `tp`:
//    the Booster's tensor_parallel_context()); a default-constructed context is tp = 1.
//  - Sequence parallelism (hybrid_parallel enable_sequence_parallelism; booster/nn/sequence_parallel.h):
//    "split_gather" keeps [B, T/tp, C] between the tensor-parallel regions (the layers communicate;
//    the RMSNorm weights' gradients are per-shard parts the plugin sums); "all_to_all" keeps
//    [B, T/sp, C] everywhere and exchanges q, k, v (sequence shards -> head shards) before the rotary
//    embedding and attention, and the output back; lm_loss averages the shards' losses. T must be a
//    multiple of the sequence-parallel size, sp_size must divide n_head / tp and n_kv_head / tp.
//  - Pipeline parallelism (pp_size > 1): pipeline_layers() lists embed, each decoder layer, and
//    norm + lm_head (the head is untied: no parameter is listed twice).
// Dtypes: token ids int64 (bytes 0..255); activations and logits in the parameters' dtype (float32,
// or bfloat16 under a bf16 plugin / autocast); RMSNorm statistics, rotary angles and the attention
// softmax in float32; lm_loss returns float32.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "booster/nn/pipeline.h"
#include "booster/nn/tensor_parallel.h"
#include "booster/nn/unit.h"

namespace llama {

struct LlamaConfig {
  int64_t vocab_size = 256;  // byte-level
  int64_t n_ctx = 256;       // maximum sequence length (transformers' max_position_embeddings)
  int64_t n_layer = 4;       // num_hidden_layers
  int64_t n_head = 4;        // num_attention_heads
  int64_t n_kv_head = 2;     // num_key_value_heads; must divide n_head
  int64_t n_embd = 256;      // C (hidden_size); a multiple of n_head with an even head_dim C / n_head
  // I, the SwiGLU width. 0: Meta's reference rule (llama model.py FeedForward, multiple_of = 32):
  // floor(8 C / 3) rounded up to a multiple of 32 (C = 256 -> 704). See intermediate_size() below.
  int64_t intermediate_size = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 500000.0;  // Llama 3's base
};

// The SwiGLU width the config gives: config.intermediate_size when > 0, else
// 32 · ceil(floor(8 · n_embd / 3) / 32). std::invalid_argument when negative.
int64_t intermediate_size(const LlamaConfig& config);

// Checks the sizes (std::invalid_argument naming the field): vocab_size, n_ctx, n_layer, n_head,
// n_kv_head, n_embd >= 1; n_head a multiple of n_kv_head; n_embd a multiple of n_head with an even
// quotient; intermediate_size >= 0; rms_norm_eps and rope_theta > 0. The model's constructors call it.
void validate(const LlamaConfig& config);

// ---- Modules.

// transformers' LlamaRMSNorm: x [..., C] -> weight · (x / sqrt(mean(x², -1) + eps)), the statistics in
// float32, the normalised value cast back to x's dtype before the weight multiplies it. weight [C]
// starts at 1.
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);

  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// Grouped-query causal self-attention with interleaved rotary embeddings: x [B, T, C] -> [B, T, C].
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const LlamaConfig& config, const booster::nn::TensorParallelContext& tp);
  torch::Tensor forward(const torch::Tensor& x);

  booster::nn::ColumnParallelLinear q_proj{nullptr};  // C -> H·D (this rank: H/tp heads)
  booster::nn::ColumnParallelLinear k_proj{nullptr};  // C -> KV·D
  booster::nn::ColumnParallelLinear v_proj{nullptr};  // C -> KV·D
  booster::nn::RowParallelLinear o_proj{nullptr};     // H·D -> C
  int64_t head_dim;
  double rope_theta;
  // sequence_parallelism_mode = "all_to_all": the context's sp group (null otherwise); the
  // constructor throws std::invalid_argument when sp_size does not divide n_head / tp or n_kv_head / tp.
  std::shared_ptr<booster::dist::ProcessGroup> sp_group;
};
TORCH_MODULE(Attention);

// x [B, T, C] -> down_proj(silu(gate_proj(x)) · up_proj(x)) [B, T, C].
struct MLPImpl : torch::nn::Module {
  MLPImpl(const LlamaConfig& config, const booster::nn::TensorParallelContext& tp);
  torch::Tensor forward(const torch::Tensor& x);

  booster::nn::ColumnParallelLinear gate_proj{nullptr};  // C -> I
  booster::nn::ColumnParallelLinear up_proj{nullptr};    // C -> I
  booster::nn::RowParallelLinear down_proj{nullptr};     // I -> C
};
TORCH_MODULE(MLP);

// Pre-norm decoder layer: h = x + self_attn(input_layernorm(x)); h + mlp(post_attention_layernorm(h)).
// [B, T, C] -> [B, T, C].
struct DecoderLayerImpl : torch::nn::Module {
  DecoderLayerImpl(const LlamaConfig& config, const booster::nn::TensorParallelContext& tp);
  torch::Tensor forward(const torch::Tensor& x);

  RMSNorm input_layernorm{nullptr};
  Attention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(DecoderLayer);

// The `model` sub-module (transformers' LlamaModel): embed_tokens, layers (ModuleList of
// Unit<DecoderLayer>), norm.
struct LlamaModelImpl : torch::nn::Module {
  LlamaModelImpl(const LlamaConfig& config, const booster::nn::TensorParallelContext& tp);

  booster::nn::VocabParallelEmbedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<booster::nn::Unit<DecoderLayer>> blocks;  // the same modules as layers, typed
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

struct LlamaImpl : torch::nn::Module, booster::nn::PipelineModule {
  // Builds the model (validate(config) first) and initialises it as transformers' LlamaForCausalLM
  // does, from the current torch RNG state (the caller seeds it with torch::manual_seed(seed) on every
  // rank): every Linear and Embedding weight ~ N(0, 0.02) (initializer_range; drawn on the full
  // weight, so the same model at every tp size), RMSNorm weights 1. `config` keeps the resolved
  // intermediate_size (never 0). tp: the tensor-parallel context the layers shard over
  // (Booster::tensor_parallel_context()); the default is tp = 1, the dense model. Throws
  // std::invalid_argument for sizes tp (or the sp group) cannot split.
  explicit LlamaImpl(const LlamaConfig& config, booster::nn::TensorParallelContext tp = {});

  // idx int64 [B, T] (T <= n_ctx) -> logits [B, T, Vp / tp]: head(run_blocks(embed(idx))).
  torch::Tensor forward(const torch::Tensor& idx);
  // The pipeline stages of forward.
  torch::Tensor embed(const torch::Tensor& idx);  // [B, T] -> [B, T, C] (embed_tokens)
  torch::Tensor run_blocks(torch::Tensor x, int64_t first = 0, int64_t last = -1);  // layers [first, last)
  torch::Tensor head(const torch::Tensor& x);     // [B, T, C] -> norm -> lm_head -> [B, T, Vp / tp]

  // embed, each decoder layer, norm + lm_head (booster/nn/pipeline.h).
  std::vector<booster::nn::PipelineLayer> pipeline_layers() override;

  int64_t num_parameters() const;  // this rank's parameter elements, each tensor once

  LlamaConfig config;
  booster::nn::TensorParallelContext tp;  // the context the model was built with
  LlamaModel model{nullptr};
  // Untied output projection [V, C] (a VocabParallelEmbedding used through lm_logits only; see the
  // header comment).
  booster::nn::VocabParallelEmbedding lm_head{nullptr};
};
TORCH_MODULE(Llama);

}  // namespace llama
