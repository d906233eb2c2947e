// grad_reducer_test.cpp — the bucketed gradient reducer (booster/core/grad_reducer.h) on 2 ranks as
// threads: averaged gradients equal the mean of the per-rank gradients computed without it, bucket
// layout and launch counters, no_sync accumulation (parameters used only inside no_sync are averaged
// too), sync_now outside backward, unused parameters, and argument errors.
// Whole-plugin equivalence with separate processes is tests/dist/ddp_test.cpp.
#include "booster/core/grad_reducer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "booster/core/replica.h"
#include "common/thread_ranks.h"

namespace {

using booster::GradientReducer;
using booster::ReducerOptions;
using ::testing::HasSubstr;

// Same initial weights on every rank, from a formula (the global RNG is shared by the rank threads),
// registration order fc1.weight, fc1.bias, fc2.*, fc3.*.
struct Mlp : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  Mlp() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 5));
    fc3 = register_module("fc3", torch::nn::Linear(5, 3));
    at::NoGradGuard no_grad;
    double k = 1;
    for (auto& p : parameters()) p.copy_(at::sin(at::arange(p.numel(), at::kFloat) * k++).reshape(p.sizes()) * 0.5);
  }
  at::Tensor forward(const at::Tensor& x, bool use_fc2 = true) {
    at::Tensor h = torch::relu(fc1->forward(x));
    if (use_fc2) return fc3->forward(torch::tanh(fc2->forward(h)));
    return fc3->forward(h.narrow(1, 0, 5));
  }
};

at::Tensor batch_of(int rank, int step) {
  return at::linspace(-1, 1, 4 * 6).reshape({4, 6}) * (rank + 1) + 0.1 * step;
}

// The gradients rank `rank` computes alone, accumulated over `steps` backward passes.
std::map<std::string, at::Tensor> local_gradients(int rank, int steps, bool use_fc2 = true) {
  auto net = std::make_shared<Mlp>();
  for (int s = 0; s < steps; ++s) net->forward(batch_of(rank, s), use_fc2).pow(2).sum().backward();
  std::map<std::string, at::Tensor> out;
  for (const auto& item : net->named_parameters())
    out[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : at::Tensor();
  return out;
}

// Mean over ranks of local_gradients: what DDP must produce.
std::map<std::string, at::Tensor> mean_gradients(int world, int steps, bool use_fc2 = true) {
  std::map<std::string, at::Tensor> sum;
  for (int r = 0; r < world; ++r)
    for (auto& [name, g] : local_gradients(r, steps, use_fc2)) {
      at::Tensor v = g.defined() ? g : at::Tensor();
      if (!v.defined()) continue;
      sum[name] = sum.count(name) ? sum[name] + v : v;
    }
  for (auto& [name, g] : sum) g = g / world;
  return sum;
}

ReducerOptions tiny_buckets() {
  ReducerOptions o;
  o.bucket_cap_bytes = 64;  // a few parameters per bucket
  o.first_bucket_bytes = 16;
  return o;
}

void expect_gradients(const Mlp& net, const std::map<std::string, at::Tensor>& want, double tol = 1e-6) {
  for (const auto& item : net.named_parameters()) {
    ASSERT_TRUE(want.count(item.key())) << item.key();
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_TRUE(at::allclose(item.value().grad(), want.at(item.key()), tol, tol))
        << item.key() << " max |diff| " << (item.value().grad() - want.at(item.key())).abs().max().item<double>();
  }
}

TEST(GradientReducer, AveragesLikeTheMeanOfLocalGradientsWithOverlap) {
  const auto want = mean_gradients(2, 1);
  std::vector<std::map<std::string, int64_t>> stats(2);
  std::vector<std::vector<std::vector<size_t>>> buckets(2);
  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    auto& g = *group;
    auto net = std::make_shared<Mlp>();
    GradientReducer reducer(booster::named_parameters_of(*net, true), group, tiny_buckets());
    net->forward(batch_of(g.rank(), 0)).pow(2).sum().backward();  // synced when backward returns
    expect_gradients(*net, want);
    stats[g.rank()] = reducer.stats();
    buckets[g.rank()] = reducer.bucket_indices();
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
  EXPECT_EQ(buckets[0], buckets[1]);
  ASSERT_GE(buckets[0].size(), 3u);
  EXPECT_EQ(buckets[0].front().back(), 5u) << "bucket 0 holds the last-registered parameter (fc3.bias)";
  EXPECT_EQ(stats[0].at("buckets"), static_cast<int64_t>(buckets[0].size()));
  EXPECT_GT(stats[0].at("buckets_launched_during_backward"), 0) << "buckets launched while backward ran";
}

// A model whose gradient-ready order differs from registration order: `late` is registered first
// but runs last, so its gradients are ready first. With rebuild_buckets, after the first synced
// backward the buckets follow the ready order (rank 0's, broadcast): bucket 0 then holds late.*,
// and the gradients stay equal to the reference (with and without gradient_as_bucket_view, and
// with no_sync accumulation across the rebuild).
struct Reordered : torch::nn::Module {
  torch::nn::Linear late{nullptr}, early{nullptr}, mid{nullptr};
  Reordered() {
    late = register_module("late", torch::nn::Linear(5, 3));  // used last: ready first
    early = register_module("early", torch::nn::Linear(6, 8));  // used first: ready last
    mid = register_module("mid", torch::nn::Linear(8, 5));
    at::NoGradGuard no_grad;
    double k = 1;
    for (auto& p : parameters()) p.copy_(at::sin(at::arange(p.numel(), at::kFloat) * k++).reshape(p.sizes()) * 0.5);
  }
  at::Tensor forward(const at::Tensor& x) { return late->forward(torch::tanh(mid->forward(torch::relu(early->forward(x))))); }
};

TEST(GradientReducer, RebuildsBucketsInGradientReadyOrderOnce) {
  for (bool as_view : {false, true}) {
    // Reference: per-rank gradients of 3 steps' losses averaged, computed without the reducer.
    std::map<std::string, at::Tensor> want;
    for (int r = 0; r < 2; ++r) {
      auto net = std::make_shared<Reordered>();
      for (int step = 0; step < 3; ++step) net->forward(batch_of(r, step)).pow(2).sum().backward();
      for (const auto& item : net->named_parameters())
        want[item.key()] = want.count(item.key()) ? want[item.key()] + item.value().grad() / 2 : item.value().grad() / 2;
    }
    std::vector<std::vector<std::vector<size_t>>> before(2), after(2);
    std::vector<std::map<std::string, int64_t>> stats(2);
    auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
      auto net = std::make_shared<Reordered>();
      ReducerOptions o = tiny_buckets();
      o.rebuild_buckets = true;
      o.gradient_as_bucket_view = as_view;
      GradientReducer reducer(booster::named_parameters_of(*net, true), group, o);
      before[group->rank()] = reducer.bucket_indices();
      // Step 0 synced (the rebuild follows it), step 1 inside no_sync, step 2 synced: gradients
      // accumulate across the rebuild.
      net->forward(batch_of(group->rank(), 0)).pow(2).sum().backward();
      after[group->rank()] = reducer.bucket_indices();
      reducer.set_require_grad_sync(false);
      net->forward(batch_of(group->rank(), 1)).pow(2).sum().backward();
      reducer.set_require_grad_sync(true);
      net->forward(batch_of(group->rank(), 2)).pow(2).sum().backward();
      for (const auto& item : net->named_parameters())
        EXPECT_TRUE(at::allclose(item.value().grad(), want.at(item.key()), 1e-5, 1e-6))
            << item.key() << " (gradient_as_bucket_view " << as_view << ")";
      EXPECT_EQ(reducer.bucket_indices(), after[group->rank()]) << "rebuilt once only";
      stats[group->rank()] = reducer.stats();
    });
    EXPECT_EQ(errors, std::vector<std::string>(2, ""));
    EXPECT_EQ(after[0], after[1]);
    EXPECT_NE(before[0], after[0]) << "the ready order differs from the registration order";
    // Registration: late.weight 0, late.bias 1, early.weight 2, early.bias 3, mid.weight 4, mid.bias 5.
    // Before: reverse registration, so bucket 0 starts with mid.bias (5). After: late's gradients are
    // ready first, so bucket 0 holds late.* (0, 1).
    EXPECT_EQ(before[0].front().back(), 5u);
    EXPECT_THAT(after[0].front(), ::testing::ElementsAre(0u, 1u));
    EXPECT_EQ(stats[0].at("buckets_rebuilt"), 1);
  }
}

TEST(GradientReducer, NoSyncAccumulatesLocallyThenAveragesTheSum) {
  const auto want = mean_gradients(2, 3);  // 3 micro-batches: gradient of the sum, averaged once
  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    auto& g = *group;
    auto net = std::make_shared<Mlp>();
    GradientReducer reducer(booster::named_parameters_of(*net, true), group, tiny_buckets());
    reducer.set_require_grad_sync(false);
    for (int s = 0; s < 2; ++s) net->forward(batch_of(g.rank(), s)).pow(2).sum().backward();
    const auto local = local_gradients(g.rank(), 2);  // unsynchronised: this rank's own sum
    for (const auto& item : net->named_parameters())
      EXPECT_TRUE(at::allclose(item.value().grad(), local.at(item.key()), 1e-6, 1e-6)) << item.key();
    reducer.set_require_grad_sync(true);
    net->forward(batch_of(g.rank(), 2)).pow(2).sum().backward();
    expect_gradients(*net, want);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(GradientReducer, UnusedParametersContributeZerosOrFailNamingThem) {
  // Rank 1 skips fc2: with find_unused_parameters its fc2 gradient counts as zeros.
  std::map<std::string, at::Tensor> want;
  {
    auto g0 = local_gradients(0, 1, true), g1 = local_gradients(1, 1, false);
    for (auto& [name, g] : g0) want[name] = (g + (g1[name].defined() ? g1[name] : at::zeros_like(g))) / 2;
  }
  ReducerOptions o = tiny_buckets();
  o.find_unused_parameters = true;
  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    auto& g = *group;
    auto net = std::make_shared<Mlp>();
    GradientReducer reducer(booster::named_parameters_of(*net, true), group, o);
    net->forward(batch_of(g.rank(), 0), /*use_fc2=*/g.rank() == 0).pow(2).sum().backward();
    expect_gradients(*net, want);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));

  // Without it, the rank that skipped fc2 fails naming the parameter (and its peer fails too).
  errors = booster::testing::run_thread_ranks(
      2,
      [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    auto& g = *group;
        auto net = std::make_shared<Mlp>();
        GradientReducer reducer(booster::named_parameters_of(*net, true), group, tiny_buckets());
        net->forward(batch_of(g.rank(), 0), g.rank() == 0).pow(2).sum().backward();
      },
      /*timeout_s=*/5);
  EXPECT_THAT(errors[1], HasSubstr("fc2."));
  EXPECT_THAT(errors[1], HasSubstr("find_unused_parameters"));
  EXPECT_NE(errors[0], "") << "rank 0 must not continue alone";
}

// fc2 gets gradients only in the no_sync pass, none in the synced one (on both ranks): it still
// counts as used (PyTorch's local_used_map_ records no_sync passes), so its accumulated gradient is
// averaged, not left as each rank's own.
TEST(GradientReducer, ParametersUsedOnlyInsideNoSyncAreAveragedAtTheSyncedPass) {
  auto two_passes = [](int rank) {
    auto net = std::make_shared<Mlp>();
    net->forward(batch_of(rank, 0), true).pow(2).sum().backward();
    net->forward(batch_of(rank, 1), false).pow(2).sum().backward();
    std::map<std::string, at::Tensor> out;
    for (const auto& item : net->named_parameters()) out[item.key()] = item.value().grad().clone();
    return out;
  };
  std::map<std::string, at::Tensor> want = two_passes(0);
  for (auto& [name, g] : two_passes(1)) want[name] = (want[name] + g) / 2;
  ReducerOptions o = tiny_buckets();
  o.find_unused_parameters = true;
  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    auto& g = *group;
    auto net = std::make_shared<Mlp>();
    GradientReducer reducer(booster::named_parameters_of(*net, true), group, o);
    reducer.set_require_grad_sync(false);
    net->forward(batch_of(g.rank(), 0), true).pow(2).sum().backward();
    reducer.set_require_grad_sync(true);
    net->forward(batch_of(g.rank(), 1), false).pow(2).sum().backward();
    expect_gradients(*net, want);
    EXPECT_EQ(reducer.synced_backwards(), 1);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

// sync_now: a synced pass with no backward (a pipeline whose last backward reached none of this
// rank's parameters) averages what was accumulated; refused inside no_sync.
TEST(GradientReducer, SyncNowAveragesTheAccumulatedGradientsOutsideBackward) {
  const auto want = mean_gradients(2, 2);
  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    auto& g = *group;
    auto net = std::make_shared<Mlp>();
    GradientReducer reducer(booster::named_parameters_of(*net, true), group, tiny_buckets());
    reducer.set_require_grad_sync(false);
    for (int s = 0; s < 2; ++s) net->forward(batch_of(g.rank(), s)).pow(2).sum().backward();
    EXPECT_THROW(reducer.sync_now(), std::logic_error);
    reducer.set_require_grad_sync(true);
    EXPECT_EQ(reducer.synced_backwards(), 0);
    reducer.sync_now();
    expect_gradients(*net, want);
    EXPECT_EQ(reducer.synced_backwards(), 1);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(GradientReducer, RejectsBadArguments) {
  auto errors = booster::testing::run_thread_ranks(1, [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    auto& g = *group;
    auto net = std::make_shared<Mlp>();
    ReducerOptions bad;
    bad.bucket_cap_bytes = 0;
    EXPECT_THROW(GradientReducer(booster::named_parameters_of(*net, true), group, bad),
                 std::invalid_argument);
    at::Tensor non_leaf = net->fc1->weight * 2;
    EXPECT_THROW(GradientReducer({{"w2", non_leaf}}, group, ReducerOptions{}), std::invalid_argument);
    EXPECT_THROW(GradientReducer({{"u", at::Tensor()}}, group, ReducerOptions{}),
                 std::invalid_argument);
  });
  EXPECT_EQ(errors, std::vector<std::string>(1, ""));
}

}  // namespace
