// zero_test.cpp — the LowLevelZero plugin (ZeRO stage 1 and 2) against single-process LibTorch.
// Each test starts N dist_worker processes on 127.0.0.1 (Gloo) and compares their parameters with
// the same model trained in this process on the concatenated batch.
//
// Tolerance (fp32): |zero - reference| <= 1e-5 + 1e-4 * |reference| per element after k steps, as
// for DDP: the only differences are the order of the gradient sums and, in stage 2, that each
// slice's gradient is reduced to its owner. Memory reports: within 5% of the ZeRO paper's formulas.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "common/debiased_momentum.h"
#include "common/test_util.h"
#include "dist/dist_common.h"
#include "dist/dist_test_util.h"

using namespace booster::testing;
using ::testing::HasSubstr;

namespace {

const std::string kZero = "booster.plugin=\"low_level_zero\"";
const std::string kFp32 = "plugin.precision=\"fp32\"";
// 0.0003 * 2^20 = 314 elements per bucket: every MLP layer gets its own buckets and most buckets
// span two ranks' shards (the MLP has 2.5k parameters).
const std::string kSmallBuckets = "plugin.reduce_bucket_size_in_m=0.0003";

std::vector<std::string> zero_sets(int stage, std::vector<std::string> more = {}) {
  std::vector<std::string> s{kZero, kFp32, "plugin.stage=" + std::to_string(stage), kSmallBuckets};
  s.insert(s.end(), more.begin(), more.end());
  return s;
}

// Single-process training of `net` with `opt` on the full batches: its parameters after `steps`.
template <class Net>
std::vector<torch::Tensor> train_single_process(Net& net, torch::optim::Optimizer& opt, const Batches& batches,
                                                int64_t steps) {
  for (int64_t s = 0; s < steps; ++s) {
    torch::mse_loss(net->forward(batches.inputs[s]), batches.targets[s]).backward();
    opt.step();
    opt.zero_grad();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

// The OddNet (two groups, padding, 1-element and frozen parameters) trained in one process.
std::vector<torch::Tensor> reference_odd(int64_t steps, int64_t global_batch) {
  torch::manual_seed(7);
  OddNet net;
  auto opt = make_odd_optimizer(net);
  return train_single_process(net, *opt, make_batches(steps, global_batch, 19), steps);
}

// The MLP with AdamW on global batches of 8 rows (the "resume" scenario's data) for `steps` steps.
std::vector<torch::Tensor> reference_resume(int64_t steps) {
  torch::manual_seed(7);
  MLP net;
  auto opt = make_optimizer("adamw", net->parameters());
  return train_single_process(net, *opt, make_batches(steps, 8, 23), steps);
}

ProcessResult expect_ranks_ok(int world, const std::vector<std::string>& args) {
  auto results = run_workers(world, args);
  expect_all_ok(results);
  return results.empty() ? ProcessResult{} : results[0];
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Equivalence with single-process training

TEST(LowLevelZero, Stage1TwoRanksSGDEqualsSingleProcess) {
  auto stats = check_train({2, "sgd", zero_sets(1), 1});
  EXPECT_EQ(stats["stage"], 1);
  // Reverse order, a bucket closes once it holds >= 314 elements: {l4, l3.bias, l3.weight},
  // {l2.bias, l2.weight}, {l1.bias, l1.weight}.
  EXPECT_EQ(stats["buckets"], 3);
}

TEST(LowLevelZero, Stage1FourRanksAdamWEqualsSingleProcess) { check_train({4, "adamw", zero_sets(1), 1}); }

TEST(LowLevelZero, Stage2TwoRanksAdamWEqualsSingleProcessAndOverlaps) {
  auto stats = check_train({2, "adamw", zero_sets(2), 1});
  EXPECT_EQ(stats["stage"], 2);
  // Every bucket's reduction was launched from a gradient hook during backward, on each of 4 steps.
  EXPECT_EQ(stats["buckets_launched_during_backward"], stats["buckets"] * 4);
}

TEST(LowLevelZero, Stage2FourRanksSGDEqualsSingleProcess) { check_train({4, "sgd", zero_sets(2), 1}); }

// Every elementwise optimizer runs unchanged on the flat slices.
TEST(LowLevelZero, Stage2AdamRMSpropAdagradEqualSingleProcess) {
  for (const char* optimizer : {"adam", "rmsprop", "adagrad"}) check_train({2, optimizer, zero_sets(2), 1});
}

TEST(LowLevelZero, Stage2WithoutOverlapEqualsSingleProcess) {
  auto stats = check_train({2, "adamw", zero_sets(2, {"plugin.overlap_communication=false"}), 1});
  EXPECT_EQ(stats["buckets_launched_during_backward"], 0);
}

TEST(LowLevelZero, Stage2DefaultBucketEqualsSingleProcess) {
  check_train({4, "adamw", {kZero, kFp32, "plugin.stage=2"}, 1});
}

// cpu_offload steps Adam / AdamW master slices through the CPU Adam kernel (rank 0 logs it) and
// still equals single-process LibTorch within the file's tolerance (the kernel is within 4 ulps of
// LibTorch's step, tests/unit/cpu_adam_test.cpp); another optimizer keeps its own step.
TEST(LowLevelZero, CpuOffloadStepsAdamThroughTheKernelAndEqualsSingleProcess) {
  const std::string kernel = "runs through the CPU Adam kernel";
  check_train({2, "adamw", zero_sets(2, {"plugin.cpu_offload=true"}), 1, 0, 2.0, kernel});
  check_train({2, "adamw", zero_sets(1, {"plugin.cpu_offload=true"}), 1, 0, 2.0, kernel});
  check_train({2, "adam", zero_sets(2, {"plugin.cpu_offload=true"}), 1, 0, 2.0, kernel});
  check_train({2, "rmsprop", zero_sets(2, {"plugin.cpu_offload=true"}), 1, 0, 2.0, "steps with its own (LibTorch) step"});
}

// HybridAdam is a registered elementwise optimizer: ZeRO shards its state like AdamW's.
TEST(LowLevelZero, HybridAdamEqualsSingleProcess) {
  check_train({2, "hybridadam", zero_sets(2), 1});
  check_train({2, "hybridadam", zero_sets(1, {"plugin.cpu_offload=true"}), 1, 0, 2.0, "HybridAdam step of the master"});
}

TEST(LowLevelZero, Stage1NoSyncAccumulationOfFourMicroBatchesEqualsOneBigBatch) {
  check_train({2, "sgd", zero_sets(1), 4});
}

TEST(LowLevelZero, Stage2NoSyncIsAClearError) {
  TempDir dir;
  std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=1", "batch=4", "accum=2"};
  for (const auto& s : zero_sets(2)) args.push_back("set=" + s);
  auto results = run_workers(2, args);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 3) << results[r].output;
    EXPECT_THAT(results[r].output, HasSubstr("no_sync is not supported with stage = 2"));
  }
}

// Padding (group sizes 86 and 24 do not divide by 3 or 4 / by 4 after frozen ones), a parameter of one
// element (smaller than the world size), two groups with different lr and weight decay, frozen
// parameters in the optimizer.
TEST(LowLevelZero, GroupsPaddingTinyAndFrozenParametersEqualSingleProcess) {
  for (int stage : {1, 2}) {
    for (int world : {2, 3, 4}) {  // 3: shards and bucket ranges that do not divide evenly
      TempDir dir;
      std::vector<std::string> args{"scenario=zero_groups", "out=" + dir.path(), "steps=4", "batch=3"};
      for (const auto& s : zero_sets(stage, {"plugin.reduce_bucket_size_in_m=0.00003"})) args.push_back("set=" + s);
      expect_ranks_ok(world, args);
      auto want = reference_odd(4, 3 * world);
      for (int r = 0; r < world; ++r)
        expect_close(load_tensors(dir.file("rank" + std::to_string(r) + ".pt")), want,
                     "stage " + std::to_string(stage) + ", " + std::to_string(world) + " ranks, rank " + std::to_string(r));
    }
  }
}

// A user-registered optimizer (DebiasedMomentum, tests/common/debiased_momentum.h; dist_worker
// registers it in main()) is sharded like the built-ins: ZeRO-1 and ZeRO-2 on 2 ranks equal
// single-process LibTorch, and its gathered, name-keyed state checkpoints from ZeRO-1 into ZeRO-2
// and into DDP, continuing as the uninterrupted run.
TEST(LowLevelZero, UserRegisteredOptimizerEqualsSingleProcessAndResumesAcrossPlugins) {
  const std::string kOpt = "optimizer=debiased_momentum";
  for (int stage : {1, 2}) {
    TempDir dir;
    std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=4", "batch=4", kOpt};
    for (const auto& s : zero_sets(stage)) args.push_back("set=" + s);
    expect_ranks_ok(2, args);
    torch::manual_seed(7);
    MLP net;
    auto opt = make_debiased_momentum(net->parameters());
    auto want = train_single_process(net, *opt, make_batches(4, 8, 11), 4);
    for (int r = 0; r < 2; ++r)
      expect_close(load_tensors(dir.file("rank" + std::to_string(r) + ".pt")), want,
                   "DebiasedMomentum, stage " + std::to_string(stage) + ", rank " + std::to_string(r));
  }
  TempDir dir;
  for (const char* d : {"a", "b", "c"}) std::filesystem::create_directories(dir.file(d));
  std::string ckpt = dir.file("zero1");
  auto with = [&](std::vector<std::string> extra, const std::vector<std::string>& sets) {
    extra.insert(extra.begin(), {"scenario=resume", "steps=6", "global=8", kOpt});
    for (const auto& s : sets) extra.push_back("set=" + s);
    return extra;
  };
  expect_ranks_ok(2, with({"out=" + dir.file("a"), "start=0", "stop=3", "save=" + ckpt}, zero_sets(1)));
  torch::manual_seed(7);
  MLP net;
  auto opt = make_debiased_momentum(net->parameters());
  auto want = train_single_process(net, *opt, make_batches(6, 8, 23), 6);
  expect_ranks_ok(2, with({"out=" + dir.file("b"), "start=3", "stop=6", "load=" + ckpt}, zero_sets(2)));
  for (int r = 0; r < 2; ++r)
    expect_close(load_tensors(dir.file("b/rank" + std::to_string(r) + ".pt")), want, "DebiasedMomentum zero1(2) -> zero2(2)");
  expect_ranks_ok(1, with({"out=" + dir.file("c"), "start=3", "stop=6", "load=" + ckpt}, {}));
  expect_close(load_tensors(dir.file("c/rank0.pt")), want, "DebiasedMomentum zero1(2) -> ddp(1)");
}

// ---------------------------------------------------------------------------------------------
// Clipping and loss scaling through the shared optimizer wrapper

TEST(LowLevelZero, ClipByL2NormStage2FourRanksEqualsSingleProcess) {
  check_train({4, "adamw", zero_sets(2, {"plugin.max_norm=0.05"}), 1, 0.05, 2.0});
}

TEST(LowLevelZero, ClipByInfNormStage1TwoRanksEqualsSingleProcess) {
  check_train({2, "sgd", zero_sets(1, {"plugin.max_norm=0.01", "plugin.norm_type=inf"}), 1, 0.01, INFINITY});
}

TEST(LowLevelZero, Stage2OverflowOnOneRankSkipsTheStepEverywhere) {
  check_overflow({"zero_stage=2", "set=" + kZero, "set=" + kFp32});
}

TEST(LowLevelZero, Stage1OverflowOnOneRankSkipsTheStepEverywhere) {
  check_overflow({"zero_stage=1", "set=" + kZero, "set=" + kFp32});
}

// ---------------------------------------------------------------------------------------------
// Checkpoints: gathered, name-keyed optimizer state moves between ZeRO stages, DDP, world sizes

TEST(LowLevelZero, Zero2CheckpointContinuesInZero1AndDDPAndEqualsTheUninterruptedRun) {
  TempDir dir;
  for (const char* d : {"a", "b", "c", "d", "e"}) std::filesystem::create_directories(dir.file(d));
  std::string ckpt = dir.file("zero2");
  std::vector<std::string> base{"scenario=resume", "steps=6", "global=8", "optimizer=adamw"};
  auto with = [&](std::vector<std::string> extra, const std::vector<std::string>& sets) {
    extra.insert(extra.begin(), base.begin(), base.end());
    for (const auto& s : sets) extra.push_back("set=" + s);
    return extra;
  };
  expect_ranks_ok(4, with({"out=" + dir.file("a"), "start=0", "stop=3", "save=" + ckpt}, zero_sets(2)));
  auto want = reference_resume(6);
  // ZeRO-1 on 2 ranks.
  expect_ranks_ok(2, with({"out=" + dir.file("b"), "start=3", "stop=6", "load=" + ckpt}, zero_sets(1)));
  for (int r = 0; r < 2; ++r)
    expect_close(load_tensors(dir.file("b/rank" + std::to_string(r) + ".pt")), want, "zero2(4) -> zero1(2)");
  // DDP on 1 rank.
  expect_ranks_ok(1, with({"out=" + dir.file("c"), "start=3", "stop=6", "load=" + ckpt}, {}));
  expect_close(load_tensors(dir.file("c/rank0.pt")), want, "zero2(4) -> ddp(1)");
  // And a DDP checkpoint continues in ZeRO-2 on 4 ranks.
  std::string ddp_ckpt = dir.file("ddp");
  expect_ranks_ok(2, with({"out=" + dir.file("d"), "start=0", "stop=3", "save=" + ddp_ckpt}, {}));
  expect_ranks_ok(4, with({"out=" + dir.file("e"), "start=3", "stop=6", "load=" + ddp_ckpt}, zero_sets(2)));
  for (int r = 0; r < 4; ++r)
    expect_close(load_tensors(dir.file("e/rank" + std::to_string(r) + ".pt")), want, "ddp(2) -> zero2(4)");
}

// ---------------------------------------------------------------------------------------------
// Memory accounting against the ZeRO paper's formulas (Ψ parameters, N ranks, Adam)

namespace {
struct MemoryCase {
  std::string plugin_stage;  // "ddp", "1", "2"
  std::string precision;     // "fp32" | "bf16"
  int world;
};

void check_memory(const MemoryCase& c) {
  TempDir dir;
  std::vector<std::string> args{"scenario=memory", "out=" + dir.path(), "width=384", "batch=2"};
  if (c.plugin_stage == "ddp") {
    if (c.precision == "bf16") args.push_back("set=booster.mixed_precision=\"bf16\"");
  } else {
    args.insert(args.end(), {"set=" + kZero, "set=plugin.precision=\"" + c.precision + "\"",
                             "set=plugin.stage=" + c.plugin_stage});
  }
  expect_ranks_ok(c.world, args);
  const double n = c.world;
  for (int r = 0; r < c.world; ++r) {
    auto st = load_stats(dir.file("rank" + std::to_string(r) + ".txt"));
    const double psi = static_cast<double>(st["numel"]);
    double want_p, want_g, want_m, want_o;
    if (c.plugin_stage == "ddp") {  // bf16 in DDP is autocast: fp32 weights
      want_p = 4 * psi; want_g = 4 * psi; want_m = 0; want_o = 8 * psi;
    } else {
      double w = c.precision == "bf16" ? 2 : 4;  // bytes per model weight / gradient element
      want_p = w * psi;
      want_g = c.plugin_stage == "1" ? w * psi : w * psi / n;
      want_m = c.precision == "bf16" ? 4 * psi / n : 0;
      want_o = 8 * psi / n;
    }
    double want_total = want_p + want_g + want_m + want_o;
    std::string what = c.plugin_stage + "/" + c.precision + "/" + std::to_string(c.world) + " ranks, rank " +
                       std::to_string(r);
    for (const char* when : {"planned", "actual"}) {
      auto at = [&](const char* k) { return static_cast<double>(st[std::string(when) + "_" + k]); };
      double total = at("parameters") + at("gradients") + at("master_weights") + at("optimizer_states");
      EXPECT_NEAR(total, want_total, 0.05 * want_total) << what << " " << when;
      EXPECT_NEAR(at("parameters"), want_p, 0.05 * want_p + 1) << what << " " << when;
      EXPECT_NEAR(at("optimizer_states"), want_o, 0.05 * want_o + 1) << what << " " << when;
      EXPECT_NEAR(at("master_weights"), want_m, 0.05 * want_m + 1) << what << " " << when;
    }
    EXPECT_NEAR(static_cast<double>(st["planned_gradients"]), want_g, 0.05 * want_g) << what;
    std::cout << "[ memory   ] " << what << ": model states " << want_total / (1 << 20) << " MiB by formula\n";
  }
}
}  // namespace

TEST(LowLevelZero, MemoryReportMatchesZeroFormulasFp32) {
  for (int world : {2, 4}) {
    check_memory({"ddp", "fp32", world});
    check_memory({"1", "fp32", world});
    check_memory({"2", "fp32", world});
  }
}

TEST(LowLevelZero, MemoryReportMatchesZeroFormulasBf16MasterWeights) {
  check_memory({"1", "bf16", 4});
  check_memory({"2", "bf16", 4});
}

// communication_dtype = "bf16": buckets travel in bf16 (8-bit mantissa), so the result is close to
// single-process fp32 (|diff| <= 1e-3 + 1e-2·|ref|) but not equal to it (max |diff| > 1e-7 shows the
// gradients really were rounded on the wire).
TEST(LowLevelZero, Bf16CommunicationDtypeIsCloseButRounded) {
  for (int stage : {1, 2}) {
    TempDir dir;
    std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=4", "batch=4", "optimizer=sgd"};
    for (const auto& s : zero_sets(stage, {"plugin.communication_dtype=\"bf16\""})) args.push_back("set=" + s);
    expect_ranks_ok(2, args);
    auto want = reference_mlp(4, 8, "sgd");
    auto got = load_tensors(dir.file("rank0.pt"));
    ASSERT_EQ(got.size(), want.size());
    double max_diff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-2, 1e-3)) << "stage " << stage << " tensor " << i;
      max_diff = std::max(max_diff, (got[i] - want[i]).abs().max().item<double>());
    }
    EXPECT_GT(max_diff, 1e-7) << "stage " << stage << ": bf16 on the wire should round the gradients";
    std::cout << "[ compare  ] bf16 wire, stage " << stage << ": max |diff| = " << max_diff << std::endl;
  }
}

// A parameter used on one rank only (head_b) and one used nowhere (never): ZeRO does not stall; the
// result equals DDP with find_unused_parameters (the mean of the per-rank losses; SGD leaves the
// never-used parameter unchanged, its gradient being zero).
TEST(LowLevelZero, ParametersUnusedOnSomeRanksEqualDdpFindUnused) {
  TempDir ddp;
  expect_ranks_ok(2, {"scenario=unused", "out=" + ddp.path(), "steps=3", "batch=4",
                      "set=plugin.find_unused_parameters=true"});
  auto want = load_tensors(ddp.file("rank0.pt"));
  for (int stage : {1, 2}) {
    TempDir dir;
    std::vector<std::string> args{"scenario=unused", "out=" + dir.path(), "steps=3", "batch=4", "timeout=30"};
    for (const auto& s : zero_sets(stage)) args.push_back("set=" + s);
    expect_ranks_ok(2, args);
    for (int r = 0; r < 2; ++r)
      expect_close(load_tensors(dir.file("rank" + std::to_string(r) + ".pt")), want,
                   "unused parameters, stage " + std::to_string(stage) + ", rank " + std::to_string(r));
  }
}

// Different models on the ranks: the same clear error as torch_ddp (core sync_replicas), on every rank.
TEST(LowLevelZero, DifferentModelsOnRanksAreAClearError) {
  TempDir dir;
  std::vector<std::string> args{"scenario=mismatch", "out=" + dir.path(), "timeout=20"};
  for (const auto& s : zero_sets(2)) args.push_back("set=" + s);
  auto results = run_workers(2, args, 60);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(results[r].exit_code, 3) << results[r].output;
    EXPECT_THAT(results[r].output, HasSubstr("differs between ranks"));
  }
}
