// split_backward_test.cpp — the zero-bubble backward split (booster/src/parallel/pipeline/split_backward.cpp,
// compiled in): B (input gradient) then W (weight gradients) give the gradients of one whole
// backward, B leaves the weights alone and W the input, the graph is freed after W, and the cases
// that fall back to a whole-backward W (output independent of the input; a parameter reached from
// one node through both kinds of edge) stay exact. Tolerance: equal, or within 1e-6 relative where a
// parameter's gradient is summed from two boundary nodes in another order.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "split_backward.h"

namespace split_backward_test {
namespace {

using booster::parallel::SplitBackward;

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 32));
    fc2 = register_module("fc2", torch::nn::Linear(32, 8));
    fc3 = register_module("fc3", torch::nn::Linear(8, 8));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x + fc2(torch::gelu(fc1(x)));
    return fc3(torch::layer_norm(h, {8}));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};
TORCH_MODULE(Mlp);

struct Result {
  torch::Tensor dx;
  std::vector<torch::Tensor> grads;
  bool split = false;
};

// f(x, params) -> output; the gradients by one backward (split = false) or by B then W.
Result run(const std::function<torch::Tensor(const torch::Tensor&)>& f, const std::vector<torch::Tensor>& params,
           bool use_split, bool scalar_loss) {
  for (auto p : params) p.mutable_grad() = torch::Tensor();
  torch::manual_seed(3);
  auto x = torch::randn({4, 8}).requires_grad_(true);
  auto out = f(x);
  torch::Tensor grad_out;
  if (scalar_loss) out = (out * out).mean();
  else grad_out = torch::randn(out.sizes());
  Result r;
  if (!use_split) {
    if (scalar_loss) out.backward();
    else out.backward(grad_out);
    r.dx = x.grad().defined() ? x.grad() : torch::zeros_like(x);
  } else {
    SplitBackward s(out, grad_out, x, params);
    r.split = s.split();
    r.dx = s.input_gradient();
    for (const auto& p : params) EXPECT_FALSE(p.grad().defined()) << "B must not touch the weights";
    s.weight_gradients();
    EXPECT_FALSE(x.grad().defined()) << "W must not accumulate into the input";
  }
  for (const auto& p : params) r.grads.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
  return r;
}

void expect_same(const Result& a, const Result& b, double rtol) {
  EXPECT_TRUE(torch::allclose(a.dx, b.dx, rtol, 0)) << (a.dx - b.dx).abs().max().item<double>();
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i)
    EXPECT_TRUE(torch::allclose(a.grads[i], b.grads[i], rtol, 0)) << i << ": "
                                                                   << (a.grads[i] - b.grads[i]).abs().max().item<double>();
}

TEST(SplitBackward, MlpGradientsEqualOneBackward) {
  torch::manual_seed(1);
  Mlp mlp;
  auto f = [&](const torch::Tensor& x) { return mlp->forward(x); };
  for (bool scalar : {false, true}) {
    SCOPED_TRACE(scalar ? "scalar loss" : "output gradient");
    Result whole = run(f, mlp->parameters(), false, scalar), split = run(f, mlp->parameters(), true, scalar);
    EXPECT_TRUE(split.split) << "an MLP's weights hang off input-dependent nodes: W must be the split one";
    expect_same(whole, split, 0);
  }
}

TEST(SplitBackward, SharedWeightSideNodeRunsOncePerBoundary) {
  // wt = wᵀ once, used by two matmuls: two boundary nodes share the weight side.
  auto w = torch::randn({8, 8}).requires_grad_(true);
  auto f = [&](const torch::Tensor& x) {
    auto wt = w.t();
    return x.mm(wt) + torch::tanh(x).mm(wt);
  };
  Result whole = run(f, {w}, false, false), split = run(f, {w}, true, false);
  EXPECT_TRUE(split.split);
  expect_same(whole, split, 1e-6);
}

TEST(SplitBackward, FallbacksGiveTheSameGradients) {
  auto w = torch::randn({8}).requires_grad_(true);
  // (x * w) * w: the outer product's node reaches w directly and through x * w.
  auto twice = [&](const torch::Tensor& x) { return (x * w) * w; };
  Result whole = run(twice, {w}, false, false), split = run(twice, {w}, true, false);
  EXPECT_FALSE(split.split);
  expect_same(whole, split, 0);
  // An output that does not depend on the input: its input gradient is zero.
  auto no_input = [&](const torch::Tensor& x) { return (w * 2).expand({4, 8}); };
  whole = run(no_input, {w}, false, false);
  split = run(no_input, {w}, true, false);
  EXPECT_FALSE(split.split);
  expect_same(whole, split, 0);
  EXPECT_EQ(split.dx.abs().sum().item<double>(), 0.0);
}

TEST(SplitBackward, GraphIsFreedAfterW) {
  torch::manual_seed(1);
  Mlp mlp;
  auto x = torch::randn({4, 8}).requires_grad_(true);
  auto out = mlp->forward(x);
  std::weak_ptr<torch::autograd::Node> node = out.grad_fn();
  SplitBackward s(out, torch::ones_like(out), x, mlp->parameters());
  out = torch::Tensor();
  s.input_gradient();
  EXPECT_FALSE(node.expired()) << "B keeps the graph for W";
  s.weight_gradients();
  EXPECT_TRUE(node.expired()) << "W frees the graph";
  EXPECT_THROW(s.weight_gradients(), std::logic_error);
  EXPECT_THROW(SplitBackward(torch::randn({2}), {}, x, {}), std::invalid_argument);
}

}  // namespace
}  // namespace split_backward_test
