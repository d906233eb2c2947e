// split_backward.cpp — B and W over LibTorch's autograd graph (see split_backward.h).
#include "split_backward.h"

#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <stdexcept>
#include <unordered_map>

namespace booster::parallel {

using torch::autograd::Edge;
using torch::autograd::edge_list;
using torch::autograd::Node;
using torch::autograd::variable_list;

struct SplitBackward::Boundary {
  std::shared_ptr<Node> node;
  std::vector<size_t> params;  // indices into params_: those its input-free edges reach
  variable_list grads;         // the gradients that reached the node in B
  bool recorded = false;
};

namespace {

// Records the gradients a boundary node receives the first time it runs (in B); W runs it again.
struct Record : torch::autograd::FunctionPreHook {
  explicit Record(std::weak_ptr<SplitBackward::Boundary> b) : boundary(std::move(b)) {}
  variable_list operator()(const variable_list& grads) override {
    if (auto b = boundary.lock(); b && !b->recorded) {
      b->grads = grads;
      b->recorded = true;
    }
    return grads;
  }
  std::weak_ptr<SplitBackward::Boundary> boundary;
};

bool any_bit(const std::vector<uint64_t>& v) {
  for (uint64_t w : v)
    if (w) return true;
  return false;
}

}  // namespace

SplitBackward::SplitBackward(at::Tensor output, at::Tensor grad_output, at::Tensor input, std::vector<at::Tensor> params)
    : output_(std::move(output)), grad_output_(std::move(grad_output)), input_(std::move(input)) {
  if (!output_.defined() || !output_.requires_grad() || !input_.defined() || !input_.requires_grad())
    throw std::invalid_argument("SplitBackward: the output and the input must require grad");
  for (auto& p : params)
    if (p.defined() && p.requires_grad()) params_.push_back(std::move(p));
  const std::shared_ptr<Node> root = output_.grad_fn();
  if (!root || params_.empty()) return;  // nothing to split: the fallback
  const Node* x_acc = torch::autograd::impl::gradient_edge(input_).function.get();
  std::vector<std::shared_ptr<Node>> accumulators;  // kept alive while the analysis runs
  std::unordered_map<const Node*, size_t> param_of;
  for (size_t i = 0; i < params_.size(); ++i) {
    accumulators.push_back(torch::autograd::impl::grad_accumulator(params_[i]));
    if (accumulators.back()) param_of.emplace(accumulators.back().get(), i);
  }
  const size_t words = (params_.size() + 63) / 64;
  // Per node: whether it reaches the input's accumulator, and the parameters it reaches (bits).
  struct Info {
    bool x = false;
    std::vector<uint64_t> bits;
    std::shared_ptr<Node> node;
  };
  std::unordered_map<const Node*, Info> info;
  std::vector<const Node*> post_order;
  std::vector<std::pair<const Node*, size_t>> stack{{root.get(), 0}};
  info[root.get()].node = root;
  while (!stack.empty()) {
    const Node* n = stack.back().first;
    const edge_list& edges = n->next_edges();
    if (stack.back().second < edges.size()) {
      const Edge& e = edges[stack.back().second++];
      if (e.function && !info.count(e.function.get())) {
        info[e.function.get()].node = e.function;
        stack.emplace_back(e.function.get(), 0);
      }
      continue;
    }
    Info& me = info[n];
    me.bits.assign(words, 0);
    me.x = n == x_acc;
    if (auto it = param_of.find(n); it != param_of.end()) me.bits[it->second / 64] |= uint64_t{1} << (it->second % 64);
    for (const Edge& e : edges) {
      if (!e.function) continue;
      const Info& c = info.at(e.function.get());
      me.x = me.x || c.x;
      for (size_t w = 0; w < words; ++w) me.bits[w] |= c.bits[w];
    }
    post_order.push_back(n);
    stack.pop_back();
  }
  if (!info.at(root.get()).x) return;  // the output does not depend on the input
  // Boundary nodes, root first (a fixed order: the W calls accumulate in it).
  std::vector<std::shared_ptr<Boundary>> boundary;
  for (auto it = post_order.rbegin(); it != post_order.rend(); ++it) {
    const Info& me = info.at(*it);
    if (!me.x) continue;
    std::vector<uint64_t> free_bits(words, 0), dependent_bits(words, 0);
    for (const Edge& e : (*it)->next_edges()) {
      if (!e.function) continue;
      const Info& c = info.at(e.function.get());
      auto& into = c.x ? dependent_bits : free_bits;
      for (size_t w = 0; w < words; ++w) into[w] |= c.bits[w];
    }
    if (!any_bit(free_bits)) continue;
    for (size_t w = 0; w < words; ++w)
      if (free_bits[w] & dependent_bits[w]) return;  // W from this node would count a part twice
    auto b = std::make_shared<Boundary>();
    b->node = me.node;
    for (size_t i = 0; i < params_.size(); ++i)
      if (free_bits[i / 64] >> (i % 64) & 1) b->params.push_back(i);
    boundary.push_back(std::move(b));
  }
  for (const auto& b : boundary) b->node->add_pre_hook(std::make_unique<Record>(b));
  boundary_ = std::move(boundary);
  split_ = true;
}

at::Tensor SplitBackward::input_gradient() {
  if (b_done_ || !output_.defined()) throw std::logic_error("SplitBackward: input_gradient() runs once");
  variable_list grad_outputs;
  if (grad_output_.defined()) grad_outputs.push_back(grad_output_);
  at::Tensor g = torch::autograd::grad({output_}, {input_}, grad_outputs, /*retain_graph=*/true,
                                       /*create_graph=*/false, /*allow_unused=*/true)[0];
  b_done_ = true;
  return g.defined() ? g : at::zeros_like(input_);
}

void SplitBackward::weight_gradients() {
  if (!b_done_ || !output_.defined())
    throw std::logic_error("SplitBackward: weight_gradients() runs once, after input_gradient()");
  if (split_) {
    auto& engine = torch::autograd::Engine::get_default_engine();
    for (const auto& b : boundary_) {
      edge_list roots, outputs;
      variable_list grads;
      for (size_t i = 0; i < b->grads.size(); ++i)
        if (b->grads[i].defined()) {
          roots.emplace_back(b->node, static_cast<uint32_t>(i));
          grads.push_back(b->grads[i]);
        }
      if (roots.empty()) continue;
      for (size_t j : b->params) outputs.push_back(torch::autograd::impl::gradient_edge(params_[j]));
      // The graph is kept: a weight-side node shared by two boundary nodes runs once for each.
      engine.execute(roots, grads, /*keep_graph=*/true, /*create_graph=*/false, /*accumulate_grad=*/true, outputs);
    }
  } else if (!params_.empty()) {
    variable_list grad_outputs;
    if (grad_output_.defined()) grad_outputs.push_back(grad_output_);
    torch::autograd::backward({output_}, grad_outputs, /*retain_graph=*/false, /*create_graph=*/false, params_);
  }
  boundary_.clear();
  output_ = at::Tensor();
  grad_output_ = at::Tensor();
  input_ = at::Tensor();
  params_.clear();
}

}  // namespace booster::parallel
