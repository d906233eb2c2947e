// checkpoint_test.cpp — save and resume through the booster with the Fashion-MNIST example on real
// data (a 1024-sample subset so the test is quick): an interrupted + resumed run equals an
// uninterrupted one bit for bit (tolerance 0: same world size, same data order, per-epoch seeds),
// and a 2-rank checkpoint continues on 1 and 4 ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include <torch/torch.h>

#include "booster/checkpoint/safetensors.h"
#include "common/test_util.h"

using namespace booster::testing;
using ::testing::HasSubstr;

namespace {

const std::string kExample = std::string(BOOSTER_BINARY_DIR) + "/bin/fashion_mnist";
const std::string kConfig = std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/ddp.toml";

ProcessResult run_example(int nproc, const std::string& out, const std::vector<std::string>& sets) {
  std::vector<std::string> argv{BOOSTER_CLI_PATH, "run", "--nproc_per_node", std::to_string(nproc), "--master_port",
                                std::to_string(free_port()), kExample, "--config", kConfig, "--output_dir", out};
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
  EXPECT_EQ(read_file(b + "/epoch.txt"), "2\n");
  auto rc = run_example(2, dir.file("run_c"),
                        {"train.resume_from=\"" + b + "\"", "train.checkpoint_dir=\"" + c + "\""});
  ASSERT_EQ(rc.exit_code, 0) << rc.output;
  EXPECT_THAT(rc.output, HasSubstr("resumed from"));
  EXPECT_EQ(read_file(c + "/epoch.txt"), "3\n");

  auto full = booster::checkpoint::load_safetensors(a + "/model/model.safetensors");
  auto resumed = booster::checkpoint::load_safetensors(c + "/model/model.safetensors");
  ASSERT_EQ(full.size(), resumed.size());
  for (size_t i = 0; i < full.size(); ++i) {
    EXPECT_EQ(full[i].first, resumed[i].first);
    EXPECT_TRUE(torch::equal(full[i].second, resumed[i].second))
        << full[i].first << " max |diff| " << (full[i].second.to(torch::kDouble) - resumed[i].second.to(torch::kDouble)).abs().max().item<double>();
  }
  // The optimizer state too (AdamW moments by parameter name).
  auto opt_full = booster::checkpoint::load_safetensors(a + "/optimizer/optimizer.safetensors");
  auto opt_resumed = booster::checkpoint::load_safetensors(c + "/optimizer/optimizer.safetensors");
  ASSERT_EQ(opt_full.size(), opt_resumed.size());
  for (size_t i = 0; i < opt_full.size(); ++i) EXPECT_TRUE(torch::equal(opt_full[i].second, opt_resumed[i].second));

  // The 2-rank checkpoint continues on 1 and on 4 ranks (gathered, name-keyed state).
  for (int n : {1, 4}) {
    std::string d = dir.file("n" + std::to_string(n));
    auto r = run_example(n, dir.file("run_n" + std::to_string(n)),
                         {"train.resume_from=\"" + b + "\"", "train.checkpoint_dir=\"" + d + "\""});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("world size " + std::to_string(n)));
    EXPECT_EQ(read_file(d + "/epoch.txt"), "3\n");
    auto m = booster::checkpoint::load_safetensors(d + "/model/model.safetensors");
    auto before = booster::checkpoint::load_safetensors(b + "/model/model.safetensors");
    EXPECT_FALSE(torch::equal(m[0].second, before[0].second)) << "epoch 3 should have changed the weights";
  }
}
