// model.cpp — the Llama-3-style model of model.h.
#include "model.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <unordered_set>

#include "booster/dist/process_group.h"
#include "booster/nn/sequence_parallel.h"

namespace llama {

namespace {
constexpr double kInitStd = 0.02;  // transformers' LlamaConfig.initializer_range

booster::nn::InitMethod normal_init() {
  return [](at::Tensor& w) { w.normal_(0.0, kInitStd); };
}

// The tensor-parallel layers (no bias); each initialises its FULL weight ~ N(0, 0.02).
booster::nn::ColumnParallelLinear column_parallel(int64_t in_features, int64_t out_features, const booster::nn::TensorParallelContext& tp) {
  return booster::nn::ColumnParallelLinear(
      booster::nn::LinearParallelOptions(in_features, out_features).bias(false).init_method(normal_init()).context(tp));
}

booster::nn::RowParallelLinear row_parallel(int64_t in_features, int64_t out_features, const booster::nn::TensorParallelContext& tp) {
  return booster::nn::RowParallelLinear(
      booster::nn::LinearParallelOptions(in_features, out_features).bias(false).init_method(normal_init()).context(tp));
}

booster::nn::VocabParallelEmbedding vocab_table(int64_t vocab_size, int64_t n_embd, const booster::nn::TensorParallelContext& tp) {
  return booster::nn::VocabParallelEmbedding(
      booster::nn::VocabParallelEmbeddingOptions(vocab_size, n_embd).init_method(normal_init()).context(tp));
}

void require_tp_divides(const char* field, int64_t value, int64_t tp, const char* why) {
  if (tp > 1 && value % tp != 0)
    throw std::invalid_argument(std::string("llama: ") + field + " (" + std::to_string(value) +
                                ") must be a multiple of the tensor-parallel size (" + std::to_string(tp) + "): " +
                                why);
}

// Interleaved rotary embedding (Meta's apply_rotary_emb) on x [B, T, heads, D]: pair j = dimensions
// (2j, 2j+1) rotated by pos · inv_freq[j]. cos / sin: [T, D/2], already in the dtype transformers
// uses (see forward). Per element the same operations as transformers' q·cos + rotate_half(q)·sin
// on the permuted layout: even' = x_even·cos − x_odd·sin, odd' = x_odd·cos + x_even·sin.
torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t D = x.size(-1);
  auto pairs = x.unflatten(-1, {D / 2, 2});                 // [B, T, h, D/2, 2]
  auto x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);  // [B, T, h, D/2]
  auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);          // [T, 1, D/2]
  auto y0 = x0 * c - x1 * s;
  auto y1 = x1 * c + x0 * s;
  return torch::stack({y0, y1}, -1).flatten(-2);  // [B, T, h, D]
}
}  // namespace

int64_t intermediate_size(const LlamaConfig& c) {
  if (c.intermediate_size < 0)
    throw std::invalid_argument("llama: intermediate_size (" + std::to_string(c.intermediate_size) +
                                ") must be >= 0 (0: the default 8 n_embd / 3 rounded up to a multiple of 32)");
  if (c.intermediate_size > 0) return c.intermediate_size;
  constexpr int64_t kMultipleOf = 32;
  const int64_t hidden = 8 * c.n_embd / 3;  // Meta: int(2 * (4 * dim) / 3)
  return kMultipleOf * ((hidden + kMultipleOf - 1) / kMultipleOf);
}

void validate(const LlamaConfig& c) {
  auto positive = [](const char* field, int64_t v) {
    if (v < 1) throw std::invalid_argument(std::string("llama: ") + field + " (" + std::to_string(v) + ") must be >= 1");
  };
  positive("vocab_size", c.vocab_size);
  positive("n_ctx", c.n_ctx);
  positive("n_layer", c.n_layer);
  positive("n_head", c.n_head);
  positive("n_kv_head", c.n_kv_head);
  positive("n_embd", c.n_embd);
  if (c.n_head % c.n_kv_head != 0)
    throw std::invalid_argument("llama: n_head (" + std::to_string(c.n_head) + ") must be a multiple of n_kv_head (" +
                                std::to_string(c.n_kv_head) + ")");
  if (c.n_embd % c.n_head != 0 || (c.n_embd / c.n_head) % 2 != 0)
    throw std::invalid_argument("llama: n_embd (" + std::to_string(c.n_embd) + ") must be a multiple of n_head (" +
                                std::to_string(c.n_head) +
                                ") with an even head_dim n_embd / n_head (rotary pairs)");
  intermediate_size(c);  // throws for a negative intermediate_size
  if (!(c.rms_norm_eps > 0))
    throw std::invalid_argument("llama: rms_norm_eps (" + std::to_string(c.rms_norm_eps) + ") must be > 0");
  if (!(c.rope_theta > 0))
    throw std::invalid_argument("llama: rope_theta (" + std::to_string(c.rope_theta) + ") must be > 0");
}


// ---------------------------------------------------------------------------------------------

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto h = x.to(torch::kFloat32);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * h.to(x.scalar_type());
}

AttentionImpl::AttentionImpl(const LlamaConfig& config, const booster::nn::TensorParallelContext& ctx)
    : head_dim(config.n_embd / std::max<int64_t>(config.n_head, 1)), rope_theta(config.rope_theta) {
  validate(config);
  const int64_t tp = ctx.size();
  require_tp_divides("n_head", config.n_head, tp, "each rank needs whole query heads");
  require_tp_divides("n_kv_head", config.n_kv_head, tp, "each rank needs whole key/value heads");
  const int64_t C = config.n_embd, D = head_dim;
  q_proj = register_module("q_proj", column_parallel(C, config.n_head * D, ctx));
  k_proj = register_module("k_proj", column_parallel(C, config.n_kv_head * D, ctx));
  v_proj = register_module("v_proj", column_parallel(C, config.n_kv_head * D, ctx));
  o_proj = register_module("o_proj", row_parallel(config.n_head * D, C, ctx));
  // The tp size the layers really use (their own group), from q_proj's local output size.
  const int64_t layer_tp = config.n_head * D / q_proj->weight.size(0);
  require_tp_divides("n_head", config.n_head, layer_tp, "each rank needs whole query heads");
  require_tp_divides("n_kv_head", config.n_kv_head, layer_tp, "each rank needs whole key/value heads");
  if (ctx.sequence_parallel == booster::nn::SequenceParallelMode::kAllToAll && ctx.sp_group &&
      ctx.sp_group->size() > 1) {
    sp_group = ctx.sp_group;
    const int64_t sp = sp_group->size();
    for (const auto& [field, heads] : {std::pair<const char*, int64_t>{"n_head", config.n_head},
                                       std::pair<const char*, int64_t>{"n_kv_head", config.n_kv_head}})
      if ((heads / layer_tp) % sp != 0)
        throw std::invalid_argument(std::string("llama: sequence_parallelism_mode = \"all_to_all\" exchanges "
                                                "attention heads over the sp group, but ") + field + " = " +
                                    std::to_string(heads) + " (" + std::to_string(heads / layer_tp) +
                                    " per tp rank) is not divisible by sp_size = " + std::to_string(sp) +
                                    "; choose an sp_size that divides the heads per tp rank");
  }
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  const int64_t D = head_dim;
  // This rank's heads (n_head / tp, n_kv_head / tp), from the layers' local output sizes. Under
  // split_gather the projections gather the sequence (x holds T / tp positions, q/k/v all T); under
  // all_to_all the sequence shards are exchanged for head shards (T / sp positions, H heads -> T
  // positions, H / sp heads), so the rotary angles below are those of the whole sequence.
  auto q = q_proj(x), k = k_proj(x), v = v_proj(x);
  const int64_t B = q.size(0);
  q = q.view({B, q.size(1), -1, D});  // [B, T, H, D]
  k = k.view({B, k.size(1), -1, D});  // [B, T, KV, D]
  v = v.view({B, v.size(1), -1, D});
  if (sp_group) {
    q = booster::nn::sequence_all_to_all(q, sp_group, 2, 1);
    k = booster::nn::sequence_all_to_all(k, sp_group, 2, 1);
    v = booster::nn::sequence_all_to_all(v, sp_group, 2, 1);
  }
  const int64_t T = q.size(1), H = q.size(2), KV = k.size(2);

  // Rotary angles in float32 (transformers' LlamaRotaryEmbedding: inv_freq = 1 / theta^(arange(0, D,
  // 2) / D), freqs = pos · inv_freq), cos / sin cast to the dtype of the hidden states (transformers
  // passes the residual stream, whose dtype x has), the rotation in q/k's dtype with promotion.
  {
    auto fopt = torch::TensorOptions().dtype(torch::kFloat32).device(x.device());
    auto inv_freq = 1.0 / torch::pow(rope_theta, torch::arange(0, D, 2, fopt) / static_cast<double>(D));
    auto freqs = torch::arange(T, fopt).unsqueeze(-1) * inv_freq;  // [T, D/2]
    auto cos = freqs.cos().to(x.scalar_type()), sin = freqs.sin().to(x.scalar_type());
    q = apply_rotary(q, cos, sin);
    k = apply_rotary(k, cos, sin);
  }
  q = q.transpose(1, 2);  // [B, H, T, D]
  k = k.transpose(1, 2);  // [B, KV, T, D]
  v = v.transpose(1, 2);
  // Grouped-query: kv head j serves query heads [j G, (j+1) G) (transformers' repeat_kv).
  if (H != KV) {
    const int64_t G = H / KV;
    k = k.unsqueeze(2).expand({B, KV, G, T, D}).reshape({B, H, T, D});
    v = v.unsqueeze(2).expand({B, KV, G, T, D}).reshape({B, H, T, D});
  }
  // transformers' eager attention: (q kᵀ) · D^-1/2, causal mask, softmax in float32 cast to q's dtype.
  auto att = torch::matmul(q, k.transpose(2, 3)) * (1.0 / std::sqrt(static_cast<double>(D)));  // [B, H, T, T]
  auto causal = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  att = att.masked_fill(causal, -std::numeric_limits<float>::infinity());
  att = torch::softmax(att, -1, torch::kFloat32).to(q.scalar_type());
  auto y = torch::matmul(att, v);                  // [B, H, T, D]
  y = y.transpose(1, 2);                           // [B, T, H, D]
  if (sp_group) y = booster::nn::sequence_all_to_all(y, sp_group, 1, 2);  // [B, T / sp, H sp, D]
  return o_proj(y.reshape({B, y.size(1), -1}));    // [B, T, H·D]
}

MLPImpl::MLPImpl(const LlamaConfig& config, const booster::nn::TensorParallelContext& tp) {
  validate(config);
  const int64_t I = intermediate_size(config);
  require_tp_divides("intermediate_size", I, tp.size(), "gate_proj / up_proj are split by columns");
  gate_proj = register_module("gate_proj", column_parallel(config.n_embd, I, tp));
  up_proj = register_module("up_proj", column_parallel(config.n_embd, I, tp));
  down_proj = register_module("down_proj", row_parallel(I, config.n_embd, tp));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) { return down_proj(torch::silu(gate_proj(x)) * up_proj(x)); }

DecoderLayerImpl::DecoderLayerImpl(const LlamaConfig& config, const booster::nn::TensorParallelContext& tp) {
  input_layernorm = register_module("input_layernorm", RMSNorm(config.n_embd, config.rms_norm_eps));
  self_attn = register_module("self_attn", Attention(config, tp));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(config.n_embd, config.rms_norm_eps));
  mlp = register_module("mlp", MLP(config, tp));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x) {
  auto h = x + self_attn(input_layernorm(x));
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& config, const booster::nn::TensorParallelContext& tp) {
  validate(config);
  embed_tokens = register_module("embed_tokens", vocab_table(config.vocab_size, config.n_embd, tp));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < config.n_layer; ++i) {
    booster::nn::Unit<DecoderLayer> layer(config, tp);
    layers->push_back(layer);
    blocks.push_back(layer);
  }
  norm = register_module("norm", RMSNorm(config.n_embd, config.rms_norm_eps));
}

namespace {
LlamaConfig resolved(LlamaConfig c) {
  validate(c);
  c.intermediate_size = intermediate_size(c);
  return c;
}
}  // namespace

LlamaImpl::LlamaImpl(const LlamaConfig& cfg, booster::nn::TensorParallelContext tp_)
    : config(resolved(cfg)), tp(std::move(tp_)) {
  // Every weight is initialised by its layer at construction: Linear / Embedding ~ N(0, 0.02) on the
  // full tensor (init_method), RMSNorm weights 1.
  model = register_module("model", LlamaModel(config, tp));
  lm_head = register_module("lm_head", vocab_table(config.vocab_size, config.n_embd, tp));
}

torch::Tensor LlamaImpl::embed(const torch::Tensor& idx) {
  const int64_t T = idx.size(1);
  if (T > config.n_ctx)
    throw std::invalid_argument("llama: sequence length " + std::to_string(T) + " exceeds n_ctx " +
                                std::to_string(config.n_ctx));
  booster::nn::sequence_shard(T, tp);  // sequence parallelism: the error naming T and sp_size
  return model->embed_tokens(booster::nn::shard_sequence_input(idx, tp));  // split_gather / all_to_all: [B, T/sp, C]
}

torch::Tensor LlamaImpl::run_blocks(torch::Tensor x, int64_t first, int64_t last) {
  const int64_t n = static_cast<int64_t>(model->blocks.size());
  if (last < 0) last = n;
  for (int64_t i = first; i < last; ++i) x = model->blocks[static_cast<size_t>(i)]->forward(x);
  return x;
}

torch::Tensor LlamaImpl::head(const torch::Tensor& x) {
  // Untied LM head: this rank's vocabulary rows of lm_head.weight (all of them at tp = 1).
  return lm_head->lm_logits(model->norm(x));
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& idx) { return head(run_blocks(embed(idx))); }

std::vector<booster::nn::PipelineLayer> LlamaImpl::pipeline_layers() {
  std::vector<booster::nn::PipelineLayer> stages;
  stages.push_back({"model.embed_tokens", {model->embed_tokens.ptr()},
                    [this](const torch::Tensor& idx) { return embed(idx); }});
  for (size_t i = 0; i < model->blocks.size(); ++i)
    stages.push_back({"model.layers." + std::to_string(i), {model->blocks[i].ptr()},
                      [this, i](const torch::Tensor& x) { return model->blocks[i]->forward(x); }});
  stages.push_back({"model.norm+lm_head", {model->norm.ptr(), lm_head.ptr()},
                    [this](const torch::Tensor& x) { return head(x); }});
  return stages;
}

int64_t LlamaImpl::num_parameters() const {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  return n;
}

}  // namespace llama
