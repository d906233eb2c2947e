// replica_test.cpp — keeping replicas identical (booster/core/replica.h) on 2 and 3 ranks as
// threads: sync_replicas copies rank 0's parameters and buffers everywhere, broadcast_coalesced
// handles several dtypes and buckets, allreduce_coalesced sums and averages views, verify_replicas fails on every rank and names the first
// differing parameter, and the named_*_of helpers list what the plugins sync.
#include "booster/core/replica.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "common/thread_ranks.h"

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Group = std::shared_ptr<booster::dist::ProcessGroup>;

// Different values per seed (from a formula: the global RNG is shared by the rank threads); a
// BatchNorm for buffers; one frozen parameter.
struct Net : torch::nn::Module {
  torch::nn::Linear fc{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  at::Tensor frozen;
  explicit Net(uint64_t seed, int64_t width = 4) {
    fc = register_module("fc", torch::nn::Linear(3, width));
    bn = register_module("bn", torch::nn::BatchNorm1d(width));
    frozen = register_parameter("frozen", at::zeros({2}), /*requires_grad=*/false);
    at::NoGradGuard no_grad;
    double k = 1;
    auto fill = [&](at::Tensor t) {
      t.copy_(at::sin(at::arange(t.numel(), at::kFloat) * k++ + static_cast<double>(seed)).reshape(t.sizes()).to(t.dtype()));
    };
    for (auto& p : parameters()) fill(p);
    fill(bn->running_mean);
  }
};

TEST(Replica, SyncCopiesRankZerosParametersAndBuffers) {
  const Net want(100);
  const auto errors = booster::testing::run_thread_ranks(3, [&](const Group& g) {
    Net net(100 + g->rank());  // different on every rank before the sync
    booster::sync_replicas(*g, net);
    for (const auto& [name, t] : booster::named_parameters_of(net, false))
      EXPECT_TRUE(at::equal(t, *want.named_parameters().find(name))) << name;
    for (const auto& [name, t] : booster::named_buffers_of(net))
      EXPECT_TRUE(at::equal(t, *want.named_buffers().find(name))) << name;
  });
  EXPECT_EQ(errors, std::vector<std::string>(3, ""));
}

TEST(Replica, BroadcastCoalescedAcrossDtypesAndBuckets) {
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) {
    const double r = g->rank();
    std::vector<at::Tensor> ts{at::full({5}, r), at::full({3, 2}, r, at::kInt), at::full({7}, r),
                               at::full({1}, r, at::kBFloat16), at::full({4}, r, at::kDouble)};
    booster::broadcast_coalesced(*g, ts, /*root=*/1, /*bucket_bytes=*/24);  // several buffers per dtype
    for (const auto& t : ts) EXPECT_TRUE(t.eq(1).all().item<bool>()) << t.dtype();
    EXPECT_EQ(ts[1].sizes(), (std::vector<int64_t>{3, 2}));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

// allreduce_coalesced on 3 ranks: sums (and averages) tensors of several dtypes and shapes, views
// into a larger tensor included, through several buffers per dtype; the rest of the larger tensor
// is untouched.
TEST(Replica, AllreduceCoalescedSumsAndAveragesViewsAcrossDtypesAndBuckets) {
  const auto errors = booster::testing::run_thread_ranks(3, [&](const Group& g) {
    const double r = g->rank() + 1;  // 1, 2, 3: sum 6, mean 2
    at::Tensor base = at::full({10}, r);
    std::vector<at::Tensor> ts{at::full({5}, r), at::full({3, 2}, r, at::kInt), base.narrow(0, 2, 4),
                               at::full({4}, r, at::kDouble)};
    booster::allreduce_coalesced(*g, ts, /*bucket_bytes=*/24, /*average=*/false);  // several buffers per dtype
    for (const auto& t : ts) EXPECT_TRUE(t.eq(6).all().item<bool>()) << t.dtype() << " " << t;
    EXPECT_EQ(ts[1].sizes(), (std::vector<int64_t>{3, 2}));
    EXPECT_TRUE(base.narrow(0, 0, 2).eq(r).all().item<bool>());
    EXPECT_TRUE(base.narrow(0, 6, 4).eq(r).all().item<bool>());
    std::vector<at::Tensor> avg{at::full({3}, r), at::full({2}, r, at::kDouble)};
    booster::allreduce_coalesced(*g, avg, 1 << 20, /*average=*/true);
    for (const auto& t : avg) EXPECT_TRUE(t.eq(2).all().item<bool>()) << t;
  });
  EXPECT_EQ(errors, std::vector<std::string>(3, ""));
}

TEST(Replica, VerifyNamesTheFirstDifferenceOnEveryRank) {
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) {
    Net net(1, g->rank() == 0 ? 4 : 5);  // rank 1 built a wider layer
    booster::verify_replicas(*g, booster::named_parameters_of(net, false));
  });
  for (const std::string& e : errors) {  // every rank throws, none continues alone
    EXPECT_THAT(e, HasSubstr("the model differs between ranks"));
    EXPECT_THAT(e, HasSubstr("build the same model on every rank"));
  }
  EXPECT_THAT(errors[1], HasSubstr("at parameter #1: rank 0 has 'fc.weight|Float|4,3', rank 1 has "
                                   "'fc.weight|Float|5,3'"));
  // Same shapes, same names: no error.
  EXPECT_EQ(booster::testing::run_thread_ranks(2,
                                               [&](const Group& g) {
                                                 Net net(g->rank());
                                                 booster::verify_replicas(*g, booster::named_parameters_of(net, false));
                                               }),
            std::vector<std::string>(2, ""));
}

TEST(Replica, NamedParametersAndBuffersInRegistrationOrder) {
  Net net(1);
  std::vector<std::string> all, trainable, buffers;
  for (const auto& [n, t] : booster::named_parameters_of(net, false)) all.push_back(n);
  for (const auto& [n, t] : booster::named_parameters_of(net, true)) trainable.push_back(n);
  for (const auto& [n, t] : booster::named_buffers_of(net)) buffers.push_back(n);
  EXPECT_THAT(all, ElementsAre("frozen", "fc.weight", "fc.bias", "bn.weight", "bn.bias"));
  EXPECT_THAT(trainable, ElementsAre("fc.weight", "fc.bias", "bn.weight", "bn.bias"));
  EXPECT_THAT(buffers, ElementsAre("bn.running_mean", "bn.running_var", "bn.num_batches_tracked"));
}

}  // namespace
