// model.h — a GPT-2-style byte-level decoder language model for the gpt example.
//
// Architecture (GPT-2): token embedding + learned position embedding, n_layer pre-LayerNorm blocks
// (causal multi-head self-attention, then a GELU MLP, each added to the residual stream), a final
// LayerNorm and an LM head TIED to the token embedding (logits = ln_f(x) · wte.weightᵀ).
//
// Parameter NAMES are GPT-2's (HuggingFace GPT2LMHeadModel without the tied lm_head); shapes as held
// in memory here:
//   transformer.wte.weight [vocab, C]          transformer.wpe.weight [n_ctx, C]
//   transformer.h.<i>.ln_1.{weight,bias} [C]   transformer.h.<i>.attn.c_attn.{weight [3C, C], bias [3C]}
//   transformer.h.<i>.attn.c_proj.{weight [C, C], bias [C]}
//   transformer.h.<i>.ln_2.{weight,bias} [C]   transformer.h.<i>.mlp.c_fc.{weight [4C, C], bias [4C]}
//   transformer.h.<i>.mlp.c_proj.{weight [C, 4C], bias [C]}
//   transformer.ln_f.{weight,bias} [C]
// In-memory LAYOUT (not GPT-2's): torch::nn::Linear's [out_features, in_features], and c_attn's
// output rows (weight rows, bias entries) ordered [head, q|k|v, head_dim]. transformers' layout is
// Conv1D's [in, out] with c_attn's output columns ordered [q|k|v, head, head_dim]; the "gpt2"
// state-dict adapter (booster/checkpoint/state_dict_adapter.h, used by the trainer's save_model and
// --init_from) converts between the two, so a saved directory is GPT2LMHeadModel.from_pretrained's.
// The math is GPT-2's: pre-LN blocks, GELU (config.gelu_tanh: "gelu_new", GPT-2's own, by default),
// attention scaled by 1/sqrt(head_dim), LayerNorm eps from the config, tied LM head
// (examples/gpt/hf_config.h maps GPTConfig to GPT2Config).
//
// Shard units: every block is a booster::nn::Unit<Block>, so a parameter-sharding plugin (FSDP)
// gathers and frees one block at a time; the embeddings and ln_f form the root unit. Units add no
// level to the names.
//
// Parallelism: the same model runs under every plugin.
//  - Tensor parallelism (hybrid_parallel tp_size > 1): c_attn and c_fc are ColumnParallelLinear,
//    both c_proj RowParallelLinear, wte a VocabParallelEmbedding whose lm_logits is the tied head,
//    and lm::lm_loss (common/lm_trainer.h) the vocab-parallel cross entropy; at tp = 1 (every other plugin) they are the dense
//    layers. c_attn's [head, q|k|v, head_dim] row order (Megatron-LM's) makes the column split give
//    each rank n_head / tp whole heads. The layers shard over the group of the TensorParallelContext
//    the model is built with (GPTImpl's `tp`: the Booster's tensor_parallel_context()); a
//    default-constructed context is tp = 1.
//  - Sequence parallelism (hybrid_parallel enable_sequence_parallelism; booster/nn/sequence_parallel.h):
//    "split_gather" keeps [B, T/tp, C] between the tensor-parallel regions (the layers communicate;
//    embed adds the shard's positions); "all_to_all" keeps [B, T/sp, C] everywhere, exchanging
//    sequence shards for head shards around attention, and lm_loss averages the shards' losses.
//    T must be a multiple of the sequence-parallel size (std::invalid_argument from embed).
//  - Pipeline parallelism (pp_size > 1): pipeline_layers() lists embed, each block, and ln_f + the
//    tied head (which lists wte again: it lives on the first and the last stage).
// Dtypes: token ids int64 (bytes 0..255); activations and logits in the parameters' dtype (float32,
// or bfloat16 under a bf16 plugin / autocast); lm_loss returns float32.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "booster/nn/pipeline.h"
#include "booster/nn/tensor_parallel.h"
#include "booster/nn/unit.h"

namespace gpt {

struct GPTConfig {
  int64_t vocab_size = 256;  // byte-level
  int64_t n_ctx = 256;       // maximum sequence length (rows of wpe)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 256;      // C; must be a multiple of n_head
  double dropout = 0.0;      // embedding, attention-probability and residual dropout (training only)
  double layer_norm_eps = 1e-5;
  bool gelu_tanh = true;     // GPT-2's tanh approximation of GELU ("gelu_new"); false: exact (erf)
                             // GELU ("gelu"), which is markedly faster on CPU in bf16
};

// ---- The tensor-parallel layers (the one construction site of each); each initialises its full
// weight ~ N(0, init_std) (biases 0) from the torch RNG and shards over tp's group.
// Linear split by output features (c_attn, c_fc).
booster::nn::ColumnParallelLinear column_parallel_linear(int64_t in_features, int64_t out_features, double init_std,
                                                         const booster::nn::TensorParallelContext& tp);
// Linear split by input features (both c_proj); its bias is replicated.
booster::nn::RowParallelLinear row_parallel_linear(int64_t in_features, int64_t out_features, double init_std,
                                                   const booster::nn::TensorParallelContext& tp);
// The token embedding [vocab, C], split by vocabulary rows.
booster::nn::VocabParallelEmbedding vocab_embedding(int64_t vocab_size, int64_t n_embd, double init_std,
                                                    const booster::nn::TensorParallelContext& tp);

// ---- Modules.

// Causal multi-head self-attention: x [B, T, C] -> [B, T, C]. c_attn's output is laid out as
// [heads, 3 (q, k, v), head_dim] along its last dimension (each tp rank holds whole heads in that
// layout).
struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(const GPTConfig& config, const booster::nn::TensorParallelContext& tp);
  torch::Tensor forward(const torch::Tensor& x);

  booster::nn::ColumnParallelLinear c_attn{nullptr};  // C -> 3C
  booster::nn::RowParallelLinear c_proj{nullptr};  // C -> C
  int64_t head_dim;
  double dropout;
  // sequence_parallelism_mode = "all_to_all": the context's sp group (null otherwise); the
  // constructor throws std::invalid_argument when sp_size does not divide n_head / tp.
  std::shared_ptr<booster::dist::ProcessGroup> sp_group;
};
TORCH_MODULE(CausalSelfAttention);

// x [B, T, C] -> c_proj(gelu(c_fc(x))) [B, T, C].
struct MLPImpl : torch::nn::Module {
  MLPImpl(const GPTConfig& config, const booster::nn::TensorParallelContext& tp);
  torch::Tensor forward(const torch::Tensor& x);

  booster::nn::ColumnParallelLinear c_fc{nullptr};    // C -> 4C
  booster::nn::RowParallelLinear c_proj{nullptr};  // 4C -> C
  double dropout;
  bool gelu_tanh;
};
TORCH_MODULE(MLP);

// Pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(·)). [B, T, C] -> [B, T, C].
struct BlockImpl : torch::nn::Module {
  BlockImpl(const GPTConfig& config, const booster::nn::TensorParallelContext& tp);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

// The `transformer` sub-module: holds wte, wpe, h (ModuleList of Unit<Block>), ln_f.
struct TransformerImpl : torch::nn::Module {
  TransformerImpl(const GPTConfig& config, const booster::nn::TensorParallelContext& tp);

  booster::nn::VocabParallelEmbedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<booster::nn::Unit<Block>> blocks;  // the same modules as h, typed
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(Transformer);

struct GPTImpl : torch::nn::Module, booster::nn::PipelineModule {
  // Builds the model and initialises it as GPT-2 from the current torch RNG state (the caller seeds
  // it with torch::manual_seed(seed) on every rank): every Linear and Embedding weight ~ N(0, 0.02),
  // the c_proj weights ~ N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm weight 1 / bias 0.
  // tp: the tensor-parallel context the layers shard over (Booster::tensor_parallel_context());
  // the default is tp = 1, the dense model. Throws std::invalid_argument for sizes tp cannot split.
  explicit GPTImpl(const GPTConfig& config, booster::nn::TensorParallelContext tp = {});

  // idx int64 [B, T] (T <= n_ctx) -> logits [B, T, vocab]: head(blocks(embed(idx))).
  torch::Tensor forward(const torch::Tensor& idx);
  // The pipeline stages of forward.
  torch::Tensor embed(const torch::Tensor& idx);      // [B, T] -> [B, T, C] (wte + wpe, dropout)
  torch::Tensor run_blocks(torch::Tensor x, int64_t first = 0, int64_t last = -1);  // blocks [first, last)
  torch::Tensor head(const torch::Tensor& x);         // [B, T, C] -> ln_f -> · wteᵀ -> [B, T, V / tp]

  // embed, each block, ln_f + tied head (booster/nn/pipeline.h).
  std::vector<booster::nn::PipelineLayer> pipeline_layers() override;

  int64_t num_parameters() const;  // each tensor once (wte counted once: the head is tied)

  GPTConfig config;
  booster::nn::TensorParallelContext tp;  // the context the model was built with
  Transformer transformer{nullptr};
};
TORCH_MODULE(GPT);

}  // namespace gpt
