// split_backward.h — one model chunk's backward split into B (the input gradient) and W (the weight
// gradients), the two passes the zero-bubble schedules run apart (Qi et al., "Zero Bubble Pipeline
// Parallelism", ICLR 2024, section 2: B needs only the output's gradient, W only B's intermediate
// gradients; the same graph analysis as PyTorch's pipelining stage_backward_input/_weight).
//
// The graph from `output` back to `input` and the parameters is analysed once: the "boundary"
// nodes are those that depend on `input` and have an edge into a part of the graph that does not
// (which leads only to parameters, e.g. a matmul's node for y = x Wᵀ). B runs
// torch::autograd::grad of output w.r.t. input with the graph kept; a pre-hook on every boundary
// node records the gradient that reaches it. W then runs, per boundary node, the engine from that
// node with the recorded gradient, restricted to the parameters its input-free edges reach: it
// evaluates only the weight side of the graph, so B + W cost one ordinary backward.
// Fallback (the same gradients, W then costs a whole backward): when output does not depend on
// input, or a parameter is reached from one boundary node both through its input-free edges and
// through an input-dependent one (which would count that part twice), W runs
// torch::autograd::backward(output, inputs = params) over the kept graph.
// Either way the gradients are those of one torch::autograd::backward of output (the same
// functions; a parameter reached through several boundary nodes sums their parts in its .grad in
// another order: equal up to float rounding).
#pragma once

#include <torch/types.h>

#include <memory>
#include <vector>

namespace booster::parallel {

class SplitBackward {
 public:
  // output: the chunk's output (any shape, floating point) or its scalar loss, requiring grad, on
  // any device; grad_output: d(loss)/d(output), output's shape and dtype (undefined for a scalar
  // loss: 1); input: the chunk's input, a leaf that requires grad; params: the chunk's parameters
  // (those not requiring grad are ignored). Throws std::invalid_argument when output or input does
  // not require grad.
  SplitBackward(at::Tensor output, at::Tensor grad_output, at::Tensor input, std::vector<at::Tensor> params);

  // B: returns d(loss)/d(input) (input's shape; zeros when no gradient flows to it) and keeps the
  // graph and the boundary gradients for W. Call once, before weight_gradients().
  at::Tensor input_gradient();
  // W: accumulates d(loss)/d(param) into every parameter's .grad (as backward() does) and drops the
  // graph, the recorded gradients and the tensors given to the constructor. Call once, after
  // input_gradient(); throws std::logic_error otherwise.
  void weight_gradients();

  // Whether W is the split one (false: the fallback above). For tests and the benchmark's notes.
  bool split() const { return split_; }

  struct Boundary;  // a boundary node and what W needs of it (split_backward.cpp)

 private:
  at::Tensor output_, grad_output_, input_;
  std::vector<at::Tensor> params_;
  std::vector<std::shared_ptr<Boundary>> boundary_;
  bool split_ = false, b_done_ = false;
};

}  // namespace booster::parallel
