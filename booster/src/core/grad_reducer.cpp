// grad_reducer.cpp — bucketed, overlapped gradient averaging (see grad_reducer.h for the algorithm).
#include "booster/core/grad_reducer.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <mutex>
#include <sstream>
#include <stdexcept>

#include "booster/dist/fp8.h"
#include "booster/dist/process_group.h"

namespace booster {

// ---------------------------------------------------------------------------------------------
// State

using Bucket = BucketView;

BucketReduction::~BucketReduction() = default;

namespace {
// DDP / ZeRO-1: SUM-allreduce of the bucket (values already divided by the world size).
class AllreduceReduction : public BucketReduction {
 public:
  AllreduceReduction(std::shared_ptr<dist::ProcessGroup> group, bool fp8) : group_(std::move(group)), fp8_(fp8) {}
  void launch(size_t index, BucketView& bucket) override {
    if (works_.size() <= index) works_.resize(index + 1);
    works_[index] = fp8_ ? dist::fp8_allreduce(*group_, bucket.flat) : group_->allreduce(bucket.flat, dist::ReduceOp::SUM);
  }
  void finish(size_t index, BucketView&) override {
    dist::Work w = std::move(works_.at(index));
    works_[index] = dist::Work();
    w.wait();
  }
  bool writes_back() const override { return true; }

 private:
  std::shared_ptr<dist::ProcessGroup> group_;
  bool fp8_;  // float8 e4m3 on the wire (dist/fp8.h)
  std::vector<dist::Work> works_;
};
}  // namespace

std::shared_ptr<BucketReduction> make_allreduce_reduction(std::shared_ptr<dist::ProcessGroup> group, bool fp8) {
  return std::make_shared<AllreduceReduction>(std::move(group), fp8);
}

struct GradientReducer::State {
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> views;             // each param's slice of its bucket, shaped like the param
  std::vector<size_t> bucket_of;             // param -> bucket
  std::vector<char> ready;                   // param got its gradient in this backward
  std::vector<char> used_since_sync;         // param got a gradient while sync was off (no_sync)
  int64_t synced_backwards = 0;              // finalized synced passes
  std::vector<Bucket> buckets;
  std::vector<size_t> pending;               // per bucket: params not yet ready in this backward
  std::shared_ptr<BucketReduction> reduction;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keep alive (weakly held by autograd)
  std::vector<uintptr_t> hook_keys;
  std::shared_ptr<dist::ProcessGroup> group;
  ReducerOptions options;
  std::mutex mutex;
  bool require_sync = true;
  bool in_backward = false;   // a backward pass with sync is under way (callback queued)
  size_t next_bucket = 0;     // buckets are launched in index order
  int64_t launched_in_backward = 0;
  double inv_world = 1.0;
  at::Tensor inv_world_tensor;  // inv_world as a 0-dim wrapped number (see copy_grad_in)
  // Strategies that do not write back (ZeRO-2) get transient buckets: allocated when the first
  // gradient arrives, released when finished, and at most kMaxInFlight launched but unfinished
  // (plus the one being filled), so the bucket memory is a few buckets, not a copy of the model.
  bool transient = false;
  static constexpr size_t kMaxInFlight = 2;
  std::vector<int64_t> bucket_numel;
  std::vector<at::TensorOptions> bucket_options;
  size_t next_finish = 0;     // buckets are finished in index order
  // Ready-order rebuild (ReducerOptions::rebuild_buckets): the order in which parameters became
  // ready in the first synced backward, used once to assign the buckets again.
  std::vector<size_t> ready_order;
  bool rebuilt = false;

  void ensure_bucket(size_t b) {
    Bucket& bucket = buckets[b];
    if (bucket.flat.defined()) return;
    bucket.flat = at::empty({bucket_numel[b]}, bucket_options[b]);
    for (size_t j = 0; j < bucket.params.size(); ++j) {
      size_t i = bucket.params[j];
      views[i] = bucket.flat.narrow(0, bucket.offsets[j], params[i].numel()).view(params[i].sizes());
    }
  }

  void release_bucket(size_t b) {
    buckets[b].flat = at::Tensor();
    for (size_t i : buckets[b].params) views[i] = at::Tensor();
  }

  void finish_next() {
    size_t b = next_finish++;
    reduction->finish(b, buckets[b]);
    if (transient) release_bucket(b);
  }

  void launch_ready_buckets() {
    while (next_bucket < buckets.size() && pending[next_bucket] == 0) {
      size_t index = next_bucket++;
      reduction->launch(index, buckets[index]);
      while (transient && next_bucket - next_finish > kMaxInFlight) finish_next();
    }
  }

  // Copies param i's gradient (divided by world size) into its bucket slice.
  void copy_grad_in(size_t i) {
    if (transient) ensure_bucket(bucket_of[i]);
    at::Tensor& view = views[i];
    at::Tensor grad = params[i].grad();
    if (!grad.defined()) {
      view.zero_();
    } else if (grad.data_ptr() == view.data_ptr() && grad.sizes() == view.sizes()) {
      grad.mul_(inv_world);  // gradient is the bucket view already
    } else {
      // The factor as a wrapped-number tensor: mul_out with a c10::Scalar computes into a
      // gradient-sized temporary and copies it (LibTorch 1.13), an extra pass over memory and fresh
      // pages on every step (found by benchmarks/bench_ddp's page-fault profile).
      at::mul_out(view, grad, inv_world_tensor);
      if (options.gradient_as_bucket_view) params[i].mutable_grad() = view;
    }
    // ZeRO-2: the full-size gradient is not needed once it is in the bucket.
    if (!reduction->writes_back()) params[i].mutable_grad() = at::Tensor();
  }

  void mark_ready(size_t i) {
    if (ready[i]) return;
    ready[i] = 1;
    if (!rebuilt) ready_order.push_back(i);
    copy_grad_in(i);
    --pending[bucket_of[i]];
    if (options.overlap_communication) launch_ready_buckets();
  }

  void on_grad_ready(size_t i) {
    std::lock_guard<std::mutex> lock(mutex);
    if (!require_sync) {
      used_since_sync[i] = 1;  // PyTorch's local_used_map_ records no_sync passes too
      return;
    }
    if (!in_backward) {
      in_backward = true;
      std::weak_ptr<State> weak = self;
      torch::autograd::Engine::get_default_engine().queue_callback([weak]() {
        if (auto s = weak.lock()) s->finalize();
      });
    }
    mark_ready(i);
  }

  std::string unready_names() const {
    std::ostringstream os;
    int shown = 0, total = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (ready[i]) continue;
      ++total;
      if (shown < 10) { os << (shown ? ", " : "") << names[i]; ++shown; }
    }
    if (total > shown) os << " and " << (total - shown) << " more";
    return os.str();
  }

  void finalize() {
    std::lock_guard<std::mutex> lock(mutex);
    in_backward = false;
    int64_t launched_by_hooks = static_cast<int64_t>(next_bucket);
    bool all_ready = true;
    for (char r : ready) all_ready = all_ready && r;
    at::Tensor used;
    if (!all_ready) {
      if (!options.find_unused_parameters) {
        std::string missing = unready_names();
        reset();
        throw std::runtime_error(
            "booster: rank " + std::to_string(group->rank()) + " finished backward but these parameters got no "
            "gradient: " + missing + ". Other ranks wait for them in the gradient allreduce. Set "
            "plugin.find_unused_parameters = true if parts of the model are unused in some iterations, or "
            "make every parameter take part in the loss.");
      }
    }
    if (options.find_unused_parameters) {
      // Which parameters were used anywhere: a parameter unused on every rank keeps its gradient.
      // Only a strategy that writes gradients back needs it (one MAX allreduce per backward).
      if (!transient) {
        used = at::zeros({static_cast<int64_t>(params.size())}, at::kInt);
        auto acc = used.accessor<int32_t, 1>();
        for (size_t i = 0; i < params.size(); ++i) acc[i] = ready[i] || used_since_sync[i] ? 1 : 0;
      }
      for (size_t i = 0; i < params.size(); ++i)
        if (!ready[i]) mark_ready(i);  // contributes zeros
    }
    launched_in_backward += launched_by_hooks;
    dist::Work used_work;
    try {
      launch_ready_buckets();  // all, without overlap_communication
      if (used.defined()) used_work = group->allreduce(used, dist::ReduceOp::MAX);
      while (next_finish < buckets.size()) finish_next();
      used_work.wait();
    } catch (...) {
      reset();
      throw;
    }
    ++synced_backwards;
    if (!reduction->writes_back()) {
      reset();
      return;
    }
    const int32_t* globally_used = used.defined() ? used.data_ptr<int32_t>() : nullptr;
    for (size_t i = 0; i < params.size(); ++i) {
      if (globally_used && !globally_used[i]) {
        // Unused everywhere: leave the gradient as it was (undefined stays undefined).
        continue;
      }
      at::Tensor grad = params[i].grad();
      if (grad.defined() && grad.data_ptr() == views[i].data_ptr()) continue;
      if (grad.defined()) grad.copy_(views[i]);
      else params[i].mutable_grad() = options.gradient_as_bucket_view ? views[i] : views[i].to(params[i].options(), false, /*copy=*/true);
    }
    reset();
    if (options.rebuild_buckets && !rebuilt) rebuild_in_ready_order();
  }

  // PyTorch's Reducer::rebuild_buckets: rank 0's recorded ready order (every rank must use the same
  // buckets) fills the buckets with the same caps; parameters never ready go last, in reverse
  // registration order. Once, after the first synced backward.
  void rebuild_in_ready_order() {
    rebuilt = true;
    std::vector<size_t> order = ready_order;
    std::vector<char> seen(params.size(), 0);
    for (size_t i : order) seen[i] = 1;
    for (size_t k = params.size(); k-- > 0;)
      if (!seen[k]) order.push_back(k);
    at::Tensor wire = at::empty({static_cast<int64_t>(order.size())}, at::kLong);
    for (size_t k = 0; k < order.size(); ++k) wire.data_ptr<int64_t>()[k] = static_cast<int64_t>(order[k]);
    group->broadcast(wire, 0).wait();
    for (size_t k = 0; k < order.size(); ++k) {
      const int64_t i = wire.data_ptr<int64_t>()[k];
      if (i < 0 || i >= static_cast<int64_t>(params.size()))
        throw std::runtime_error("booster: rebuild_buckets: rank 0 sent parameter index " + std::to_string(i) +
                                 " of " + std::to_string(params.size()) + "; the ranks' models differ");
      order[k] = static_cast<size_t>(i);
    }
    // Gradients that are bucket views keep their values in the new buckets.
    std::vector<at::Tensor> kept(params.size());
    if (options.gradient_as_bucket_view)
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].grad().defined()) kept[i] = params[i].grad().clone();
    assign_buckets(order);
    if (options.gradient_as_bucket_view)
      for (size_t i = 0; i < params.size(); ++i)
        if (kept[i].defined()) views[i].copy_(kept[i]);
    ready_order.clear();
    ++rebuilds;
  }
  int64_t rebuilds = 0;

  // Buckets filled in `order` (parameter indices): a new bucket on dtype or key change or when the
  // current one reached its cap (the first one's cap is first_bucket_bytes); ascending inside a
  // bucket, so a bucket is one contiguous range of a flat layout when the order is reversed
  // registration order.
  void assign_buckets(const std::vector<size_t>& order) {
    buckets.clear();
    pending.clear();
    bucket_numel.clear();
    bucket_options.clear();
    auto key = [&](size_t k) { return options.bucket_key.empty() ? 0 : options.bucket_key[k]; };
    std::vector<std::vector<size_t>> groups;
    int64_t bytes = 0, cap = options.first_bucket_bytes;
    for (size_t k : order) {
      const at::Tensor& p = params[k];
      if (!groups.empty() && !groups.back().empty() &&
          (params[groups.back().front()].scalar_type() != p.scalar_type() || key(groups.back().front()) != key(k))) {
        groups.emplace_back();
        bytes = 0;
      }
      if (groups.empty()) groups.emplace_back();
      groups.back().push_back(k);
      bytes += p.numel() * static_cast<int64_t>(p.element_size());
      if (bytes >= cap) {
        groups.emplace_back();
        bytes = 0;
        cap = options.bucket_cap_bytes;
      }
    }
    if (!groups.empty() && groups.back().empty()) groups.pop_back();
    for (auto& g : groups) {
      std::sort(g.begin(), g.end());
      Bucket b;
      b.params = g;
      int64_t numel = 0;
      for (size_t i : g) {
        b.offsets.push_back(numel);
        numel += params[i].numel();
      }
      auto dtype = params[g.front()].scalar_type();
      if (options.communication_dtype != at::ScalarType::Undefined && !is_fp8_wire(options.communication_dtype)) {
        if (options.gradient_as_bucket_view && options.communication_dtype != dtype)
          throw std::invalid_argument("booster: gradient_as_bucket_view needs communication_dtype equal to the "
                                      "parameters' dtype");
        dtype = options.communication_dtype;
      }
      at::TensorOptions bucket_opts = params[g.front()].options().dtype(dtype).requires_grad(false);
      bucket_numel.push_back(numel);
      bucket_options.push_back(bucket_opts);
      if (!transient) b.flat = at::zeros({numel}, bucket_opts);
      for (size_t j = 0; j < g.size(); ++j) {
        size_t i = g[j];
        views[i] = transient ? at::Tensor() : b.flat.narrow(0, b.offsets[j], params[i].numel()).view(params[i].sizes());
        bucket_of[i] = buckets.size();
        if (options.gradient_as_bucket_view) {
          at::Tensor g0 = params[i].grad();
          if (g0.defined()) views[i].copy_(g0);
          params[i].mutable_grad() = views[i];
        }
      }
      pending.push_back(g.size());
      buckets.push_back(std::move(b));
    }
  }

  void reset() {
    std::fill(ready.begin(), ready.end(), 0);
    std::fill(used_since_sync.begin(), used_since_sync.end(), 0);
    for (size_t b = 0; b < buckets.size(); ++b) {
      pending[b] = buckets[b].params.size();
      if (transient) release_bucket(b);
    }
    next_bucket = 0;
    next_finish = 0;
  }

  std::weak_ptr<State> self;
};

// ---------------------------------------------------------------------------------------------
// Construction: bucket assignment and hooks

GradientReducer::GradientReducer(std::vector<std::pair<std::string, torch::Tensor>> named_params,
                                 std::shared_ptr<dist::ProcessGroup> group, ReducerOptions options)
    : state_(std::make_shared<State>()) {
  if (!group) throw std::invalid_argument("booster: GradientReducer needs a process group");
  if (options.bucket_cap_bytes <= 0 || options.first_bucket_bytes <= 0)
    throw std::invalid_argument("booster: bucket caps must be > 0 bytes");
  if (!options.bucket_key.empty() && options.bucket_key.size() != named_params.size())
    throw std::invalid_argument("booster: ReducerOptions::bucket_key needs one key per parameter (" +
                                std::to_string(named_params.size()) + "), got " +
                                std::to_string(options.bucket_key.size()));
  State& s = *state_;
  s.self = state_;
  s.group = group;
  s.options = options;
  s.inv_world = 1.0 / group->size();
  s.inv_world_tensor = c10::scalar_to_tensor(at::Scalar(s.inv_world));
  s.inv_world_tensor.unsafeGetTensorImpl()->set_wrapped_number(true);
  s.reduction = options.reduction ? options.reduction : make_allreduce_reduction(group, is_fp8_wire(options.communication_dtype));
  s.transient = !s.reduction->writes_back();
  if (s.transient && options.gradient_as_bucket_view)
    throw std::invalid_argument("booster: gradient_as_bucket_view needs a reduction that writes gradients back");
  for (auto& [name, p] : named_params) {
    if (!p.defined()) throw std::invalid_argument("booster: parameter " + name + " is undefined");
    if (!p.is_leaf()) throw std::invalid_argument("booster: parameter " + name + " is not a leaf tensor");
    s.names.push_back(name);
    s.params.push_back(p);
  }
  size_t n = s.params.size();
  s.views.resize(n);
  s.bucket_of.resize(n);
  s.ready.assign(n, 0);
  s.used_since_sync.assign(n, 0);

  // Reverse registration order (gradients of the last layers are ready first).
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = n - 1 - k;
  s.assign_buckets(order);
  s.rebuilt = !options.rebuild_buckets || (options.find_unused_parameters && !options.static_graph);

  // A post hook on each parameter's gradient accumulator: runs after the gradient was accumulated
  // into param.grad().
  std::weak_ptr<State> weak = state_;
  for (size_t i = 0; i < n; ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(s.params[i]);
    if (!acc) throw std::invalid_argument("booster: parameter " + s.names[i] + " has no gradient accumulator "
                                          "(does it require grad?)");
    s.hook_keys.push_back(acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [weak, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          if (auto st = weak.lock()) st->on_grad_ready(i);
          return outputs;
        })));
    s.accumulators.push_back(std::move(acc));
  }
}

GradientReducer::~GradientReducer() {
  if (!state_) return;
  for (size_t i = 0; i < state_->accumulators.size(); ++i)
    state_->accumulators[i]->del_post_hook(state_->hook_keys[i]);
}

void GradientReducer::set_require_grad_sync(bool required) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->require_sync = required;
}

bool GradientReducer::require_grad_sync() const { return state_->require_sync; }

void GradientReducer::sync_now() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->in_backward)
      throw std::logic_error("booster: GradientReducer::sync_now was called while a synced backward is under way; "
                             "its end-of-backward callback averages the gradients");
    if (!state_->require_sync)
      throw std::logic_error("booster: GradientReducer::sync_now was called with gradient sync off (inside no_sync); "
                             "call set_require_grad_sync(true) first");
    for (size_t i = 0; i < state_->params.size(); ++i)
      if (!state_->ready[i] && state_->params[i].grad().defined()) {
        state_->used_since_sync[i] = 1;
        state_->mark_ready(i);
      }
  }
  state_->finalize();
}

int64_t GradientReducer::synced_backwards() const { return state_->synced_backwards; }

std::vector<std::vector<size_t>> GradientReducer::bucket_indices() const {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : state_->buckets) out.push_back(b.params);
  return out;
}

std::vector<int64_t> GradientReducer::bucket_bytes() const {
  std::vector<int64_t> out;
  for (size_t b = 0; b < state_->buckets.size(); ++b)
    out.push_back(state_->bucket_numel[b] * static_cast<int64_t>(c10::elementSize(
                                              c10::typeMetaToScalarType(state_->bucket_options[b].dtype()))));
  return out;
}

int64_t GradientReducer::resident_bucket_bytes() const {
  std::vector<int64_t> bytes = bucket_bytes();
  if (!state_->transient) {
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    return total;
  }
  // Launched-but-unfinished buckets, plus the one being filled, plus one that completes early.
  std::sort(bytes.rbegin(), bytes.rend());
  int64_t total = 0;
  for (size_t k = 0; k < bytes.size() && k < State::kMaxInFlight + 2; ++k) total += bytes[k];
  return total;
}

int64_t GradientReducer::buckets_launched_during_backward() const { return state_->launched_in_backward; }

std::map<std::string, int64_t> GradientReducer::stats() const {
  return {{"buckets", static_cast<int64_t>(bucket_indices().size())},
          {"buckets_launched_during_backward", buckets_launched_during_backward()},
          {"buckets_rebuilt", state_->rebuilds}};
}

}  // namespace booster
