// tensor_parallel.cpp — the layer half of tensor_parallel.h: the tensor-parallel context's size and
// rank, the registry of parameter specs, and ColumnParallelLinear, RowParallelLinear and
// VocabParallelEmbedding. The communication operators, the cross entropy and the dropout are in
// tensor_parallel_ops.cpp.
#include "booster/nn/tensor_parallel.h"

#include <c10/util/intrusive_ptr.h>
#include <torch/nn/init.h>

#include <cmath>
#include <mutex>
#include <unordered_map>

#include "booster/dist/process_group.h"
#include "booster/nn/sequence_parallel.h"

namespace booster::nn {

using Group = std::shared_ptr<dist::ProcessGroup>;

// sequence_parallel.cpp: gather(x) W^T + b keeping only the shard x for backward.
at::Tensor sequence_parallel_column_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                           const Group& group);

// ---------------------------------------------------------------------------------------------
// The context

int TensorParallelContext::size() const { return group ? group->size() : 1; }
int TensorParallelContext::rank() const { return group ? group->rank() : 0; }

// ---------------------------------------------------------------------------------------------
// The spec registry. Keyed by TensorImpl address; each entry holds a weak reference to its
// TensorImpl, which keeps the TensorImpl's memory (not its storage) allocated while the entry
// exists, so the address cannot be reused by another tensor until the entry is dropped. Entries of
// destroyed tensors are dropped when looked up and by a sweep whenever the map has doubled.

namespace {

using WeakImpl = c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>;

struct SpecEntry {
  WeakImpl impl;
  TensorParallelSpec spec;
};

struct SpecRegistry {
  std::mutex mutex;
  std::unordered_map<const c10::TensorImpl*, SpecEntry> entries;
  size_t sweep_at = 64;
};

SpecRegistry& spec_registry() {
  static auto* registry = new SpecRegistry();  // never destroyed: used until the process exits
  return *registry;
}

}  // namespace

std::optional<TensorParallelSpec> tensor_parallel_spec(const at::Tensor& param) {
  if (!param.defined()) return std::nullopt;
  auto& reg = spec_registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.entries.find(param.unsafeGetTensorImpl());
  if (it == reg.entries.end()) return std::nullopt;
  if (it->second.impl.expired()) {  // cannot happen while `param` holds this impl; kept for clarity
    reg.entries.erase(it);
    return std::nullopt;
  }
  return it->second.spec;
}

void register_tensor_parallel_spec(const at::Tensor& param, TensorParallelSpec spec) {
  if (!param.defined()) throw std::invalid_argument("booster::nn::register_tensor_parallel_spec: undefined tensor");
  if (spec.tp_size < 1 || spec.tp_rank < 0 || spec.tp_rank >= spec.tp_size || spec.full_size < 0 ||
      spec.padded_size < spec.full_size || spec.padded_size % spec.tp_size != 0 || spec.dim < 0 || spec.dim >= param.dim())
    throw std::invalid_argument("booster::nn::register_tensor_parallel_spec: inconsistent spec (dim " +
                                std::to_string(spec.dim) + ", full_size " + std::to_string(spec.full_size) +
                                ", padded_size " + std::to_string(spec.padded_size) + ", tp " +
                                std::to_string(spec.tp_rank) + "/" + std::to_string(spec.tp_size) + ") for a tensor of " +
                                std::to_string(param.dim()) + " dims");
  auto& reg = spec_registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  if (reg.entries.size() >= reg.sweep_at) {
    for (auto it = reg.entries.begin(); it != reg.entries.end();)
      it = it->second.impl.expired() ? reg.entries.erase(it) : std::next(it);
    reg.sweep_at = std::max<size_t>(64, 2 * reg.entries.size());
  }
  reg.entries.insert_or_assign(param.unsafeGetTensorImpl(), SpecEntry{WeakImpl(param.getIntrusivePtr()), std::move(spec)});
}

int64_t padded_vocab_size(int64_t vocab_size, int tp, int64_t divisible_by) {
  if (vocab_size < 1 || tp < 1 || divisible_by < 1)
    throw std::invalid_argument("booster::nn::padded_vocab_size: needs vocab_size, tp and divisible_by >= 1, got " +
                                std::to_string(vocab_size) + ", " + std::to_string(tp) + ", " +
                                std::to_string(divisible_by));
  if (vocab_size % tp == 0) return vocab_size;
  const int64_t multiple = divisible_by * tp;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

// ---------------------------------------------------------------------------------------------
// Layers

namespace {

// options.group, else the context's; a group of one rank becomes null (T = 1: the dense layer).
Group resolve_group(const Group& explicit_group, const TensorParallelContext& context) {
  Group g = explicit_group ? explicit_group : context.group;
  return g && g->size() > 1 ? g : nullptr;
}

// Megatron-SP for a layer over `g`: the option, else the context's mode; never at T = 1.
bool resolve_sequence_parallel(const std::optional<bool>& option, const TensorParallelContext& context, const Group& g) {
  if (!g) return false;
  if (option) return *option;
  return context.sequence_parallel == SequenceParallelMode::kSplitGather;
}

// The context of a split_gather layer over g: sequence_shard's checks and error message.
TensorParallelContext split_gather_context(const Group& g) {
  TensorParallelContext c;
  c.group = g;
  c.sequence_parallel = SequenceParallelMode::kSplitGather;
  return c;
}

void refuse_under_sequence_parallel(const char* layer, const char* what) {
  throw std::logic_error(std::string("booster::nn::") + layer + ": " + what +
                         " is not supported with sequence parallelism (sequence_parallelism_mode = \"split_gather\"); "
                         "disable enable_sequence_parallelism or use sequence_parallelism_mode = \"all_to_all\"");
}

int tp_size(const Group& g) { return g ? g->size() : 1; }
int tp_rank(const Group& g) { return g ? g->rank() : 0; }

void check_positive(const char* layer, const char* what, int64_t size) {
  if (size < 1)
    throw std::invalid_argument(std::string("booster::nn::") + layer + ": " + what + " must be >= 1, got " +
                                std::to_string(size));
}

void check_divisible(const char* layer, const char* what, int64_t size, int t) {
  check_positive(layer, what, size);
  if (size % t != 0)
    throw std::invalid_argument(std::string("booster::nn::") + layer + ": " + what + " (" + std::to_string(size) +
                                ") is not divisible by the tensor-parallel size " + std::to_string(t) + "; make " + what +
                                " a multiple of " + std::to_string(t) + " or use a tp size that divides it");
}


// The full Linear weight [out, in] and bias [out] (undefined without bias) drawn from the global RNG
// exactly as torch::nn::Linear draws them, or with the options' init methods.
std::pair<at::Tensor, at::Tensor> init_full_linear(const LinearParallelOptions& o) {
  torch::NoGradGuard no_grad;
  at::Tensor w = at::empty({o.out_features(), o.in_features()});
  at::Tensor b;
  if (o.init_method()) {
    o.init_method()(w);
  } else {
    torch::nn::init::kaiming_uniform_(w, std::sqrt(5));
  }
  if (o.bias()) {
    b = at::empty({o.out_features()});
    if (o.bias_init_method()) {
      o.bias_init_method()(b);
    } else if (o.init_method()) {
      b.zero_();
    } else {
      const double bound = 1 / std::sqrt(static_cast<double>(o.in_features()));
      torch::nn::init::uniform_(b, -bound, bound);
    }
  }
  return {w, b};
}

TensorParallelSpec make_spec(int64_t dim, int64_t full, int64_t padded, const Group& g) {
  TensorParallelSpec s;
  s.dim = dim;
  s.full_size = full;
  s.padded_size = padded;
  s.tp_size = tp_size(g);
  s.tp_rank = tp_rank(g);
  s.group = g;
  return s;
}

// This rank's chunk along dim, as a fresh contiguous tensor.
at::Tensor shard(const at::Tensor& full, int64_t dim, const Group& g) {
  const int t = tp_size(g);
  if (t == 1) return full;
  const int64_t chunk = full.size(dim) / t;
  return full.narrow(dim, tp_rank(g) * chunk, chunk).clone().contiguous();
}

}  // namespace

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options_) : options(options_) {
  check_positive("Linear", "in_features", options.in_features());
  check_positive("Linear", "out_features", options.out_features());
  reset();
}

void LinearImpl::reset() {
  parameters_.clear();
  auto [w, b] = init_full_linear(LinearParallelOptions(options.in_features(), options.out_features()).bias(options.bias()));
  weight = register_parameter("weight", w);
  bias = register_parameter("bias", b.defined() ? b : at::Tensor(), /*requires_grad=*/b.defined());
}

at::Tensor LinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = at::linear(x, weight, bias);
  return forward_hook ? forward_hook(*this, x, y) : y;
}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(LinearParallelOptions options_)
    : options(std::move(options_)),
      group(resolve_group(options.group(), options.context())),
      sequence_parallel(resolve_sequence_parallel(options.sequence_parallel(), options.context(), group)) {
  check_positive("ColumnParallelLinear", "in_features", options.in_features());
  check_divisible("ColumnParallelLinear", "out_features", options.out_features(), tp_size(group));
  reset();
}

void ColumnParallelLinearImpl::reset() {
  parameters_.clear();  // reset() may be called again: it re-creates weight and bias
  auto [w, b] = init_full_linear(options);
  weight = register_parameter("weight", shard(w, 0, group));
  bias = register_parameter("bias", b.defined() ? shard(b, 0, group) : at::Tensor(), /*requires_grad=*/b.defined());
  if (group) {
    register_tensor_parallel_spec(weight, make_spec(0, options.out_features(), options.out_features(), group));
    if (bias.defined()) register_tensor_parallel_spec(bias, make_spec(0, options.out_features(), options.out_features(), group));
  }
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y;
  if (!group) {
    y = at::linear(x, weight, bias);
  } else if (sequence_parallel) {
    if (options.gather_output()) refuse_under_sequence_parallel("ColumnParallelLinear", "gather_output");
    if (forward_hook) refuse_under_sequence_parallel("ColumnParallelLinear", "a forward_hook (LoRA)");
    return sequence_parallel_column_linear(x, weight, bias, group);
  } else {
    y = at::linear(copy_to_tensor_parallel_region(x, group), weight, bias);
    if (options.gather_output()) y = gather_from_tensor_parallel_region(y, group);
  }
  return forward_hook ? forward_hook(*this, x, y) : y;
}

namespace {
// The start of every layer's parallelize(context): refuses a layer already sharded, and returns the
// tp group to shard over; at T = 1 (null) the layer stays dense and only its options take `context`.
template <class Options>
Group parallelize_group(const char* layer, const Group& current, Options& options, const TensorParallelContext& context) {
  if (current)
    throw std::logic_error(std::string("booster::nn::") + layer + "::parallelize: the layer is already sharded over a tp "
                           "group of " + std::to_string(current->size()) + " ranks; parallelize takes a dense layer "
                           "(built with the default context, T = 1)");
  Group g = resolve_group(nullptr, context);
  if (!g) options.context(context);
  return g;
}
}  // namespace

void ColumnParallelLinearImpl::parallelize(const TensorParallelContext& context) {
  Group g = parallelize_group("ColumnParallelLinear", group, options, context);
  if (!g) return;
  check_divisible("ColumnParallelLinear", "out_features", options.out_features(), tp_size(g));
  torch::NoGradGuard no_grad;
  weight.set_data(shard(weight.detach(), 0, g));
  if (bias.defined()) bias.set_data(shard(bias.detach(), 0, g));
  options.context(context);
  group = g;
  sequence_parallel = resolve_sequence_parallel(options.sequence_parallel(), context, group);
  register_tensor_parallel_spec(weight, make_spec(0, options.out_features(), options.out_features(), group));
  if (bias.defined()) register_tensor_parallel_spec(bias, make_spec(0, options.out_features(), options.out_features(), group));
}

RowParallelLinearImpl::RowParallelLinearImpl(LinearParallelOptions options_)
    : options(std::move(options_)),
      group(resolve_group(options.group(), options.context())),
      sequence_parallel(resolve_sequence_parallel(options.sequence_parallel(), options.context(), group)) {
  check_positive("RowParallelLinear", "out_features", options.out_features());
  check_divisible("RowParallelLinear", "in_features", options.in_features(), tp_size(group));
  reset();
}

void RowParallelLinearImpl::reset() {
  parameters_.clear();  // reset() may be called again: it re-creates weight and bias
  auto [w, b] = init_full_linear(options);
  weight = register_parameter("weight", shard(w, 1, group));
  bias = register_parameter("bias", b, /*requires_grad=*/b.defined());  // replicated: no spec
  if (group) register_tensor_parallel_spec(weight, make_spec(1, options.in_features(), options.in_features(), group));
}

void RowParallelLinearImpl::parallelize(const TensorParallelContext& context) {
  Group g = parallelize_group("RowParallelLinear", group, options, context);
  if (!g) return;
  check_divisible("RowParallelLinear", "in_features", options.in_features(), tp_size(g));
  torch::NoGradGuard no_grad;
  weight.set_data(shard(weight.detach(), 1, g));
  options.context(context);
  group = g;
  sequence_parallel = resolve_sequence_parallel(options.sequence_parallel(), context, group);
  register_tensor_parallel_spec(weight, make_spec(1, options.in_features(), options.in_features(), group));
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y;
  if (!group) {
    y = at::linear(x, weight, bias);
  } else if (sequence_parallel) {
    if (!options.input_is_parallel()) refuse_under_sequence_parallel("RowParallelLinear", "input_is_parallel = false");
    if (forward_hook) refuse_under_sequence_parallel("RowParallelLinear", "a forward_hook (LoRA)");
    sequence_shard(x.size(1), split_gather_context(group));  // the error naming T and sp_size
    y = reduce_scatter_sequence(at::linear(x, weight), group, 1);
    return bias.defined() ? y + bias : y;
  } else {
    at::Tensor in = options.input_is_parallel() ? x : scatter_to_tensor_parallel_region(x, group);
    y = reduce_from_tensor_parallel_region(at::linear(in, weight), group);
    if (bias.defined()) y = y + bias;
  }
  return forward_hook ? forward_hook(*this, x, y) : y;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(VocabParallelEmbeddingOptions options_)
    : options(std::move(options_)),
      group(resolve_group(options.group(), options.context())),
      sequence_parallel(resolve_sequence_parallel(options.sequence_parallel(), options.context(), group)) {
  check_positive("VocabParallelEmbedding", "num_embeddings", options.num_embeddings());
  check_positive("VocabParallelEmbedding", "embedding_dim", options.embedding_dim());
  if (options.make_vocab_size_divisible_by() < 0)
    throw std::invalid_argument("booster::nn::VocabParallelEmbedding: make_vocab_size_divisible_by must be >= 0");
  if (options.make_vocab_size_divisible_by() == 0)
    options.make_vocab_size_divisible_by(options.context().make_vocab_size_divisible_by);
  reset();
}

void VocabParallelEmbeddingImpl::reset() {
  parameters_.clear();  // reset() may be called again: it re-creates weight and bias
  const int t = tp_size(group);
  const int64_t v = options.num_embeddings();
  padded_vocab_ = padded_vocab_size(v, t, options.make_vocab_size_divisible_by());
  vocab_start_ = tp_rank(group) * (padded_vocab_ / t);
  at::Tensor full = at::empty({v, options.embedding_dim()});
  {
    torch::NoGradGuard no_grad;
    if (options.init_method()) {
      options.init_method()(full);
    } else {
      torch::nn::init::normal_(full);
    }
    if (padded_vocab_ > v) full = at::cat({full, at::zeros({padded_vocab_ - v, options.embedding_dim()})}, 0);
  }
  weight = register_parameter("weight", shard(full, 0, group));
  if (t > 1 || padded_vocab_ > v) register_tensor_parallel_spec(weight, make_spec(0, v, padded_vocab_, group));
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  if (!ids.defined() || ids.scalar_type() != at::kLong)
    throw std::invalid_argument("booster::nn::VocabParallelEmbedding: ids must be an int64 tensor");
  const int64_t v = options.num_embeddings();
  if (ids.numel() > 0) {
    at::Tensor bad = (ids < 0).logical_or_(ids >= v).reshape({-1});
    if (bad.any().item<bool>()) {
      const int64_t first = bad.nonzero()[0][0].item<int64_t>();
      throw std::out_of_range("booster::nn::VocabParallelEmbedding: id " +
                              std::to_string(ids.reshape({-1})[first].item<int64_t>()) + " (element " +
                              std::to_string(first) + ") is outside the vocabulary [0, " + std::to_string(v) + ")");
    }
  }
  if (!group) return at::embedding(weight, ids);
  const int64_t local = weight.size(0);
  at::Tensor outside = (ids < vocab_start_).logical_or_(ids >= vocab_start_ + local);
  at::Tensor local_ids = (ids - vocab_start_).masked_fill_(outside, 0);
  at::Tensor y = at::embedding(weight, local_ids).masked_fill(outside.unsqueeze(-1), 0);
  if (sequence_parallel) {
    if (ids.dim() < 2)
      throw std::invalid_argument("booster::nn::VocabParallelEmbedding: sequence parallelism needs ids [B, T, ...]");
    sequence_shard(ids.size(1), split_gather_context(group));  // the error naming T and sp_size
    return reduce_scatter_sequence(y, group, 1);
  }
  return reduce_from_tensor_parallel_region(y, group);
}

void VocabParallelEmbeddingImpl::parallelize(const TensorParallelContext& context) {
  Group g = parallelize_group("VocabParallelEmbedding", group, options, context);
  if (!g) return;
  const int t = tp_size(g);
  const int64_t v = options.num_embeddings();
  torch::NoGradGuard no_grad;
  at::Tensor full = weight.detach().narrow(0, 0, v);  // a dense table has no padding rows
  options.make_vocab_size_divisible_by(context.make_vocab_size_divisible_by);
  const int64_t padded = padded_vocab_size(v, t, options.make_vocab_size_divisible_by());
  if (padded > v) full = at::cat({full, at::zeros({padded - v, full.size(1)}, full.options())}, 0);
  weight.set_data(shard(full, 0, g));
  options.context(context);
  group = g;
  sequence_parallel = resolve_sequence_parallel(options.sequence_parallel(), context, group);
  padded_vocab_ = padded;
  vocab_start_ = tp_rank(group) * (padded_vocab_ / t);
  register_tensor_parallel_spec(weight, make_spec(0, v, padded_vocab_, group));
}

at::Tensor VocabParallelEmbeddingImpl::lm_logits(const at::Tensor& hidden) {
  if (sequence_parallel) return at::linear(gather_sequence(hidden, group, 1), weight);
  return at::linear(copy_to_tensor_parallel_region(hidden, group), weight);
}

}  // namespace booster::nn
