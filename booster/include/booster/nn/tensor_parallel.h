// tensor_parallel.h — Megatron-style tensor-parallel layers (Shoeybi et al., "Megatron-LM: Training
// Multi-Billion Parameter Language Models Using Model Parallelism", 2019; Megatron-LM's
// core/tensor_parallel/layers.py, mappings.py, cross_entropy.py): a linear layer split by output
// columns or by input rows, a vocabulary-split embedding, and a cross entropy over vocabulary-split
// logits that never gathers them.
//
// The group. Every layer shards over a tensor-parallel ("tp") group of T ranks, taken from the
// TensorParallelContext in its options (`context`; `group` overrides the context's group). The
// operators and functions of this file and of sequence_parallel.h take their group or context as an
// argument; none of them finds a group or context in process-wide or thread-local state. A layer
// built with a default-constructed context (the options' default) is the dense layer (T = 1). A
// training program takes the context from its Booster (Booster::tensor_parallel_context(): the
// plugin's Plugin::tensor_parallel_context(), hybrid_parallel's tp group; T = 1 for every other
// plugin) and hands it to the model it builds before boost():
//     booster::Booster booster(config);
//     auto model = std::make_shared<GPT>(cfg, booster.tensor_parallel_context());
//     auto [m, opt, ...] = booster.boost(model, ...);
// With T = 1 every layer IS the dense layer: same parameter shapes, same initial values, same
// outputs and gradients as torch::nn::Linear / Embedding / cross_entropy.
//
// Initialisation is independent of T: each layer initialises the FULL weight (and bias) with the
// global torch RNG (torch::manual_seed on every rank), exactly as the dense layer would, and keeps
// its slice. So tp = 1 and tp = 2 start from the same model when every rank seeds alike.
//
// Parameter names are the dense layer's ("weight", "bias") and each sharded parameter is registered
// with its TensorParallelSpec (tensor_parallel_spec below), from which checkpoints gather the full
// dense tensor (and strip vocabulary padding). Parameters without a spec are replicated across the tp
// group (identical on every tp rank): LayerNorm weights, RowParallelLinear's bias, position
// embeddings.
#pragma once

#include <torch/nn/cloneable.h>
#include <torch/nn/module.h>
#include <torch/nn/options/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include "booster/export.h"

namespace booster {
namespace dist {
class ProcessGroup;
}

namespace nn {

// ---------------------------------------------------------------------------------------------
// The tensor-parallel context

// Sequence parallelism (hybrid_parallel's enable_sequence_parallelism / sequence_parallelism_mode;
// booster/nn/sequence_parallel.h has the operators and the model-side calls):
//   kSplitGather: Megatron-SP (Korthikanti et al., "Reducing Activation Recomputation in Large
//     Transformer Models", 2022) over the tp group: activations outside the tensor-parallel regions
//     are [B, T/T_tp, ...] sequence shards (sequence dim 1); ColumnParallelLinear all-gathers the
//     sequence before its matmul (backward: reduce-scatter), RowParallelLinear and
//     VocabParallelEmbedding reduce-scatter along the sequence instead of all-reducing (backward:
//     all-gather), lm_logits all-gathers the sequence. Needs T_tp > 1.
//   kAllToAll: DeepSpeed-Ulysses (Jacobs et al., "DeepSpeed Ulysses", 2023) over `sp_group`: the
//     model keeps [B, T/sp, ...] shards everywhere and exchanges sequence shards for head shards
//     around attention (sequence_all_to_all); the tensor-parallel layers are unchanged.
enum class SequenceParallelMode { kNone, kSplitGather, kAllToAll };
// "none", "split_gather", "all_to_all" (ColossalAI's sequence_parallelism_mode names).
BOOSTER_API const char* sequence_parallel_mode_name(SequenceParallelMode mode);

// A plain value: the groups and the sequence-parallel mode the tensor- and sequence-parallel layers
// and functions use. A default-constructed context is T = 1 without sequence parallelism (every
// layer dense, every function the identity). Copies share the groups.
struct BOOSTER_API TensorParallelContext {
  // The tp group; null (or a group of one rank) means T = 1 (dense layers, no communication).
  std::shared_ptr<dist::ProcessGroup> group;
  SequenceParallelMode sequence_parallel = SequenceParallelMode::kNone;
  // kAllToAll: the sequence-parallel group (sp_size ranks); null otherwise (or sp_size = 1).
  std::shared_ptr<dist::ProcessGroup> sp_group;
  // VocabParallelEmbedding pads the vocabulary to a multiple of make_vocab_size_divisible_by * T
  // when T does not divide it (ColossalAI's / Megatron's make_vocab_size_divisible_by, default 64).
  int64_t make_vocab_size_divisible_by = 64;
  int size() const;  // T (1 when group is null)
  int rank() const;  // this rank in the tp group (0 when group is null)
  // The number of sequence shards: size() under kSplitGather, sp_group's size under kAllToAll, else 1.
  int sequence_parallel_size() const;
  int sequence_parallel_rank() const;  // this rank's shard index in [0, sequence_parallel_size())
};

// How a sharded parameter relates to its full (dense) tensor: the full tensor, padded along `dim` to
// `padded_size`, is split into T equal contiguous chunks along `dim`; tp rank r holds chunk r. The
// first `full_size` entries along `dim` are real, the rest (padded_size - full_size, vocabulary
// padding) are not part of the dense model: checkpoints drop them on save and zero-fill them on load.
struct TensorParallelSpec {
  int64_t dim = 0;
  int64_t full_size = 0;    // the dense size along dim
  int64_t padded_size = 0;  // >= full_size, a multiple of tp_size
  int tp_size = 1;
  int tp_rank = 0;
  std::shared_ptr<dist::ProcessGroup> group;  // null when tp_size == 1
};
// The spec of a parameter registered by a TP layer of this file with tp_size > 1 or padding; nullopt
// for every other tensor (replicated). Keyed by the tensor's TensorImpl (survives Module::to(dtype),
// which keeps it; a clone or copy is a new tensor without a spec); thread-safe. The registry holds
// weak references: a destroyed tensor's entry is dropped and never passes to a new tensor.
// register_tensor_parallel_spec replaces an existing entry; std::invalid_argument for an undefined
// tensor or an inconsistent spec (dim outside the tensor, padded_size < full_size or not a multiple
// of tp_size, tp_rank outside [0, tp_size)).
BOOSTER_API std::optional<TensorParallelSpec> tensor_parallel_spec(const at::Tensor& param);
BOOSTER_API void register_tensor_parallel_spec(const at::Tensor& param, TensorParallelSpec spec);
// The vocabulary size VocabParallelEmbedding uses for `vocab_size` at tp size `tp`: vocab_size when tp
// divides it, else rounded up to a multiple of divisible_by * tp. std::invalid_argument unless all three
// are >= 1.
BOOSTER_API int64_t padded_vocab_size(int64_t vocab_size, int tp, int64_t divisible_by);

// ---------------------------------------------------------------------------------------------
// The conjugate communication operators (Megatron's mappings.py). x: any shape, floating dtype; the
// "last dim" is x.dim() - 1. With T = 1 each is the identity.
//   copy_to_tensor_parallel_region (f):     forward identity,              backward all-reduce (sum)
//   reduce_from_tensor_parallel_region (g): forward all-reduce (sum),      backward identity
//   gather_from_tensor_parallel_region:     forward all-gather (last dim), backward split (own chunk)
//   scatter_to_tensor_parallel_region:      forward split (own chunk of the last dim, which T must
//                                           divide: std::invalid_argument), backward all-gather
// Collective over `group` (every tp rank calls them in the same order, forward and backward); a
// null group or one of one rank makes them the identity. std::invalid_argument for a tensor that is
// not floating-point. bf16 works (the adapter carries it as float32 on Gloo).
BOOSTER_API at::Tensor copy_to_tensor_parallel_region(const at::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group);
BOOSTER_API at::Tensor reduce_from_tensor_parallel_region(const at::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group);
BOOSTER_API at::Tensor gather_from_tensor_parallel_region(const at::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group);
BOOSTER_API at::Tensor scatter_to_tensor_parallel_region(const at::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group);

// ---------------------------------------------------------------------------------------------
// Layers. Options: `context` (TensorParallelContext; default: T = 1, the dense layer) gives the tp
// group, the sequence-parallel mode and the vocabulary padding; `group` overrides the context's
// group (null: the context's); `init_method` (optional) initialises the FULL weight in place
// instead of the dense layer's default (e.g. normal std 0.02); with init_method the bias starts at
// zero (Megatron) unless bias_init_method initialises the full bias. A group of one rank counts as
// T = 1: the layer's `group` member is then null and it is exactly the dense layer (no
// communication).
// reset() (Cloneable) re-creates the parameters: it draws the full tensors from the global RNG again
// and re-registers "weight"/"bias" with their specs. Unlike LibTorch's layers it may also be called
// directly on a built layer (their second reset() throws "already defined"); parameters handed to an
// optimizer before are then no longer the module's.

using InitMethod = std::function<void(at::Tensor& full)>;

// A forward hook of ColumnParallelLinear / RowParallelLinear (LibTorch modules have none, and a
// parent's typed member cannot be swapped for a wrapper): when set, forward returns
// hook(layer, x, y) instead of y, where layer is the module itself (so a clone() finds its own
// sub-modules by name), x forward's input and y the layer's output. Used by LoRA
// (booster/nn/lora.h) to add its low-rank term; copied by clone().
using LinearForwardHook = std::function<at::Tensor(torch::nn::Module& layer, const at::Tensor& x, const at::Tensor& y)>;

struct LinearParallelOptions {
  LinearParallelOptions(int64_t in_features, int64_t out_features) : in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  TORCH_ARG(bool, bias) = true;
  // ColumnParallelLinear: all-gather the output (full out_features) instead of returning this rank's
  // columns (Megatron's gather_output; default false, as the output usually feeds a RowParallelLinear).
  TORCH_ARG(bool, gather_output) = false;
  // RowParallelLinear: the input is already split along its last dim (the output of a
  // ColumnParallelLinear; default true); false splits a full input first.
  TORCH_ARG(bool, input_is_parallel) = true;
  TORCH_ARG(InitMethod, init_method) = nullptr;
  TORCH_ARG(InitMethod, bias_init_method) = nullptr;
  // The tensor-parallel context (its group, its sequence_parallel mode); default: T = 1.
  TORCH_ARG(TensorParallelContext, context) = TensorParallelContext{};
  // The tp group when non-null, in place of context.group.
  TORCH_ARG(std::shared_ptr<dist::ProcessGroup>, group) = nullptr;
  // Megatron-SP (SequenceParallelMode::kSplitGather) over the layer's group: nullopt takes it from
  // the context (context.sequence_parallel == kSplitGather). Ignored at T = 1.
  TORCH_ARG(std::optional<bool>, sequence_parallel) = std::nullopt;
};

// Y = X A^T + b with A split by rows of the [out, in] weight (= output columns): this rank holds
// weight [out/T, in] (float32) and bias [out/T]; T must divide out_features (std::invalid_argument).
// forward: x [..., in] -> [..., out/T] (or [..., out] with gather_output). Input gradient all-reduced
// over tp (f). Default init: torch::nn::Linear's (kaiming_uniform(a=sqrt(5)) on the full weight,
// bias uniform(+-1/sqrt(in))), then sliced.
// Sequence parallel (split_gather): x [B, T/T_tp, in] (sequence dim 1) is all-gathered along the
// sequence to [B, T, in] for the matmul, output [B, T, out/T_tp]; only the shard is kept for backward,
// which gathers it again for the weight gradient and reduce-scatters the input gradient (Korthikanti
// et al. 2022, 4.2.2). Every rank's shard must have the same length. gather_output and a
// forward_hook are refused (std::logic_error at forward).
class BOOSTER_API ColumnParallelLinearImpl : public torch::nn::Cloneable<ColumnParallelLinearImpl> {
 public:
  ColumnParallelLinearImpl(int64_t in_features, int64_t out_features)
      : ColumnParallelLinearImpl(LinearParallelOptions(in_features, out_features)) {}
  explicit ColumnParallelLinearImpl(LinearParallelOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  // Shards this dense layer (group null: built at T = 1) over `context`'s tp group in place, as if it
  // had been built with that context: weight and bias keep their tensors (set_data) and become this
  // rank's rows, with their specs; options.context becomes `context`. A no-op at T = 1. Call it
  // before the parameters go to an optimizer. Throws std::logic_error for a layer already sharded,
  // std::invalid_argument when T does not divide out_features. (booster::parallel::parallelize.)
  void parallelize(const TensorParallelContext& context);
  LinearParallelOptions options;
  at::Tensor weight, bias;
  LinearForwardHook forward_hook;  // null: none (see LinearForwardHook)
  std::shared_ptr<dist::ProcessGroup> group;  // resolved at construction (null: T = 1)
  bool sequence_parallel = false;  // resolved at construction: split_gather and T > 1
};
TORCH_MODULE(ColumnParallelLinear);

// Y = X A^T + b with A split by input columns: this rank holds weight [out, in/T] and the full bias
// [out] (replicated); T must divide in_features. forward: x [..., in/T] (input_is_parallel) or
// [..., in] -> [..., out]; the partial products are all-reduced (g), then the bias is added once.
// Sequence parallel (split_gather): x [B, T, in/T_tp] -> [B, T/T_tp, out]: the partial products are
// reduce-scattered along the sequence (dim 1; backward: all-gather), then the bias is added; the
// bias gradient is then this shard's part (the hybrid_parallel plugin sums it over tp). T_tp must
// divide T (std::invalid_argument naming T and sp_size); input_is_parallel = false and a
// forward_hook are refused (std::logic_error).
class BOOSTER_API RowParallelLinearImpl : public torch::nn::Cloneable<RowParallelLinearImpl> {
 public:
  RowParallelLinearImpl(int64_t in_features, int64_t out_features)
      : RowParallelLinearImpl(LinearParallelOptions(in_features, out_features)) {}
  explicit RowParallelLinearImpl(LinearParallelOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  // As ColumnParallelLinear::parallelize, by input columns (the bias stays replicated); T must
  // divide in_features.
  void parallelize(const TensorParallelContext& context);
  LinearParallelOptions options;
  at::Tensor weight, bias;
  LinearForwardHook forward_hook;  // null: none (see LinearForwardHook)
  std::shared_ptr<dist::ProcessGroup> group;
  bool sequence_parallel = false;  // resolved at construction: split_gather and T > 1
};
TORCH_MODULE(RowParallelLinear);

// torch::nn::Linear with a forward hook: the same options (torch::nn::LinearOptions), parameter
// names ("weight" [out, in], "bias" [out]), initialisation (drawn from the global RNG exactly as
// torch::nn::Linear draws it) and forward (y = x W^T + b, x [..., in] -> [..., out], any floating
// dtype and device), plus `forward_hook` (LinearForwardHook) so LoRA (booster/nn/lora.h) can target
// it. Never tensor-parallel: it ignores the tensor-parallel context. It is the drop-in replacement
// for a torch::nn::Linear that LoRA should adapt (LibTorch's Linear::forward has no hook point).
// Throws std::invalid_argument for in_features or out_features < 1.
class BOOSTER_API LinearImpl : public torch::nn::Cloneable<LinearImpl> {
 public:
  LinearImpl(int64_t in_features, int64_t out_features) : LinearImpl(torch::nn::LinearOptions(in_features, out_features)) {}
  explicit LinearImpl(const torch::nn::LinearOptions& options);
  void reset() override;
  at::Tensor forward(const at::Tensor& x);
  torch::nn::LinearOptions options;
  at::Tensor weight, bias;
  LinearForwardHook forward_hook;  // null: none (see LinearForwardHook)
};
TORCH_MODULE(Linear);

struct VocabParallelEmbeddingOptions {
  VocabParallelEmbeddingOptions(int64_t num_embeddings, int64_t embedding_dim)
      : num_embeddings_(num_embeddings), embedding_dim_(embedding_dim) {}
  TORCH_ARG(int64_t, num_embeddings);
  TORCH_ARG(int64_t, embedding_dim);
  TORCH_ARG(InitMethod, init_method) = nullptr;  // default: normal(0, 1) as torch::nn::Embedding
  // As LinearParallelOptions::context / group.
  TORCH_ARG(TensorParallelContext, context) = TensorParallelContext{};
  TORCH_ARG(std::shared_ptr<dist::ProcessGroup>, group) = nullptr;
  // 0: context.make_vocab_size_divisible_by (64 in a default-constructed context). The constructor
  // writes the value it used here.
  TORCH_ARG(int64_t, make_vocab_size_divisible_by) = 0;
  // Megatron-SP over the layer's group, as LinearParallelOptions::sequence_parallel.
  TORCH_ARG(std::optional<bool>, sequence_parallel) = std::nullopt;
};

// An embedding table split by vocabulary rows: the vocabulary is padded to padded_vocab_size(V, T,
// divisible_by) rows (padding rows exist only when T does not divide V), this rank holds rows
// [r * Vp/T, (r+1) * Vp/T) as weight [Vp/T, dim]. forward: ids (int64, any shape [...], values in
// [0, V); out of range: std::out_of_range naming the first bad id) -> [..., dim]: each rank looks up
// the ids in its range (zeros elsewhere), the results are all-reduced (g).
// lm_logits: the tied language-model head (Megatron's parallel_lm_logits): hidden [..., dim] ->
// this rank's logits [..., Vp/T] = f(hidden) @ weight^T; feed them to vocab_parallel_cross_entropy.
// Padding rows start at zero and receive no gradient from forward or from the cross entropy.
// Sequence parallel (split_gather): forward ids [B, T] -> [B, T/T_tp, dim], the lookups
// reduce-scattered along the sequence (dim 1) instead of all-reduced (T_tp must divide T:
// std::invalid_argument naming T and sp_size); lm_logits hidden [B, T/T_tp, dim] -> [B, T, Vp/T_tp],
// the sequence all-gathered first (backward: reduce-scatter).
// ids not int64: std::invalid_argument.
class BOOSTER_API VocabParallelEmbeddingImpl : public torch::nn::Cloneable<VocabParallelEmbeddingImpl> {
 public:
  VocabParallelEmbeddingImpl(int64_t num_embeddings, int64_t embedding_dim)
      : VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions(num_embeddings, embedding_dim)) {}
  explicit VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions options);
  void reset() override;
  at::Tensor forward(const at::Tensor& ids);
  at::Tensor lm_logits(const at::Tensor& hidden);
  // As ColumnParallelLinear::parallelize, by vocabulary rows: the full table is padded with zero
  // rows to padded_vocab_size(num_embeddings, T, context.make_vocab_size_divisible_by) first (the
  // options take that value, as a layer built with the context does).
  void parallelize(const TensorParallelContext& context);
  int64_t padded_vocab() const { return padded_vocab_; }
  int64_t vocab_start() const { return vocab_start_; }  // first vocabulary row this rank holds
  VocabParallelEmbeddingOptions options;
  at::Tensor weight;
  std::shared_ptr<dist::ProcessGroup> group;
  bool sequence_parallel = false;  // resolved at construction: split_gather and T_tp > 1

 private:
  int64_t padded_vocab_ = 0, vocab_start_ = 0;
};
TORCH_MODULE(VocabParallelEmbedding);

// Mean cross entropy (nats, float32 scalar) of vocabulary-split logits (Megatron's
// vocab_parallel_cross_entropy): local_logits [..., Vp/T] (this rank's columns, as lm_logits gives;
// any floating dtype, computed in float32), target int64 [...] in [0, vocab_size). Only [...]-sized
// tensors are all-reduced (max; then target logit and sum of exp together, one [2, ...] all-reduce):
// the logits are never gathered. Columns of vocabulary padding (index >= vocab_size; vocab_size <= 0:
// no padding) are excluded. With T = 1 it equals torch::nn::functional::cross_entropy (mean
// reduction; without padding it IS that function, applied to the logits cast to float32). Gradient:
// (softmax - one_hot) * upstream / N on the local columns (zero on padding columns), in the logits'
// dtype. Collective over `group` (every tp rank calls it; null or a group of one rank: T = 1, no
// communication; pass the tp group of the layer that made the logits, e.g. VocabParallelEmbedding's
// `group` member). Errors, thrown before any communication (so every rank throws alike):
// std::out_of_range naming the first target outside [0, vocab_size) (or outside the whole vocabulary
// when vocab_size <= 0); std::invalid_argument for a target that is not int64 or not shaped like the
// logits without their last dim, or vocab_size > Vp.
BOOSTER_API at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& target,
                                                    int64_t vocab_size,
                                                    const std::shared_ptr<dist::ProcessGroup>& group);

// ---------------------------------------------------------------------------------------------
// Dropout inside the tensor-parallel region (on column-split activations, e.g. attention
// probabilities) must differ per tp rank, dropout elsewhere must be the same on every tp rank
// (Megatron's model-parallel RNG tracker: seed + 2718 + tp_rank inside). tensor_parallel_dropout
// draws from this thread's generator, seeded with seed + 2718 + r where r is this rank in `group`
// (0 for a null group): set_tensor_parallel_seed sets the seed (default 1234) for this thread and
// re-seeds its generator on its next use; a call with a group of another rank than the generator was
// seeded for re-seeds it too. Plain torch dropout uses the global RNG, which every rank seeds alike.
// x any floating tensor (std::invalid_argument otherwise), the output has its dtype and shape; p in
// [0, 1) (std::invalid_argument otherwise); identity when !training or p == 0. Local: no
// communication.
BOOSTER_API void set_tensor_parallel_seed(uint64_t seed);
BOOSTER_API at::Tensor tensor_parallel_dropout(const at::Tensor& x, double p, bool training,
                                               const std::shared_ptr<dist::ProcessGroup>& group);

}  // namespace nn
}  // namespace booster
