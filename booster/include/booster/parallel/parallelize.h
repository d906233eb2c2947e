// parallelize.h — tensor parallelism as a function: a plan of (module path pattern, style) applied to
// a built model's named sub-modules over a tp group, the C++ counterpart of PyTorch's
// parallelize_module (torch.distributed.tensor.parallel, as torchtitan applies it with
// ColwiseParallel / RowwiseParallel plans) over the Megatron-style layers of nn/tensor_parallel.h:
//     Net net;                                 // built dense: the layers' default context, T = 1
//     booster::parallel::parallelize(*net, booster.tensor_parallel_context(),
//                                    {{"h.*.fc", booster::parallel::colwise()},
//                                     {"h.*.proj", booster::parallel::rowwise()},
//                                     {"wte", booster::parallel::vocab_parallel()}});
// Each matched layer is sharded in place (its parameters keep their tensors and become this rank's
// shard, with the TensorParallelSpec checkpoints use), so the model equals one built with the context
// from the start: the same shards, outputs and gradients. LibTorch's own torch::nn::Linear has no
// hook point for the collectives, so the plan's modules must be booster::nn::ColumnParallelLinear,
// RowParallelLinear or VocabParallelEmbedding (dense until parallelized).
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

#include "booster/export.h"
#include "booster/nn/tensor_parallel.h"

namespace booster::parallel {

// How one layer is split (torchtitan's names).
struct ParallelStyle {
  enum class Kind { kColwise, kRowwise, kVocab };
  Kind kind = Kind::kColwise;
  bool gather_output = false;     // colwise: all-gather the output (Megatron's gather_output)
  bool input_is_parallel = true;  // rowwise: the input is already split (a colwise layer's output)
};
// A ColumnParallelLinear split by output features; its output stays split unless gather_output.
inline ParallelStyle colwise(bool gather_output = false) { return {ParallelStyle::Kind::kColwise, gather_output, true}; }
// A RowParallelLinear split by input features; the partial products are all-reduced. input_is_parallel
// false: a full input is split first.
inline ParallelStyle rowwise(bool input_is_parallel = true) { return {ParallelStyle::Kind::kRowwise, false, input_is_parallel}; }
// A VocabParallelEmbedding split by vocabulary rows (its lm_logits then give vocabulary shards).
inline ParallelStyle vocab_parallel() { return {ParallelStyle::Kind::kVocab, false, true}; }

// One entry: a module path pattern (dotted names as Module::named_modules gives them; `*` matches
// within one path component, fnmatch rules otherwise: "h.*.fc") and its style.
using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

// Applies `plan` to `model`'s sub-modules over context's tp group: every module a pattern matches is
// sharded by its style (ColumnParallelLinearImpl::parallelize and the others), with gather_output /
// input_is_parallel set from the style. At T = 1 (a default context) the layers stay dense. Returns
// the paths it sharded, in named_modules order. Call it before the optimizer takes the parameters.
// Local: no communication (every tp rank must apply the same plan). Throws std::invalid_argument,
// before changing anything, for a pattern that matches no module, a module matched by two patterns,
// a matched module whose type does not fit its style (naming both), and a size T does not divide;
// std::logic_error for a layer that is already sharded.
BOOSTER_API std::vector<std::string> parallelize(torch::nn::Module& model, const nn::TensorParallelContext& context,
                                                 const ParallelizePlan& plan);

}  // namespace booster::parallel
