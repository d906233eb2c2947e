// fp8_comm_test.cpp — compressed communication (communication_dtype = "fp8" / "bf16", ColossalAI's
// fp8_communication) under the torch_ddp, low_level_zero (stage 1 and 2), torch_fsdp and gemini
// plugins: 2 dist_worker ranks on 127.0.0.1 (Gloo) train the MLP for kSteps SGD steps, and their
// loss curve and final parameters are compared with the same model trained in this process in
// float32 on the concatenated batch (the exact fp32 result).
//
// Bands (stated; measured values are printed): per step, |loss - reference loss| <= kLossBand *
// reference loss; after kSteps steps, |parameter - reference| <= kParamAtol + kParamRtol |reference|
// per element. fp8 rounds each gradient (and under FSDP/Gemini each gathered parameter) to 3
// mantissa bits with per-bucket scaling (relative error <= 2^-4 of the value, dist/fp8.h); bf16 to
// 8 bits. The same runs with fp32 communication stay within 1e-5 + 1e-4 |reference| (the plugins'
// own tests), so the bands measure the wire dtype. Each run is also checked to differ from the fp32
// reference, so a setting that is silently ignored fails.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "common/test_util.h"
#include "dist/dist_common.h"
#include "dist/dist_test_util.h"

namespace fp8_comm_test {

using namespace booster::testing;
using ::testing::HasSubstr;

constexpr int64_t kSteps = 12, kBatch = 8;
constexpr double kLossBand = 0.01;                      // relative, per step
constexpr double kParamAtol = 1e-2, kParamRtol = 2e-2;  // fp8; bf16 gets a quarter of both

struct Reference {
  std::vector<double> losses;
  std::vector<torch::Tensor> params;
};

// The MLP trained in one process, float32, SGD, global batch 2 * kBatch.
Reference reference_fp32(int world) {
  torch::manual_seed(7);
  MLP net;
  auto opt = make_optimizer("sgd", net->parameters());
  auto batches = make_batches(kSteps, kBatch * world, 11);
  Reference ref;
  for (int64_t s = 0; s < kSteps; ++s) {
    auto loss = torch::mse_loss(net->forward(batches.inputs[s]), batches.targets[s]);
    ref.losses.push_back(loss.item<double>());
    loss.backward();
    opt->step();
    opt->zero_grad();
  }
  for (auto& p : net->parameters()) ref.params.push_back(p.detach().clone());
  return ref;
}

// Runs the train scenario with `sets` on 2 ranks and checks the bands; returns the largest
// relative loss deviation.
double check_band(const std::vector<std::string>& sets, const std::string& what, double scale = 1.0) {
  const int world = 2;
  TempDir dir;
  std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=" + std::to_string(kSteps),
                                "batch=" + std::to_string(kBatch), "optimizer=sgd"};
  for (const auto& s : sets) args.push_back("set=" + s);
  auto results = run_workers(world, args);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << what << " rank " << r << " output:\n" << results[r].output;
    if (results[r].exit_code != 0) return 0;
  }
  const Reference ref = reference_fp32(world);
  // The global loss of a step: the mean of the ranks' losses (equal batch sizes).
  auto l0 = load_tensors(dir.file("rank0_losses.pt"))[0], l1 = load_tensors(dir.file("rank1_losses.pt"))[0];
  double worst = 0;
  for (int64_t s = 0; s < kSteps; ++s) {
    const double got = 0.5 * (l0[s].item<double>() + l1[s].item<double>());
    const double rel = std::abs(got - ref.losses[static_cast<size_t>(s)]) / ref.losses[static_cast<size_t>(s)];
    worst = std::max(worst, rel);
    EXPECT_LE(rel, kLossBand * scale) << what << " step " << s << ": loss " << got << " vs fp32 "
                                      << ref.losses[static_cast<size_t>(s)];
  }
  double max_diff = 0;
  for (int r = 0; r < world; ++r) {
    auto got = load_tensors(dir.file("rank" + std::to_string(r) + ".pt"));
    EXPECT_EQ(got.size(), ref.params.size());
    if (got.size() != ref.params.size()) return worst;
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::allclose(got[i], ref.params[i], kParamRtol * scale, kParamAtol * scale))
          << what << " rank " << r << " tensor " << i << " max |d| "
          << (got[i] - ref.params[i]).abs().max().item<double>();
      max_diff = std::max(max_diff, (got[i] - ref.params[i]).abs().max().item<double>());
    }
  }
  // The wire dtype did change something (an ignored setting would reproduce fp32 to ~1e-6).
  EXPECT_GT(max_diff, 1e-5) << what << ": no difference from fp32 communication";
  std::cout << "[ band     ] " << what << ": max relative loss deviation " << worst << ", max |param - fp32| "
            << max_diff << std::endl;
  return worst;
}

const std::string kSmallBuckets = "plugin.reduce_bucket_size_in_m=0.0003";

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

const std::vector<std::string> kDDP{"booster.plugin=\"torch_ddp\"", "plugin.bucket_cap_mb=0.002"};
const std::vector<std::string> kZero2{"booster.plugin=\"low_level_zero\"", "plugin.precision=\"fp32\"", "plugin.stage=2",
                                      kSmallBuckets};
const std::vector<std::string> kZero1{"booster.plugin=\"low_level_zero\"", "plugin.precision=\"fp32\"", "plugin.stage=1",
                                      kSmallBuckets};
const std::vector<std::string> kFsdp{"booster.plugin=\"torch_fsdp\"", "plugin.sharding_strategy=\"FULL_SHARD\"",
                                     "plugin.sync_module_states=true"};
const std::vector<std::string> kGemini{"booster.plugin=\"gemini\"", "plugin.precision=\"fp32\"",
                                       "plugin.min_chunk_size_m=0.0005", "plugin.search_range_m=0", "plugin.hidden_dim=16"};

TEST(Fp8Communication, TorchDDPTrainsWithinBandOfFp32) {
  check_band(with(kDDP, {"plugin.communication_dtype=\"fp8\""}), "torch_ddp fp8");
  check_band(with(kDDP, {"plugin.fp8_communication=true", "plugin.gradient_as_bucket_view=true"}),
             "torch_ddp fp8_communication + gradient_as_bucket_view");
  check_band(with(kDDP, {"plugin.communication_dtype=\"bf16\""}), "torch_ddp bf16", 0.25);
}

TEST(Fp8Communication, LowLevelZeroTrainsWithinBandOfFp32) {
  check_band(with(kZero2, {"plugin.communication_dtype=\"fp8\""}), "low_level_zero stage 2 fp8");
  check_band(with(kZero1, {"plugin.fp8_communication=true"}), "low_level_zero stage 1 fp8_communication");
}

TEST(Fp8Communication, TorchFSDPTrainsWithinBandOfFp32) {
  check_band(with(kFsdp, {"plugin.communication_dtype=\"fp8\""}), "torch_fsdp fp8");
}

TEST(Fp8Communication, GeminiTrainsWithinBandOfFp32) {
  check_band(with(kGemini, {"plugin.fp8_communication=true"}), "gemini fp8");
}

// ---------------------------------------------------------------------------------------------
// The main job (examples/fashion_mnist) and the GPT example, short runs on 2 ranks: the same run
// with fp8 (and bf16) communication against fp32 communication. Bands: main job train loss of each
// epoch within kExampleLossBand (relative) and test accuracy within 0.03; GPT validation loss of
// each evaluation within kExampleLossBand (relative).

constexpr double kExampleLossBand = 0.01;

// Column `col` of every data row of a metrics.csv.
std::vector<double> csv_column(const std::string& path, size_t col) {
  std::istringstream in(read_file(path));
  std::string line;
  std::getline(in, line);  // header
  std::vector<double> out;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<std::string> cols;
    std::stringstream ss(line);
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
    if (cols.size() > col) out.push_back(std::stod(cols[col]));
  }
  return out;
}

// Compares two curves element by element; returns the largest relative deviation.
double compare_curves(const std::vector<double>& got, const std::vector<double>& want, double band, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  EXPECT_FALSE(want.empty()) << what;
  double worst = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double rel = std::abs(got[i] - want[i]) / std::abs(want[i]);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, band) << what << " point " << i << ": " << got[i] << " vs fp32 " << want[i];
  }
  return worst;
}

ProcessResult run_main_job(const std::string& config, const std::string& out, std::vector<std::string> sets) {
  return run_fashion_mnist_two_ranks(config, out, std::move(sets), 1024, 500);
}

TEST(Fp8Communication, MainJobLossWithinBandOfFp32) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  const std::string configs = std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/";
  for (const auto& [config, wire] : std::vector<std::pair<std::string, std::string>>{
           {"ddp.toml", "fp8"}, {"ddp.toml", "bf16"}, {"zero2.toml", "fp8"}}) {
    TempDir a, b;
    auto ref = run_main_job(configs + config, a.path(), {});
    auto run = run_main_job(configs + config, b.path(), {"plugin.communication_dtype=\"" + wire + "\""});
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const std::string what = config + " " + wire;
    const double loss = compare_curves(csv_column(b.file("metrics.csv"), 1), csv_column(a.file("metrics.csv"), 1),
                                       kExampleLossBand, what + " train loss");
    const auto acc = csv_column(b.file("metrics.csv"), 2), acc_ref = csv_column(a.file("metrics.csv"), 2);
    ASSERT_FALSE(acc.empty());
    EXPECT_NEAR(acc.back(), acc_ref.back(), 0.03) << what;
    EXPECT_GT(loss, 0.0) << what << ": the same curve as fp32 communication (the setting was ignored?)";
    std::cout << "[ band     ] main job " << what << ": max relative train-loss deviation " << loss << ", accuracy "
              << acc.back() << " vs fp32 " << acc_ref.back() << std::endl;
  }
}

TEST(Fp8Communication, GptExampleLossWithinBandOfFp32) {
  if (!std::filesystem::exists("/usr/bin/bible") && !std::filesystem::exists("/usr/games/bible"))
    GTEST_SKIP() << "bible-kjv is not installed (scripts/install_deps.sh installs it)";
  const std::string gpt = std::string(BOOSTER_BINARY_DIR) + "/bin/gpt";
  const std::string configs = std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/";
  TempDir corpus;
  auto run_gpt = [&](const std::string& config, const std::string& out, const std::vector<std::string>& sets) {
    std::vector<std::string> argv{BOOSTER_CLI_PATH, "run", "--nproc_per_node", "2", "--master_port",
                                  std::to_string(free_port()), gpt, "--config", configs + config, "--output_dir", out};
    std::vector<std::string> all{"train.n_layer=2", "train.n_embd=32", "train.n_head=2", "train.n_ctx=32",
                                 "train.batch_size=8", "train.max_steps=60", "train.eval_interval=20",
                                 "train.eval_windows=16", "train.final_eval_windows=64", "train.warmup_steps=10",
                                 "train.log_interval=20", "train.sample_length=20", "train.max_minutes=3",
                                 "train.corpus=\"" + corpus.file("kjv.txt") + "\""};
    all.insert(all.end(), sets.begin(), sets.end());
    for (const auto& s : all) argv.insert(argv.end(), {"--set", s});
    return run_process(argv, {}, 300);
  };
  for (const auto& [config, sets] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"gpt_ddp.toml", {"booster.mixed_precision=\"fp32\""}},
           {"gpt_fsdp.toml", {"plugin.mixed_precision.param_dtype=\"fp32\""}}}) {
    TempDir a, b;
    auto ref = run_gpt(config, a.path(), sets);
    std::vector<std::string> fp8 = sets;
    fp8.push_back("plugin.fp8_communication=true");
    auto run = run_gpt(config, b.path(), fp8);
    ASSERT_EQ(ref.exit_code, 0) << ref.output;
    ASSERT_EQ(run.exit_code, 0) << run.output;
    // metrics.csv column 3: val_loss of each evaluation (every 20 steps, then the final one).
    const double worst = compare_curves(csv_column(b.file("metrics.csv"), 3), csv_column(a.file("metrics.csv"), 3),
                                        kExampleLossBand, "gpt " + config + " fp8 val loss");
    EXPECT_GT(worst, 0.0) << config << ": the same curve as fp32 communication (the setting was ignored?)";
    std::cout << "[ band     ] gpt " << config << " fp8: max relative validation-loss deviation " << worst << std::endl;
  }
}

// ---------------------------------------------------------------------------------------------
// Bad input: each names the option and the fix.

std::string rank0_output(const std::vector<std::string>& sets) {
  TempDir dir;
  std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=1", "batch=2"};
  for (const auto& s : sets) args.push_back("set=" + s);
  auto results = run_workers(2, args);
  EXPECT_FALSE(results.empty());
  if (results.empty()) return "";
  EXPECT_NE(results[0].exit_code, 0) << results[0].output;
  return results[0].output;
}

TEST(Fp8Communication, InconsistentOrUnsupportedSettingsAreClearErrors) {
  EXPECT_THAT(rank0_output(with(kDDP, {"plugin.fp8_communication=true", "plugin.communication_dtype=\"bf16\""})),
              HasSubstr("fp8_communication = true means communication_dtype = \"fp8\"; set only one of them"));
  EXPECT_THAT(rank0_output(with(kZero2, {"plugin.fp8_communication=false", "plugin.communication_dtype=\"fp8\""})),
              HasSubstr("remove fp8_communication or set it to true"));
  EXPECT_THAT(rank0_output({"booster.plugin=\"hybrid_parallel\"", "plugin.precision=\"fp32\"", "plugin.fp8_communication=true"}),
              HasSubstr("hybrid_parallel: fp8_communication = true is not supported by this plugin"));
  EXPECT_THAT(rank0_output(with(kFsdp, {"plugin.communication_dtype=\"bf16\""})),
              HasSubstr("torch_fsdp takes communication_dtype = \"fp8\" only"));
  EXPECT_THAT(rank0_output(with(kGemini, {"plugin.communication_dtype=\"bf16\""})),
              HasSubstr("set precision = \"bf16\" for that wire dtype instead"));
  EXPECT_THAT(rank0_output(with(kDDP, {"plugin.communication_dtype=\"bf16\"", "plugin.gradient_as_bucket_view=true"})),
              HasSubstr("or gradient_as_bucket_view = false"));
}

}  // namespace fp8_comm_test
