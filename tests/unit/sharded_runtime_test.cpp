// sharded_runtime_test.cpp — the sharded runtime (booster/parallel/sharded_runtime.h) under a small
// test policy on 2 ranks as threads: the hooks it calls and in what order, gradients reduced once per
// FlatParameter equal to the average of the ranks' gradients, a unit run twice reduced at the end of
// backward, no_sync, frozen parameters without hooks, and the errors it throws.
#include "booster/parallel/sharded_runtime.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/thread_ranks.h"

namespace sharded_runtime_test {

using booster::FlatParameter;
using booster::parallel::ShardedFlat;
using booster::parallel::ShardedRuntime;
using Group = std::shared_ptr<booster::dist::ProcessGroup>;
using Layer = booster::nn::Unit<torch::nn::Linear>;

// Two units and a root parameter; values from a formula (the global RNG is shared by the threads).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", Layer(4, 3));
    b = register_module("b", Layer(3, 2));
    scale = register_parameter("scale", torch::ones({2}));
    torch::NoGradGuard no_grad;
    int k = 0;
    for (auto& p : parameters()) p.copy_(at::sin(at::arange(p.numel(), at::kFloat) + (k++)).reshape(p.sizes()) * 0.5);
  }
  // `twice`: b runs a second time on its own output's first columns.
  at::Tensor forward(const at::Tensor& x, bool twice = false) {
    at::Tensor h = b(at::tanh(a(x)));
    if (twice) h = h + b(at::cat({h, h.narrow(1, 0, 1)}, 1));
    return h * scale;
  }
  Layer a{nullptr}, b{nullptr};
  at::Tensor scale;
};
TORCH_MODULE(Net);

// One FlatParameter per unit (root included); gathers before a unit runs, frees after, reduces when
// the gradients are ready; records every hook as a string.
class TestPolicy : public ShardedRuntime {
 public:
  TestPolicy(torch::nn::Module& model, torch::optim::Optimizer* optimizer, Group group)
      : ShardedRuntime(model, optimizer, "test_policy") {
    std::vector<ShardedFlat> flats;
    for (size_t u = 0; u < unit_params_.size(); ++u) {
      ShardedFlat s;
      s.group = group_of(unit_params_[u].front().second);
      s.flat = std::make_unique<FlatParameter>(unit_params_[u], group);
      flats.push_back(std::move(s));
    }
    set_flats(std::move(flats));
  }
  std::vector<std::string> log;
  std::vector<size_t> forward_order() const { return forward_order_; }

 private:
  void on_begin_forward() override { log.push_back("begin"); gather(0); }
  void on_pre_forward(size_t u) override { log.push_back("pre_forward " + std::to_string(u)); gather(u); }
  void on_post_forward(size_t u) override { log.push_back("post_forward " + std::to_string(u)); }
  void on_forward_without_backward() override { log.push_back("eval_end"); release_all(); }
  void on_pre_backward(size_t u) override { log.push_back("pre_backward " + std::to_string(u)); gather(u); }
  void on_gradients_ready(size_t f) override {
    log.push_back("ready " + std::to_string(f));
    if (forward_calls_[flats_[f].units.front()] <= 1) reduce(f);
  }
  void on_finish_backward() override { log.push_back("finish"); release_all(); }
};

std::vector<std::string> without_forward(const std::vector<std::string>& log) {
  std::vector<std::string> out;
  for (const auto& e : log)
    if (e.rfind("ready", 0) == 0 || e.rfind("finish", 0) == 0 || e.rfind("pre_backward", 0) == 0) out.push_back(e);
  return out;
}

// The average over ranks r = 0, 1 of the gradient of the loss at input (r + 1) * x.
std::vector<at::Tensor> reference_gradients(bool twice) {
  std::vector<at::Tensor> sum;
  for (int r = 0; r < 2; ++r) {
    Net net;
    const at::Tensor x = at::linspace(-1, 1, 8).reshape({2, 4}) * (r + 1);
    net->forward(x, twice).pow(2).sum().backward();
    const auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      if (sum.size() <= i) sum.push_back(at::zeros_like(params[i]));
      sum[i] += params[i].grad() / 2;
    }
  }
  return sum;
}

// Each flat's reduced shard equals its piece of the reference (padding is zero).
void expect_reduced_equal(TestPolicy& rt, Net& net, const std::vector<at::Tensor>& want, int rank) {
  std::map<const void*, at::Tensor> by_param;
  const auto params = net->parameters();
  for (size_t i = 0; i < params.size(); ++i) by_param[params[i].unsafeGetTensorImpl()] = want[i];
  for (auto& s : rt.flats()) {
    const auto& l = s.flat->layout();
    std::vector<at::Tensor> parts;
    for (const auto& [name, p] : s.flat->params()) parts.push_back(by_param.at(p.unsafeGetTensorImpl()).reshape({-1}));
    at::Tensor full = at::cat({at::cat(parts), at::zeros({l.padded_numel - l.numel})});
    ASSERT_TRUE(s.flat->local_grad().defined());
    EXPECT_TRUE(at::allclose(s.flat->local_grad(), full.narrow(0, l.shard_begin(rank), l.shard_numel), 1e-5, 1e-6));
  }
}

TEST(ShardedRuntime, HooksRunInOrderAndEachFlatIsReducedOnceToTheAverage) {
  const auto errors = booster::testing::run_thread_ranks(2, [](const Group& g) {
    Net net;
    auto rt = std::make_shared<TestPolicy>(*net, nullptr, g);
    rt->install();
    ASSERT_EQ(rt->flats().size(), 3u);  // root (scale), a, b
    EXPECT_EQ(rt->flats()[1].units, std::vector<size_t>{1});
    rt->begin_forward();
    at::Tensor loss = net->forward(at::linspace(-1, 1, 8).reshape({2, 4}) * (g->rank() + 1)).pow(2).sum();
    rt->end_forward();
    EXPECT_EQ(rt->log, (std::vector<std::string>{"begin", "pre_forward 1", "post_forward 1", "pre_forward 2",
                                                  "post_forward 2"}));
    EXPECT_EQ(rt->forward_order(), (std::vector<size_t>{1, 2}));
    loss.backward();
    // b's gradients arrive before a's; the root's scale first of all.
    EXPECT_EQ(without_forward(rt->log), (std::vector<std::string>{"ready 0", "pre_backward 2", "ready 2", "pre_backward 1",
                                                                   "ready 1", "finish"}));
    EXPECT_EQ(rt->stats().at("reduce_scatters"), 3);
    EXPECT_EQ(rt->stats().at("units"), 3);
    expect_reduced_equal(*rt, net, reference_gradients(false), g->rank());
    for (auto& s : rt->flats()) EXPECT_EQ(s.flat->state(), FlatParameter::State::kSharded);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(ShardedRuntime, AUnitRunTwiceIsReducedAtTheEndOfBackward) {
  const auto errors = booster::testing::run_thread_ranks(2, [](const Group& g) {
    Net net;
    auto rt = std::make_shared<TestPolicy>(*net, nullptr, g);
    rt->install();
    rt->begin_forward();
    at::Tensor loss = net->forward(at::linspace(-1, 1, 8).reshape({2, 4}) * (g->rank() + 1), true).pow(2).sum();
    rt->end_forward();
    loss.backward();
    // b's flat (2) was ready after its first backward pass but is left to the final callback, which
    // reduces it with both passes' gradients.
    EXPECT_EQ(rt->stats().at("reduce_scatters"), 3);
    expect_reduced_equal(*rt, net, reference_gradients(true), g->rank());
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(ShardedRuntime, NoSyncReducesNothingAndEvaluationEndsTheIteration) {
  const auto errors = booster::testing::run_thread_ranks(2, [](const Group& g) {
    Net net;
    auto rt = std::make_shared<TestPolicy>(*net, nullptr, g);
    rt->install();
    rt->set_require_grad_sync(false);
    rt->begin_forward();
    at::Tensor loss = net->forward(at::linspace(-1, 1, 8).reshape({2, 4})).pow(2).sum();
    rt->end_forward();
    loss.backward();
    EXPECT_EQ(rt->stats().at("reduce_scatters"), 0);
    EXPECT_TRUE(net->scale.grad().defined());  // accumulated locally
    rt->log.clear();
    {
      torch::NoGradGuard no_grad;
      rt->begin_forward();
      net->forward(at::ones({1, 4}));
      rt->end_forward();
    }
    EXPECT_EQ(rt->log.back(), "eval_end");
    for (auto& s : rt->flats()) EXPECT_EQ(s.flat->state(), FlatParameter::State::kSharded);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(ShardedRuntime, FrozenParametersGetNoHookAndGroupsComeFromTheOptimizer) {
  const auto errors = booster::testing::run_thread_ranks(2, [](const Group& g) {
    Net net;
    net->a->weight.requires_grad_(false);
    net->a->bias.requires_grad_(false);
    torch::optim::SGD sgd({net->b->weight, net->b->bias}, 0.1);
    sgd.add_param_group(torch::optim::OptimizerParamGroup({net->scale}));
    auto rt = std::make_shared<TestPolicy>(*net, &sgd, g);
    rt->install();
    EXPECT_EQ(rt->flats()[0].group, 1);  // scale
    EXPECT_EQ(rt->flats()[1].group, -1);  // a: frozen
    EXPECT_EQ(rt->flats()[2].group, 0);
    rt->begin_forward();
    at::Tensor loss = net->forward(at::linspace(-1, 1, 8).reshape({2, 4})).pow(2).sum();
    rt->end_forward();
    loss.backward();
    // a's output needs no gradient (frozen weights, an input without one): no pre_backward for it.
    EXPECT_EQ(without_forward(rt->log), (std::vector<std::string>{"ready 0", "pre_backward 2", "ready 2", "finish"}));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(ShardedRuntime, BadModelsAndOptimizersAreClearErrors) {
  const auto errors = booster::testing::run_thread_ranks(1, [](const Group& g) {
    Net net, other;
    torch::optim::SGD foreign(other->parameters(), 0.1);
    EXPECT_THAT([&] { (void)std::make_shared<TestPolicy>(*net, &foreign, g); },
                ::testing::ThrowsMessage<std::invalid_argument>(::testing::AllOf(
                    ::testing::HasSubstr("test_policy"), ::testing::HasSubstr("is not a parameter of the model"))));
    torch::optim::SGD partial({net->b->weight}, 0.1);
    EXPECT_THAT([&] { (void)std::make_shared<TestPolicy>(*net, &partial, g); },
                ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr(
                    "parameter scale requires grad but is not in the optimizer")));
    auto rt = std::make_shared<TestPolicy>(*net, nullptr, g);
    rt->install();
    EXPECT_THAT([&] { rt->pre_forward(*other->a); },
                ::testing::ThrowsMessage<std::logic_error>(::testing::HasSubstr("was not in the model at boost() time")));
  });
  EXPECT_EQ(errors, std::vector<std::string>(1, ""));
}

}  // namespace sharded_runtime_test
