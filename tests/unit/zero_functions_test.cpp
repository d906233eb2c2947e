// zero_functions_test.cpp — booster::parallel::shard_optimizer_states and shard_gradients (ZeRO-1/2,
// parallel/zero.h) without a plugin, on 2 ranks as threads, against single-process LibTorch on both
// ranks' data: three AdamW steps give the same parameters (fp32, 1e-5 absolute + 1e-5 relative: only
// the order of the gradient sums differs), rank 1 starts from rank 0's weights, and the stage is the
// one asked for.
#include "booster/parallel/zero.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "booster/wrappers/model_wrapper.h"
#include "common/thread_ranks.h"

namespace zero_functions_test {

using Group = std::shared_ptr<booster::dist::ProcessGroup>;

struct NetImpl : torch::nn::Module {
  explicit NetImpl(double shift) {
    fc1 = register_module("fc1", torch::nn::Linear(5, 4));
    fc2 = register_module("fc2", torch::nn::Linear(4, 3));
    torch::NoGradGuard no_grad;
    int k = 0;
    for (auto& p : parameters()) p.copy_(at::cos(at::arange(p.numel(), at::kFloat) * 0.8 + (k++) + shift).reshape(p.sizes()) * 0.5);
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(at::tanh(fc1(x))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Net);

at::Tensor input(int rank, int step) { return at::linspace(-1, 1, 10).reshape({2, 5}) * (rank + 1) - 0.2 * step; }

void check_stage(int stage) {
  Net ref(0.0);
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(0.05));
  for (int step = 0; step < 3; ++step) {
    ref_opt.zero_grad();
    ((ref->forward(input(0, step)).pow(2).sum() + ref->forward(input(1, step)).pow(2).sum()) / 2).backward();
    ref_opt.step();
  }
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) {
    Net net(g->rank() == 0 ? 0.0 : 3.0);
    auto opt = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(0.05));
    booster::ZeroOptions zo;
    zo.reduce_bucket_elements = 16;  // several buckets
    auto zero = stage == 1 ? booster::parallel::shard_optimizer_states(net.ptr(), opt, g, zo)
                           : booster::parallel::shard_gradients(net.ptr(), opt, g, zo);
    ASSERT_TRUE(zero.optimizer);
    EXPECT_EQ(zero.hooks->stats().at("stage"), stage);
    booster::ModelWrapper<NetImpl> model(net.ptr(), zero.hooks);
    for (int step = 0; step < 3; ++step) {
      zero.optimizer->zero_grad();
      zero.hooks->backward(model.forward(input(g->rank(), step)).pow(2).sum());
      zero.optimizer->step();
    }
    const auto want = ref->named_parameters();
    for (const auto& item : net->named_parameters()) {
      SCOPED_TRACE(item.key());
      EXPECT_TRUE(at::allclose(item.value(), want[item.key()], 1e-5, 1e-5));
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(ZeroFunctions, ShardOptimizerStatesOnTwoRanksEqualsSingleProcess) { check_stage(1); }
TEST(ZeroFunctions, ShardGradientsOnTwoRanksEqualsSingleProcess) { check_stage(2); }

TEST(ZeroFunctions, NullArgumentsAreClearErrors) {
  Net net(0.0);
  EXPECT_THAT([&] { booster::parallel::shard_gradients(net.ptr(), nullptr, nullptr); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("ZeRO: the process group is null")));
  EXPECT_THAT([&] { booster::parallel::shard_optimizer_states(nullptr, nullptr, nullptr); },
              ::testing::ThrowsMessage<std::invalid_argument>(::testing::HasSubstr("ZeRO: the model is null")));
}

}  // namespace zero_functions_test
