// example_test.cpp — the main job (examples/fashion_mnist) end to end on the real data, a few steps:
// the same binary under `booster run`, under torchrun --no_python, with explicit --rank flags, and
// alone; plus its error for a missing data set. (Accuracy of the full run is in the README.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "common/test_util.h"
#include "dist/dist_test_util.h"

using namespace booster::testing;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {


std::vector<std::string> example_args(const std::string& out) {
  return {kFashionMnistBinary, "--config", kDdpConfig, "--set", "train.epochs=1", "--set", "train.max_steps_per_epoch=5",
          "--set", "train.lr_scheduler.warmup_steps=2", "--output_dir", out};
}

// `booster run --nproc_per_node 2 --master_port <free> fashion_mnist <example_args>`.
std::vector<std::string> booster_run_argv(const std::string& out) {
  std::vector<std::string> argv{BOOSTER_CLI_PATH, "run", "--nproc_per_node", "2", "--master_port",
                                std::to_string(free_port())};
  auto args = example_args(out);
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

bool have_data() { return std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"); }

// metrics.csv has a header and one row for the one epoch; the effective config keeps the overrides.
void expect_run_outputs(const std::string& out) {
  std::string csv = read_file(out + "/metrics.csv");
  EXPECT_THAT(csv, HasSubstr("epoch,train_loss,test_accuracy,samples_per_s,epoch_seconds,lr\n1,"));
  EXPECT_TRUE(std::filesystem::exists(out + "/metrics.png")) << "booster plot at the end of the run";
  std::string config = read_file(out + "/config.toml");
  EXPECT_THAT(config, HasSubstr("max_steps_per_epoch = "));  // the --set override is in the effective config
  EXPECT_THAT(config, ::testing::AnyOf(HasSubstr("plugin = 'torch_ddp'"), HasSubstr("plugin = \"torch_ddp\"")));
}

// The example on 2 ranks under `booster run` for 2 epochs of a 512-sample subset (the checkpoint
// tests' size) with `config` and extra --set assignments; 180 s timeout.
ProcessResult run_small_example(const std::string& config, const std::string& out, std::vector<std::string> sets) {
  return run_fashion_mnist_two_ranks(config, out, std::move(sets), 512, 200);
}

}  // namespace

TEST(Example, TwoRanksUnderBoosterRun) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TempDir dir;
  auto argv = booster_run_argv(dir.file("run"));
  auto r = run_process(argv, {}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[rank 0]: "));
  EXPECT_THAT(r.output, HasSubstr("world size 2"));
  expect_run_outputs(dir.file("run"));
}

TEST(Example, TwoRanksUnderTorchrun) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TempDir dir;
  std::vector<std::string> argv{BOOSTER_PYTHON, "-m", "torch.distributed.run", "--no_python", "--nproc_per_node", "2",
                                "--master_port", std::to_string(free_port()), "--redirects", "1", "--tee", "1",
                                "--log_dir", dir.file("logs")};
  auto args = example_args(dir.file("run"));
  argv.insert(argv.end(), args.begin(), args.end());
  auto r = run_process(argv, {}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("world size 2"));
  expect_run_outputs(dir.file("run"));
}

TEST(Example, TwoRanksWithExplicitFlags) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TempDir dir;
  int port = free_port();
  std::vector<int> pids;
  for (int rank = 0; rank < 2; ++rank) {
    auto argv = example_args(dir.file("run"));
    argv.insert(argv.end(), {"--rank", std::to_string(rank), "--world_size", "2", "--host", "127.0.0.1", "--port", std::to_string(port)});
    // No torchrun variables: the flags alone must launch.
    pids.push_back(spawn_process(argv, {{"RANK", "\x01unset"}, {"WORLD_SIZE", "\x01unset"}},
                                 dir.file("rank" + std::to_string(rank) + ".log")));
  }
  for (int rank = 0; rank < 2; ++rank) {
    auto r = wait_process(pids[rank], 180);
    EXPECT_EQ(r.exit_code, 0) << read_file(dir.file("rank" + std::to_string(rank) + ".log"));
  }
  EXPECT_THAT(read_file(dir.file("rank0.log")), HasSubstr("world size 2"));
  expect_run_outputs(dir.file("run"));
}

TEST(Example, SingleProcessStandalone) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TempDir dir;
  auto r = run_process(example_args(dir.file("run")), {{"RANK", "\x01unset"}}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("world size 1"));
  expect_run_outputs(dir.file("run"));
}

TEST(Example, TwoRanksBf16WithGradientAccumulation) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TempDir dir;
  auto argv = booster_run_argv(dir.file("run"));
  argv.insert(argv.end(), {"--set", "booster.mixed_precision=bf16", "--set", "train.gradient_accumulation_steps=2",
                           "--set", "booster.max_norm=1.0", "--set", "train.max_steps_per_epoch=8"});
  auto r = run_process(argv, {}, 180);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("precision bf16"));
  expect_run_outputs(dir.file("run"));
  EXPECT_THAT(read_file(dir.file("run/config.toml")), HasSubstr("gradient_accumulation_steps = 2\nlr = 0.001\nmax_steps_per_epoch = 8"));
}

TEST(Example, MissingDataSetIsAClearError) {
  TempDir dir;
  auto args = example_args(dir.file("run"));
  args.insert(args.end(), {"--data_dir", dir.file("no_such_dir")});
  auto r = run_process(args, {{"RANK", "\x01unset"}}, 60);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("no_such_dir"));
  EXPECT_THAT(r.output, HasSubstr("apt-get install dataset-fashion-mnist"));
}

TEST(Example, BadConfigValueIsAClearErrorWithLocation) {
  TempDir dir;
  auto args = example_args(dir.file("run"));
  args.insert(args.end(), {"--set", "plugin.bucket_cap_mb=\"big\""});
  auto r = run_process(args, {{"RANK", "\x01unset"}}, 60);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("plugin.bucket_cap_mb"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("run/metrics.csv")));
}

// The example with examples/configs/zero1.toml (ZeRO-1, fp32) and zero2.toml (ZeRO-2, bf16 weights
// + fp32 master slices) on a 4096-sample subset for 2 epochs reaches DDP's accuracy band: within
// 0.03 of ddp.toml's test accuracy on the same subset, and well above chance (0.1).
// Also fsdp.toml (FULL_SHARD) and gemini.toml (bf16 static, and fp32 auto with an offload_dir) on
// 2 ranks, hybrid.toml (hybrid_parallel on a data-parallel mesh), and HYBRID_SHARD with bf16 compute
// on 4 ranks against
// ddp.toml on 4 ranks (the global batch, hence the number of steps, depends on the rank count).
TEST(Example, ZeroFsdpAndGeminiConfigsReachTheDdpAccuracyBand) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  auto accuracy = [](const std::string& config, const std::string& out, int ranks = 2,
                     std::vector<std::string> sets = {}) {
    std::vector<std::string> argv{BOOSTER_CLI_PATH, "run", "--nproc_per_node", std::to_string(ranks), "--master_port",
                                  std::to_string(free_port()), kFashionMnistBinary, "--config", config,
                                  "--output_dir", out};
    for (std::string s : {"train.epochs=1", "train.train_subset=4096", "train.test_subset=1000",
                          "train.lr_scheduler.warmup_steps=10"})
      sets.push_back(s);
    for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
    auto r = run_process(argv, {}, 300);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::string csv = read_file(out + "/metrics.csv");
    // Last row: epoch,train_loss,test_accuracy,...
    auto last = csv.substr(csv.rfind('\n', csv.size() - 2) + 1);
    std::vector<std::string> cols;
    std::stringstream ss(last);
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
    EXPECT_GE(cols.size(), 3u) << csv;
    return cols.size() >= 3 ? std::stod(cols[2]) : 0.0;
  };
  TempDir dir;
  std::string configs = std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/";
  double ddp = accuracy(configs + "ddp.toml", dir.file("ddp"));
  double zero1 = accuracy(configs + "zero1.toml", dir.file("zero1"));
  double zero2 = accuracy(configs + "zero2.toml", dir.file("zero2"));
  double fsdp = accuracy(configs + "fsdp.toml", dir.file("fsdp"));
  double ddp4 = accuracy(configs + "ddp.toml", dir.file("ddp4"), 4);
  double hybrid4 = accuracy(configs + "fsdp.toml", dir.file("hybrid4"), 4,
                            {"plugin.sharding_strategy=\"HYBRID_SHARD\"", "plugin.shard_group_size=2",
                             "plugin.mixed_precision.param_dtype=\"bf16\"", "plugin.mixed_precision.reduce_dtype=\"fp32\""});
  double gemini = accuracy(configs + "gemini.toml", dir.file("gemini"));
  double hybrid_parallel = accuracy(configs + "hybrid.toml", dir.file("hybrid_parallel"));
  std::filesystem::create_directories(dir.file("offload"));
  double gemini_auto = accuracy(configs + "gemini.toml", dir.file("gemini_auto"), 2,
                                {"plugin.placement_policy=\"auto\"", "plugin.precision=\"fp32\"",
                                 "plugin.offload_dir=\"" + dir.file("offload") + "\""});
  std::cout << "[ accuracy ] ddp " << ddp << ", zero1 " << zero1 << ", zero2 " << zero2 << ", fsdp " << fsdp
            << ", gemini bf16 " << gemini << ", hybrid_parallel " << hybrid_parallel << ", gemini auto + offload_dir " << gemini_auto << "; 4 ranks: ddp " << ddp4
            << ", fsdp HYBRID_SHARD bf16 " << hybrid4 << std::endl;
  EXPECT_NEAR(gemini, ddp, 0.03);
  EXPECT_NEAR(gemini_auto, ddp, 0.03);
  EXPECT_NEAR(hybrid_parallel, ddp, 0.03);
  EXPECT_GT(ddp, 0.6);
  EXPECT_NEAR(zero1, ddp, 0.03);
  EXPECT_NEAR(zero2, ddp, 0.03);
  EXPECT_NEAR(fsdp, ddp, 0.03);
  EXPECT_GT(ddp4, 0.6);
  EXPECT_NEAR(hybrid4, ddp4, 0.03);
  EXPECT_THAT(read_file(dir.file("zero2/config.toml")), HasSubstr("low_level_zero"));
  EXPECT_THAT(read_file(dir.file("hybrid4/config.toml")), HasSubstr("HYBRID_SHARD"));
  EXPECT_THAT(read_file(dir.file("hybrid_parallel/config.toml")), HasSubstr("hybrid_parallel"));
}

// Switching strategy is a config edit, also for a checkpoint: one epoch of zero2.toml (bf16 weights)
// with checkpoint_dir, then ddp.toml (fp32) with resume_from continues at epoch 2, converting the 12
// parameters and 4 BatchNorm running statistics to fp32 on load, and the 2 num_batches_tracked
// counters (cast to bf16 with the module, whole numbers) back to int64.
TEST(Example, Zero2Bf16CheckpointResumesUnderDdpFp32) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TempDir dir;
  std::string configs = std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/";
  auto run = [&](const std::string& config, const std::string& out, const std::vector<std::string>& sets) {
    return run_small_example(configs + config, out, sets);
  };
  std::string zero_ckpt = dir.file("zero2_ckpt"), ddp_ckpt = dir.file("ddp_ckpt");
  auto zero = run("zero2.toml", dir.file("zero2"),
                  {"train.checkpoint_dir=\"" + zero_ckpt + "\"", "train.stop_after_epoch=1"});
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_EQ(checkpoint_next_epoch(latest_checkpoint(zero_ckpt)), 2);
  auto ddp = run("ddp.toml", dir.file("ddp"),
                 {"train.resume_from=\"" + zero_ckpt + "\"", "train.checkpoint_dir=\"" + ddp_ckpt + "\""});
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  EXPECT_THAT(ddp.output, HasSubstr("resumed from " + latest_checkpoint(zero_ckpt) + " after epoch 1"));
  // bf16 weights and running statistics widen; BatchNorm's num_batches_tracked stayed an integer
  // under bf16 ZeRO (only floating-point tensors are cast), so nothing converts to Long.
  EXPECT_THAT(ddp.output, HasSubstr("converted 16 tensors BFloat16 -> Float (the model's dtype)"));
  EXPECT_THAT(ddp.output, Not(HasSubstr("-> Long")));
  EXPECT_EQ(checkpoint_next_epoch(latest_checkpoint(ddp_ckpt)), 3);
  EXPECT_THAT(read_file(dir.file("ddp/metrics.csv")), HasSubstr("\n2,"));
}

// The same with FSDP: one epoch of fsdp.toml (FULL_SHARD: the model save streams gathered units,
// the optimizer state is saved from the shards), then ddp.toml resumes at epoch 2 with nothing to
// convert (FSDP saves full-precision fp32 values).
TEST(Example, FsdpCheckpointResumesUnderDdp) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TempDir dir;
  std::string configs = std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/";
  auto run = [&](const std::string& config, const std::string& out, const std::vector<std::string>& sets) {
    return run_small_example(configs + config, out, sets);
  };
  std::string fsdp_ckpt = dir.file("fsdp_ckpt"), ddp_ckpt = dir.file("ddp_ckpt");
  auto fsdp = run("fsdp.toml", dir.file("fsdp"),
                  {"train.checkpoint_dir=\"" + fsdp_ckpt + "\"", "train.stop_after_epoch=1"});
  ASSERT_EQ(fsdp.exit_code, 0) << fsdp.output;
  EXPECT_EQ(checkpoint_next_epoch(latest_checkpoint(fsdp_ckpt)), 2);
  auto ddp = run("ddp.toml", dir.file("ddp"),
                 {"train.resume_from=\"" + fsdp_ckpt + "\"", "train.checkpoint_dir=\"" + ddp_ckpt + "\""});
  ASSERT_EQ(ddp.exit_code, 0) << ddp.output;
  EXPECT_THAT(ddp.output, HasSubstr("resumed from " + latest_checkpoint(fsdp_ckpt) + " after epoch 1"));
  EXPECT_THAT(ddp.output, Not(HasSubstr("converted")));
  EXPECT_EQ(checkpoint_next_epoch(latest_checkpoint(ddp_ckpt)), 3);
}

// --estimate N: one process measures one real micro-batch and prints every installed plugin's
// per-rank memory for N ranks, then exits without training or writing a run directory; under
// several ranks it is a clear error (the measurement is single-process).
TEST(Example, EstimatePrintsEveryPluginForTheRequestedWorldAndExits) {
  if (!have_data()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TempDir dir;
  auto argv = example_args(dir.file("run"));  // one process: no launcher
  argv.insert(argv.end(), {"--estimate", "4"});
  auto r = run_process(argv, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("parameters, 4 ranks, fp32, 8 bytes of optimizer state per parameter"));
  for (const char* plugin : {"torch_ddp", "low_level_zero", "torch_fsdp", "gemini", "hybrid_parallel"})
    EXPECT_THAT(r.output, HasSubstr(std::string("\n") + plugin + " ")) << plugin;
  EXPECT_THAT(r.output, HasSubstr("activations measured on the data loader's first batch"));
  EXPECT_THAT(r.output, ::testing::Not(HasSubstr("activations 0.0 MiB")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("run/metrics.csv")));

  auto two = booster_run_argv(dir.file("run2"));
  two.insert(two.end(), {"--estimate", "4"});
  auto bad = run_process(two, {}, 120);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("run the trainer as a single process"));
}

// BOOSTER_EXAMPLE_PROFILE (examples/common/step_profiler.h): a Kineto trace (Chrome JSON) of the
// asked optimizer steps with the steps' operators; a malformed value is refused naming the expected
// form, before training.
TEST(Example, StepProfilerTracesTheAskedStepsAndRefusesAMalformedValue) {
  TempDir dir;
  const std::vector<std::string> argv{kFashionMnistBinary, "--config", kDdpConfig, "--output_dir", dir.file("run"),
                                      "--set", "train.epochs=1", "--set", "train.max_steps_per_epoch=6",
                                      "--set", "train.train_subset=512", "--set", "train.test_subset=100",
                                      "--set", "train.lr_scheduler.warmup_steps=2"};
  const std::string trace = dir.file("trace.json");
  auto r = run_process(argv, {{"BOOSTER_EXAMPLE_PROFILE", "3-4:" + trace}}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("step_profiler: steps 3-4 traced to " + trace));
  const std::string json = read_file(trace);
  EXPECT_THAT(json, HasSubstr("\"traceEvents\""));
  EXPECT_THAT(json, HasSubstr("aten::convolution")) << "the CNN's forward";
  EXPECT_THAT(json, HasSubstr("ConvolutionBackward0")) << "its backward";
  for (const std::string& bad : std::vector<std::string>{"3:x.json", "5-4:" + trace, "0-1:" + trace, "3-4:"}) {
    auto b = run_process(argv, {{"BOOSTER_EXAMPLE_PROFILE", bad}}, 120);
    EXPECT_NE(b.exit_code, 0) << bad;
    EXPECT_THAT(b.output, HasSubstr("BOOSTER_EXAMPLE_PROFILE")) << bad << "\n" << b.output;
    EXPECT_THAT(b.output, HasSubstr("FIRST-LAST:PATH")) << bad << "\n" << b.output;
  }
}
