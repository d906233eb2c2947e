// health_test.cpp — a hung rank is named: 3 ranks under `booster run` with timeout_s = 5; after
// one allreduce rank 2 stops itself with SIGSTOP (or sleeps, stuck outside collectives); ranks 0 and
// 1 must fail their next allreduce within the timeout plus the health check's store wait, rank 0 (the
// store's server) with an error naming rank 2 and why, and the launcher must stop the job and leave
// no process behind. Before that, the waiting ranks log the same diagnosis (the watch, health.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>

#include "common/test_util.h"

namespace bt = booster::testing;
using ::testing::HasSubstr;

namespace {

bt::ProcessResult run_hang(const bt::TempDir& dir, const std::string& mode) {
  return bt::run_process({BOOSTER_CLI_PATH, "run", "--nproc_per_node", "3", BOOSTER_DIST_WORKER_PATH, "scenario=hang",
                          "hang=" + mode, "timeout=5", "out=" + dir.path()},
                         {{"OMP_NUM_THREADS", "1"}}, 90);
}

void expect_gone(const bt::TempDir& dir, int rank) {
  std::ifstream in(dir.file("rank" + std::to_string(rank) + ".pid"));
  int pid = 0;
  ASSERT_TRUE(in >> pid) << "rank " << rank << " wrote no pid";
  EXPECT_NE(::kill(pid, 0), 0) << "rank " << rank << " (pid " << pid << ") is still there";
}

}  // namespace

TEST(Health, StoppedRankIsNamedAndTheJobEnds) {
  bt::TempDir dir;
  auto r = run_hang(dir, "stop");
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 40.0) << r.output;
  // Rank 0 serves the store, so it can always read the heartbeats and must name rank 2. Rank 1 times
  // out at about the same moment; when rank 0 has already exited, rank 1 cannot read the store any
  // more and says so instead (seen once in three CI runs).
  const std::string err0 = bt::read_file(dir.file("rank0.err"));
  EXPECT_THAT(err0, HasSubstr("rank 2 did not answer")) << err0;
  EXPECT_THAT(err0, HasSubstr("SIGSTOP")) << err0;
  EXPECT_THAT(err0, ::testing::Not(HasSubstr("rank 1 did not answer"))) << err0;
  const std::string err1 = bt::read_file(dir.file("rank1.err"));
  EXPECT_THAT(err1, ::testing::AnyOf(HasSubstr("rank 2 did not answer"), HasSubstr("rank 0 may be gone"))) << err1;
  EXPECT_THAT(err1, ::testing::Not(HasSubstr("rank 0 did not answer"))) << err1;
  for (int rank : {0, 1, 2}) expect_gone(dir, rank);
}

TEST(Health, RankStuckOutsideCollectivesIsNamed) {
  bt::TempDir dir;
  auto r = run_hang(dir, "stuck");
  EXPECT_FALSE(r.timed_out) << r.output;
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 40.0) << r.output;
  const std::string err0 = bt::read_file(dir.file("rank0.err"));
  EXPECT_THAT(err0, HasSubstr("rank 2 is alive but has issued")) << err0;
  EXPECT_THAT(err0, HasSubstr("stuck outside collectives")) << err0;
  const std::string err1 = bt::read_file(dir.file("rank1.err"));  // as above: rank 0 may have gone first
  EXPECT_THAT(err1, ::testing::AnyOf(HasSubstr("rank 2 is alive but has issued"), HasSubstr("rank 0 may be gone")))
      << err1;
  for (int rank : {0, 1, 2}) expect_gone(dir, rank);
}

// Before the timeout: the ranks waiting in the collective rank 2 never joined log the same diagnosis
// once their count of world collectives has not moved for Health::watch_after_s(5) = 2.5 s (what a
// job on NCCL, whose collectives c10d's watchdog ends without naming anyone, gets before the end).
TEST(Health, WaitingRanksNameTheMissingRankBeforeTheTimeout) {
  bt::TempDir dir;
  auto r = run_hang(dir, "stuck");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("no new world collective for")) << r.output;
  EXPECT_THAT(r.output, HasSubstr("may be waiting for ranks that did not join it")) << r.output;
  // The logged diagnosis names rank 2 (a "[rank 0]: " or "[rank 1]: " line of the launcher's output).
  const size_t at = r.output.find("no new world collective for");
  ASSERT_NE(at, std::string::npos);
  EXPECT_THAT(r.output.substr(at), HasSubstr("rank 2 is alive but has issued")) << r.output;
  for (int rank : {0, 1, 2}) expect_gone(dir, rank);
}
