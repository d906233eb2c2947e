// ddp_test.cpp — the TorchDDP plugin against single-process LibTorch. Each test starts N
// dist_worker processes on 127.0.0.1 (Gloo) and compares what they computed with the same model
// trained in this process on the concatenated batch.
//
// Tolerance: |ddp - reference| <= 1e-5 + 1e-4 * |reference| per element after k steps (fp32; the
// only difference is the order of the gradient sums: per-rank mean, /world_size, allreduce).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "dist/dist_common.h"
#include "dist/dist_test_util.h"

using namespace booster::testing;
using ::testing::HasSubstr;

namespace {

const std::string kTinyBuckets1 = "plugin.bucket_cap_mb=0.000001";
const std::string kTinyBuckets2 = "plugin.first_bucket_mb=0.000001";

}  // namespace

// ---------------------------------------------------------------------------------------------
// Equivalence with single-process training

TEST(TorchDDP, TwoRanksOneBucketEqualsSingleProcess) {
  auto stats = check_train({2, "sgd", {}, 1});
  EXPECT_EQ(stats["buckets"], 1);  // 2.5k parameters: all in the 1 MiB first bucket
}

TEST(TorchDDP, TwoRanksManyBucketsEqualsSingleProcessAndOverlaps) {
  auto stats = check_train({2, "sgd", {kTinyBuckets1, kTinyBuckets2}, 1});
  EXPECT_EQ(stats["buckets"], 8);  // one bucket per parameter (4 weights + 4 biases)
  // Buckets are launched from gradient hooks while backward still runs (overlap): all 8 per step.
  EXPECT_EQ(stats["buckets_launched_during_backward"], 8 * 4);
}

TEST(TorchDDP, FourRanksManyBucketsEqualsSingleProcess) { check_train({4, "sgd", {kTinyBuckets1, kTinyBuckets2}, 1}); }

// The ReorderedMLP registers l4 first but uses it last: its gradients are ready first, so after the
// first iteration the buckets are rebuilt in ready order (stat buckets_rebuilt), on 2 and 3 ranks,
// with gradient_as_bucket_view and with find_unused_parameters + static_graph; training equals
// single-process LibTorch. find_unused_parameters without static_graph keeps the buckets (PyTorch).
TEST(TorchDDP, BucketsAreRebuiltInGradientReadyOrder) {
  torch::manual_seed(7);
  ReorderedMLP net;
  auto opt = make_optimizer("adamw", net->parameters());
  auto batches = make_batches(4, 12, 11);
  for (int s = 0; s < 4; ++s) {
    torch::mse_loss(net->forward(batches.inputs[s]), batches.targets[s]).backward();
    opt->step();
    opt->zero_grad();
  }
  std::vector<torch::Tensor> want;
  for (auto& p : net->parameters()) want.push_back(p.detach().clone());
  struct Case {
    int world;
    std::vector<std::string> sets;
    int64_t rebuilt;
  };
  for (const Case& c : {Case{2, {kTinyBuckets1, kTinyBuckets2}, 1}, Case{3, {kTinyBuckets1, kTinyBuckets2}, 1},
                        Case{2, {kTinyBuckets1, kTinyBuckets2, "plugin.gradient_as_bucket_view=true"}, 1},
                        Case{2, {kTinyBuckets1, "plugin.find_unused_parameters=true", "plugin.static_graph=true"}, 1},
                        Case{2, {kTinyBuckets1, "plugin.find_unused_parameters=true"}, 0}}) {
    TempDir dir;
    std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=4",
                                  "batch=" + std::to_string(12 / c.world), "optimizer=adamw", "model=reordered"};
    for (const auto& s : c.sets) args.push_back("set=" + s);
    auto results = run_workers(c.world, args);
    expect_all_ok(results);
    for (int r = 0; r < c.world; ++r)
      expect_close(load_tensors(dir.file("rank" + std::to_string(r) + ".pt")), want,
                   std::to_string(c.world) + " ranks, rank " + std::to_string(r));
    EXPECT_EQ(load_stats(dir.file("rank0.txt"))["buckets_rebuilt"], c.rebuilt) << c.world << " ranks, " << c.sets.back();
  }
}

TEST(TorchDDP, FourRanksAdamWEqualsSingleProcess) { check_train({4, "adamw", {}, 1}); }

TEST(TorchDDP, GradientAsBucketViewEqualsSingleProcess) {
  check_train({2, "adamw", {"plugin.gradient_as_bucket_view=true", kTinyBuckets1}, 1});
}

TEST(TorchDDP, NoSyncAccumulationOfFourMicroBatchesEqualsOneBigBatch) {
  check_train({2, "sgd", {kTinyBuckets1}, 4});
}

// ---------------------------------------------------------------------------------------------
// Buffers

TEST(TorchDDP, BuffersAreBroadcastFromRankZeroBeforeForward) {
  TempDir dir;
  auto results = run_workers(2, {"scenario=buffers", "out=" + dir.path()});
  expect_all_ok(results);
  auto b0 = load_tensors(dir.file("rank0.pt")), b1 = load_tensors(dir.file("rank1.pt"));
  ASSERT_EQ(b0.size(), 3u);  // running_mean, running_var, num_batches_tracked
  for (size_t i = 0; i < b0.size(); ++i) EXPECT_TRUE(torch::equal(b0[i], b1[i])) << "buffer " << i;
  // Rank 0's drifted running_mean (1.0) went into the momentum update: 0.9 * 1 + 0.1 * batch mean.
  EXPECT_GT(b0[0].min().item<double>(), 0.8);
}

TEST(TorchDDP, BuffersDivergeWithoutBroadcastBuffers) {
  TempDir dir;
  auto results = run_workers(2, {"scenario=buffers", "out=" + dir.path(), "set=plugin.broadcast_buffers=false"});
  expect_all_ok(results);
  auto b0 = load_tensors(dir.file("rank0.pt")), b1 = load_tensors(dir.file("rank1.pt"));
  // running_mean started at 1 on rank 0 and 2 on rank 1: 0.9 apart after one update.
  EXPECT_NEAR((b1[0] - b0[0]).mean().item<double>(), 0.9, 1e-5);
}

// ---------------------------------------------------------------------------------------------
// Unused parameters

TEST(TorchDDP, FindUnusedParametersMatchesMeanOfPerRankLosses) {
  TempDir dir;
  const int64_t steps = 3, batch = 4;
  auto results = run_workers(2, {"scenario=unused", "out=" + dir.path(), "steps=3", "batch=4",
                                 "set=plugin.find_unused_parameters=true"});
  expect_all_ok(results);
  // Reference: the DDP objective is the mean of the ranks' losses; rank 0 uses head_b, rank 1 not.
  torch::manual_seed(7);
  BranchNet net;
  auto opt = make_optimizer("sgd", net->parameters());
  auto batches = make_batches(steps, batch * 2, 13);
  std::vector<torch::Tensor> last_grads;
  for (int64_t s = 0; s < steps; ++s) {
    torch::Tensor loss = torch::zeros({});
    for (int r = 0; r < 2; ++r)
      loss = loss + torch::mse_loss(net->forward(batches.inputs[s].narrow(0, r * batch, batch), r == 0),
                                    batches.targets[s].narrow(0, r * batch, batch)) / 2.0;
    loss.backward();
    if (s + 1 == steps) last_grads = {net->trunk->weight.grad().clone(), net->head_b->weight.grad().clone()};
    opt->step();
    opt->zero_grad();
  }
  std::vector<torch::Tensor> want;
  for (auto& p : net->parameters()) want.push_back(p.detach().clone());
  for (int r = 0; r < 2; ++r) {
    std::string rs = std::to_string(r);
    expect_close(load_tensors(dir.file("rank" + rs + ".pt")), want, "find_unused params, rank " + rs);
    expect_close(load_tensors(dir.file("rank" + rs + "_grads.pt")), last_grads, "find_unused grads, rank " + rs);
    // `never` is unused on every rank: its gradient stays undefined, as in PyTorch.
    EXPECT_EQ(load_stats(dir.file("rank" + rs + ".txt"))["never_grad_defined"], 0);
  }
}

TEST(TorchDDP, UnusedParameterWithoutFindUnusedIsAClearErrorNotAHang) {
  TempDir dir;
  // `never` is unused everywhere and head_b on rank 1: with find_unused_parameters=false every
  // rank must fail (not hang) within the collective timeout (5 s here).
  auto results = run_workers(2, {"scenario=unused", "out=" + dir.path(), "steps=2", "timeout=5"}, 60);
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung";
    EXPECT_NE(results[r].exit_code, 0) << results[r].output;
    EXPECT_LT(results[r].seconds, 30.0);
  }
  EXPECT_THAT(results[1].output, HasSubstr("head_b.weight"));
  EXPECT_THAT(results[1].output, HasSubstr("find_unused_parameters = true"));
}

// ---------------------------------------------------------------------------------------------
// Replica verification

TEST(TorchDDP, DifferentModelsOnRanksAreAClearError) {
  TempDir dir;
  auto results = run_workers(2, {"scenario=mismatch", "out=" + dir.path(), "timeout=20"}, 60);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 3) << results[r].output;
    EXPECT_THAT(results[r].output, HasSubstr("differs between ranks"));
  }
  EXPECT_THAT(results[1].output, HasSubstr("rank 0 has 'l1.weight|Float|32,16', rank 1 has 'l1.weight|Float|16,16'"));
}

// ---------------------------------------------------------------------------------------------
// Gradient clipping by global norm (booster.max_norm) with DDP equals single-process clipping

TEST(TorchDDP, ClipByL2NormOnTwoRanksEqualsSingleProcess) {
  check_train({2, "sgd", {"booster.max_norm=0.05"}, 1, 0.05, 2.0});
}

TEST(TorchDDP, ClipByL2NormOnFourRanksEqualsSingleProcess) {
  check_train({4, "adamw", {"booster.max_norm=0.05", kTinyBuckets1}, 1, 0.05, 2.0});
}

TEST(TorchDDP, ClipByInfNormOnTwoRanksEqualsSingleProcess) {
  check_train({2, "sgd", {"booster.max_norm=0.01", "booster.norm_type=inf"}, 1, 0.01, INFINITY});
}

TEST(TorchDDP, ClipByInfNormOnFourRanksEqualsSingleProcess) {
  check_train({4, "sgd", {"booster.max_norm=0.01", "booster.norm_type=inf"}, 1, 0.01, INFINITY});
}

// ---------------------------------------------------------------------------------------------
// Loss scaling: an overflow on one rank only makes every rank skip the same step

TEST(TorchDDP, OverflowOnOneRankSkipsTheStepEverywhere) { check_overflow({}); }
