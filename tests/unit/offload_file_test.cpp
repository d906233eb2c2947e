// offload_file_test.cpp — Gemini's per-rank offload file (booster/src/parallel/gemini/offload_file.h): values
// survive a swap out and in, memory is freed while out, bad directories are clear errors, and
// nothing is left in the directory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "common/test_util.h"
#include "offload_file.h"

using namespace booster::parallel::gemini;
using booster::testing::TempDir;
using ::testing::HasSubstr;

TEST(OffloadFile, SwapOutFreesTheStorageAndSwapInRestoresTheValues) {
  TempDir dir;
  OffloadFile file(dir.path(), 3);
  at::Tensor a = torch::randn({1000}), b = torch::randn({17}).to(torch::kBFloat16);
  const at::Tensor a0 = a.clone(), b0 = b.clone();
  const int64_t sa = file.reserve(a.numel() * 4), sb = file.reserve(b.numel() * 2);
  at::Tensor alias = a;  // another handle of the same storage sees the swap
  file.swap_out(a, sa);
  file.swap_out(b, sb);
  EXPECT_FALSE(OffloadFile::resident(a));
  EXPECT_FALSE(OffloadFile::resident(alias));
  EXPECT_EQ(a.storage().nbytes(), 0u);
  EXPECT_EQ(file.bytes_written(), 1000 * 4 + 17 * 2);
  file.swap_in(a, sa);
  file.swap_in(b, sb);
  EXPECT_TRUE(torch::equal(alias, a0));
  EXPECT_TRUE(torch::equal(b, b0));
  // release: freed without a write; the slot still holds the values.
  file.release(a);
  file.swap_in(a, sa);
  EXPECT_TRUE(torch::equal(a, a0));
  // Nothing is visible in the directory (the file is unlinked at creation).
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(OffloadFile, MissingNotADirectoryAndReadOnlyDirectoriesAreClearErrors) {
  TempDir dir;
  try {
    OffloadFile f(dir.path() + "/missing", 0);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("does not exist"));
    EXPECT_THAT(e.what(), HasSubstr("plugin.offload_dir"));
  }
  const std::string file_path = dir.file("plain");
  { std::ofstream(file_path) << "x"; }
  EXPECT_THROW(OffloadFile(file_path, 0), std::runtime_error);
  if (::geteuid() != 0) {  // root writes anywhere
    const std::string ro = dir.file("ro");
    std::filesystem::create_directory(ro);
    ::chmod(ro.c_str(), 0500);
    try {
      OffloadFile f(ro, 0);
      FAIL() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_THAT(e.what(), HasSubstr("writable"));
    }
  }
}

TEST(OffloadFile, AFullDiskIsReportedWhenTheSlotIsReserved) {
  // Far more than any disk has.
  TempDir dir;
  OffloadFile file(dir.path(), 0);
  try {
    file.reserve(int64_t{1} << 60);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_THAT(e.what(), HasSubstr("cannot hold"));
    EXPECT_THAT(e.what(), HasSubstr("offload_dir"));
  }
  EXPECT_EQ(file.reserved_bytes(), 0);
}
