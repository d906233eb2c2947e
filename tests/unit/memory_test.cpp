// memory_test.cpp — MemoryReport's line and process_memory(): touching fresh memory raises the
// resident size, the peak and the minor-fault count by what was touched.
#include "booster/core/memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MemoryReport, LineNamesEveryPartAndTheHeldCacheOnlyWhenThereIsOne) {
  booster::MemoryReport r;
  r.parameters = 3 << 20;
  r.gradients = 3 << 20;
  r.optimizer_states = 6 << 20;
  r.communication_buffers = 1 << 20;
  EXPECT_EQ(r.model_states(), 12 << 20);
  EXPECT_EQ(r.to_string(), "params 3.0 MiB, grads 3.0 MiB, master weights 0.0 MiB, optimizer states 6.0 MiB, "
                           "communication buffers 1.0 MiB; model states 12.0 MiB");
  r.host_cache_held = 5 << 19;
  EXPECT_THAT(r.to_string(), HasSubstr("; host cache holds 2.5 MiB free"));
}

TEST(ProcessMemory, TouchingFreshPagesShowsInRssPeakAndFaults) {
  constexpr size_t kBytes = 64 << 20;
  const booster::ProcessMemory before = booster::process_memory();
  ASSERT_GT(before.rss_bytes, 0);
  ASSERT_GE(before.peak_rss_bytes, before.rss_bytes);
  ASSERT_GE(before.minor_faults, 0);
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, kBytes);
  const booster::ProcessMemory during = booster::process_memory();
  ::munmap(p, kBytes);
  const booster::ProcessMemory after = booster::process_memory();
  EXPECT_GE(during.rss_bytes - before.rss_bytes, static_cast<int64_t>(kBytes) * 9 / 10);
  EXPECT_GE(during.peak_rss_bytes, during.rss_bytes - (1 << 20));
  // 4 KiB pages: 16384 faults; with transparent huge pages fewer, but at least one per 2 MiB.
  EXPECT_GE(during.minor_faults - before.minor_faults, 32);
  EXPECT_LT(after.rss_bytes, during.rss_bytes - static_cast<int64_t>(kBytes) / 2);
  // The kernel's per-thread RSS counters are folded in lazily: allow 1 MiB of skew.
  EXPECT_GE(after.peak_rss_bytes, during.rss_bytes - (1 << 20));
}
