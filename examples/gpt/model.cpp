// model.cpp — the GPT-2-style model of model.h.
#include "model.h"

#include "booster/dist/process_group.h"
#include "booster/nn/sequence_parallel.h"

#include <cmath>
#include <stdexcept>
#include <unordered_set>

namespace gpt {

namespace {
constexpr double kInitStd = 0.02;  // GPT-2's initializer_range
double proj_init_std(const GPTConfig& c) { return kInitStd / std::sqrt(2.0 * static_cast<double>(c.n_layer)); }
}  // namespace

booster::nn::ColumnParallelLinear column_parallel_linear(int64_t in_features, int64_t out_features, double init_std,
                                                         const booster::nn::TensorParallelContext& tp) {
  return booster::nn::ColumnParallelLinear(booster::nn::LinearParallelOptions(in_features, out_features)
                                               .init_method([init_std](at::Tensor& w) { w.normal_(0.0, init_std); })
                                               .context(tp));
}

booster::nn::RowParallelLinear row_parallel_linear(int64_t in_features, int64_t out_features, double init_std,
                                                   const booster::nn::TensorParallelContext& tp) {
  return booster::nn::RowParallelLinear(booster::nn::LinearParallelOptions(in_features, out_features)
                                            .init_method([init_std](at::Tensor& w) { w.normal_(0.0, init_std); })
                                            .context(tp));
}

booster::nn::VocabParallelEmbedding vocab_embedding(int64_t vocab_size, int64_t n_embd, double init_std,
                                                    const booster::nn::TensorParallelContext& tp) {
  return booster::nn::VocabParallelEmbedding(booster::nn::VocabParallelEmbeddingOptions(vocab_size, n_embd)
                                                 .init_method([init_std](at::Tensor& w) { w.normal_(0.0, init_std); })
                                                 .context(tp));
}


// ---------------------------------------------------------------------------------------------

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& config, const booster::nn::TensorParallelContext& ctx)
    : head_dim(config.n_embd / config.n_head), dropout(config.dropout) {
  if (config.n_head <= 0 || config.n_embd % config.n_head != 0)
    throw std::invalid_argument("gpt: n_embd (" + std::to_string(config.n_embd) + ") must be a multiple of n_head (" +
                                std::to_string(config.n_head) + ")");
  c_attn = register_module("c_attn", column_parallel_linear(config.n_embd, 3 * config.n_embd, kInitStd, ctx));
  c_proj = register_module("c_proj", row_parallel_linear(config.n_embd, config.n_embd, proj_init_std(config), ctx));
  if (ctx.sequence_parallel == booster::nn::SequenceParallelMode::kAllToAll && ctx.sp_group &&
      ctx.sp_group->size() > 1) {
    sp_group = ctx.sp_group;
    const int64_t sp = sp_group->size(), local_heads = config.n_head / (ctx.group ? ctx.group->size() : 1);
    if (local_heads % sp != 0)
      throw std::invalid_argument("gpt: sequence_parallelism_mode = \"all_to_all\" exchanges attention heads over "
                                  "the sp group, but n_head = " + std::to_string(config.n_head) + " (" +
                                  std::to_string(local_heads) + " per tp rank) is not divisible by sp_size = " +
                                  std::to_string(sp) + "; choose an sp_size that divides the heads per tp rank");
  }
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  // [B, T, H * 3 * D] (rows of c_attn ordered [head, q|k|v, head_dim]) -> [3, B, H, T, D]; H is
  // whatever this rank's c_attn produces (n_head / tp). Under split_gather c_attn gathers the
  // sequence (x holds T / tp positions, its output T); under all_to_all the sequence shards are
  // exchanged for head shards here (T / sp positions, H heads -> T positions, H / sp heads).
  auto qkv = c_attn(x);
  const int64_t B = qkv.size(0);
  if (sp_group)
    qkv = booster::nn::sequence_all_to_all(qkv.view({B, qkv.size(1), -1, 3 * head_dim}), sp_group, 2, 1);
  const int64_t T = qkv.size(1);
  qkv = qkv.reshape({B, T, -1, 3, head_dim}).permute({3, 0, 2, 1, 4});
  auto q = qkv[0], k = qkv[1], v = qkv[2];
  const int64_t H = q.size(1);
  // Scores with the causal mask fused into the GEMM: mask + (q kᵀ) / sqrt(D), mask = -inf above the
  // diagonal. [B H, T, T].
  auto mask = torch::full({T, T}, -std::numeric_limits<float>::infinity(), q.options())
                  .triu(1)
                  .expand({B * H, T, T});
  auto att = torch::baddbmm(mask, q.reshape({B * H, T, head_dim}), k.reshape({B * H, T, head_dim}).transpose(1, 2),
                            /*beta=*/1.0, /*alpha=*/1.0 / std::sqrt(static_cast<double>(head_dim)))
                 .softmax(-1);
  // Attention probabilities are split by head across tp ranks: a different mask per tp rank.
  att = booster::nn::tensor_parallel_dropout(att, dropout, is_training(), c_attn->group);
  auto y = torch::bmm(att.to(v.scalar_type()), v.reshape({B * H, T, head_dim}));  // [B H, T, D]
  y = y.view({B, H, T, head_dim}).transpose(1, 2);                                // [B, T, H, D]
  if (sp_group) y = booster::nn::sequence_all_to_all(y, sp_group, 1, 2);           // [B, T / sp, H sp, D]
  y = c_proj(y.reshape({B, y.size(1), -1}));
  if (dropout > 0 && is_training()) y = torch::dropout(y, dropout, true);
  return y;
}

MLPImpl::MLPImpl(const GPTConfig& config, const booster::nn::TensorParallelContext& tp)
    : dropout(config.dropout), gelu_tanh(config.gelu_tanh) {
  c_fc = register_module("c_fc", column_parallel_linear(config.n_embd, 4 * config.n_embd, kInitStd, tp));
  c_proj = register_module("c_proj", row_parallel_linear(4 * config.n_embd, config.n_embd, proj_init_std(config), tp));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  auto y = c_proj(torch::gelu(c_fc(x), gelu_tanh ? "tanh" : "none"));
  if (dropout > 0 && is_training()) y = torch::dropout(y, dropout, true);
  return y;
}

BlockImpl::BlockImpl(const GPTConfig& config, const booster::nn::TensorParallelContext& tp) {
  auto ln = [&] {
    return torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_eps));
  };
  ln_1 = register_module("ln_1", ln());
  attn = register_module("attn", CausalSelfAttention(config, tp));
  ln_2 = register_module("ln_2", ln());
  mlp = register_module("mlp", MLP(config, tp));
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + attn(ln_1(x));
  return h + mlp(ln_2(h));
}

TransformerImpl::TransformerImpl(const GPTConfig& config, const booster::nn::TensorParallelContext& tp) {
  wte = register_module("wte", vocab_embedding(config.vocab_size, config.n_embd, kInitStd, tp));
  wpe = register_module("wpe", torch::nn::Embedding(config.n_ctx, config.n_embd));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) {
    booster::nn::Unit<Block> block(config, tp);
    h->push_back(block);
    blocks.push_back(block);
  }
  ln_f = register_module(
      "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_eps)));
}

GPTImpl::GPTImpl(const GPTConfig& cfg, booster::nn::TensorParallelContext tp_) : config(cfg), tp(std::move(tp_)) {
  transformer = register_module("transformer", Transformer(config, tp));
  // The tensor-parallel layers initialised their full weights at construction (init_method:
  // N(0, 0.02), c_proj N(0, 0.02 / sqrt(2 n_layer)), biases 0); the replicated rest here, so the
  // initial model is the same at every tp size.
  torch::NoGradGuard no_grad;
  transformer->wpe->weight.normal_(0.0, kInitStd);
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with("ln_1.weight") || ends_with("ln_2.weight") || ends_with("ln_f.weight")) p.fill_(1.0);
    if (ends_with("ln_1.bias") || ends_with("ln_2.bias") || ends_with("ln_f.bias")) p.zero_();
  }
}

torch::Tensor GPTImpl::embed(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  if (T > config.n_ctx)
    throw std::invalid_argument("gpt: sequence length " + std::to_string(T) + " exceeds n_ctx " +
                                std::to_string(config.n_ctx));
  // Sequence parallelism: this rank's positions [offset, offset + T / sp) (booster/nn/sequence_parallel.h);
  // wte returns that shard (split_gather: reduce-scattered; all_to_all: looked up from the shard's ids).
  const auto shard = booster::nn::sequence_shard(T, tp);
  auto pos = torch::arange(shard.offset, shard.offset + shard.length,
                           torch::TensorOptions().dtype(torch::kLong).device(idx.device()));
  auto x = transformer->wte(booster::nn::shard_sequence_input(idx, tp)) + transformer->wpe(pos);  // [B, t, C] + [t, C]
  if (config.dropout > 0 && is_training()) x = torch::dropout(x, config.dropout, true);
  return x;
}

torch::Tensor GPTImpl::run_blocks(torch::Tensor x, int64_t first, int64_t last) {
  const int64_t n = static_cast<int64_t>(transformer->blocks.size());
  if (last < 0) last = n;
  for (int64_t i = first; i < last; ++i) x = transformer->blocks[static_cast<size_t>(i)]->forward(x);
  return x;
}

torch::Tensor GPTImpl::head(const torch::Tensor& x) {
  // Tied LM head: the token embedding's weight as the output projection (this rank's vocabulary
  // columns under tensor parallelism).
  return transformer->wte->lm_logits(transformer->ln_f(x));
}

torch::Tensor GPTImpl::forward(const torch::Tensor& idx) { return head(run_blocks(embed(idx))); }

std::vector<booster::nn::PipelineLayer> GPTImpl::pipeline_layers() {
  std::vector<booster::nn::PipelineLayer> layers;
  layers.push_back({"transformer.embed", {transformer->wte.ptr(), transformer->wpe.ptr()},
                    [this](const torch::Tensor& idx) { return embed(idx); }});
  for (size_t i = 0; i < transformer->blocks.size(); ++i)
    layers.push_back({"transformer.h." + std::to_string(i), {transformer->blocks[i].ptr()},
                      [this, i](const torch::Tensor& x) { return transformer->blocks[i]->forward(x); }});
  // The tied head lists wte again: it lives on the first and the last stage.
  layers.push_back({"transformer.ln_f+lm_head", {transformer->ln_f.ptr(), transformer->wte.ptr()},
                    [this](const torch::Tensor& x) { return head(x); }});
  return layers;
}

int64_t GPTImpl::num_parameters() const {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  return n;
}

}  // namespace gpt
