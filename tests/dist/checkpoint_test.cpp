// checkpoint_test.cpp — save and resume through the booster with the Fashion-MNIST example on real
// data (a 1024-sample subset so the test is quick): an interrupted + resumed run equals an
// uninterrupted one bit for bit (tolerance 0: same world size, same data order, per-epoch seeds),
// and a 2-rank checkpoint continues on 1 and 4 ranks. And across precisions with dist_worker's MLP
// ("resume" scenario): a ZeRO-2 bf16 checkpoint, with or without master weights, continues under DDP
// fp32 (equal, to fp32 tolerance, to the same checkpoint loaded and trained in this process), and a
// DDP fp32 checkpoint under ZeRO-2
// bf16 (the loaded weights are exactly the bf16 rounding of the saved ones; training then stays
// within bf16 tolerance of the uninterrupted fp32 run). And the sharded optimizer format: ZeRO-2 on 2
// ranks and FSDP on 4 (FULL_SHARD, HYBRID_SHARD) write one file per rank, none holding the whole
// state, and resume in ZeRO-1/2, DDP and FSDP at other world sizes like the uninterrupted run (DDP's
// gathered checkpoint into FSDP too); `booster ckpt consolidate` of an FSDP checkpoint gives FSDP's
// own gathered files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include <torch/torch.h>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/checkpoint/safetensors.h"
#include "booster/checkpoint/sharded_state.h"
#include "booster/dist/process_group.h"
#include "booster/wrappers/optimizer_wrapper.h"
#include "common/test_util.h"
#include "dist/dist_common.h"
#include "dist/dist_test_util.h"

using namespace booster::testing;
using ::testing::HasSubstr;

namespace {


ProcessResult run_example(int nproc, const std::string& out, const std::vector<std::string>& sets) {
  std::vector<std::string> argv{BOOSTER_CLI_PATH, "run", "--nproc_per_node", std::to_string(nproc), "--master_port",
                                std::to_string(free_port()), kFashionMnistBinary, "--config", kDdpConfig, "--output_dir", out};
  for (std::string s : {"train.epochs=3", "train.train_subset=1024", "train.test_subset=500", "train.batch_size=32",
                        "train.lr_scheduler.warmup_steps=5"})
    argv.insert(argv.end(), {"--set", s});
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  return run_process(argv, {}, 300);
}

}  // namespace

TEST(Checkpoint, ResumedRunEqualsUninterruptedRunAndContinuesOnOtherWorldSizes) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  TempDir dir;
  std::string a = dir.file("a"), b = dir.file("b"), c = dir.file("c");
  auto ra = run_example(2, dir.file("run_a"), {"train.checkpoint_dir=\"" + a + "\""});
  ASSERT_EQ(ra.exit_code, 0) << ra.output;
  auto rb = run_example(2, dir.file("run_b"), {"train.checkpoint_dir=\"" + b + "\"", "train.stop_after_epoch=2"});
  ASSERT_EQ(rb.exit_code, 0) << rb.output;
  EXPECT_EQ(checkpoint_next_epoch(latest_checkpoint(b)), 3);
  auto rc = run_example(2, dir.file("run_c"),
                        {"train.resume_from=\"" + b + "\"", "train.checkpoint_dir=\"" + c + "\""});
  ASSERT_EQ(rc.exit_code, 0) << rc.output;
  EXPECT_THAT(rc.output, HasSubstr("resumed from"));
  EXPECT_EQ(checkpoint_next_epoch(latest_checkpoint(c)), 4);

  auto full = booster::checkpoint::load_safetensors(latest_checkpoint(a) + "/model/model.safetensors");
  auto resumed = booster::checkpoint::load_safetensors(latest_checkpoint(c) + "/model/model.safetensors");
  ASSERT_EQ(full.size(), resumed.size());
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(full[i].first, resumed[i].first);
    EXPECT_TRUE(torch::equal(full[i].second, resumed[i].second))
        << full[i].first << " max |diff| " << (full[i].second.to(torch::kDouble) - resumed[i].second.to(torch::kDouble)).abs().max().item<double>();
  }
  // The optimizer state too (AdamW moments by parameter name).
  auto opt_full = booster::checkpoint::load_safetensors(latest_checkpoint(a) + "/optimizer/optimizer.safetensors");
  auto opt_resumed = booster::checkpoint::load_safetensors(latest_checkpoint(c) + "/optimizer/optimizer.safetensors");
  ASSERT_EQ(opt_full.size(), opt_resumed.size());
  for (size_t i = 0; i < opt_full.size(); ++i) EXPECT_TRUE(torch::equal(opt_full[i].second, opt_resumed[i].second));

  // Mid-epoch: stopped after optimizer step 10 with a checkpoint every 4 steps (the newest is step 8,
  // inside epoch 1), the same command continues by itself (auto_resume: the batch position, each
  // rank's generator, the step) and ends bitwise equal to the uninterrupted run.
  const std::string e = dir.file("e");
  const std::vector<std::string> every4 = {"train.checkpoint_dir=\"" + e + "\"", "train.checkpoint_every_steps=4",
                                           "train.keep_last_n=2"};
  std::vector<std::string> stop = every4;
  stop.push_back("train.stop_after_step=10");
  auto re1 = run_example(2, dir.file("run_e"), stop);
  ASSERT_EQ(re1.exit_code, 0) << re1.output;
  EXPECT_EQ(latest_checkpoint(e), e + "/step_000000008");
  const std::string mid8 = dir.file("mid8");  // kept for the error cases below (keep_last_n prunes it)
  std::filesystem::copy(e + "/step_000000008", mid8, std::filesystem::copy_options::recursive);
  auto re2 = run_example(2, dir.file("run_e"), every4);
  ASSERT_EQ(re2.exit_code, 0) << re2.output;
  EXPECT_THAT(re2.output, HasSubstr("resumed from " + e + "/step_000000008 in epoch 1 after batch 8"));
  EXPECT_EQ(latest_checkpoint(e), e + "/step_000000048");
  auto mid = booster::checkpoint::load_safetensors(latest_checkpoint(e) + "/model/model.safetensors");
  ASSERT_EQ(mid.size(), full.size());
  for (size_t i = 0; i < full.size(); ++i) EXPECT_TRUE(torch::equal(full[i].second, mid[i].second)) << full[i].first;
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(e), std::filesystem::directory_iterator()), 3)
      << "keep_last_n = 2: two step directories and `latest`";
  // The epoch-1 row of metrics.csv survives the resume, with the uninterrupted run's train loss.
  auto loss_and_accuracy = [](const std::string& csv, int row) {  // "epoch,train_loss,test_accuracy" of a row
    size_t at = 0;
    for (int r = 0; r < row && at != std::string::npos; ++r) at = csv.find('\n', at) + 1;
    size_t end = at;
    for (int commas = 0; commas < 3 && end != std::string::npos; ++commas) end = csv.find(',', end + 1);
    return csv.substr(at, end - at);
  };
  const std::string csv_a = read_file(dir.file("run_a") + "/metrics.csv"), csv_e = read_file(dir.file("run_e") + "/metrics.csv");
  for (int row = 1; row <= 3; ++row) {
    EXPECT_EQ(loss_and_accuracy(csv_e, row), loss_and_accuracy(csv_a, row)) << "metrics.csv row " << row;
    EXPECT_EQ(loss_and_accuracy(csv_e, row).substr(0, 2), std::to_string(row) + ",");
  }

  // A mid-epoch checkpoint holds each rank's data position and generator: on another world size it
  // is a clear error naming both ways out, and nothing is written to its directory.
  const std::string mid8_state = read_file(mid8 + "/trainer_state.json");
  auto r1 = run_example(1, dir.file("run_mid1"), {"train.resume_from=\"" + mid8 + "\""});
  EXPECT_NE(r1.exit_code, 0);
  EXPECT_THAT(r1.output, HasSubstr("was saved mid-epoch by 2 ranks"));
  EXPECT_THAT(r1.output, HasSubstr("resume from a checkpoint saved at an epoch end"));
  EXPECT_EQ(read_file(mid8 + "/trainer_state.json"), mid8_state);
  // resume_from naming neither a checkpoint nor a checkpoint_dir with step directories.
  const std::string empty = dir.file("empty");
  std::filesystem::create_directories(empty);
  auto r2 = run_example(2, dir.file("run_empty"), {"train.resume_from=\"" + empty + "\""});
  EXPECT_NE(r2.exit_code, 0);
  EXPECT_THAT(r2.output, HasSubstr("is neither a checkpoint (model/, trainer_state.json) nor a checkpoint_dir"));
  EXPECT_TRUE(list_dir(empty).empty());

  // The 2-rank checkpoint continues on 1 and on 4 ranks (gathered, name-keyed state).
  for (int n : {1, 4}) {
    std::string d = dir.file("n" + std::to_string(n));
    auto r = run_example(n, dir.file("run_n" + std::to_string(n)),
                         {"train.resume_from=\"" + b + "\"", "train.checkpoint_dir=\"" + d + "\""});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("world size " + std::to_string(n)));
    EXPECT_EQ(checkpoint_next_epoch(latest_checkpoint(d)), 4);
    auto m = booster::checkpoint::load_safetensors(latest_checkpoint(d) + "/model/model.safetensors");
    auto before = booster::checkpoint::load_safetensors(latest_checkpoint(b) + "/model/model.safetensors");
    EXPECT_FALSE(torch::equal(m[0].second, before[0].second)) << "epoch 3 should have changed the weights";
  }
}

// ---------------------------------------------------------------------------------------------
// Across precisions: the model's weights load in the receiving model's dtype

namespace {

// ZeRO-2 with bf16 weights and fp32 master slices (examples/configs/zero2.toml's precision), with
// small buckets so that buckets span both ranks' shards.
const std::vector<std::string> kZero2Bf16{"booster.plugin=\"low_level_zero\"", "plugin.stage=2",
                                          "plugin.precision=\"bf16\"", "plugin.reduce_bucket_size_in_m=0.0003"};

// dist_worker's "resume" scenario: AdamW on the MLP, global batches of 8 rows, steps [start, stop).
std::vector<ProcessResult> resume_run(int world, const std::string& out, int64_t start, int64_t stop,
                                      const std::string& io_arg, const std::vector<std::string>& sets,
                                      const std::vector<std::string>& more_args = {}) {
  std::filesystem::create_directories(out);
  std::vector<std::string> args{"scenario=resume", "steps=6", "global=8", "optimizer=adamw", "out=" + out,
                                "start=" + std::to_string(start), "stop=" + std::to_string(stop), io_arg};
  args.insert(args.end(), more_args.begin(), more_args.end());
  for (const auto& s : sets) args.push_back("set=" + s);
  auto results = run_workers(world, args);
  expect_all_ok(results);
  return results;
}

std::vector<torch::Tensor> parameters_of(MLP& net) {
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

size_t occurrences(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

// A ZeRO-2 bf16 checkpoint (`zero_sets`) continues under DDP fp32 on 1 rank: equal, to fp32 tolerance,
// to the same checkpoint loaded into the fp32 MLP in this process and trained on the same batches.
// `state_log` is the optimizer's conversion line expected in rank 0's output ("" = none).
void check_zero2_bf16_to_ddp_fp32(const std::vector<std::string>& zero_sets, at::ScalarType state_dtype,
                                  const std::string& state_log) {
  TempDir dir;
  const std::string ckpt = dir.file("zero2_bf16");
  resume_run(2, dir.file("a"), 0, 3, "save=" + ckpt, zero_sets);
  // What ZeRO-2 bf16 writes: the model's weights in bf16, the optimizer state in its master dtype.
  auto model_file = booster::checkpoint::load_safetensors(ckpt + "/model/model.safetensors");
  ASSERT_EQ(model_file.size(), 8u);
  for (const auto& [name, t] : model_file) EXPECT_EQ(t.scalar_type(), at::kBFloat16) << name;
  // (ZeRO saves the optimizer sharded: one file per rank.)
  booster::checkpoint::ShardedStateReader state(ckpt + "/optimizer");
  ASSERT_EQ(state.tensors().size(), 16u);
  for (const auto& t : state.tensors()) EXPECT_EQ(t.dtype, state_dtype) << t.name;

  auto results = resume_run(1, dir.file("b"), 3, 6, "load=" + ckpt, {});
  EXPECT_EQ(occurrences(results[0].output, "converted 8 tensors BFloat16 -> Float (the model's dtype)"), 1u)
      << results[0].output;
  if (state_log.empty()) EXPECT_EQ(occurrences(results[0].output, "state tensor"), 0u) << results[0].output;
  else EXPECT_EQ(occurrences(results[0].output, state_log), 1u) << results[0].output;

  // Reference. Right after loading, the weights are exactly the bf16 values widened.
  torch::manual_seed(7);
  MLP net;
  auto opt = make_optimizer("adamw", net->parameters());
  booster::OptimizerWrapper wrapper(opt, nullptr);
  std::vector<std::string> names;
  for (const auto& item : net->named_parameters()) names.push_back(item.key());
  wrapper.set_parameter_names(names);
  booster::checkpoint::CheckpointIO io(booster::dist::ProcessGroup::rendezvous({}));
  io.load_model(*net, ckpt + "/model");
  io.load_optimizer(wrapper, ckpt + "/optimizer");
  auto loaded = load_tensors(dir.file("b/rank0_loaded.pt"));
  ASSERT_EQ(loaded.size(), model_file.size());
  for (size_t i = 0; i < loaded.size(); ++i) {
    EXPECT_EQ(names[i], model_file[i].first);
    EXPECT_TRUE(torch::equal(loaded[i], model_file[i].second.to(at::kFloat))) << names[i];
    EXPECT_TRUE(torch::equal(net->parameters()[i], loaded[i])) << names[i];
  }
  auto batches = make_batches(6, 8, 23);
  for (int64_t s = 3; s < 6; ++s) {
    torch::mse_loss(net->forward(batches.inputs[s]), batches.targets[s]).backward();
    opt->step();
    opt->zero_grad();
  }
  auto resumed = load_tensors(dir.file("b/rank0.pt"));
  expect_close(resumed, parameters_of(net), "zero2 bf16 (2 ranks) -> ddp fp32 (1 rank) vs in-process load");
  for (size_t i = 0; i < resumed.size(); ++i) EXPECT_FALSE(torch::equal(resumed[i], loaded[i])) << "step changed nothing";
}

}  // namespace

// With master weights (zero2.toml): bf16 weights converted, fp32 optimizer state as is.
TEST(Checkpoint, Zero2Bf16CheckpointContinuesUnderDdpFp32) {
  check_zero2_bf16_to_ddp_fp32(kZero2Bf16, at::kFloat, "");
}

// Without master weights the optimizer state is bf16 too and is widened on load.
TEST(Checkpoint, Zero2Bf16WithoutMasterWeightsContinuesUnderDdpFp32) {
  auto sets = kZero2Bf16;
  sets.push_back("plugin.master_weights=false");
  check_zero2_bf16_to_ddp_fp32(sets, at::kBFloat16,
                               "converted 16 state tensors BFloat16 -> Float (the optimizer's dtype)");
}

TEST(Checkpoint, DdpFp32CheckpointContinuesUnderZero2Bf16) {
  TempDir dir;
  const std::string ckpt = dir.file("ddp_fp32");
  resume_run(2, dir.file("a"), 0, 3, "save=" + ckpt, {});
  auto model_file = booster::checkpoint::load_safetensors(ckpt + "/model/model.safetensors");
  ASSERT_EQ(model_file.size(), 8u);
  auto results = resume_run(2, dir.file("b"), 3, 6, "load=" + ckpt, kZero2Bf16);
  EXPECT_EQ(occurrences(results[0].output, "converted 8 tensors Float -> BFloat16 (the model's dtype)"), 1u)
      << results[0].output;
  EXPECT_EQ(occurrences(results[1].output, "converted"), 0u) << results[1].output;  // rank 0 logs
  EXPECT_EQ(occurrences(results[0].output, "state tensor"), 0u) << results[0].output;  // fp32 masters: no conversion

  // Right after loading, every rank's bf16 weights are exactly the bf16 rounding of the fp32 ones.
  for (int r = 0; r < 2; ++r) {
    auto loaded = load_tensors(dir.file("b/rank" + std::to_string(r) + "_loaded.pt"));
    ASSERT_EQ(loaded.size(), model_file.size());
    for (size_t i = 0; i < loaded.size(); ++i) {
      EXPECT_EQ(loaded[i].scalar_type(), at::kBFloat16);
      EXPECT_TRUE(torch::equal(loaded[i], model_file[i].second.to(at::kBFloat16))) << model_file[i].first;
    }
  }
  // Training proceeds: the ranks agree bit for bit, and after 3 bf16 steps the weights are within
  // bf16 tolerance of the uninterrupted fp32 run (6 steps in this process). bf16 keeps 8 significant
  // bits, so one rounding is up to 2^-8 = 0.4% relative; the tolerance, |bf16 - fp32| <= 2e-3 +
  // 1/64 |fp32| per element, allows the rounding at load and at each step plus bf16 forward and
  // gradients (measured: max |diff| 1.5e-3).
  auto want = uninterrupted_resume_run(6);
  auto r0 = load_tensors(dir.file("b/rank0.pt")), r1 = load_tensors(dir.file("b/rank1.pt"));
  auto loaded = load_tensors(dir.file("b/rank0_loaded.pt"));
  ASSERT_EQ(r0.size(), want.size());
  const double rtol = 1.0 / 64, atol = 2e-3;
  double max_diff = 0, used = 0;  // used: the largest |diff| / (atol + rtol |fp32|), 1 = at the tolerance
  for (size_t i = 0; i < r0.size(); ++i) {
    EXPECT_TRUE(torch::equal(r0[i], r1[i])) << "ranks differ in tensor " << i;
    EXPECT_FALSE(torch::equal(r0[i], loaded[i])) << "step changed nothing in tensor " << i;
    auto diff = (r0[i].to(at::kFloat) - want[i]).abs();
    EXPECT_TRUE(torch::allclose(r0[i].to(at::kFloat), want[i], rtol, atol))
        << "tensor " << i << " max |diff| " << diff.max().item<double>();
    max_diff = std::max(max_diff, diff.max().item<double>());
    used = std::max(used, (diff / (atol + rtol * want[i].abs())).max().item<double>());
  }
  std::cout << "[ compare  ] ddp fp32 (2 ranks) -> zero2 bf16 (2 ranks) vs uninterrupted fp32: max |diff| = "
            << max_diff << ", " << used << " of the tolerance" << std::endl;
}

// ---------------------------------------------------------------------------------------------
// Sharded optimizer checkpoints: ZeRO and FSDP save without gathering (every rank writes its own
// file), and any plugin at any world size resumes from them by the ranges it keeps. Each resumed
// run (steps 3..5) equals the uninterrupted one (steps 0..5 in this process) within the plugins'
// tolerance, 1e-5 + 1e-4 |reference| per element.

namespace {

const std::vector<std::string> kZeroFp32{"booster.plugin=\"low_level_zero\"", "plugin.precision=\"fp32\"",
                                         "plugin.reduce_bucket_size_in_m=0.0003"};

std::vector<std::string> zero_fp32(int stage) {
  auto sets = kZeroFp32;
  sets.push_back("plugin.stage=" + std::to_string(stage));
  return sets;
}

// torch_fsdp with rank 0's weights broadcast at boost (sync_module_states, as in fsdp_test.cpp).
std::vector<std::string> fsdp(const std::string& strategy = "FULL_SHARD", std::vector<std::string> more = {}) {
  std::vector<std::string> sets{"booster.plugin=\"torch_fsdp\"", "plugin.sync_module_states=true",
                                "plugin.sharding_strategy=\"" + strategy + "\""};
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

// The MLP with AdamW on the resume scenario's global batches of 8 rows, `steps` steps in one process.
std::vector<torch::Tensor> uninterrupted(int64_t steps) { return uninterrupted_resume_run(steps); }

// Resumes `ckpt` on `world` ranks with `sets` for steps 3..5; every rank equals the uninterrupted run.
void expect_resumes(const std::string& ckpt, int world, const std::vector<std::string>& sets, const std::string& what) {
  TempDir out;
  resume_run(world, out.path(), 3, 6, "load=" + ckpt, sets);
  const auto want = uninterrupted(6);
  for (int r = 0; r < world; ++r)
    expect_close(load_tensors(out.file("rank" + std::to_string(r) + ".pt")), want, what + ", rank " + std::to_string(r));
}

// The optimizer directory of a sharded save by `world` ranks: the files, every AdamW moment of the
// MLP fully covered, and no rank holding the whole state: each rank's file is smaller than the
// state's bytes. Returns the elements each rank saved.
std::vector<int64_t> expect_sharded_files(const std::string& dir, int world) {
  namespace fs = std::filesystem;
  booster::checkpoint::ShardedStateReader reader(dir);
  EXPECT_EQ(reader.world_size(), world);
  EXPECT_FALSE(fs::exists(dir + "/optimizer.safetensors"));
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names.size(), static_cast<size_t>(world) + 2)
      << "one file per rank + optimizer.sharded.json + optimizer_groups.json";
  EXPECT_EQ(reader.tensors().size(), 16u);  // 8 parameters x {exp_avg, exp_avg_sq}
  int64_t total = 0;
  std::vector<int64_t> held(world, 0);
  for (const auto& t : reader.tensors()) {
    EXPECT_EQ(t.covered, t.numel) << t.name;
    total += t.numel;
    for (const auto& p : t.pieces) held.at(p.rank) += p.length;
  }
  EXPECT_EQ(total, 2 * 2788);
  for (int r = 0; r < world; ++r) {
    const auto bytes = static_cast<int64_t>(fs::file_size(reader.files().at(r)));
    EXPECT_LT(bytes, total * 4) << "rank " << r << "'s file holds the whole state";
    EXPECT_LT(held[r], total) << "rank " << r;
  }
  return held;
}

}  // namespace

TEST(Checkpoint, Zero2ShardedOptimizerResumesInZero1DdpAndFsdp) {
  TempDir dir;
  const std::string ckpt = dir.file("zero2");
  resume_run(2, dir.file("a"), 0, 3, "save=" + ckpt, zero_fp32(2));
  auto held = expect_sharded_files(ckpt + "/optimizer", 2);
  EXPECT_EQ(held[0], 2 * 1394);  // each rank its half of every group's flat layout (no padding)
  EXPECT_EQ(held[1], 2 * 1394);
  expect_resumes(ckpt, 4, zero_fp32(1), "zero2 (2 ranks, sharded) -> zero1 (4 ranks)");
  expect_resumes(ckpt, 1, {}, "zero2 (2 ranks, sharded) -> ddp (1 rank)");
  expect_resumes(ckpt, 2, fsdp(), "zero2 (2 ranks, sharded) -> fsdp (2 ranks)");
}

TEST(Checkpoint, FsdpShardedOptimizerResumesInDdpAndZero2AndDdpResumesInFsdp) {
  TempDir dir;
  const std::string ckpt = dir.file("fsdp");
  resume_run(4, dir.file("a"), 0, 3, "save=" + ckpt, fsdp());
  for (int64_t n : expect_sharded_files(ckpt + "/optimizer", 4)) EXPECT_GT(n, 0);
  expect_resumes(ckpt, 1, {}, "fsdp (4 ranks, sharded) -> ddp (1 rank)");
  expect_resumes(ckpt, 2, zero_fp32(2), "fsdp (4 ranks, sharded) -> zero2 (2 ranks)");
  // The reverse: DDP writes the gathered format (one file), FSDP on 4 ranks cuts its shards from it.
  const std::string ddp = dir.file("ddp");
  resume_run(1, dir.file("b"), 0, 3, "save=" + ddp, {});
  EXPECT_TRUE(std::filesystem::exists(ddp + "/optimizer/optimizer.safetensors"));
  EXPECT_FALSE(booster::checkpoint::ShardedStateReader::exists(ddp + "/optimizer"));
  expect_resumes(ddp, 4, fsdp(), "ddp (1 rank, gathered) -> fsdp (4 ranks)");
}

// HYBRID_SHARD and NO_SHARD replicate each shard across the replicate group: only one replica saves
// it. NO_SHARD's state is not split (a shard group of one rank), so by default it is saved gathered.
TEST(Checkpoint, ReplicatedFsdpShardsAreSavedFromOneReplica) {
  TempDir dir;
  const std::string ckpt = dir.file("hsdp");
  resume_run(4, dir.file("a"), 0, 3, "save=" + ckpt, fsdp("HYBRID_SHARD", {"plugin.shard_group_size=2"}));
  auto held = expect_sharded_files(ckpt + "/optimizer", 4);
  int savers = 0;
  for (int64_t n : held) savers += n > 0 ? 1 : 0;
  EXPECT_EQ(savers, 2) << "one shard group's ranks";
  expect_resumes(ckpt, 2, zero_fp32(1), "hybrid shard (4 ranks, sharded) -> zero1 (2 ranks)");

  const std::string no_shard = dir.file("no_shard"), forced = dir.file("no_shard_sharded");
  resume_run(2, dir.file("b"), 0, 3, "save=" + no_shard, fsdp("NO_SHARD"));
  EXPECT_TRUE(std::filesystem::exists(no_shard + "/optimizer/optimizer.safetensors"));
  resume_run(2, dir.file("c"), 0, 3, "save=" + forced, fsdp("NO_SHARD"), {"optimizer_format=sharded"});
  booster::checkpoint::ShardedStateReader reader(forced + "/optimizer");
  for (const auto& t : reader.tensors()) {
    ASSERT_EQ(t.pieces.size(), 1u) << t.name;
    EXPECT_EQ(t.pieces[0].rank, 0) << t.name;
  }
  expect_resumes(forced, 1, {}, "no shard (2 ranks, sharded) -> ddp (1 rank)");
}

// `booster ckpt consolidate` turns a sharded FSDP checkpoint into the gathered format: the same
// tensors and groups file as FSDP's own gathered save, and it resumes the same way.
TEST(Checkpoint, ConsolidatedFsdpCheckpointEqualsTheGatheredOne) {
  TempDir dir;
  const std::string sharded = dir.file("sharded"), gathered = dir.file("gathered"), joined = dir.file("joined");
  resume_run(2, dir.file("a"), 0, 3, "save=" + sharded, fsdp());
  resume_run(2, dir.file("b"), 0, 3, "save=" + gathered, fsdp(), {"optimizer_format=gathered"});
  ASSERT_TRUE(std::filesystem::exists(gathered + "/optimizer/optimizer.safetensors"));
  std::filesystem::create_directories(joined);
  std::filesystem::copy(sharded + "/model", joined + "/model");
  auto r = run_process({BOOSTER_CLI_PATH, "ckpt", "consolidate", sharded + "/optimizer", joined + "/optimizer"}, {}, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto want = booster::checkpoint::load_safetensors(gathered + "/optimizer/optimizer.safetensors");
  auto got = booster::checkpoint::load_safetensors(joined + "/optimizer/optimizer.safetensors");
  ASSERT_EQ(got.size(), want.size());
  std::map<std::string, torch::Tensor> by_name(got.begin(), got.end());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(by_name.count(name)) << name;
    EXPECT_TRUE(torch::equal(by_name[name], t)) << name;
  }
  EXPECT_EQ(read_file(joined + "/optimizer/optimizer_groups.json"),
            read_file(gathered + "/optimizer/optimizer_groups.json"));
  expect_resumes(joined, 2, fsdp(), "fsdp sharded, consolidated -> fsdp (2 ranks)");
  expect_resumes(joined, 1, {}, "fsdp sharded, consolidated -> ddp (1 rank)");
}

// Gemini saves its float32 master shards (model) and its sharded optimizer like FSDP; the checkpoint
// continues in FSDP, ZeRO-2 and DDP, and theirs continue in Gemini (chunks of 1024 elements over the
// MLP, optimizer states offloaded to a file on one side).
TEST(Checkpoint, GeminiCheckpointContinuesInFsdpZero2AndDdpAndBack) {
  TempDir dir, off;
  const std::vector<std::string> gemini{"booster.plugin=\"gemini\"", "plugin.precision=\"fp32\"",
                                        "plugin.min_chunk_size_m=0.0005", "plugin.search_range_m=0",
                                        "plugin.hidden_dim=16"};
  std::vector<std::string> offloaded = gemini;
  offloaded.push_back("plugin.offload_optim_frac=1.0");
  offloaded.push_back("plugin.offload_dir=\"" + off.path() + "\"");
  const std::string ckpt = dir.file("gemini");
  resume_run(2, dir.file("a"), 0, 3, "save=" + ckpt, offloaded);
  for (int64_t n : expect_sharded_files(ckpt + "/optimizer", 2)) EXPECT_GT(n, 0);
  expect_resumes(ckpt, 4, fsdp(), "gemini (2 ranks) -> fsdp (4 ranks)");
  expect_resumes(ckpt, 2, zero_fp32(2), "gemini (2 ranks) -> zero2 (2 ranks)");
  expect_resumes(ckpt, 1, {}, "gemini (2 ranks) -> ddp (1 rank)");
  expect_resumes(ckpt, 4, gemini, "gemini (2 ranks) -> gemini (4 ranks)");
  const std::string zero2 = dir.file("zero2");
  resume_run(2, dir.file("b"), 0, 3, "save=" + zero2, zero_fp32(2));
  expect_resumes(zero2, 2, offloaded, "zero2 (2 ranks) -> gemini (2 ranks, optimizer offloaded)");
  const std::string ddp = dir.file("ddp");
  resume_run(1, dir.file("c"), 0, 3, "save=" + ddp, {});
  expect_resumes(ddp, 2, gemini, "ddp (1 rank) -> gemini (2 ranks)");
}

namespace {

// Every file under `dir` (relative name -> bytes).
std::map<std::string, std::string> files_under(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[std::filesystem::relative(e.path(), dir).string()] = read_file(e.path().string());
  return out;
}

}  // namespace

// Asynchronous checkpoint saves ([train] checkpoint_use_async, booster/checkpoint/async_save.h) on
// 2 rank processes, a checkpoint every 4 steps while training continues. DDP (model and optimizer
// gathered on rank 0): the run is stopped mid-way and resumed; every committed set equals the
// blocking run's byte for byte (trainer_state.json's config text aside) and the resumed run ends
// bitwise equal to it. ZeRO-2 (one optimizer file per rank, sharded_state.h): every set holds the
// blocking run's tensors (its files carry a random save id, so bytes differ by design).
TEST(Checkpoint, AsyncSavesWriteTheSameSetsAsBlockingOnesAndResume) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  for (const std::string config : {"ddp", "zero2"}) {
    TempDir dir;
    auto run = [&](const std::string& out, const std::vector<std::string>& sets) {
      std::vector<std::string> argv{BOOSTER_CLI_PATH, "run", "--nproc_per_node", "2", "--master_port",
                                    std::to_string(free_port()), kFashionMnistBinary, "--config",
                                    std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/" + config + ".toml",
                                    "--output_dir", out};
      for (std::string s : {"train.epochs=2", "train.train_subset=512", "train.test_subset=200", "train.batch_size=32",
                            "train.lr_scheduler.warmup_steps=5", "train.checkpoint_every_steps=4"})
        argv.insert(argv.end(), {"--set", s});
      for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
      return run_process(argv, {}, 300);
    };
    const std::string s = dir.file("sync"), a = dir.file("async");
    auto rs = run(dir.file("run_s"), {"train.checkpoint_dir=\"" + s + "\""});
    ASSERT_EQ(rs.exit_code, 0) << rs.output;
    const std::vector<std::string> async_sets = {"train.checkpoint_dir=\"" + a + "\"", "train.checkpoint_use_async=true"};
    if (config == "ddp") {
      std::vector<std::string> stop = async_sets;
      stop.push_back("train.stop_after_step=10");
      auto ra1 = run(dir.file("run_a"), stop);
      ASSERT_EQ(ra1.exit_code, 0) << ra1.output;
      EXPECT_THAT(ra1.output, HasSubstr("asynchronous save of"));
      EXPECT_EQ(latest_checkpoint(a), a + "/step_000000008");
    }
    auto ra2 = run(dir.file("run_a"), async_sets);
    ASSERT_EQ(ra2.exit_code, 0) << ra2.output;
    if (config == "ddp") EXPECT_THAT(ra2.output, HasSubstr("resumed from " + a + "/step_000000008"));
    const std::string last = latest_checkpoint(s);
    ASSERT_FALSE(last.empty());
    EXPECT_EQ(latest_checkpoint(a), a + "/" + std::filesystem::path(last).filename().string());
    for (const std::string& step : std::vector<std::string>{"step_000000004", "step_000000008",
                                                             std::filesystem::path(last).filename().string()}) {
      auto want = files_under(s + "/" + step), got = files_under(a + "/" + step);
      want.erase("trainer_state.json");  // holds the effective config, which differs in checkpoint_dir
      got.erase("trainer_state.json");
      EXPECT_EQ(want.size(), got.size()) << config << " " << step;
      for (const auto& [name, bytes] : want) {
        ASSERT_TRUE(got.count(name)) << config << " " << step << "/" << name;
        if (config == "ddp" || name.find("optimizer") == std::string::npos) {
          EXPECT_TRUE(got[name] == bytes) << config << " " << step << "/" << name;
        } else if (name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0) {
          auto w = booster::checkpoint::load_safetensors(s + "/" + step + "/" + name);
          auto g = booster::checkpoint::load_safetensors(a + "/" + step + "/" + name);
          ASSERT_EQ(w.size(), g.size()) << name;
          for (size_t i = 0; i < w.size(); ++i)
            EXPECT_TRUE(w[i].first == g[i].first && torch::equal(w[i].second, g[i].second)) << step << "/" << name;
        }
      }
    }
    // No temporary, marker or trash left behind.
    for (const auto& e : std::filesystem::directory_iterator(a))
      EXPECT_EQ(e.path().filename().string().rfind(".", 0), std::string::npos) << e.path();
  }
}
