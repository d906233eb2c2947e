// checkpoint.cpp — activation checkpointing (checkpoint.h): a custom autograd node that keeps the
// inputs and the generator states, and recomputes in backward.
#include "booster/nn/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>

#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <utility>

namespace booster::nn {

// tensor_parallel_ops.cpp: the tensor-parallel dropout generator's state (nullopt: not created yet).
std::optional<at::Tensor> tensor_parallel_dropout_rng_state();
void set_tensor_parallel_dropout_rng_state(const std::optional<at::Tensor>& state);

namespace {

// The states of every generator the function may draw from.
struct RngState {
  at::Tensor cpu;
  std::vector<std::pair<at::Device, at::Tensor>> devices;
  std::optional<at::Tensor> tensor_parallel;

  static at::Tensor get(at::Generator g) {
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.get_state();
  }
  static void set(at::Generator g, const at::Tensor& state) {
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
  }

  static RngState capture(const std::vector<at::Device>& devices) {
    RngState s;
    s.cpu = get(at::detail::getDefaultCPUGenerator());
    for (const auto& d : devices) s.devices.emplace_back(d, get(at::globalContext().defaultGenerator(d)));
    s.tensor_parallel = tensor_parallel_dropout_rng_state();
    return s;
  }
  void restore() const {
    set(at::detail::getDefaultCPUGenerator(), cpu);
    for (const auto& [d, state] : devices) set(at::globalContext().defaultGenerator(d), state);
    set_tensor_parallel_dropout_rng_state(tensor_parallel);
  }
};

// Autocast as the forward ran it (CPU and CUDA), re-entered for the recomputation, as
// torch.utils.checkpoint does: the backward pass itself runs outside the trainer's autocast region.
struct AutocastState {
  struct One {
    at::DeviceType device;
    bool enabled;
    at::ScalarType dtype;
  };
  std::vector<One> devices;
  static AutocastState capture() {
    AutocastState s;
    for (at::DeviceType d : {at::kCPU, at::kCUDA})
      s.devices.push_back({d, at::autocast::is_autocast_enabled(d), at::autocast::get_autocast_dtype(d)});
    return s;
  }
  bool any() const {
    for (const auto& d : devices)
      if (d.enabled) return true;
    return false;
  }
  void set() const {
    for (const auto& d : devices) {
      at::autocast::set_autocast_enabled(d.device, d.enabled);
      at::autocast::set_autocast_dtype(d.device, d.dtype);
    }
  }
};

// Sets `state` for its lifetime (the cast cache cleared on leaving a region it opened).
class AutocastScope {
 public:
  explicit AutocastScope(const AutocastState& state) : before_(AutocastState::capture()), opened_(state.any()) {
    state.set();
    if (opened_) at::autocast::increment_nesting();
  }
  ~AutocastScope() {
    if (opened_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    before_.set();
  }
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  AutocastState before_;
  bool opened_;
};

// The accelerator devices of the inputs (their generators are saved besides the CPU one).
std::vector<at::Device> accelerator_devices(const std::vector<at::Tensor>& inputs) {
  std::vector<at::Device> out;
  std::set<std::pair<int, int>> seen;
  for (const auto& t : inputs)
    if (t.defined() && !t.device().is_cpu() && seen.emplace(static_cast<int>(t.device().type()), t.device().index()).second)
      out.push_back(t.device());
  return out;
}

struct CheckpointBackward : torch::autograd::Node {
  CheckpointFunction fn;
  std::vector<at::Tensor> inputs;        // detached, as given
  std::vector<bool> input_needs_grad;    // per input: has an edge
  std::vector<at::Tensor> params;        // those that require grad, in edge order after the inputs
  RngState rng;
  AutocastState autocast;

  std::string name() const override { return "booster::nn::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    // Recompute under the forward's generator states, then give the generators theirs back.
    std::vector<at::Tensor> detached;
    std::vector<at::Tensor> wrt;
    for (size_t i = 0; i < inputs.size(); ++i) {
      at::Tensor x = inputs[i].defined() ? inputs[i].detach() : at::Tensor();
      if (input_needs_grad[i]) {
        x.requires_grad_(true);
        wrt.push_back(x);
      }
      detached.push_back(x);
    }
    for (const auto& p : params) wrt.push_back(p);
    at::Tensor out;
    {
      const RngState now = RngState::capture(accelerator_devices(inputs));
      rng.restore();
      try {
        at::AutoGradMode enable(true);
        AutocastScope scope(autocast);
        out = fn(detached);
      } catch (...) {
        now.restore();
        throw;
      }
      now.restore();
    }
    if (!out.defined() || !out.requires_grad())
      throw std::logic_error("booster::nn::checkpoint: the recomputation's result does not require grad (the "
                             "function is not the one that ran in forward)");
    torch::autograd::variable_list g =
        torch::autograd::grad({out}, wrt, {grads.at(0)}, /*retain_graph=*/false, /*create_graph=*/false,
                              /*allow_unused=*/true);
    // One gradient per edge: the inputs that have one, then the params.
    torch::autograd::variable_list result;
    size_t k = 0;
    for (size_t i = 0; i < inputs.size(); ++i)
      if (input_needs_grad[i]) result.push_back(g[k++]);
    for (size_t i = 0; i < params.size(); ++i) result.push_back(g[k++]);
    return result;
  }
  // Called by the engine after apply unless the backward keeps the graph: a backward with
  // retain_graph (the zbv pipeline's B pass, before its W) leaves the inputs for the next one.
  void release_variables() override {
    inputs.clear();
    params.clear();
  }
};

}  // namespace

at::Tensor checkpoint(CheckpointFunction fn, const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params) {
  bool any = false;
  for (const auto& t : inputs) any = any || (t.defined() && t.requires_grad());
  for (const auto& t : params) any = any || (t.defined() && t.requires_grad());
  if (!at::GradMode::is_enabled() || !any) {
    at::Tensor out = fn(inputs);
    if (!out.defined()) throw std::invalid_argument("booster::nn::checkpoint: the function returned an undefined tensor");
    return out;
  }
  auto node = std::shared_ptr<CheckpointBackward>(new CheckpointBackward(), torch::autograd::deleteNode);
  node->rng = RngState::capture(accelerator_devices(inputs));
  node->autocast = AutocastState::capture();
  std::vector<at::Tensor> detached;
  torch::autograd::edge_list edges;
  for (const auto& t : inputs) {
    const bool needs = t.defined() && t.requires_grad();
    node->input_needs_grad.push_back(needs);
    node->inputs.push_back(t.defined() ? t.detach() : at::Tensor());
    detached.push_back(node->inputs.back());
    if (needs) edges.push_back(torch::autograd::impl::gradient_edge(t));
  }
  for (const auto& p : params)
    if (p.defined() && p.requires_grad()) {
      node->params.push_back(p);
      edges.push_back(torch::autograd::impl::gradient_edge(p));
    }
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = fn(detached);
  }
  if (!out.defined()) throw std::invalid_argument("booster::nn::checkpoint: the function returned an undefined tensor");
  // A result that aliases an input (or a view of one) gets its own storage, so that the edge set on
  // it does not rewrite the input's history.
  for (const auto& t : detached)
    if (t.defined() && out.is_alias_of(t)) {
      out = out.clone();
      break;
    }
  if (out.is_view()) out = out.clone();
  node->fn = std::move(fn);
  node->set_next_edges(std::move(edges));
  torch::autograd::create_gradient_edge(out, node);
  return out;
}

}  // namespace booster::nn
