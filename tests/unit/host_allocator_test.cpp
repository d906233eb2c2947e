// host_allocator_test.cpp — configure_host_allocator: "retain" makes glibc serve and keep an 8 MiB
// block from the heap (read back through mallinfo2), "return" maps 1 MiB blocks on their own and
// unmaps them when freed, the environment's own settings and a preloaded
// allocator are respected, bad modes are refused.
#include "booster/core/host_allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "common/test_util.h"

using ::testing::HasSubstr;

namespace {

// Sets an environment variable for the scope of the object, restoring the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace

TEST(HostAllocator, RetainServesLargeBlocksFromTheHeapAndKeepsThem) {
#if defined(__SANITIZE_ADDRESS__)
  // BOOSTER_SANITIZE build: AddressSanitizer's allocator replaces glibc's, so "retain" sets nothing.
  EXPECT_THAT(booster::configure_host_allocator("retain"), HasSubstr("AddressSanitizer's allocator is in use"));
  GTEST_SKIP() << "glibc malloc settings do not apply under AddressSanitizer";
#endif
  const std::string line = booster::configure_host_allocator("retain");
  EXPECT_THAT(line, HasSubstr("M_MMAP_THRESHOLD = 33554432"));
  EXPECT_THAT(line, HasSubstr("M_TRIM_THRESHOLD = 2147483647"));
  constexpr size_t kBytes = 8 << 20;  // above glibc's initial 128 KiB mmap threshold
  const struct mallinfo2 before = ::mallinfo2();
  char* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  const struct mallinfo2 during = ::mallinfo2();
  // From the heap (arena), not a mapping of its own (hblkhd: bytes in mmapped blocks).
  EXPECT_EQ(during.hblkhd, before.hblkhd);
  EXPECT_GE(during.uordblks, before.uordblks + kBytes);
  std::free(block);
  const struct mallinfo2 after = ::mallinfo2();
  // Freed, not trimmed: the heap keeps its size and the block is now free heap memory.
  EXPECT_EQ(after.arena, during.arena);
  EXPECT_GE(after.fordblks, static_cast<size_t>(kBytes));
}

// "return": blocks of 1 MiB and more get mappings of their own and are unmapped when freed, also after
// a large free (which under glibc's defaults raises the dynamic mmap threshold to that size, so that
// later blocks below it would come from the heap and stay resident once freed). A process sets its
// mode once, at start, so the check runs in a fresh copy of this binary: in this one, earlier tests
// left free heap chunks that glibc would serve such blocks from.
TEST(HostAllocator, ReturnMapsMegabyteBlocksAndGivesThemBack) {
#if defined(__SANITIZE_ADDRESS__)
  EXPECT_THAT(booster::configure_host_allocator("return"), HasSubstr("AddressSanitizer's allocator is in use"));
  GTEST_SKIP() << "glibc malloc settings do not apply under AddressSanitizer";
#endif
  if (std::getenv("BOOSTER_TEST_FRESH_PROCESS") == nullptr) {
    auto r = booster::testing::run_process({"/proc/self/exe", "--gtest_filter=HostAllocator.ReturnMapsMegabyteBlocksAndGivesThemBack"},
                                           {{"BOOSTER_TEST_FRESH_PROCESS", "1"}, {"GTEST_TOTAL_SHARDS", "1"},
                                            {"GTEST_SHARD_INDEX", "0"}},
                                           60);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_THAT(r.output, HasSubstr("[  PASSED  ] 1 test"));
    return;
  }
  const std::string line = booster::configure_host_allocator("return");
  EXPECT_THAT(line, HasSubstr("malloc = \"return\": glibc: M_MMAP_THRESHOLD = 1048576, M_TRIM_THRESHOLD = 1048576"));
  char* large = static_cast<char*>(std::malloc(24 << 20));
  ASSERT_NE(large, nullptr);
  std::memset(large, 1, 24 << 20);
  std::free(large);
  constexpr size_t kBytes = 2 << 20;
  const struct mallinfo2 before = ::mallinfo2();
  char* block = static_cast<char*>(std::malloc(kBytes));
  ASSERT_NE(block, nullptr);
  std::memset(block, 1, kBytes);
  const struct mallinfo2 during = ::mallinfo2();
  EXPECT_GE(during.hblkhd, before.hblkhd + kBytes);  // a mapping of its own
  std::free(block);
  const struct mallinfo2 after = ::mallinfo2();
  EXPECT_EQ(after.hblkhd, before.hblkhd);  // unmapped: back to the system
  EXPECT_LT(after.fordblks, before.fordblks + kBytes);
}

TEST(HostAllocator, EnvironmentSettingsAndPreloadedAllocatorsAreKept) {
#if defined(__SANITIZE_ADDRESS__)
  // BOOSTER_SANITIZE build: AddressSanitizer's allocator replaces glibc's, so "retain" sets nothing.
  EXPECT_THAT(booster::configure_host_allocator("retain"), HasSubstr("AddressSanitizer's allocator is in use"));
  GTEST_SKIP() << "glibc malloc settings do not apply under AddressSanitizer";
#endif
  {
    ScopedEnv trim("MALLOC_TRIM_THRESHOLD_", "131072");
    const std::string line = booster::configure_host_allocator("retain");
    EXPECT_THAT(line, HasSubstr("kept from the environment: MALLOC_TRIM_THRESHOLD_"));
    EXPECT_THAT(line, HasSubstr("M_MMAP_THRESHOLD = 33554432"));
    EXPECT_THAT(line, ::testing::Not(HasSubstr("M_TRIM_THRESHOLD =")));
  }
  {
    ScopedEnv pad("MALLOC_TOP_PAD_", "268435456");
    EXPECT_THAT(booster::configure_host_allocator("retain"), HasSubstr("nothing set"));
  }
  {
    ScopedEnv preload("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libmimalloc.so.2");
    EXPECT_THAT(booster::configure_host_allocator("retain"), HasSubstr("mimalloc is preloaded"));
    EXPECT_THAT(booster::configure_host_allocator("cache"), HasSubstr("tensor cache left alone"));
  }
  EXPECT_THAT(booster::configure_host_allocator("system"), HasSubstr("glibc's defaults"));
}

TEST(HostAllocator, UnknownModeIsAClearError) {
  try {
    booster::configure_host_allocator("jemalloc");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("\"cache\""));
    EXPECT_THAT(e.what(), HasSubstr("\"retain\""));
    EXPECT_THAT(e.what(), HasSubstr("\"system\""));
    EXPECT_THAT(e.what(), HasSubstr("\"return\""));
  }
}
