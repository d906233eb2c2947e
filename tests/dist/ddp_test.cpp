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

// Single-process reference: the MLP trained on the whole global batch of each step.
// With max_norm > 0 the gradients are clipped with torch::nn::utils::clip_grad_norm_ and its
// returned norms collected in *norms.
std::vector<torch::Tensor> reference_mlp(int64_t steps, int64_t global_batch, const std::string& optimizer,
                                         double max_norm = 0, double norm_type = 2.0,
                                         std::vector<double>* norms = nullptr) {
  torch::manual_seed(7);
  MLP net;
  auto opt = make_optimizer(optimizer, net->parameters());
  auto batches = make_batches(steps, global_batch, 11);
  for (int64_t s = 0; s < steps; ++s) {
    auto loss = torch::mse_loss(net->forward(batches.inputs[s]), batches.targets[s]);
    loss.backward();
    if (max_norm > 0) {
      double n = torch::nn::utils::clip_grad_norm_(net->parameters(), max_norm, norm_type);
      if (norms) norms->push_back(n);
    }
    opt->step();
    opt->zero_grad();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

struct TrainCase {
  int world;
  std::string optimizer;
  std::vector<std::string> sets;
  int64_t accum;
  double max_norm = 0;  // also pass "booster.max_norm=..." in sets
  double norm_type = 2.0;
};

// Runs the "train" scenario and checks every rank against the reference; returns rank 0's stats.
std::map<std::string, int64_t> check_train(const TrainCase& c) {
  TempDir dir;
  const int64_t steps = 4, batch = 4;
  std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=" + std::to_string(steps),
                                "batch=" + std::to_string(batch), "accum=" + std::to_string(c.accum),
                                "optimizer=" + c.optimizer};
  for (const auto& s : c.sets) args.push_back("set=" + s);
  auto results = run_workers(c.world, args);
  expect_all_ok(results);
  std::vector<double> norms;
  auto want = reference_mlp(steps, batch * c.world * c.accum, c.optimizer, c.max_norm, c.norm_type, &norms);
  for (int r = 0; r < c.world; ++r) {
    std::string rs = std::to_string(r);
    expect_close(load_tensors(dir.file("rank" + rs + ".pt")), want, std::to_string(c.world) + " ranks, rank " + rs);
    if (c.max_norm > 0) {
      // The reported global norm equals clip_grad_norm_'s on the full batch (float32 there, float64 here).
      auto got = load_tensors(dir.file("rank" + rs + "_norms.pt"))[0];
      EXPECT_EQ(got.numel(), static_cast<int64_t>(norms.size()));
      if (got.numel() != static_cast<int64_t>(norms.size())) continue;
      for (size_t s = 0; s < norms.size(); ++s) {
        EXPECT_NEAR(got[s].item<double>(), norms[s], 1e-5 * norms[s]) << "step " << s;
        EXPECT_GT(norms[s], c.max_norm) << "the test should make clipping active";
      }
    }
  }
  return load_stats(dir.file("rank0.txt"));
}

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

TEST(TorchDDP, OverflowOnOneRankSkipsTheStepEverywhere) {
  TempDir dir;
  const int64_t steps = 4, batch = 4;
  auto results = run_workers(2, {"scenario=overflow", "out=" + dir.path(), "steps=4", "batch=4", "bad_step=1",
                                 "bad_rank=1"});
  expect_all_ok(results);
  // Reference: plain SGD on the full batch that skips step 1 (power-of-two loss scales are exact).
  torch::manual_seed(7);
  MLP net;
  auto opt = make_optimizer("sgd", net->parameters());
  auto batches = make_batches(steps, batch * 2, 11);
  std::vector<std::vector<torch::Tensor>> want;
  for (int64_t s = 0; s < steps; ++s) {
    torch::mse_loss(net->forward(batches.inputs[s]), batches.targets[s]).backward();
    if (s != 1) opt->step();
    opt->zero_grad();
    std::vector<torch::Tensor> p;
    for (auto& t : net->parameters()) p.push_back(t.detach().clone());
    want.push_back(p);
  }
  for (int r = 0; r < 2; ++r) {
    std::string rs = std::to_string(r);
    auto info = load_tensors(dir.file("rank" + rs + "_steps.pt"));
    // taken: 1, 0 (skipped), 1, 1 on every rank; scale: 1024, backoff to 512 (hysteresis 1),
    // 512, then growth after growth_interval = 2 clean steps -> 1024.
    EXPECT_TRUE(torch::equal(info[0], torch::tensor({1.0, 0.0, 1.0, 1.0}, torch::kDouble))) << info[0];
    EXPECT_TRUE(torch::equal(info[1], torch::tensor({1024.0, 512.0, 512.0, 1024.0}, torch::kDouble))) << info[1];
    EXPECT_EQ(load_stats(dir.file("rank" + rs + ".txt"))["skipped_steps"], 1);
    for (int64_t s = 0; s < steps; ++s)
      expect_close(load_tensors(dir.file("rank" + rs + "_step" + std::to_string(s) + ".pt")), want[s],
                   "overflow test rank " + rs + " after step " + std::to_string(s));
    // The skipped step left the parameters exactly unchanged.
    auto p0 = load_tensors(dir.file("rank" + rs + "_step0.pt")), p1 = load_tensors(dir.file("rank" + rs + "_step1.pt"));
    for (size_t i = 0; i < p0.size(); ++i) EXPECT_TRUE(torch::equal(p0[i], p1[i]));
  }
  // And the ranks are identical to each other, bit for bit.
  for (int64_t s = 0; s < steps; ++s) {
    auto a = load_tensors(dir.file("rank0_step" + std::to_string(s) + ".pt"));
    auto b = load_tensors(dir.file("rank1_step" + std::to_string(s) + ".pt"));
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i]));
  }
}
