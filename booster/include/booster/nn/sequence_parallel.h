// sequence_parallel.h — the operators of sequence parallelism and the calls a model makes for it.
//
// Two modes, chosen by the hybrid_parallel plugin's enable_sequence_parallelism /
// sequence_parallelism_mode / sp_size and carried by the tensor-parallel context
// (TensorParallelContext::sequence_parallel, tensor_parallel.h) that the model receives (from
// Booster::tensor_parallel_context()) and passes to its layers and to the calls below:
//  - "split_gather": Megatron-SP (Korthikanti et al., "Reducing Activation Recomputation in Large
//    Transformer Models", 2022) over the tp group. The tensor-parallel layers do the communication
//    themselves (tensor_parallel.h); the operators below are theirs.
//  - "all_to_all": DeepSpeed-Ulysses (Jacobs et al., "DeepSpeed Ulysses: System Optimizations for
//    Enabling Training of Extreme Long Sequence Transformer Models", 2023) over the sp group. The
//    model cuts its input with shard_sequence_input, exchanges sequence shards for head shards
//    around attention with sequence_all_to_all, and averages its loss with sequence_parallel_loss.
//
// Model-side contract (both modes; activations are batch-first, the sequence is dim 1; ctx the
// model's TensorParallelContext):
//   auto shard = booster::nn::sequence_shard(T, ctx);   // positions [offset, offset + length) of T
//   ids = booster::nn::shard_sequence_input(ids, ctx);  // all_to_all: this rank's [B, T/sp] slice
//   x = wte(ids) + wpe(arange(shard.offset, shard.offset + shard.length));   // [B, T/sp, C]
//   ... attention: all_to_all before (sequence -> heads) and after (heads -> sequence) ...
//   loss = sequence_parallel_loss(cross_entropy(logits, shard_sequence_input(targets, ctx)), ctx);
// Without sequence parallelism (ctx.sequence_parallel == kNone, e.g. a default-constructed context)
// every call is the identity (offset 0, length T).
//
// Gradients: under split_gather, a parameter without a TensorParallelSpec (LayerNorm weights,
// RowParallelLinear's bias, position embeddings) receives only its sequence shard's part; under
// all_to_all every parameter does (the local loss is this shard's mean). The hybrid_parallel plugin
// sums the former over tp and averages all gradients over dp x sp, which gives the gradient of the
// single-process model on the whole sequence.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>

#include "booster/export.h"
#include "booster/nn/tensor_parallel.h"

namespace booster {
namespace dist {
class ProcessGroup;
}

namespace nn {

// Megatron-SP's conjugate pair along dim `dim` of x (any shape, floating dtype; dim may be negative)
// over `group` (collective: every rank calls them in the same order, forward and backward). With a
// null group or one of one rank each is the identity.
//   gather_sequence:         forward all-gather along dim (rank order), backward reduce-scatter (sum)
//   reduce_scatter_sequence: forward reduce-scatter along dim (sum; rank r keeps chunk r), backward
//                            all-gather
// std::invalid_argument for a non-floating tensor, a dim outside x, or (reduce_scatter_sequence)
// a size along dim that the group size does not divide (the message names the size and sp_size).
BOOSTER_API at::Tensor gather_sequence(const at::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group,
                                       int64_t dim = 1);
BOOSTER_API at::Tensor reduce_scatter_sequence(const at::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group,
                                               int64_t dim = 1);

// Ulysses' all-to-all: x is cut into P = group size equal chunks along scatter_dim; chunk p goes to
// rank p, and the chunks received from ranks 0..P-1 are concatenated along gather_dim. E.g.
// [B, T/P, H, D] with scatter_dim 2, gather_dim 1 -> [B, T, H/P, D] (sequence shards -> head
// shards), and back with the dims swapped. Backward: the all-to-all with the dims swapped. x any
// floating dtype and shape; identity for a null group or one of one rank. std::invalid_argument for
// a non-floating tensor, equal or out-of-range dims, or a scatter_dim size not divisible by P (the
// message names the size and sp_size).
BOOSTER_API at::Tensor sequence_all_to_all(const at::Tensor& x, const std::shared_ptr<dist::ProcessGroup>& group,
                                           int64_t scatter_dim, int64_t gather_dim);

// The positions of a length-T sequence this rank's activations hold: [offset, offset + length) with
// length = T / S and offset = rank * length, where S and rank are context.sequence_parallel_size() /
// context.sequence_parallel_rank() (S = 1: offset 0, length T). Local: no communication.
// std::invalid_argument when S does not divide T: "sequence length T = 30 is not divisible by
// sp_size = 4 (sequence_parallelism_mode = \"split_gather\", where sp_size is tp_size); use a
// sequence length that is a multiple of 4".
struct SequenceShard {
  int64_t offset = 0;
  int64_t length = 0;
};
BOOSTER_API SequenceShard sequence_shard(int64_t seq_len, const TensorParallelContext& context);

// context.sequence_parallel == kAllToAll: this rank's slice x.narrow(1, offset, length) of a
// batch-first input (token ids [B, T], targets, any dtype; a view, differentiable); every other mode:
// x itself. Errors as sequence_shard (T = x.size(1)); std::invalid_argument for x with fewer than 2
// dims. Local: no communication.
BOOSTER_API at::Tensor shard_sequence_input(const at::Tensor& x, const TensorParallelContext& context);

// context.sequence_parallel == kAllToAll with an sp_group of more than one rank: the mean of every sp
// rank's `local_loss` (a float scalar: that rank's mean over its shard; equal shards make it the
// mean over the whole sequence), so every sp rank reports the same value; collective over
// context.sp_group (every sp rank calls it). Backward passes the upstream gradient to the local loss
// unchanged: each rank's gradients are those of its own shard's mean, and the plugin's average over
// dp x sp makes them the whole sequence's. Every other mode: local_loss itself.
// std::invalid_argument for a non-floating loss.
BOOSTER_API at::Tensor sequence_parallel_loss(const at::Tensor& local_loss, const TensorParallelContext& context);

}  // namespace nn
}  // namespace booster
