// replicate_test.cpp — booster::parallel::replicate without a plugin, on 2 ranks as threads: the
// ranks start from rank 0's weights, gradients are averaged over the ranks (equal to single-process
// LibTorch on both ranks' data within 1e-6), buffers follow rank 0's, no_sync accumulates locally,
// and bad arguments are clear errors.
#include "booster/parallel/replicate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "booster/wrappers/model_wrapper.h"
#include "common/thread_ranks.h"

namespace replicate_test {

using Group = std::shared_ptr<booster::dist::ProcessGroup>;

struct NetImpl : torch::nn::Module {
  explicit NetImpl(double shift) {
    fc1 = register_module("fc1", torch::nn::Linear(4, 3));
    bn = register_module("bn", torch::nn::BatchNorm1d(3));
    fc2 = register_module("fc2", torch::nn::Linear(3, 2));
    torch::NoGradGuard no_grad;
    int k = 0;
    for (auto& p : parameters()) p.copy_(at::cos(at::arange(p.numel(), at::kFloat) * 0.7 + (k++) + shift).reshape(p.sizes()));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(at::tanh(bn(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

at::Tensor input(int rank) { return at::linspace(-1, 1, 12).reshape({3, 4}) * (rank + 1); }

TEST(Replicate, GradientsAreTheAverageOverRanksStartingFromRankZerosWeights) {
  // Reference: rank 0's initial weights, the mean of the two ranks' losses in one process.
  Net ref(0.0);
  ref->train();
  at::Tensor ref_loss = (ref->forward(input(0)).pow(2).sum() + ref->forward(input(1)).pow(2).sum()) / 2;
  ref_loss.backward();
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) {
    Net net(g->rank() == 0 ? 0.0 : 5.0);  // rank 1 starts elsewhere: replicate makes it rank 0's
    auto hooks = booster::parallel::replicate(net.ptr(), g);
    booster::ModelWrapper<NetImpl> model(net.ptr(), hooks);
    net->train();
    at::Tensor loss = model.forward(input(g->rank())).pow(2).sum();
    hooks->backward(loss);
    const auto mine = net->named_parameters();
    const auto want = ref->named_parameters();
    for (const auto& item : mine) {
      SCOPED_TRACE(item.key());
      EXPECT_TRUE(at::allclose(item.value().grad(), want[item.key()].grad(), 1e-6, 1e-6));
    }
    EXPECT_GE(hooks->stats().at("buckets"), 1);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(Replicate, BuffersFollowRankZeroAndNoSyncAccumulatesLocally) {
  const auto errors = booster::testing::run_thread_ranks(2, [](const Group& g) {
    Net net(0.0);
    auto hooks = booster::parallel::replicate(net.ptr(), g);
    booster::ModelWrapper<NetImpl> model(net.ptr(), hooks);
    net->train();
    {
      torch::NoGradGuard no_grad;
      net->bn->running_mean.fill_(static_cast<float>(g->rank() + 1));  // rank 1's drifted
    }
    hooks->set_require_grad_sync(false);
    hooks->backward(model.forward(input(g->rank())).pow(2).sum());
    // The forward broadcast rank 0's running mean (1) first, then updated it with this rank's batch.
    Net local(0.0);
    local->train();
    {
      torch::NoGradGuard no_grad;
      local->bn->running_mean.fill_(1.0f);
    }
    local->forward(input(g->rank())).pow(2).sum().backward();
    EXPECT_TRUE(at::allclose(net->bn->running_mean, local->bn->running_mean, 1e-6, 1e-6));
    // no_sync: this rank's own gradient, not the average.
    EXPECT_TRUE(at::allclose(net->fc1->weight.grad(), local->fc1->weight.grad(), 1e-6, 1e-6));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(Replicate, NullArgumentsAreClearErrors) {
  const auto errors = booster::testing::run_thread_ranks(1, [](const Group& g) {
    EXPECT_THAT([&] { booster::parallel::replicate(nullptr, g); },
                ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("replicate: the model is null")));
    Net net(0.0);
    EXPECT_THAT([&] { booster::parallel::replicate(net.ptr(), nullptr); },
                ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("process group is null")));
    auto hooks = booster::parallel::replicate(net.ptr(), g);
    EXPECT_EQ(hooks->stats().at("buckets"), 0);  // one rank: nothing to reduce
  });
  EXPECT_EQ(errors, std::vector<std::string>(1, ""));
}

}  // namespace replicate_test
