// gpu_checkpoint_test.cpp — checkpoint writers on GPU tensors (checkpoint/async_save.h:
// host_copy_for_write): a CUDA tensor's bytes are taken from a pinned host copy, an asynchronous save
// of CUDA tensors counts them as copied through pinned memory, and the files are byte-identical to a
// blocking save of the same values on the CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>

#include "booster/checkpoint/async_save.h"
#include "booster/checkpoint/state_dict_io.h"
#include "common/test_util.h"
#include "gpu/gpu_test_util.h"

namespace gpu_checkpoint_test {

namespace fs = std::filesystem;
using booster::testing::read_file;
using booster::testing::TempDir;

std::map<std::string, std::string> tree(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_file(e.path().string());
  return out;
}

TEST(GpuCheckpoint, HostCopyOfACudaTensorIsPinnedAndEqual) {
  SKIP_WITHOUT_GPU();
  torch::manual_seed(3);
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat16, torch::kInt64}) {
    const at::Tensor t = torch::randn({257, 129}, torch::kCUDA).mul(100).to(dtype);
    const at::Tensor h = booster::checkpoint::host_copy_for_write(t.t());  // a non-contiguous view
    EXPECT_TRUE(h.device().is_cpu());
    EXPECT_TRUE(h.is_pinned());
    EXPECT_TRUE(h.is_contiguous());
    EXPECT_EQ(h.scalar_type(), dtype);
    EXPECT_TRUE(torch::equal(h, t.t().cpu()));
  }
}

TEST(GpuCheckpoint, AsyncSaveOfCudaTensorsGoesThroughPinnedMemoryAndMatchesABlockingSave) {
  SKIP_WITHOUT_GPU();
  TempDir tmp;
  torch::manual_seed(5);
  booster::checkpoint::StateDict gpu{{"w", torch::randn({1000, 300}, torch::kCUDA)},
                                     {"b", torch::randn({300}, torch::kCUDA).to(torch::kBFloat16)},
                                     {"step", torch::tensor(int64_t{7}).to(torch::kCUDA)}};
  booster::checkpoint::StateDict cpu;
  int64_t bytes = 0;
  for (const auto& [name, t] : gpu) {
    cpu.emplace_back(name, t.cpu());
    bytes += t.numel() * t.element_size();
  }
  booster::checkpoint::save_state_dict(tmp.file("blocking"), cpu, {});
  {  // The staging alone: the bytes of every CUDA tensor went through pinned memory.
    booster::checkpoint::StagedSave staged(tmp.file("staged"), "", {}, "staged");
    staged.run([&] { booster::checkpoint::save_state_dict(tmp.file("staged"), gpu, {}); });
    EXPECT_EQ(staged.pinned_bytes(), bytes);
    EXPECT_GT(staged.staged_bytes(), bytes);  // the files: tensors + headers
  }
  ASSERT_TRUE(booster::checkpoint::async_save(nullptr, tmp.file("async"), {}, [&] {
    booster::checkpoint::save_state_dict(tmp.file("async"), gpu, {});
  }));
  for (auto& [name, t] : gpu) t.add_(1);  // training goes on: the save keeps the values of save time
  booster::checkpoint::wait_async_save(nullptr);
  EXPECT_EQ(tree(tmp.file("async")), tree(tmp.file("blocking")));
}

}  // namespace gpu_checkpoint_test
