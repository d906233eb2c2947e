// zero_optimizer.cpp — ZeRO stage 1/2 optimizer wrapper (see zero_optimizer.h for the algorithm).
#include "booster/wrappers/zero_optimizer.h"

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <set>
#include <stdexcept>

#include "booster/core/grad_reducer.h"
#include "booster/dist/fp8.h"
#include "booster/dist/process_group.h"
#include "booster/logging.h"
#include "booster/optim/cpu_adam.h"
#include "booster/optim/optimizer_registry.h"
#include "device_offload.h"

namespace booster {

struct ZeroOptimizer::Group {
  FlatLayout layout;
  std::vector<at::Tensor> params;  // trainable model parameters, in layout order (views of flat)
  std::vector<size_t> indices;     // their index in parameters()
  at::Tensor flat;                 // [padded_numel], model dtype: the parameters' storage
  at::Tensor shard;                // flat's slice owned by this rank
  at::Tensor master;               // what the optimizer updates: shard itself or a copy
  bool master_is_shard = true;
  at::Tensor grad_shard;           // stage 2: [shard_numel] reduced gradients (model dtype)
};

namespace {

// A bucket is a contiguous range of its group's flat buffer (the reducer packs a bucket's
// parameters in ascending order, as the layout does); the part of it inside rank r's shard is
// reduced to r by one in-place reduce-scatter with per-rank counts (DeepSpeed's stage-2
// average_tensor, with one collective per bucket instead of one reduce per owner). Stage 2 adds the
// owned part into r's gradient shard and the bucket is released; stage 1 keeps the buckets (they are
// the parameters' .grad()), whose owned part then holds the averaged gradient.
class OwnerReduction : public BucketReduction {
 public:
  using Group = ZeroOptimizer::Group;
  OwnerReduction(std::vector<std::shared_ptr<Group>> groups, std::vector<size_t> group_of, std::vector<size_t> local_of,
                 std::shared_ptr<dist::ProcessGroup> world, bool keep_buckets, bool fp8)
      : groups_(std::move(groups)), group_of_(std::move(group_of)), local_of_(std::move(local_of)),
        world_(std::move(world)), keep_buckets_(keep_buckets), fp8_(fp8) {}

  void launch(size_t index, BucketView& bucket) override {
    if (pending_.size() <= index) pending_.resize(index + 1);
    Group& g = *groups_[group_of_[bucket.params.front()]];
    const int64_t begin = g.layout.offsets[local_of_[bucket.params.front()]];
    const int64_t end = begin + bucket.flat.numel();
    for (size_t k = 0; k < bucket.params.size(); ++k)
      if (g.layout.offsets[local_of_[bucket.params[k]]] - begin != bucket.offsets[k])
        throw std::logic_error("booster: ZeRO: a gradient bucket is not a contiguous range of its group's flat buffer");
    std::vector<int64_t> counts(static_cast<size_t>(world_->size()), 0);
    for (int r = 0; r < world_->size(); ++r) {
      const int64_t lo = std::max(begin, g.layout.shard_begin(r));
      const int64_t hi = std::min(end, g.layout.shard_begin(r) + g.layout.shard_numel);
      counts[static_cast<size_t>(r)] = std::max<int64_t>(0, hi - lo);
    }
    const int rank = world_->rank();
    Pending& p = pending_[index];
    p.group = &g;
    p.bucket_offset = std::min(std::max<int64_t>(0, g.layout.shard_begin(rank) - begin), bucket.flat.numel());
    p.shard_offset = std::max<int64_t>(0, begin - g.layout.shard_begin(rank));
    p.count = counts[static_cast<size_t>(rank)];
    p.work = fp8_ ? dist::fp8_reduce_scatter_in_place(*world_, bucket.flat, counts)
                  : world_->reduce_scatter_in_place(bucket.flat, counts, dist::ReduceOp::SUM);
  }

  void finish(size_t index, BucketView& bucket) override {
    Pending p = std::move(pending_.at(index));
    pending_[index] = Pending();
    p.work.wait();
    if (keep_buckets_ || p.count == 0) return;
    at::NoGradGuard no_grad;
    p.group->grad_shard.narrow(0, p.shard_offset, p.count).add_(bucket.flat.narrow(0, p.bucket_offset, p.count));
  }

  bool writes_back() const override { return keep_buckets_; }

 private:
  struct Pending {
    Group* group = nullptr;
    int64_t bucket_offset = 0;  // where this rank's part starts in the bucket
    int64_t shard_offset = 0;   // and in this rank's shard
    int64_t count = 0;          // its length (0: the bucket does not reach this rank's shard)
    dist::Work work;
  };
  std::vector<std::shared_ptr<Group>> groups_;
  std::vector<size_t> group_of_, local_of_;  // per reducer parameter index
  std::shared_ptr<dist::ProcessGroup> world_;
  bool keep_buckets_;
  bool fp8_;  // float8 e4m3 on the wire (dist/fp8.h)
  std::vector<Pending> pending_;  // per bucket
};

// cpu_offload: says once per process how the master slices will step.
void log_offload_step(const torch::optim::Optimizer& optimizer) {
  static std::atomic<bool> logged{false};
  if (logged.exchange(true)) return;
  const std::string type = optimizer_type_info(optimizer).name();
  bool amsgrad = false;
  for (const auto& g : optimizer.param_groups()) {
    if (type == "Adam") amsgrad = amsgrad || static_cast<const torch::optim::AdamOptions&>(g.options()).amsgrad();
    if (type == "AdamW") amsgrad = amsgrad || static_cast<const torch::optim::AdamWOptions&>(g.options()).amsgrad();
  }
  if ((type == "Adam" || type == "AdamW" || type == "CPUAdam" || type == "HybridAdam") && !amsgrad)
    log::info("ZeRO cpu_offload: the " + type + " step of the master slices runs through the CPU Adam kernel (" +
              kernels::cpu::isa_name(optim::cpu_adam_isa()) + "), with the optimizer's own hyper-parameters and state");
  else
    log::warn("ZeRO cpu_offload: " + type + (amsgrad ? " with amsgrad" : "") +
              " steps with its own (LibTorch) step; Adam, AdamW (amsgrad off), CPUAdam and HybridAdam step through "
              "the faster CPU Adam kernel");
}

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction: flatten, shard, bind the optimizer to the slices, install the reducer

ZeroOptimizer::ZeroOptimizer(std::shared_ptr<torch::optim::Optimizer> optimizer, std::shared_ptr<ModelHooks> hooks,
                             OptimizerWrapperOptions options, ZeroOptions zero,
                             const std::vector<std::pair<std::string, torch::Tensor>>& named_model_parameters)
    : OptimizerWrapper(std::move(optimizer), std::move(hooks), std::move(options), NoMasterCopies{}), zero_(zero) {
  if (zero_.stage != 1 && zero_.stage != 2)
    throw std::invalid_argument("booster: ZeRO stage must be 1 or 2, got " + std::to_string(zero_.stage));
  if (zero_.reduce_bucket_elements < 1) throw std::invalid_argument("booster: reduce bucket size must be >= 1 element");
  if (!options_.group) throw std::invalid_argument("booster: ZeroOptimizer needs the data-parallel group (options.group)");
  optimizer_type_info(*optimizer_);  // throws for optimizers whose state cannot be sliced (unregistered)
  const auto& world = options_.group;
  const int rank = world->rank(), n = world->size();
  // State the optimizer already has (Adagrad creates its sums eagerly) is re-cut into the slices.
  std::vector<ParamOptimState> existing = OptimizerWrapper::gather_param_states();
  bool has_state = !optimizer_->state().empty();

  // Every trainable model parameter must be in the optimizer: ZeRO synchronises only those.
  std::set<const void*> in_optimizer;
  for (const auto& p : model_params_) in_optimizer.insert(p.unsafeGetTensorImpl());
  std::map<const void*, std::string> names;
  for (const auto& [name, p] : named_model_parameters) {
    names[p.unsafeGetTensorImpl()] = name;
    if (p.requires_grad() && !in_optimizer.count(p.unsafeGetTensorImpl()))
      throw std::invalid_argument("booster: ZeRO: parameter " + name + " requires grad but is not in the optimizer, "
                                  "so its gradient would never be synchronised; add it to the optimizer or set "
                                  "requires_grad(false)");
  }

  param_group_.assign(model_params_.size(), -1);
  param_local_.assign(model_params_.size(), -1);
  std::vector<std::pair<std::string, torch::Tensor>> trainable;  // reducer order: group by group
  std::vector<size_t> red_group, red_local;
  std::vector<int64_t> bucket_key;
  size_t index = 0;
  auto& param_groups = optimizer_->param_groups();
  for (size_t gi = 0; gi < param_groups.size(); ++gi) {
    auto g = std::make_shared<Group>();
    for (auto& p : param_groups[gi].params()) {
      if (p.requires_grad()) {
        param_group_[index] = static_cast<int64_t>(gi);
        param_local_[index] = static_cast<int64_t>(g->params.size());
        g->params.push_back(p);
        g->indices.push_back(index);
      }
      ++index;
    }
    std::vector<int64_t> numels;
    for (const auto& p : g->params) numels.push_back(p.numel());
    g->layout = make_flat_layout(numels, n);
    try {
      g->flat = flatten_into_views(g->params, g->layout);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string(e.what()) + " (optimizer parameter group " + std::to_string(gi) + ")");
    }
    g->shard = g->flat.narrow(0, g->layout.shard_begin(rank), g->layout.shard_numel);
    at::ScalarType dtype = g->flat.scalar_type();
    bool fp32_master = options_.master_weights && at::isFloatingType(dtype) && dtype != at::kFloat;
    if (zero_.cpu_offload && !g->params.empty() && !g->flat.device().is_cpu()) {
      // On an accelerator: the master slice in pinned host memory.
      if (!offload_) offload_ = std::make_unique<detail::DeviceOffload>(g->flat.device());
      g->master = detail::pinned_empty(g->layout.shard_numel, fp32_master ? at::kFloat : dtype);
      g->master.copy_(g->shard);
      g->master_is_shard = false;
    } else if (fp32_master || zero_.cpu_offload) {
      g->master = g->shard.to(zero_.cpu_offload ? at::Device(at::kCPU) : g->shard.device(),
                              fp32_master ? at::kFloat : dtype, false, /*copy=*/true);
      g->master_is_shard = false;
    } else {
      g->master = g->shard;
    }
    param_groups[gi].params() = {g->master};
    if (zero_.stage == 2) g->grad_shard = at::zeros({g->layout.shard_numel}, g->flat.options());
    for (size_t j = 0; j < g->params.size(); ++j) {
      trainable.emplace_back(names.count(g->params[j].unsafeGetTensorImpl()) ? names[g->params[j].unsafeGetTensorImpl()]
                                                                             : "parameter " + std::to_string(g->indices[j]),
                             g->params[j]);
      red_group.push_back(gi);
      red_local.push_back(j);
      bucket_key.push_back(static_cast<int64_t>(gi));
    }
    groups_.push_back(std::move(g));
  }

  ReducerOptions ro;
  int64_t elem = trainable.empty() ? 4 : static_cast<int64_t>(trainable.front().second.element_size());
  ro.bucket_cap_bytes = zero_.reduce_bucket_elements * elem;
  ro.first_bucket_bytes = ro.bucket_cap_bytes;  // ColossalAI has no small first bucket
  ro.overlap_communication = zero_.overlap_communication;
  // A parameter without a gradient on some rank (unused in this step) takes part as zeros instead
  // of stalling the other ranks; its slice is then stepped with a zero gradient (header comment).
  ro.find_unused_parameters = true;
  ro.communication_dtype = zero_.communication_dtype;
  ro.bucket_key = bucket_key;
  if (zero_.stage == 1) {
    // Gradients live in the buckets (no second full-size copy) unless the wire dtype differs.
    grads_are_buckets_ = true;
    for (const auto& [name, p] : trainable)
      grads_are_buckets_ = grads_are_buckets_ && (zero_.communication_dtype == at::ScalarType::Undefined ||
                                                  is_fp8_wire(zero_.communication_dtype) ||
                                                  zero_.communication_dtype == p.scalar_type());
    ro.gradient_as_bucket_view = grads_are_buckets_;
  }
  ro.reduction = std::make_shared<OwnerReduction>(groups_, red_group, red_local, world, zero_.stage == 1,
                                                is_fp8_wire(zero_.communication_dtype));
  reducer_ = std::make_unique<GradientReducer>(trainable, world, ro);
  if (has_state) load_param_states(existing);
  if (zero_.cpu_offload) log_offload_step(*optimizer_);
  if (offload_)
    log::info("ZeRO cpu_offload: the model is on " + offload_->device().str() + "; the master slices and optimizer "
              "states are in pinned host memory, gradient slices copied device -> host on a side stream");
}

ZeroOptimizer::~ZeroOptimizer() = default;

const FlatLayout& ZeroOptimizer::layout(size_t group) const { return groups_.at(group)->layout; }
const at::Tensor& ZeroOptimizer::master_slice(size_t group) const { return groups_.at(group)->master; }
const at::Tensor& ZeroOptimizer::flat_parameters(size_t group) const { return groups_.at(group)->flat; }
const std::vector<size_t>& ZeroOptimizer::layout_parameters(size_t group) const { return groups_.at(group)->indices; }
dist::ProcessGroup* ZeroOptimizer::norm_group() const { return options_.group.get(); }

void ZeroOptimizer::set_require_grad_sync(bool required) {
  if (!required && zero_.stage == 2)
    throw std::logic_error("booster: ZeRO stage 2 keeps only this rank's gradient shard, so gradients cannot "
                           "accumulate unsynchronised (no_sync); use stage = 1 for no_sync, or call backward on "
                           "each micro-batch without no_sync (stage 2 accumulates into the shard)");
  reducer_->set_require_grad_sync(required);
}

// ---------------------------------------------------------------------------------------------
// Gradients of the slices

void ZeroOptimizer::prepare_slice_grads() {
  if (grads_prepared_) return;
  at::NoGradGuard no_grad;
  const int rank = options_.group->rank();
  std::vector<at::Tensor> on_device;  // offload_: each group's gradient slice where the model is
  std::vector<at::ScalarType> host_dtypes;
  for (auto& g : groups_) {
    at::Tensor grad;
    if (zero_.stage == 1) {
      // offload_: gathered on the device, then one copy to the host.
      grad = at::zeros({g->layout.shard_numel}, offload_ ? g->flat.options() : g->master.options());
      for (size_t j = 0; j < g->params.size(); ++j) {
        FlatLayout::Piece piece = g->layout.piece(j, rank);
        const at::Tensor& pg = g->params[j].grad();
        if (piece.length == 0 || !pg.defined()) continue;
        grad.narrow(0, piece.shard_offset, piece.length)
            .copy_(pg.reshape({-1}).narrow(0, piece.tensor_offset, piece.length));
      }
    } else if (offload_) {
      grad = g->grad_shard;
    } else {
      bool same = g->grad_shard.scalar_type() == g->master.scalar_type() &&
                  g->grad_shard.device() == g->master.device();
      grad = same ? g->grad_shard : g->grad_shard.to(g->master.options(), false, true);
    }
    if (offload_) {
      on_device.push_back(grad);
      host_dtypes.push_back(g->master.scalar_type());
    } else {
      g->master.mutable_grad() = grad;
    }
  }
  if (offload_) {
    // Device -> pinned host on the side stream; returns once every slice has arrived (so the last
    // step's uploads of the master slices, queued before, are done too).
    std::vector<at::Tensor> host = offload_->download(on_device, host_dtypes);
    offload_->wait_uploads();
    for (size_t i = 0; i < groups_.size(); ++i) groups_[i]->master.mutable_grad() = host[i];
  }
  grads_prepared_ = true;
  on_gradients_prepared();
}

void ZeroOptimizer::pin_offloaded_states() {
  if (!offload_) return;
  for (auto& g : groups_) detail::pin_optimizer_state(*optimizer_, g->master);
}

std::vector<torch::Tensor> ZeroOptimizer::local_gradients() const {
  std::vector<torch::Tensor> grads;
  for (const auto& g : groups_)
    if (g->master.grad().defined()) grads.push_back(g->master.grad());
  return grads;
}

void ZeroOptimizer::backward(const torch::Tensor& loss) {
  OptimizerWrapper::backward(loss);
  grads_prepared_ = false;
}

double ZeroOptimizer::clip_grad_by_norm(double max_norm, double norm_type) {
  prepare_slice_grads();
  return OptimizerWrapper::clip_grad_by_norm(max_norm, norm_type);
}

void ZeroOptimizer::clip_grad_by_value(double clip_value) {
  prepare_slice_grads();
  OptimizerWrapper::clip_grad_by_value(clip_value);
}

bool ZeroOptimizer::step() {
  at::NoGradGuard no_grad;
  prepare_slice_grads();
  // Overflow skip, clip, the wrapped optimizer on the slices (cpu_offload: through the CPU Adam
  // kernel for the Adam family, on the optimizer's own state).
  bool stepped = zero_.cpu_offload ? step_with([](torch::optim::Optimizer& o) {
                                       if (!optim::step_with_cpu_adam_kernel(o)) o.step();
                                     })
                                   : OptimizerWrapper::step();
  if (stepped) {
    if (offload_) {
      pin_offloaded_states();  // the step that created them made them in ordinary host memory
      std::vector<std::pair<at::Tensor, at::Tensor>> uploads;
      for (auto& g : groups_) uploads.emplace_back(g->shard, g->master);  // rounded to the model dtype
      offload_->upload(uploads);  // non-blocking, ahead of the all-gathers on the same stream
    }
    std::vector<dist::Work> works;
    for (auto& g : groups_) {
      if (!offload_ && !g->master_is_shard) g->shard.copy_(g->master);  // rounded to the model dtype
      works.push_back(options_.group->all_gather_into_tensor(g->flat, g->shard));
    }
    for (auto& w : works) w.wait();
  }
  for (auto& g : groups_) g->master.mutable_grad() = at::Tensor();  // stage 1: a transient copy
  grads_prepared_ = false;
  return stepped;
}

void ZeroOptimizer::zero_grad() {
  OptimizerWrapper::zero_grad();  // stage 1: the bucket views in param.grad()
  at::NoGradGuard no_grad;
  for (auto& g : groups_) {
    g->master.mutable_grad() = at::Tensor();
    if (g->grad_shard.defined()) g->grad_shard.zero_();
  }
  grads_prepared_ = false;
}

// ---------------------------------------------------------------------------------------------
// State in full shape (checkpoints)

std::vector<ParamOptimState> ZeroOptimizer::gather_param_states() {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<ParamOptimState> out(model_params_.size());
  auto& state = optimizer_->state();
  for (auto& g : groups_) {
    auto it = state.find(optimizer_state_key(g->master));
    if (it == state.end()) continue;  // not stepped yet: the same on every rank
    gather_slice_state(info.extract_state(*it->second), g->layout, *options_.group, g->indices, out);
  }
  return out;
}

std::vector<checkpoint::StatePiece> ZeroOptimizer::local_state_pieces() {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<checkpoint::StatePiece> pieces;
  auto& state = optimizer_->state();
  for (auto& g : groups_) {
    auto it = state.find(optimizer_state_key(g->master));
    if (it == state.end()) continue;  // not stepped yet: the same on every rank
    for (auto& p : slice_state_pieces(info.extract_state(*it->second), g->layout, options_.group->rank(), g->indices))
      pieces.push_back(std::move(p));
  }
  return pieces;
}

std::vector<std::map<std::string, int64_t>> ZeroOptimizer::local_state_scalars() {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  std::vector<std::map<std::string, int64_t>> out(model_params_.size());
  auto& state = optimizer_->state();
  for (auto& g : groups_) {
    auto it = state.find(optimizer_state_key(g->master));
    if (it == state.end()) continue;
    auto scalars = info.extract_state(*it->second).scalars;
    for (size_t idx : g->indices) out[idx] = scalars;
  }
  return out;
}

bool ZeroOptimizer::state_is_sharded() const { return options_.group->size() > 1; }

void ZeroOptimizer::load_state_ranges(const std::vector<ParamStateSource>& sources, const StateRangeReader& read) {
  const OptimizerTypeInfo& info = optimizer_type_info(*optimizer_);
  if (sources.size() != model_params_.size())
    throw std::invalid_argument("booster: load_state_ranges: " + std::to_string(sources.size()) + " sources for " +
                                std::to_string(model_params_.size()) + " parameters");
  const int rank = options_.group->rank();
  std::vector<std::pair<OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>>> fresh;
  for (auto& g : groups_) {
    ParamOptimState slice = read_slice_state(sources, read, g->layout, rank, g->indices, g->master.options());
    if (!slice.empty()) fresh.emplace_back(optimizer_state_key(g->master), info.make_state(slice));
  }
  optimizer_->state().clear();
  for (auto& [k, st] : fresh) optimizer_->state()[k] = std::move(st);
  pin_offloaded_states();
}

void ZeroOptimizer::sync_master_from_model() {
  at::NoGradGuard no_grad;
  if (offload_) offload_->wait_uploads();
  for (auto& g : groups_)
    if (!g->master_is_shard) g->master.copy_(g->shard);
}

void ZeroOptimizer::visit_memory(MemoryVisitor& visitor) const {
  const bool pinned = offload_ != nullptr;  // pinned host memory exists only beside an accelerator
  // Gradients and buckets live where the model's parameters are.
  bool model_on_device = false;
  for (const auto& g : groups_)
    if (!g->params.empty()) model_on_device = model_on_device || !g->flat.device().is_cpu();
  const int64_t buckets = reducer_->resident_bucket_bytes();
  for (const auto& g : groups_) {
    if (!g->master_is_shard) visitor.visit(MemoryCategory::kMasterWeights, g->master, pinned);
    if (zero_.stage == 2) visitor.visit(MemoryCategory::kGradients, g->grad_shard, false);
  }
  if (zero_.stage == 1 && grads_are_buckets_) {
    visitor.visit_planned(MemoryCategory::kGradients, buckets, model_on_device);  // the buckets are the gradients
  } else {
    if (zero_.stage == 1) {
      int64_t grads = 0;
      for (const auto& g : groups_)
        for (const auto& p : g->params) grads += bytes_of(p);
      visitor.visit_planned(MemoryCategory::kGradients, grads, model_on_device);
    }
    visitor.visit_planned(MemoryCategory::kCommunicationBuffers, buckets, model_on_device);
  }
  visitor.visit(MemoryCategory::kOptimizerStates, optimizer_state_places(*optimizer_, pinned, pinned));
}

}  // namespace booster
