// async_save_test.cpp — asynchronous checkpoint saves (async_save.h): byte-identical to a blocking
// save, the files hold the values at save time although training changes them right after, a save
// while one is in flight waits or is skipped, the host-memory bound falls back to a blocking save,
// a failing background write surfaces at the next sync point on every rank and commits nothing,
// on 1 rank and 2 ranks (threads with their own Gloo groups and writers).
#include "booster/checkpoint/async_save.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "booster/booster.h"
#include "booster/checkpoint/checkpoint_io.h"
#include "booster/checkpoint/checkpoint_manager.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/io/atomic_write.h"
#include "common/test_util.h"
#include "common/thread_ranks.h"

namespace {

namespace fs = std::filesystem;
using booster::checkpoint::AsyncSavePolicy;
using booster::checkpoint::CheckpointError;
using booster::checkpoint::CheckpointManager;
using booster::testing::list_dir;
using booster::testing::read_file;
using booster::testing::TempDir;
using ::testing::HasSubstr;

// Sets BOOSTER_ASYNC_SAVE_DELAY_MS (the writer's test hook: a slow disk) for the scope.
struct SlowDisk {
  explicit SlowDisk(int ms) { ::setenv("BOOSTER_ASYNC_SAVE_DELAY_MS", std::to_string(ms).c_str(), 1); }
  ~SlowDisk() { ::unsetenv("BOOSTER_ASYNC_SAVE_DELAY_MS"); }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Every file under `dir` (relative name -> bytes).
std::map<std::string, std::string> tree(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_file(e.path().string());
  return out;
}

booster::checkpoint::StateDict make_state(int64_t n) {
  torch::manual_seed(7);
  return {{"a.weight", torch::randn({n})}, {"b.bias", torch::arange(10, torch::kFloat64)},
          {"c.steps", torch::tensor(int64_t{42})}};
}

}  // namespace

TEST(AsyncSave, WritesTheSameBytesAsABlockingSaveAndKeepsTheValuesAtSaveTime) {
  TempDir tmp;
  for (bool shard : {false, true}) {
    auto state = make_state(300000);  // 1.2 MB: two shards of 1 MiB when sharded
    booster::checkpoint::SaveOptions so;
    so.shard = shard;
    so.size_per_shard_mb = 1;
    const std::string sync_dir = tmp.file(shard ? "sync_sharded" : "sync");
    const std::string async_dir = tmp.file(shard ? "async_sharded" : "async");
    booster::checkpoint::save_state_dict(sync_dir, state, so);
    SlowDisk slow(300);
    ASSERT_TRUE(booster::checkpoint::async_save(nullptr, async_dir, {}, [&] {
      booster::checkpoint::save_state_dict(async_dir, state, so);
    }));
    // Training continues: the parameters change at once, before the writer has written anything.
    EXPECT_TRUE(booster::checkpoint::async_save_in_flight());
    EXPECT_FALSE(fs::exists(async_dir));  // not committed yet
    const at::Tensor at_save = state.at(0).second.clone();
    for (auto& [name, t] : state) t.add_(1);
    booster::checkpoint::wait_async_save(nullptr);
    EXPECT_FALSE(booster::checkpoint::async_save_in_flight());
    EXPECT_EQ(tree(async_dir), tree(sync_dir));
    EXPECT_EQ(tree(async_dir).size(), shard ? 3u : 1u);
    EXPECT_EQ(list_dir(tmp.path()).count(fs::path(async_dir).filename().string() + ".async-" + std::to_string(::getpid())), 0u);
    // The loaded values are those of save time.
    for (const auto& [name, t] : booster::checkpoint::load_state_dict(async_dir))
      if (name == "a.weight") EXPECT_TRUE(torch::equal(t, at_save));
  }
}

TEST(AsyncSave, HostCopyForWriteKeepsContiguousCpuTensorsAndCountsNoPinnedBytesForThem) {
  // The CPU half of host_copy_for_write (the CUDA half, pinned, is tests/gpu/gpu_checkpoint_test.cpp).
  const at::Tensor t = torch::arange(12, torch::kFloat32).reshape({3, 4});
  EXPECT_EQ(booster::checkpoint::host_copy_for_write(t).data_ptr(), t.data_ptr());  // no copy
  const at::Tensor h = booster::checkpoint::host_copy_for_write(t.t());
  EXPECT_TRUE(h.is_contiguous());
  EXPECT_TRUE(torch::equal(h, t.t()));
  TempDir tmp;
  booster::checkpoint::StagedSave staged(tmp.file("s"), "", {}, "s");
  staged.run([&] { booster::checkpoint::save_state_dict(tmp.file("s"), make_state(1000), {}); });
  EXPECT_EQ(staged.pinned_bytes(), 0);
  EXPECT_GT(staged.staged_bytes(), 1000 * 4);
}

TEST(AsyncSave, ReplacesAnExistingCheckpointInOneStep) {
  TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  auto state = make_state(100);
  booster::checkpoint::save_state_dict(dir, state, {});
  for (auto& [name, t] : state) t.mul_(3);
  {
    SlowDisk slow(200);
    booster::checkpoint::async_save(nullptr, dir, {}, [&] { booster::checkpoint::save_state_dict(dir, state, {}); });
    // The old checkpoint stays readable until the new one is complete.
    auto old = booster::checkpoint::load_state_dict(dir);
    EXPECT_TRUE(torch::equal(old.at(0).second * 3, state.at(0).second));
  }
  booster::checkpoint::wait_async_save(nullptr);
  EXPECT_TRUE(torch::equal(booster::checkpoint::load_state_dict(dir).at(0).second, state.at(0).second));
}

TEST(AsyncSave, ManagerSetIsByteIdenticalToABlockingOneAndCommittedOnlyWhenWritten) {
  TempDir tmp;
  torch::nn::Linear net(16, 4);
  booster::checkpoint::CheckpointIO io(nullptr);
  booster::checkpoint::TrainerState ts;
  ts.epoch = 3;
  ts.global_step = 120;
  auto fill_with = [&](const std::string& d) {
    io.save_model(*net, d + "/model", {});
    booster::checkpoint::save_trainer_state(d, ts, nullptr);
  };
  CheckpointManager sync_m(tmp.file("sync"), nullptr);
  torch::manual_seed(1);
  const std::string sync_dir = sync_m.save(120, fill_with);
  CheckpointManager m(tmp.file("async"), nullptr, /*keep_last_n=*/1);
  m.set_async(true);
  const std::string first = m.save(60, fill_with);  // committed by the next save's sync point
  torch::manual_seed(1);  // the same generator state as the sync save
  std::string dir;
  {
    SlowDisk slow(300);
    dir = m.save(120, fill_with);
    EXPECT_EQ(m.latest(), first);  // step 60 is committed (the second save waited), 120 not yet
    torch::NoGradGuard no_grad;
    net->weight.fill_(5);  // the next training step
  }
  m.wait();
  EXPECT_EQ(m.latest(), dir);
  EXPECT_EQ(m.steps(), (std::vector<int64_t>{120}));  // keep_last_n = 1 pruned step 60
  EXPECT_EQ(tree(dir), tree(sync_dir));
  EXPECT_EQ(list_dir(tmp.file("async")), (std::set<std::string>{"latest", "step_000000120"}));  // no markers left
}

TEST(AsyncSave, ASaveWhileOneIsInFlightWaitsOrIsSkippedWithAWarning) {
  TempDir tmp;
  CheckpointManager m(tmp.file("ckpt"), nullptr);
  m.set_async(true);
  auto fill = [](const std::string& d) { booster::io::write_new_file(d + "/x.txt", "x"); };
  SlowDisk slow(400);
  m.save(1, fill);
  ASSERT_TRUE(booster::checkpoint::async_save_in_flight());
  auto t0 = std::chrono::steady_clock::now();
  m.save(2, fill);  // waits for step 1
  EXPECT_GT(seconds_since(t0), 0.2);
  EXPECT_EQ(m.steps(), (std::vector<int64_t>{1}));
  AsyncSavePolicy skip;
  skip.skip_if_busy = true;
  m.set_async(true, skip);
  t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(m.save(3, fill), "");  // skipped: step 2 is still being written
  EXPECT_LT(seconds_since(t0), 0.2);
  m.wait();
  EXPECT_EQ(m.steps(), (std::vector<int64_t>{1, 2}));  // step 2 was not disturbed; 3 never written
  EXPECT_NE(m.save(3, fill), "");  // nothing in flight: saved
  m.wait();
  EXPECT_EQ(m.steps(), (std::vector<int64_t>{1, 2, 3}));
}

TEST(AsyncSave, ASaveOverTheHostMemoryBoundIsWrittenBlockingAndStillCorrect) {
  TempDir tmp;
  auto state = make_state(1 << 20);  // 4 MiB
  AsyncSavePolicy small;
  small.max_host_mib = 1;
  const std::string dir = tmp.file("big");
  SlowDisk slow(500);
  booster::checkpoint::async_save(nullptr, dir, small, [&] { booster::checkpoint::save_state_dict(dir, state, {}); });
  // Already on disk (written in the foreground), waiting only for the commit.
  EXPECT_TRUE(fs::exists(dir + ".async-" + std::to_string(::getpid()) + "/model.safetensors"));
  booster::checkpoint::wait_async_save(nullptr);
  EXPECT_TRUE(torch::equal(booster::checkpoint::load_state_dict(dir).at(0).second, state.at(0).second));
  small.max_host_mib = 0;
  EXPECT_THAT([&] { booster::checkpoint::async_save(nullptr, dir, small, [] {}); },
              ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("max_host_mib")));
  CheckpointManager m(tmp.file("m"), nullptr);
  EXPECT_THROW(m.set_async(true, small), std::invalid_argument);
}

TEST(AsyncSave, AFailingBackgroundWriteThrowsOnEveryRankAtTheNextSyncPointAndKeepsThePreviousSet) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  SlowDisk slow(300);  // set once: the ranks are threads of this process
  const auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
    CheckpointManager m(root, g);
    m.set_async(true);
    const int r = g->rank();
    auto fill = [&](const std::string& d) {
      booster::io::write_new_file(d + "/rank" + std::to_string(r) + "/part.txt", "step data of rank " + std::to_string(r));
    };
    m.save(10, fill);
    m.wait();
    ASSERT_EQ(m.latest(), root + "/step_000000010");
    std::string tmpdir;
    m.save(20, [&](const std::string& d) {
      tmpdir = d;
      fill(d);
    });
    // Rank 1's disk fails while its writer is waiting: its directory becomes a file.
    if (r == 1) booster::io::write_new_file(tmpdir + "/rank1", "not a directory");
    try {
      m.wait();
      ADD_FAILURE() << "rank " << r << ": wait() did not throw";
    } catch (const CheckpointError& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 1"));
      EXPECT_THAT(e.what(), HasSubstr("was not committed"));
    }
    EXPECT_EQ(m.latest(), root + "/step_000000010");
    EXPECT_EQ(m.steps(), (std::vector<int64_t>{10}));
    EXPECT_EQ(read_file(root + "/step_000000010/rank1/part.txt"), "step data of rank 1");
    m.wait();  // reported once
    // The next save works again.
    m.save(30, fill);
    m.wait();
    EXPECT_EQ(m.latest(), root + "/step_000000030");
    EXPECT_EQ(read_file(root + "/step_000000030/rank0/part.txt"), "step data of rank 0");
  });
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_FALSE(fs::exists(root + "/.tmp-step_000000020-" + std::to_string(::getpid())));
}

TEST(AsyncSave, TwoRanksCommitOnlyWhenBothPartsAreWritten) {
  TempDir tmp;
  const std::string root = tmp.file("ckpt");
  const auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
    CheckpointManager m(root, g);
    m.set_async(true);
    const int r = g->rank();
    booster::checkpoint::TrainerState ts;
    ts.global_step = 5;
    ts.sums = {{"loss_sum", 1.5 + r}};
    m.save(5, [&](const std::string& d) {
      booster::io::write_new_file(d + "/part" + std::to_string(r), std::string(1000, static_cast<char>('a' + r)));
      booster::checkpoint::save_trainer_state(d, ts, g);
    });
    m.wait();
    EXPECT_EQ(m.latest(), root + "/step_000000005");
    EXPECT_EQ(read_file(root + "/step_000000005/part1"), std::string(1000, 'b'));
    auto loaded = booster::checkpoint::load_trainer_state(root + "/step_000000005", g);
    EXPECT_EQ(loaded.global_step, 5);
    EXPECT_EQ(loaded.sums.at(0).second, 1.5 + r);
  });
  EXPECT_EQ(errors, (std::vector<std::string>{"", ""}));
  EXPECT_EQ(list_dir(root), (std::set<std::string>{"latest", "step_000000005"}));
}

TEST(AsyncSave, BoosterSaveModelAndOptimizerWithUseAsyncWriteWhatABlockingSaveWrites) {
  booster::testing::ScopedEnv env;
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) env.unset(v);
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  const std::string plugin = std::string(BOOSTER_TEST_PLUGIN_DIR) + "/booster_plugin_test_minimal.so";
  booster::Booster b(booster::Config::from_string(
      "[booster]\nplugin = \"test_minimal\"\n[plugin]\npath = \"" + plugin + "\"\n", "test.toml"));
  torch::manual_seed(3);
  torch::nn::Linear net(64, 32);
  auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-2));
  booster::Criterion mse = [](const torch::Tensor& y, const torch::Tensor& t) { return torch::mse_loss(y, t); };
  auto boosted = b.boost(net, adamw, mse);
  auto step = [&] {
    auto loss = boosted.criterion(boosted.model.forward(torch::randn({8, 64})), torch::randn({8, 32}));
    b.backward(loss, *boosted.optimizer);
    boosted.optimizer->step();
    boosted.optimizer->zero_grad();
  };
  step();
  TempDir tmp;
  b.save_model(boosted.model, tmp.file("sync_model"));
  b.save_optimizer(*boosted.optimizer, tmp.file("sync_opt"));
  booster::checkpoint::ModelSaveOptions mo;
  mo.use_async = true;
  booster::checkpoint::OptimizerSaveOptions oo;
  oo.use_async = true;
  {
    SlowDisk slow(200);
    b.save_model(boosted.model, tmp.file("async_model"), mo);
    EXPECT_TRUE(booster::checkpoint::async_save_in_flight());
    step();  // training goes on while it is written
    b.save_optimizer(*boosted.optimizer, tmp.file("async_opt"), oo);  // waits for the model's save first
    EXPECT_TRUE(fs::exists(tmp.file("async_model")));
  }
  step();
  booster::checkpoint::wait_async_save(&b.world());
  EXPECT_EQ(tree(tmp.file("async_model")), tree(tmp.file("sync_model")));
  // The optimizer was saved after one more step: it must differ from the first one and hold that
  // step's state (its step count is 2).
  EXPECT_EQ(tree(tmp.file("async_opt")).size(), tree(tmp.file("sync_opt")).size());
  EXPECT_NE(tree(tmp.file("async_opt")), tree(tmp.file("sync_opt")));
}
