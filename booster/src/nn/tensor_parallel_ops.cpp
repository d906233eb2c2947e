// tensor_parallel_ops.cpp — the communication half of tensor_parallel.h: the conjugate f/g
// operators and the split/gather of the last dim (custom autograd Functions), the vocabulary-split
// cross entropy, and the per-tp-rank dropout generator. The layers are in tensor_parallel.cpp.
#include <ATen/CPUGeneratorImpl.h>

#include <mutex>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "booster/dist/process_group.h"
#include "booster/nn/tensor_parallel.h"
#include "autograd_group.h"

namespace booster::nn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Group = std::shared_ptr<dist::ProcessGroup>;

namespace {

using detail::save_group;
using detail::saved_group;

using detail::check_floating;
using detail::group_active;

at::Tensor all_reduce_sum(const at::Tensor& x, const Group& group) {
  at::Tensor out = x.contiguous().clone();
  group->allreduce(out).wait();
  return out;
}

// Concatenation of every rank's x along the last dim, in rank order: all-gather the contiguous x
// into a [T, ...x.shape] buffer, then move the chunk dim to the last dim.
at::Tensor all_gather_last_dim(const at::Tensor& x, const Group& group) {
  at::Tensor in = x.contiguous();
  std::vector<int64_t> shape{static_cast<int64_t>(group->size())};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor buffer = at::empty(shape, in.options());
  group->all_gather_into_tensor(buffer, in).wait();
  if (in.dim() == 0) return buffer;  // scalars: the gathered [T] vector
  return at::cat(buffer.unbind(0), -1);
}

// This rank's chunk of the last dim (T must divide it).
at::Tensor split_last_dim(const at::Tensor& x, const Group& group, const char* op) {
  const int64_t t = group->size();
  const int64_t last = x.dim() == 0 ? 1 : x.size(-1);
  if (x.dim() == 0 || last % t != 0)
    throw std::invalid_argument(std::string("booster::nn::") + op + ": the last dim (" + std::to_string(last) +
                                ") is not divisible by the tensor-parallel size " + std::to_string(t) +
                                "; make the split dimension a multiple of " + std::to_string(t));
  const int64_t chunk = last / t;
  return x.narrow(-1, group->rank() * chunk, chunk).contiguous();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Group& group) {
    save_group(ctx, group);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduce_sum(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Group& group) {
    return all_reduce_sum(x, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Group& group) {
    save_group(ctx, group);
    return all_gather_last_dim(x, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {split_last_dim(grads[0], saved_group(ctx), "gather_from_tensor_parallel_region (backward)"), at::Tensor()};
  }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Group& group) {
    save_group(ctx, group);
    return split_last_dim(x, group, "scatter_to_tensor_parallel_region");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_last_dim(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_tensor_parallel_region(const at::Tensor& x, const Group& group) {
  check_floating(x, "copy_to_tensor_parallel_region");
  if (!group_active(group)) return x;
  return CopyToRegion::apply(x, group);
}

at::Tensor reduce_from_tensor_parallel_region(const at::Tensor& x, const Group& group) {
  check_floating(x, "reduce_from_tensor_parallel_region");
  if (!group_active(group)) return x;
  return ReduceFromRegion::apply(x, group);
}

at::Tensor gather_from_tensor_parallel_region(const at::Tensor& x, const Group& group) {
  check_floating(x, "gather_from_tensor_parallel_region");
  if (!group_active(group)) return x;
  return GatherFromRegion::apply(x, group);
}

at::Tensor scatter_to_tensor_parallel_region(const at::Tensor& x, const Group& group) {
  check_floating(x, "scatter_to_tensor_parallel_region");
  if (!group_active(group)) return x;
  return ScatterToRegion::apply(x, group);
}

// ---------------------------------------------------------------------------------------------
// Vocabulary-parallel cross entropy

namespace {

void check_targets(const at::Tensor& target, int64_t limit, const char* what) {
  if (target.numel() == 0) return;
  at::Tensor bad = (target < 0).logical_or_(target >= limit).reshape({-1});
  if (!bad.any().item<bool>()) return;
  const int64_t first = bad.nonzero()[0][0].item<int64_t>();
  const int64_t id = target.reshape({-1})[first].item<int64_t>();
  throw std::out_of_range("booster::nn::vocab_parallel_cross_entropy: target " + std::to_string(id) + " (element " +
                          std::to_string(first) + ") is outside [0, " + std::to_string(limit) + ") (" + what + ")");
}

// Megatron-LM's vocab_parallel_cross_entropy on this rank's columns [start, start + local) of a
// padded vocabulary whose real part is [0, vocab_size). Forward in float32; saves the local softmax.
struct VocabParallelCrossEntropyFn : torch::autograd::Function<VocabParallelCrossEntropyFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits, const at::Tensor& target,
                            int64_t vocab_size, const Group& group) {
    const bool multi = group_active(group);
    const int64_t local = logits.size(-1);
    const int64_t start = multi ? group->rank() * local : 0;
    at::Tensor x = logits.to(at::kFloat).reshape({-1, local});  // [N, local]
    at::Tensor t = target.reshape({-1});                         // [N]
    if (vocab_size > 0 && start + local > vocab_size) {
      // Padding columns take no probability: -inf before the max and the exp.
      const int64_t real = std::max<int64_t>(0, vocab_size - start);
      x = x.clone();
      x.narrow(1, real, local - real).fill_(-std::numeric_limits<float>::infinity());
    }
    at::Tensor max = std::get<0>(x.max(1));  // [N]
    if (multi) group->allreduce(max, dist::ReduceOp::MAX).wait();
    at::Tensor shifted = x - max.unsqueeze(1);

    at::Tensor outside = (t < start).logical_or_(t >= start + local);  // the target is another rank's
    at::Tensor local_target = (t - start).masked_fill_(outside, 0);
    at::Tensor exp = shifted.exp();  // padding: exp(-inf) = 0
    // One all-reduce for the target logit and the sum of exp: [2, N].
    at::Tensor both = at::stack({shifted.gather(1, local_target.unsqueeze(1)).squeeze(1).masked_fill_(outside, 0),
                                 exp.sum(1)});
    if (multi) group->allreduce(both).wait();
    at::Tensor target_logit = both[0], sum_exp = both[1];
    at::Tensor loss = (sum_exp.log() - target_logit).mean();

    exp.div_(sum_exp.unsqueeze(1));  // the softmax, local columns
    ctx->save_for_backward({exp, local_target, outside});
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    ctx->saved_data["shape"] = logits.sizes();
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    at::Tensor grad = saved[0].clone();  // softmax [N, local]
    const at::Tensor& local_target = saved[1];
    const at::Tensor& outside = saved[2];
    const int64_t n = grad.size(0);
    // - one_hot(target) on the rank that holds the target's column.
    grad.scatter_add_(1, local_target.unsqueeze(1), outside.logical_not().to(at::kFloat).neg_().unsqueeze(1));
    grad.mul_(grads[0].to(at::kFloat) / static_cast<double>(n));
    const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grad.to(dtype).reshape(ctx->saved_data["shape"].toIntVector()), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local_logits, const at::Tensor& target, int64_t vocab_size,
                                        const Group& group) {
  check_floating(local_logits, "vocab_parallel_cross_entropy");
  if (local_logits.dim() < 1)
    throw std::invalid_argument("booster::nn::vocab_parallel_cross_entropy: logits must have a vocabulary dim");
  if (!target.defined() || target.scalar_type() != at::kLong)
    throw std::invalid_argument("booster::nn::vocab_parallel_cross_entropy: target must be an int64 tensor");
  const auto batch = local_logits.sizes().slice(0, local_logits.dim() - 1);
  if (target.sizes() != batch)
    throw std::invalid_argument("booster::nn::vocab_parallel_cross_entropy: target shape " + c10::str(target.sizes()) +
                                " must be the logits' shape without the last dim, " + c10::str(batch));
  const int64_t t = group_active(group) ? group->size() : 1;
  const int64_t local = local_logits.size(-1);
  const int64_t total = local * t;
  if (vocab_size > total)
    throw std::invalid_argument("booster::nn::vocab_parallel_cross_entropy: vocab_size " + std::to_string(vocab_size) +
                                " exceeds the logits' vocabulary " + std::to_string(local) + " x tp " + std::to_string(t));
  const int64_t limit = vocab_size > 0 ? vocab_size : total;
  check_targets(target, limit, vocab_size > 0 ? "vocab_size" : "the logits' vocabulary");
  if (t == 1 && limit == total) {
    // The dense loss itself (log_softmax + nll_loss), in float32.
    return at::cross_entropy_loss(local_logits.to(at::kFloat).reshape({-1, local}), target.reshape({-1}));
  }
  return VocabParallelCrossEntropyFn::apply(local_logits, target, vocab_size > 0 ? vocab_size : total,
                                            group_active(group) ? group : nullptr);
}

// ---------------------------------------------------------------------------------------------
// Dropout inside the tensor-parallel region

namespace {

struct DropoutRng {
  uint64_t seed = 1234;
  std::optional<at::Generator> generator;  // created on first use with seed + 2718 + tp rank
  // The tp rank the generator was seeded for; -1 after set_tensor_parallel_dropout_rng_state (a
  // checkpoint of this rank's stream): the next call's rank adopts it.
  int rank = -1;
};
thread_local DropoutRng tls_dropout_rng;

}  // namespace

std::optional<at::Tensor> tensor_parallel_dropout_rng_state() {
  if (!tls_dropout_rng.generator) return std::nullopt;
  std::lock_guard<std::mutex> lock(tls_dropout_rng.generator->mutex());
  return tls_dropout_rng.generator->get_state();
}

void set_tensor_parallel_dropout_rng_state(const std::optional<at::Tensor>& state) {
  if (!state) {
    tls_dropout_rng.generator.reset();  // re-created from the seed on its next use, as it was
    return;
  }
  if (!tls_dropout_rng.generator) tls_dropout_rng.generator = at::make_generator<at::CPUGeneratorImpl>(0);
  tls_dropout_rng.rank = -1;
  std::lock_guard<std::mutex> lock(tls_dropout_rng.generator->mutex());
  tls_dropout_rng.generator->set_state(*state);
}

void set_tensor_parallel_seed(uint64_t seed) {
  tls_dropout_rng.seed = seed;
  tls_dropout_rng.generator.reset();
}

at::Tensor tensor_parallel_dropout(const at::Tensor& x, double p, bool training, const Group& group) {
  if (!(p >= 0.0 && p < 1.0))
    throw std::invalid_argument("booster::nn::tensor_parallel_dropout: p must be in [0, 1), got " + std::to_string(p));
  check_floating(x, "tensor_parallel_dropout");
  if (!training || p == 0.0) return x;
  auto& rng = tls_dropout_rng;
  const int rank = group ? group->rank() : 0;
  if (rng.generator && rng.rank == -1) rng.rank = rank;
  if (!rng.generator || rng.rank != rank) {
    rng.generator = at::make_generator<at::CPUGeneratorImpl>(rng.seed + 2718 + static_cast<uint64_t>(rank));
    rng.rank = rank;
  }
  at::Tensor keep = at::empty(x.sizes(), x.options().dtype(at::kFloat).requires_grad(false));
  {
    at::NoGradGuard no_grad;
    keep.bernoulli_(1.0 - p, *rng.generator);
    keep.mul_(1.0 / (1.0 - p));
  }
  return x * keep.to(x.scalar_type());
}

}  // namespace booster::nn
