// activation_estimate.h — the activation memory of a decoder-only transformer from its shape, with
// and without activation checkpointing (recomputation), tensor and sequence parallelism: the model of
// Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models" (MLSys 2023),
// §4 and Table 2, with the element size a parameter. Used by `booster estimate` when the model is
// given by its shape instead of a measured micro-batch (estimate.h measures a real one).
//
// Per layer and micro-batch, s = seq_length, b = micro_batch, h = hidden, a = heads, e = bytes per
// activation element (2 for bf16 / fp16, 4 for fp32), dropout masks 1 byte per element:
//   attention  (5e + 1)·sbh + (2e + 1)·a·s²·b   (QKV input, Q, K, V, projection input; softmax
//                                                 output, its dropout mask and output)
//   MLP        (9e + 1)·sbh                      (input, 4h GeLU input and output, dropout mask)
//   LayerNorms 2e·sbh
// which is the paper's sbh(34 + 5as/h) at e = 2. Parallelism divides it:
//   tensor parallel t (Megatron): the attention's and MLP's inner tensors split, the LayerNorm,
//     dropout and block inputs replicated: sbh·(5e + (16e + 2 - 5e)/t) + (2e+1)·a·s²·b/t (the
//     paper's sbh(10 + 24/t + 5as/(ht)) at e = 2: the replicated part is its 10 scaled by e/2);
//   sequence parallel in the tp group ("split_gather", Megatron-SP): everything / t;
//   sequence parallel "all_to_all" (DeepSpeed-Ulysses) over sp ranks: everything / sp (sequence
//     shards outside attention, head shards inside).
// Recomputation (a layer = one booster::nn::Unit):
//   "full": a checkpointed layer keeps only its input, e·sbh (/ t with split_gather, / sp), and the
//     backward pass recomputes one layer at a time, so one layer's full activations come on top;
//   "selective": every selective_every-th layer from the first is checkpointed (this SDK's
//     [booster] selective_ac_every, torchtitan's ac_freq), i.e. ceil(L / k) layers; the others keep
//     everything.
// The language-model head adds the logits [b, s, V] in e bytes and their fp32 log-softmax for the
// loss, 4 bytes (vocab-split over t when tp > 1), when vocab > 0. Embeddings' own activations, the
// optimizer and the model states are not counted here (core/memory_estimate.h does the states).
#pragma once

#include <cstdint>
#include <string>

#include "booster/export.h"

namespace booster {

struct TransformerShape {
  int64_t layers = 0;       // L, transformer blocks (each one recomputation unit)
  int64_t hidden = 0;       // h
  int64_t heads = 0;        // a, attention heads
  int64_t seq_length = 0;   // s, tokens per sequence
  int64_t micro_batch = 0;  // b, sequences per micro-batch on one data-parallel rank
  int64_t vocab = 0;        // V for the head's logits; 0: not counted
};

struct ActivationOptions {
  std::string precision = "bf16";     // "fp32" (e = 4) | "bf16" | "fp16" (e = 2)
  std::string checkpointing = "none";  // "none" | "full" | "selective"
  int64_t selective_every = 2;         // k of "selective" (>= 1)
  int tp = 1;                          // tensor-parallel size t (>= 1)
  std::string sequence_parallelism;    // "" | "split_gather" (needs tp > 1) | "all_to_all"
  int sp = 1;                          // ranks of "all_to_all" (>= 1; 1 otherwise)
};

// Bytes of activations one micro-batch's forward keeps for its backward on one rank, at the peak of
// backward (the formula above). Throws std::invalid_argument naming the field for a shape field < 1
// (vocab < 0), an unknown precision / checkpointing / sequence_parallelism, selective_every < 1,
// tp < 1, sp < 1, split_gather with tp = 1, sp > 1 without all_to_all, or s not divisible by the
// sequence-sharding degree.
BOOSTER_API int64_t transformer_activation_bytes(const TransformerShape& shape, const ActivationOptions& options);

}  // namespace booster
