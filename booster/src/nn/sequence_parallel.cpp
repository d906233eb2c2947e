// sequence_parallel.cpp — sequence_parallel.h: Megatron-SP's gather / reduce-scatter along the
// sequence, Ulysses' all-to-all, the shard of a sequence, and the sp-averaged loss.
#include "booster/nn/sequence_parallel.h"

#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/custom_class.h>

#include <string>
#include <vector>

#include "booster/dist/process_group.h"
#include "autograd_group.h"

namespace booster::nn {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using SpGroup = std::shared_ptr<dist::ProcessGroup>;

namespace {

using detail::save_group;
using detail::saved_group;


int64_t sp_wrap_dim(const at::Tensor& x, int64_t dim, const char* op) {
  const int64_t n = x.dim();
  if (dim < -n || dim >= n)
    throw std::invalid_argument(std::string("booster::nn::") + op + ": dim " + std::to_string(dim) +
                                " is outside a tensor of " + std::to_string(n) + " dims");
  return dim < 0 ? dim + n : dim;
}

void check_divides(int64_t size, int parts, const char* op, const char* what) {
  if (size % parts != 0)
    throw std::invalid_argument(std::string("booster::nn::") + op + ": " + what + " " + std::to_string(size) +
                                " is not divisible by sp_size = " + std::to_string(parts) + "; make it a multiple of " +
                                std::to_string(parts));
}

// Every rank's x concatenated along dim in rank order.
at::Tensor all_gather_dim(const at::Tensor& x, const SpGroup& group, int64_t dim) {
  at::Tensor in = x.contiguous();
  std::vector<int64_t> shape{static_cast<int64_t>(group->size())};
  shape.insert(shape.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor buffer = at::empty(shape, in.options());
  group->all_gather_into_tensor(buffer, in).wait();
  return at::cat(buffer.unbind(0), dim);
}

// The sum over ranks of chunk `rank` of x along dim.
at::Tensor reduce_scatter_dim(const at::Tensor& x, const SpGroup& group, int64_t dim, const char* op) {
  const int p = group->size();
  check_divides(x.size(dim), p, op, dim == 1 ? "sequence length T =" : "size along the split dim =");
  at::Tensor in = at::stack(x.chunk(p, dim)).contiguous();  // [P, ...chunk]
  std::vector<int64_t> shape = in.sizes().slice(1).vec();
  at::Tensor out = at::empty(shape, in.options());
  group->reduce_scatter_tensor(out, in).wait();
  return out;
}

at::Tensor all_to_all_dims(const at::Tensor& x, const SpGroup& group, int64_t scatter_dim, int64_t gather_dim) {
  const int p = group->size();
  check_divides(x.size(scatter_dim), p, "sequence_all_to_all", "the size along scatter_dim =");
  at::Tensor in = at::stack(x.chunk(p, scatter_dim)).contiguous();  // [P, ...chunk]
  at::Tensor out = at::empty_like(in);
  group->all_to_all_single(out, in).wait();
  return at::cat(out.unbind(0), gather_dim);
}

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const SpGroup& group, int64_t dim) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return all_gather_dim(x, group, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scatter_dim(grads[0], saved_group(ctx), ctx->saved_data["dim"].toInt(), "gather_sequence (backward)"),
            at::Tensor(), at::Tensor()};
  }
};

struct ReduceScatterSequence : torch::autograd::Function<ReduceScatterSequence> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const SpGroup& group, int64_t dim) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return reduce_scatter_dim(x, group, dim, "reduce_scatter_sequence");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_dim(grads[0], saved_group(ctx), ctx->saved_data["dim"].toInt()), at::Tensor(), at::Tensor()};
  }
};

struct SequenceAllToAll : torch::autograd::Function<SequenceAllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const SpGroup& group, int64_t scatter_dim,
                            int64_t gather_dim) {
    save_group(ctx, group);
    ctx->saved_data["scatter"] = scatter_dim;
    ctx->saved_data["gather"] = gather_dim;
    return all_to_all_dims(x, group, scatter_dim, gather_dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_to_all_dims(grads[0], saved_group(ctx), ctx->saved_data["gather"].toInt(),
                            ctx->saved_data["scatter"].toInt()),
            at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// Megatron-SP's column-parallel matmul (Korthikanti et al. 2022, section 4.2.2): y = gather(x) W^T + b
// with only the shard x saved; backward gathers x again for the weight gradient and reduce-scatters
// the input gradient, so the full sequence is never kept between forward and backward.
struct GatherLinear : torch::autograd::Function<GatherLinear> {
  // y = gather(x) W^T (the bias is added outside, by autograd).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const SpGroup& group) {
    save_group(ctx, group);
    ctx->save_for_backward({x, weight});
    return at::linear(all_gather_dim(x, group, 1), weight);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const SpGroup group = saved_group(ctx);
    const at::Tensor full = all_gather_dim(x, group, 1);  // [B, T, in]
    const at::Tensor& gy = grads[0];                        // [B, T, out]
    at::Tensor gx = reduce_scatter_dim(at::matmul(gy, weight), group, 1, "ColumnParallelLinear (backward)");
    at::Tensor gw = gy.reshape({-1, gy.size(-1)}).t().mm(full.reshape({-1, full.size(-1)}));
    return {gx, gw, at::Tensor()};
  }
};

// Forward: the mean over the group; backward: identity.
struct MeanLossIdentityBackward : torch::autograd::Function<MeanLossIdentityBackward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& loss, const SpGroup& group) {
    at::Tensor out = loss.detach().to(at::kFloat).contiguous().clone();
    group->allreduce(out).wait();
    return out.div_(group->size()).to(loss.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) { return {grads[0], at::Tensor()}; }
};

}  // namespace

// ColumnParallelLinear's forward under split_gather (tensor_parallel.cpp): x [B, T/P, in] -> [B, T, out/P].
at::Tensor sequence_parallel_column_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                           const SpGroup& group) {
  detail::check_floating(x, "ColumnParallelLinear");
  if (x.dim() < 2) throw std::invalid_argument("booster::nn::ColumnParallelLinear: sequence parallelism needs x [B, T, ...]");
  if (!detail::group_active(group)) return at::linear(x, weight, bias);
  at::Tensor y = GatherLinear::apply(x, weight, group);
  return bias.defined() ? y + bias : y;
}

const char* sequence_parallel_mode_name(SequenceParallelMode mode) {
  switch (mode) {
    case SequenceParallelMode::kSplitGather: return "split_gather";
    case SequenceParallelMode::kAllToAll: return "all_to_all";
    case SequenceParallelMode::kNone: break;
  }
  return "none";
}

int TensorParallelContext::sequence_parallel_size() const {
  if (sequence_parallel == SequenceParallelMode::kSplitGather) return size();
  if (sequence_parallel == SequenceParallelMode::kAllToAll) return sp_group ? sp_group->size() : 1;
  return 1;
}

int TensorParallelContext::sequence_parallel_rank() const {
  if (sequence_parallel == SequenceParallelMode::kSplitGather) return rank();
  if (sequence_parallel == SequenceParallelMode::kAllToAll) return sp_group ? sp_group->rank() : 0;
  return 0;
}

at::Tensor gather_sequence(const at::Tensor& x, const SpGroup& group, int64_t dim) {
  detail::check_floating(x, "gather_sequence");
  dim = sp_wrap_dim(x, dim, "gather_sequence");
  if (!detail::group_active(group)) return x;
  return GatherSequence::apply(x, group, dim);
}

at::Tensor reduce_scatter_sequence(const at::Tensor& x, const SpGroup& group, int64_t dim) {
  detail::check_floating(x, "reduce_scatter_sequence");
  dim = sp_wrap_dim(x, dim, "reduce_scatter_sequence");
  if (!detail::group_active(group)) return x;
  return ReduceScatterSequence::apply(x, group, dim);
}

at::Tensor sequence_all_to_all(const at::Tensor& x, const SpGroup& group, int64_t scatter_dim, int64_t gather_dim) {
  detail::check_floating(x, "sequence_all_to_all");
  scatter_dim = sp_wrap_dim(x, scatter_dim, "sequence_all_to_all");
  gather_dim = sp_wrap_dim(x, gather_dim, "sequence_all_to_all");
  if (scatter_dim == gather_dim)
    throw std::invalid_argument("booster::nn::sequence_all_to_all: scatter_dim and gather_dim must differ (both " +
                                std::to_string(scatter_dim) + ")");
  if (!detail::group_active(group)) return x;
  return SequenceAllToAll::apply(x, group, scatter_dim, gather_dim);
}

SequenceShard sequence_shard(int64_t seq_len, const TensorParallelContext& c) {
  const int s = c.sequence_parallel_size();
  if (s <= 1) return {0, seq_len};
  if (seq_len % s != 0)
    throw std::invalid_argument(
        "booster: sequence length T = " + std::to_string(seq_len) + " is not divisible by sp_size = " +
        std::to_string(s) + " (sequence_parallelism_mode = \"" + sequence_parallel_mode_name(c.sequence_parallel) +
        "\"" + (c.sequence_parallel == SequenceParallelMode::kSplitGather ? ", where sp_size is tp_size" : "") +
        "); use a sequence length that is a multiple of " + std::to_string(s));
  const int64_t length = seq_len / s;
  return {c.sequence_parallel_rank() * length, length};
}

at::Tensor shard_sequence_input(const at::Tensor& x, const TensorParallelContext& context) {
  if (context.sequence_parallel != SequenceParallelMode::kAllToAll) return x;
  if (!x.defined() || x.dim() < 2)
    throw std::invalid_argument("booster::nn::shard_sequence_input: needs a batch-first tensor [B, T, ...]");
  const SequenceShard s = sequence_shard(x.size(1), context);
  return x.narrow(1, s.offset, s.length);
}

at::Tensor sequence_parallel_loss(const at::Tensor& local_loss, const TensorParallelContext& c) {
  detail::check_floating(local_loss, "sequence_parallel_loss");
  if (c.sequence_parallel != SequenceParallelMode::kAllToAll || !detail::group_active(c.sp_group)) return local_loss;
  return MeanLossIdentityBackward::apply(local_loss, c.sp_group);
}

}  // namespace booster::nn
