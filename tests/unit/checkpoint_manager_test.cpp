// checkpoint_manager_test.cpp — one-commit checkpoint directories (checkpoint_manager.h): commit,
// the `latest` pointer and its fall-back, pruning, leftovers of crashes, a failing rank, and the
// trainer state with the generator, on 1 and 2 ranks (threads).
#include "booster/checkpoint/checkpoint_manager.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "booster/checkpoint/safetensors.h"
#include "booster/io/atomic_write.h"
#include "common/test_util.h"
#include "common/thread_ranks.h"

namespace {

using booster::testing::list_dir;

namespace fs = std::filesystem;
using booster::checkpoint::CheckpointManager;
using booster::testing::TempDir;
using ::testing::HasSubstr;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST(CheckpointManager, CommitsOneDirectoryPerStepPointsLatestAtItAndPrunes) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  CheckpointManager m(root, nullptr, /*keep_last_n=*/2);
  EXPECT_EQ(m.latest(), std::nullopt);  // root does not exist yet
  for (int64_t step : {10, 20, 30}) {
    std::string seen;
    const std::string dir = m.save(step, [&](const std::string& d) {
      seen = d;
      EXPECT_THAT(fs::path(d).filename().string(), HasSubstr(".tmp-step_"));  // never under the step's name
      booster::io::write_new_file(d + "/value.txt", std::to_string(step));
    });
    EXPECT_EQ(dir, root + "/" + CheckpointManager::step_name(step));
    EXPECT_FALSE(fs::exists(seen));
    EXPECT_EQ(slurp(dir + "/value.txt"), std::to_string(step));
    EXPECT_EQ(m.latest(), dir);
    EXPECT_EQ(slurp(root + "/latest"), CheckpointManager::step_name(step) + "\n");
  }
  EXPECT_EQ(m.steps(), (std::vector<int64_t>{20, 30}));
  EXPECT_EQ(list_dir(root), (std::set<std::string>{"latest", "step_000000020", "step_000000030"}));
  EXPECT_EQ(CheckpointManager::step_name(7), "step_000000007");
  EXPECT_EQ(CheckpointManager::step_name(12345678901LL), "step_12345678901");
}

TEST(CheckpointManager, LatestFallsBackToTheNewestDirectoryAndCrashLeftoversAreCleaned) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  CheckpointManager m(root, nullptr);
  m.save(5, [](const std::string& d) { booster::io::write_new_file(d + "/a", "5"); });
  m.save(7, [](const std::string& d) { booster::io::write_new_file(d + "/a", "7"); });
  // A crash between the commit's rename and the pointer's update: `latest` names step 5; it still
  // names a complete checkpoint, and that is what latest() returns.
  booster::io::atomic_write_file(root + "/latest", "step_000000005\n");
  EXPECT_EQ(m.latest(), root + "/step_000000005");
  // Pointer missing, malformed, or naming a pruned directory: the newest directory.
  fs::remove(root + "/latest");
  EXPECT_EQ(m.latest(), root + "/step_000000007");
  booster::io::atomic_write_file(root + "/latest", "../../etc\n");
  EXPECT_EQ(m.latest(), root + "/step_000000007");
  booster::io::atomic_write_file(root + "/latest", "step_000000099\n");
  EXPECT_EQ(m.latest(), root + "/step_000000007");
  // A save cut off by a crash and a half-removed pruned checkpoint: invisible to latest(), removed
  // by the next save; files that are not checkpoints are left alone.
  fs::create_directories(root + "/.tmp-step_000000009-123/model");
  fs::create_directories(root + "/.trash-step_000000001-123");
  booster::io::write_new_file(root + "/notes.txt", "mine");
  EXPECT_EQ(m.latest(), root + "/step_000000007");
  EXPECT_EQ(m.steps(), (std::vector<int64_t>{5, 7}));
  m.save(9, [](const std::string& d) { booster::io::write_new_file(d + "/a", "9"); });
  EXPECT_EQ(list_dir(root),
            (std::set<std::string>{"latest", "notes.txt", "step_000000005", "step_000000007", "step_000000009"}));
  // Saving a step again replaces it whole.
  m.save(9, [](const std::string& d) { booster::io::write_new_file(d + "/b", "again"); });
  EXPECT_EQ(list_dir(root + "/step_000000009"), (std::set<std::string>{"b"}));
}

TEST(CheckpointManager, AFailingRankCommitsNothingAndEveryRankThrowsItsMessage) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
    CheckpointManager m(root, g, 1);
    m.save(1, [&](const std::string& d) {
      booster::io::write_new_file(d + "/rank" + std::to_string(g->rank()), "ok");
    });
    EXPECT_EQ(list_dir(root + "/step_000000001"), (std::set<std::string>{"rank0", "rank1"}));
    g->barrier();
    try {
      m.save(2, [&](const std::string& d) {
        booster::io::write_new_file(d + "/rank" + std::to_string(g->rank()), "ok");
        if (g->rank() == 1) throw std::runtime_error("disk full on rank 1");
      });
      ADD_FAILURE() << "save should have thrown on rank " << g->rank();
    } catch (const booster::checkpoint::CheckpointError& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 1: disk full on rank 1"));
      EXPECT_THAT(e.what(), HasSubstr("nothing committed"));
    }
    g->barrier();
    EXPECT_EQ(m.latest(), root + "/step_000000001");
    EXPECT_EQ(list_dir(root), (std::set<std::string>{"latest", "step_000000001"}));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(CheckpointManager, TrainerStateRestoresPositionSumsAndEachRanksGenerator) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  // Two ranks as threads share one default generator, so the per-rank files are checked in a
  // single process here and across processes by the example's resume tests.
  CheckpointManager m(root, nullptr);
  booster::checkpoint::TrainerState state;
  state.epoch = 3;
  state.step_in_epoch = 17;
  state.global_step = 117;
  state.sums = {{"loss_sum", 12.5}, {"samples", 544}};
  state.config = "[train]\nepochs = 5\n";
  torch::manual_seed(123);
  torch::rand({5});  // advance the stream
  const std::string dir = m.save(117, [&](const std::string& d) { save_trainer_state(d, state, nullptr); });
  const at::Tensor next = torch::rand({8});  // what a continuing run draws next
  torch::manual_seed(999);
  auto loaded = booster::checkpoint::load_trainer_state(dir, nullptr);
  EXPECT_TRUE(torch::equal(torch::rand({8}), next));
  EXPECT_EQ(loaded.epoch, 3);
  EXPECT_EQ(loaded.step_in_epoch, 17);
  EXPECT_EQ(loaded.global_step, 117);
  EXPECT_EQ(loaded.sums, state.sums);
  EXPECT_EQ(loaded.config, state.config);
  EXPECT_EQ(loaded.world_size, 1);
  EXPECT_TRUE(loaded.generator_restored);

  // Malformed or missing files are errors naming the file.
  booster::io::atomic_write_file(dir + "/trainer_state.json", "{\"epoch\": \"three\"}");
  EXPECT_THAT([&] { booster::checkpoint::load_trainer_state(dir, nullptr); },
              ::testing::ThrowsMessage<booster::checkpoint::CheckpointError>(
                  HasSubstr(dir + "/trainer_state.json is not a trainer state")));
  fs::remove(dir + "/rng_state_rank0.bin");
  booster::io::atomic_write_file(dir + "/trainer_state.json",
                                 "{\"epoch\": 1, \"step_in_epoch\": 0, \"global_step\": 4, \"world_size\": 1, "
                                 "\"sums\": [{}]}");
  EXPECT_FALSE(booster::checkpoint::load_trainer_state(dir, nullptr).generator_restored);
  booster::io::write_new_file(dir + "/rng_state_rank0.bin", "short");
  EXPECT_THAT([&] { booster::checkpoint::load_trainer_state(dir, nullptr); },
              ::testing::ThrowsMessage<booster::checkpoint::CheckpointError>(HasSubstr("rng_state_rank0.bin holds 5 bytes")));
  EXPECT_THROW(CheckpointManager("", nullptr), std::invalid_argument);
  EXPECT_THROW(CheckpointManager(root, nullptr, -1), std::invalid_argument);
  EXPECT_THROW(m.save(-1, [](const std::string&) {}), std::invalid_argument);
}

TEST(CheckpointManager, TrainerStateKeepsEachRanksSums) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
    CheckpointManager m(root, g);
    booster::checkpoint::TrainerState state;
    state.epoch = 1;
    state.step_in_epoch = 5;
    state.global_step = 5;
    state.sums = {{"loss_sum", 1.5 + g->rank()}};
    const std::string dir = m.save(5, [&](const std::string& d) { save_trainer_state(d, state, g); });
    auto loaded = booster::checkpoint::load_trainer_state(dir, g);
    EXPECT_EQ(loaded.sums, state.sums) << "rank " << g->rank();
    EXPECT_EQ(loaded.world_size, 2);
    // A rank the checkpoint did not have (more ranks now) gets no sums.
    if (g->rank() == 0) {
      auto single = booster::checkpoint::load_trainer_state(dir, nullptr);
      EXPECT_EQ(single.sums, (std::vector<std::pair<std::string, double>>{{"loss_sum", 1.5}}));
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}
