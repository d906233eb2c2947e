// hybrid_common.h — a tiny GPT-like language model built from the tensor-parallel layers and
// offered as pipeline layers, shared by hybrid_worker (the ranks) and booster_dist_tests (the
// single-process reference, tp = 1, built with the same seed: the same dense model).
//   tokens [B, S] int64 in [0, kVocab) -> embed (VocabParallelEmbedding wte + Embedding wpe)
//   -> kLayers (or the constructor's `blocks`) pre-LN MLP blocks (ColumnParallelLinear -> GELU -> RowParallelLinear, residual)
//   -> ln_f -> tied LM head (wte.lm_logits) -> this rank's logits [B, S, Vp / tp].
// Sequence parallelism: split_gather through the layers (activations [B, S/tp, kDim] between them),
// all_to_all through shard_sequence_input (no attention: the blocks act per token). The layers and
// the loss take the TensorParallelContext given to the constructor / criterion (the Booster's on the
// ranks; a default-constructed one, tp = 1, for the reference).
// kVocab = 37 is not divisible by 2 or 4, so at tp > 1 the vocabulary is padded (to 128).
#pragma once

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "booster/nn/pipeline.h"
#include "booster/nn/sequence_parallel.h"
#include "booster/nn/tensor_parallel.h"

namespace booster::testing {

constexpr int64_t kVocab = 37, kDim = 16, kSeq = 8, kLayers = 4;

struct TinyBlockImpl : torch::nn::Module {
  explicit TinyBlockImpl(const booster::nn::TensorParallelContext& tp = {}) {
    ln = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
    fc = register_module("fc", booster::nn::ColumnParallelLinear(booster::nn::LinearParallelOptions(kDim, 4 * kDim).context(tp)));
    proj = register_module("proj", booster::nn::RowParallelLinear(booster::nn::LinearParallelOptions(4 * kDim, kDim).context(tp)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + proj(torch::gelu(fc(ln(x)))); }
  torch::nn::LayerNorm ln{nullptr};
  booster::nn::ColumnParallelLinear fc{nullptr};
  booster::nn::RowParallelLinear proj{nullptr};
};
TORCH_MODULE(TinyBlock);

struct TinyLMImpl : torch::nn::Module, booster::nn::PipelineModule {
  explicit TinyLMImpl(booster::nn::TensorParallelContext tp_ = {}, int64_t blocks = kLayers) : tp(std::move(tp_)) {
    wte = register_module("wte", booster::nn::VocabParallelEmbedding(booster::nn::VocabParallelEmbeddingOptions(kVocab, kDim).context(tp)));
    wpe = register_module("wpe", torch::nn::Embedding(kSeq, kDim));
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < blocks; ++i) h->push_back(TinyBlock(tp));
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})));
  }
  // Sequence parallelism (booster/nn/sequence_parallel.h): this rank's shard of the positions.
  torch::Tensor embed(const torch::Tensor& ids) {
    const auto shard = booster::nn::sequence_shard(ids.size(1), tp);
    return wte(booster::nn::shard_sequence_input(ids, tp)) +
           wpe(torch::arange(shard.offset, shard.offset + shard.length, torch::kLong)).unsqueeze(0);
  }
  torch::Tensor block(size_t i, const torch::Tensor& x) { return h[i]->as<TinyBlock>()->forward(x); }
  torch::Tensor head(const torch::Tensor& x) { return wte->lm_logits(ln_f(x)); }
  torch::Tensor forward(const torch::Tensor& ids) {
    torch::Tensor x = embed(ids);
    for (size_t i = 0; i < h->size(); ++i) x = block(i, x);
    return head(x);
  }
  std::vector<booster::nn::PipelineLayer> pipeline_layers() override {
    std::vector<booster::nn::PipelineLayer> layers;
    layers.push_back({"embed", {wte.ptr(), wpe.ptr()}, [this](const torch::Tensor& ids) { return embed(ids); }});
    for (size_t i = 0; i < h->size(); ++i)
      layers.push_back({"h." + std::to_string(i), {h[i]}, [this, i](const torch::Tensor& x) { return block(i, x); }});
    layers.push_back({"head", {ln_f.ptr(), wte.ptr()}, [this](const torch::Tensor& x) { return head(x); }});
    return layers;
  }
  booster::nn::TensorParallelContext tp;
  booster::nn::VocabParallelEmbedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
};
TORCH_MODULE(TinyLM);

// Mean token cross entropy of this rank's logits [B, S, Vp/tp] against targets [B, S] (all_to_all:
// logits [B, S/sp, Vp/tp], the targets' shard, averaged over sp).
inline torch::Tensor tiny_lm_loss(const torch::Tensor& logits, const torch::Tensor& targets,
                                  const booster::nn::TensorParallelContext& tp) {
  const torch::Tensor local = booster::nn::shard_sequence_input(targets, tp);
  return booster::nn::sequence_parallel_loss(
      booster::nn::vocab_parallel_cross_entropy(logits.reshape({-1, logits.size(-1)}), local.reshape({-1}), kVocab, tp.group),
      tp);
}
// tiny_lm_loss over `tp` as a criterion (logits, targets) for boost().
inline std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)> tiny_lm_criterion(
    booster::nn::TensorParallelContext tp) {
  return [tp = std::move(tp)](const torch::Tensor& logits, const torch::Tensor& targets) {
    return tiny_lm_loss(logits, targets, tp);
  };
}

// Global batches of the language-model task: tokens[s] and targets[s] int64 [global_batch, kSeq].
struct TokenBatches {
  std::vector<torch::Tensor> tokens, targets;
};
inline TokenBatches make_token_batches(int64_t steps, int64_t global_batch, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  TokenBatches b;
  for (int64_t s = 0; s < steps; ++s) {
    auto seq = at::randint(0, kVocab, {global_batch, kSeq + 1}, gen, torch::kLong);
    b.tokens.push_back(seq.narrow(1, 0, kSeq).contiguous());
    b.targets.push_back(seq.narrow(1, 1, kSeq).contiguous());
  }
  return b;
}

inline std::shared_ptr<torch::optim::Optimizer> make_lm_optimizer(const std::string& kind,
                                                                  std::vector<torch::Tensor> params) {
  if (kind == "adamw")
    return std::make_shared<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  return std::make_shared<torch::optim::SGD>(params, torch::optim::SGDOptions(0.5).momentum(0.9));
}

}  // namespace booster::testing
