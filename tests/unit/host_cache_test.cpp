// host_cache_test.cpp — the host tensor cache (core/host_cache.h): size classes, a freed block served
// again without new page faults, the bound on held free bytes and resident memory falling back after
// a phase of large temporaries, small storage left to the previous allocator, trims, bad limits.
// The cache is process-wide, so every test that installs it runs in a fresh copy of this binary.
#include "booster/core/host_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <cstring>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "booster/core/cpu_byte_counter.h"
#include "booster/core/host_allocator.h"
#include "booster/core/memory.h"
#include "common/test_util.h"

using ::testing::HasSubstr;

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// true in the fresh process; otherwise runs `test` there and checks that it passed.
bool in_fresh_process(const std::string& test) {
  if (std::getenv("BOOSTER_TEST_FRESH_PROCESS") != nullptr) return true;
  auto r = booster::testing::run_process({"/proc/self/exe", "--gtest_filter=" + test},
                                         {{"BOOSTER_TEST_FRESH_PROCESS", "1"}, {"GTEST_TOTAL_SHARDS", "1"},
                                          {"GTEST_SHARD_INDEX", "0"}},
                                         120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("[  PASSED  ] 1 test"));
  return false;
}

int64_t rss_bytes() { return booster::process_memory().rss_bytes; }

int64_t minor_faults() { return booster::process_memory().minor_faults; }

}  // namespace

TEST(HostCache, SizeClassesRoundUpByAtMostAnEighth) {
  EXPECT_EQ(booster::host_cache_size_class(1), 4096);
  EXPECT_EQ(booster::host_cache_size_class(kMiB), kMiB);
  EXPECT_EQ(booster::host_cache_size_class(kMiB + 1), kMiB + 128 * 1024);  // [1, 2) MiB: 128 KiB steps
  EXPECT_EQ(booster::host_cache_size_class(3 * kMiB), 3 * kMiB);
  EXPECT_EQ(booster::host_cache_size_class(3 * kMiB + 1), 3 * kMiB + 256 * 1024);  // [2, 4) MiB: 256 KiB
  EXPECT_EQ(booster::host_cache_size_class(100 * kMiB), 104 * kMiB);               // [64, 128) MiB: 8 MiB
  for (int64_t bytes = kMiB; bytes < 512 * kMiB; bytes = bytes * 9 / 8 + 4097) {
    const int64_t c = booster::host_cache_size_class(bytes);
    EXPECT_GE(c, bytes);
    EXPECT_LE(c - bytes, bytes / 8) << bytes;
    EXPECT_EQ(c % 4096, 0) << bytes;
    EXPECT_EQ(booster::host_cache_size_class(c), c) << "a class is its own class";
  }
}

TEST(HostCache, AFreedBlockIsServedAgainWithoutNewPageFaults) {
  if (!in_fresh_process("HostCache.AFreedBlockIsServedAgainWithoutNewPageFaults")) return;
  booster::install_host_cache(64 * kMiB, /*huge_pages=*/false);  // 4 KiB pages: one fault per page
  void* first = nullptr;
  int64_t first_faults = 0;
  {
    const int64_t f0 = minor_faults();
    at::Tensor t = at::empty({2 * 1024 * 1024}, at::kFloat);  // 8 MiB
    t.fill_(1.0f);
    first_faults = minor_faults() - f0;
    first = t.data_ptr();
  }
  auto s = booster::host_cache_stats();
  EXPECT_TRUE(s.installed);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.held_bytes, 8 * kMiB);
  EXPECT_EQ(s.in_use_bytes, 0);
  const int64_t f1 = minor_faults();
  at::Tensor again = at::empty({2 * 1024 * 1024 - 1000}, at::kFloat);  // same size class
  again.fill_(2.0f);
  const int64_t second_faults = minor_faults() - f1;
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_GE(first_faults, 1000) << "8 MiB of fresh pages fault in (4 KiB pages: 2048)";
  EXPECT_LE(second_faults, 20) << "the held block's pages are resident";
  EXPECT_FLOAT_EQ(again.sum().item<float>(), 2.0f * (2 * 1024 * 1024 - 1000));
  s = booster::host_cache_stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.held_bytes, 0);
  EXPECT_EQ(s.in_use_bytes, 8 * kMiB);
}

// The bound: a phase of large temporaries (96 MiB touched, then freed) leaves at most the limit held,
// and resident memory falls back to within the limit (+ slack for LibTorch's and the test's own
// allocations) of where it started. A trim returns the rest.
TEST(HostCache, ResidentMemoryFallsBackWithinTheBoundAfterLargeTemporaries) {
  if (!in_fresh_process("HostCache.ResidentMemoryFallsBackWithinTheBoundAfterLargeTemporaries")) return;
  booster::install_host_cache(16 * kMiB);
  at::ones({8}).sum();  // LibTorch's first-use allocations happen before the baseline
  const int64_t base = rss_bytes();
  ASSERT_GT(base, 0);
  int64_t during = 0;
  {
    std::vector<at::Tensor> temporaries;
    for (int i = 0; i < 24; ++i) temporaries.push_back(at::full({kMiB}, static_cast<float>(i)));  // 4 MiB each
    during = rss_bytes();
  }
  const auto s = booster::host_cache_stats();
  const int64_t after = rss_bytes();
  std::cout << "RSS above baseline: during " << (during - base) / kMiB << " MiB, after " << (after - base) / kMiB
            << " MiB (bound 16 MiB)\n";
  EXPECT_GE(during - base, 90 * kMiB);
  EXPECT_EQ(s.held_bytes, 16 * kMiB);
  EXPECT_EQ(s.peak_held_bytes, 16 * kMiB);
  EXPECT_EQ(s.released_bytes, 80 * kMiB);
  EXPECT_LE(after - base, 16 * kMiB + 4 * kMiB);
  EXPECT_EQ(booster::trim_host_cache(0), 16 * kMiB);
  EXPECT_EQ(booster::host_cache_stats().held_bytes, 0);
  EXPECT_LE(rss_bytes() - base, 4 * kMiB);
  // Lowering the limit unmaps what is above it at once.
  { at::Tensor a = at::empty({kMiB}), b = at::empty({kMiB}); }
  EXPECT_EQ(booster::host_cache_stats().held_bytes, 8 * kMiB);
  booster::install_host_cache(4 * kMiB);
  EXPECT_EQ(booster::host_cache_stats().held_bytes, 4 * kMiB);
  EXPECT_EQ(booster::host_cache_stats().limit_bytes, 4 * kMiB);
}

TEST(HostCache, SmallStorageGoesToThePreviousAllocator) {
  if (!in_fresh_process("HostCache.SmallStorageGoesToThePreviousAllocator")) return;
  booster::install_host_cache(16 * kMiB);
  { at::Tensor small = at::ones({1000}); }
  auto s = booster::host_cache_stats();
  EXPECT_EQ(s.hits + s.misses, 0);
  EXPECT_EQ(s.held_bytes, 0);
  // raw_allocate / raw_deallocate (c10's raw path uses the allocator's raw_deleter) for both kinds.
  c10::Allocator* a = c10::GetCPUAllocator();
  void* small = a->raw_allocate(1000);
  void* large = a->raw_allocate(2 * kMiB);
  std::memset(small, 1, 1000);
  std::memset(large, 1, 2 * kMiB);
  EXPECT_EQ(booster::host_cache_stats().in_use_bytes, 2 * kMiB);
  a->raw_deallocate(small);
  a->raw_deallocate(large);
  s = booster::host_cache_stats();
  EXPECT_EQ(s.in_use_bytes, 0);
  EXPECT_EQ(s.held_bytes, 2 * kMiB);
}

TEST(HostCache, ConfigureInstallsItAndBadLimitsAreErrors) {
  if (!in_fresh_process("HostCache.ConfigureInstallsItAndBadLimitsAreErrors")) return;
  EXPECT_EQ(booster::trim_host_cache(0), 0) << "not installed: nothing to trim";
  EXPECT_FALSE(booster::host_cache_stats().installed);
  EXPECT_THROW(booster::install_host_cache(-1), std::invalid_argument);
  try {
    booster::configure_host_allocator("cache", -kMiB);
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("malloc_cache_mb must be >= 0"));
  }
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "the cache is not installed under AddressSanitizer (it must see every tensor)";
#endif
  const std::string line = booster::configure_host_allocator("cache", 24 * kMiB);
  EXPECT_THAT(line, HasSubstr("at most 24 MiB held free"));
  const std::string thp = booster::transparent_huge_pages_mode();
  EXPECT_THAT(line, HasSubstr(thp == "always" || thp == "madvise" ? "2 MiB huge pages" : "4 KiB pages (transparent huge pages: "));
  EXPECT_THAT(line, HasSubstr("M_MMAP_THRESHOLD = 1048576, M_TRIM_THRESHOLD = 33554432"));
  EXPECT_TRUE(booster::host_cache_stats().installed);
  EXPECT_EQ(booster::host_cache_stats().limit_bytes, 24 * kMiB);
  EXPECT_EQ(booster::default_host_cache_limit(0), 48 * kMiB);
  EXPECT_EQ(booster::default_host_cache_limit(1000 * kMiB), 150 * kMiB);
}

// Huge pages: an 8 MiB block faults in as four 2 MiB pages (AnonHugePages rises, a handful of
// faults instead of 2048); with huge_pages = false, as 4 KiB pages.
TEST(HostCache, BlocksOfTwoMiBAndMoreFaultInAsHugePages) {
  if (!in_fresh_process("HostCache.BlocksOfTwoMiBAndMoreFaultInAsHugePages")) return;
  const std::string mode = booster::transparent_huge_pages_mode();
  if (mode != "always" && mode != "madvise") GTEST_SKIP() << "transparent huge pages are " << mode << " here";
  auto anon_huge = [] {
    std::ifstream in("/proc/self/smaps_rollup");
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("AnonHugePages:", 0) == 0) return static_cast<int64_t>(std::stoll(line.substr(14))) * 1024;
    return int64_t{-1};
  };
  booster::install_host_cache(0, /*huge_pages=*/true);
  EXPECT_TRUE(booster::host_cache_stats().huge_pages);
  {
    const int64_t h0 = anon_huge(), f0 = minor_faults();
    at::Tensor t = at::empty({2 * 1024 * 1024}, at::kFloat);  // 8 MiB
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % (2 << 20), 0u) << "2 MiB-aligned";
    t.fill_(1.0f);
    const int64_t faults = minor_faults() - f0, huge = anon_huge() - h0;
    std::cout << "8 MiB with huge pages: " << faults << " faults, AnonHugePages +" << huge / kMiB << " MiB\n";
    EXPECT_LE(faults, 256) << "4 KiB pages would take 2048";
    EXPECT_GE(huge, 6 * kMiB) << "the kernel may fall back to 4 KiB pages when it has no free 2 MiB page";
  }
  booster::install_host_cache(0, /*huge_pages=*/false);
  EXPECT_FALSE(booster::host_cache_stats().huge_pages);
  const int64_t f0 = minor_faults();
  at::Tensor t = at::empty({2 * 1024 * 1024}, at::kFloat);
  t.fill_(1.0f);
  EXPECT_GE(minor_faults() - f0, 1000);
}

// The byte counter (core/cpu_byte_counter.h) installed first, as booster.estimate() or Gemini's
// auto placement does before a later Booster: c10 keeps it (priority 255) as LibTorch's CPU
// allocator, so the cache must go under it; a freed block then stays in the cache and is still
// counted. Run in a fresh process (both are installed once per process).
TEST(HostCache, InstalledAfterTheByteCounterItGoesUnderIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        booster::install_cpu_byte_counter();
        if (!booster::cpu_byte_counter_installed()) std::exit(3);
        booster::install_host_cache(64 << 20, false);
        const int64_t before = booster::counted_cpu_bytes();
        {
          at::Tensor block = at::empty({2 << 20});  // 8 MiB: a cached size
          if (booster::counted_cpu_bytes() - before < (8 << 20)) std::exit(4);  // counted
        }
        if (booster::counted_cpu_bytes() != before) std::exit(5);
        if (booster::host_cache_stats().held_bytes < (8 << 20)) std::exit(6);  // kept by the cache
        { at::Tensor again = at::empty({2 << 20}); }  // served from the cache, freed into it again
        std::exit(booster::host_cache_stats().held_bytes >= (8 << 20) ? 0 : 7);
      },
      ::testing::ExitedWithCode(0), "");
}
