// supervisor_test.cpp — tests of `booster run`'s process supervision (tools/booster/supervisor.cpp):
// environment contract, "[rank R]: " output prefixes, failure propagation, signal forwarding, and
// that no rank (or helper process of a rank) outlives the launcher. Ranks are small /bin/sh
// scripts; the tool is the binary at BOOSTER_CLI_PATH. The command line is tested in run_args_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"

namespace bt = booster::testing;

namespace {

constexpr double kTimeoutS = 30;  // a hung launcher fails the test instead of hanging it

struct Launch {
  bt::ProcessResult proc;
  std::string out;  // the launcher's stdout
  std::string err;  // the launcher's stderr
};

// Starts `booster ARGS...` with stdout and stderr captured in separate files under `io`.
int start_booster(const bt::TempDir& io, const std::vector<std::string>& args,
                  std::map<std::string, std::string> env = {}) {
  // sh execs the tool with stderr redirected (spawn_process sends both streams to one file).
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$@\" 2>\"$BOOSTER_TEST_STDERR\"", "sh",
                                   BOOSTER_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  env["BOOSTER_TEST_STDERR"] = io.file("launcher_stderr.txt");
  return bt::spawn_process(argv, env, io.file("launcher_stdout.txt"));
}

Launch finish_booster(const bt::TempDir& io, int pid, double timeout_s = kTimeoutS) {
  Launch l;
  l.proc = bt::wait_process(pid, timeout_s);
  l.out = bt::read_file(io.file("launcher_stdout.txt"));
  l.err = bt::read_file(io.file("launcher_stderr.txt"));
  return l;
}

Launch booster(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {},
               double timeout_s = kTimeoutS) {
  bt::TempDir io;
  return finish_booster(io, start_booster(io, args, env), timeout_s);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool has_line(const std::string& text, const std::string& line) {
  for (const auto& l : lines_of(text))
    if (l == line) return true;
  return false;
}

// Waits until every file exists and is non-empty.
bool wait_for_files(const std::vector<std::string>& paths, double timeout_s) {
  auto start = std::chrono::steady_clock::now();
  while (true) {
    bool all = true;
    for (const auto& p : paths) all = all && !bt::read_file(p).empty();
    if (all) return true;
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Pids written by the ranks ("echo $$ > file"); files that are missing are skipped.
std::vector<int> read_pids(const bt::TempDir& dir, const std::vector<std::string>& names) {
  std::vector<int> pids;
  for (const auto& n : names) {
    std::string text = bt::read_file(dir.file(n));
    if (!text.empty()) pids.push_back(std::stoi(text));
  }
  return pids;
}

// Expects none of `pids` to be alive; kills survivors so a failing test leaves nothing behind.
void expect_all_dead(const std::vector<int>& pids) {
  for (int pid : pids) {
    EXPECT_FALSE(bt::process_alive(pid)) << "process " << pid << " outlived the launcher";
    if (bt::process_alive(pid)) kill(pid, SIGKILL);
  }
}

std::string describe(const Launch& l) {
  return "exit=" + std::to_string(l.proc.exit_code) + " signal=" + std::to_string(l.proc.term_signal) +
         "\n--- stdout:\n" + l.out + "--- stderr:\n" + l.err;
}

const char* kEchoEnv =
    "echo \"RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE "
    "GROUP_RANK=$GROUP_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT OMP=$OMP_NUM_THREADS\"";

TEST(Supervisor, AllRanksSucceedWithTorchrunEnvironment) {
  int port = bt::free_port();
  // A RANK already in the environment must be overridden; OMP_NUM_THREADS defaults to 1.
  Launch l = booster({"run", "--nproc_per_node", "2", "--master_port", std::to_string(port), "/bin/sh", "-c",
                      kEchoEnv},
                     {{"RANK", "99"}, {"OMP_NUM_THREADS", "\x01unset"}});
  ASSERT_EQ(l.proc.exit_code, 0) << describe(l);
  EXPECT_FALSE(l.proc.timed_out);
  std::string p = std::to_string(port);
  EXPECT_TRUE(has_line(l.out, "[rank 0]: RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 "
                              "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + p + " OMP=1"))
      << describe(l);
  EXPECT_TRUE(has_line(l.out, "[rank 1]: RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 "
                              "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + p + " OMP=1"))
      << describe(l);
  EXPECT_EQ(lines_of(l.out).size(), 2u) << describe(l);
}

// Without --master_port a single-node job gets a port that was free (torchrun --standalone): two jobs
// started at once on one machine each bind their MASTER_PORT (as rank 0's store does) and both
// succeed; with several nodes the default stays 29500. OMP_NUM_THREADS from the environment is kept.
TEST(Supervisor, DefaultsAndExistingOmpNumThreadsKept) {
  const char* kBindPort =
      "import os, socket, time\n"
      "s = socket.socket(); s.bind(('127.0.0.1', int(os.environ['MASTER_PORT']))); s.listen()\n"
      "time.sleep(1.5)\n"
      "print('bound', os.environ['MASTER_PORT'], 'OMP', os.environ['OMP_NUM_THREADS'])\n";
  bt::TempDir io_a, io_b;
  const int pid_a = start_booster(io_a, {"run", "/usr/bin/python3", "-c", kBindPort}, {{"OMP_NUM_THREADS", "7"}});
  const int pid_b = start_booster(io_b, {"run", "/usr/bin/python3", "-c", kBindPort}, {{"OMP_NUM_THREADS", "7"}});
  Launch a = finish_booster(io_a, pid_a), b = finish_booster(io_b, pid_b);
  ASSERT_EQ(a.proc.exit_code, 0) << describe(a);
  ASSERT_EQ(b.proc.exit_code, 0) << describe(b);
  auto port_of = [](const Launch& l) {
    const auto at = l.out.find("bound ");
    return at == std::string::npos ? -1 : std::stoi(l.out.substr(at + 6));
  };
  EXPECT_NE(port_of(a), port_of(b)) << describe(a) << describe(b);
  EXPECT_GT(port_of(a), 0) << describe(a);
  EXPECT_THAT(a.out, ::testing::HasSubstr("OMP 7")) << describe(a);
  Launch two = booster({"run", "--nnodes", "2", "--node_rank", "1", "/bin/sh", "-c", kEchoEnv});
  ASSERT_EQ(two.proc.exit_code, 0) << describe(two);
  EXPECT_THAT(two.out, ::testing::HasSubstr("MASTER_PORT=29500")) << describe(two);
}

TEST(Supervisor, SecondNodeOfTwoGetsGlobalRanks) {
  Launch l = booster({"run", "--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "2", "--master_addr",
                      "10.1.2.3", "--master_port", "23456", "/bin/sh", "-c", kEchoEnv});
  ASSERT_EQ(l.proc.exit_code, 0) << describe(l);
  EXPECT_TRUE(has_line(l.out, "[rank 2]: RANK=2 LOCAL_RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 "
                              "MASTER_ADDR=10.1.2.3 MASTER_PORT=23456 OMP=1"))
      << describe(l);
  EXPECT_TRUE(has_line(l.out, "[rank 3]: RANK=3 LOCAL_RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_RANK=1 "
                              "MASTER_ADDR=10.1.2.3 MASTER_PORT=23456 OMP=1"))
      << describe(l);
}

TEST(Supervisor, ProgramArgumentsPassThroughAndPathLookup) {
  // "sh" has no '/', so it is looked up in PATH; options after it belong to the program.
  Launch l = booster({"run", "--nproc-per-node", "1", "sh", "-c", "echo \"args: $*\"", "sh", "--rank", "3",
                      "-h", "--nproc_per_node", "9", "--", "x"});
  ASSERT_EQ(l.proc.exit_code, 0) << describe(l);
  EXPECT_TRUE(has_line(l.out, "[rank 0]: args: --rank 3 -h --nproc_per_node 9 -- x")) << describe(l);

  // A "--" before the program ends the launcher's options.
  Launch m = booster({"run", "--", "/bin/sh", "-c", "echo ok"});
  ASSERT_EQ(m.proc.exit_code, 0) << describe(m);
  EXPECT_TRUE(has_line(m.out, "[rank 0]: ok")) << describe(m);
}

TEST(Supervisor, StreamsArePrefixedSeparatelyAndPartialLineIsFlushed) {
  Launch l = booster({"run", "--nproc_per_node", "2", "/bin/sh", "-c",
                      "echo \"out $RANK\"; echo \"err $RANK\" >&2; printf 'tail %s' \"$RANK\""});
  ASSERT_EQ(l.proc.exit_code, 0) << describe(l);
  for (const char* r : {"0", "1"}) {
    std::string rank = r;
    EXPECT_TRUE(has_line(l.out, "[rank " + rank + "]: out " + rank)) << describe(l);
    EXPECT_TRUE(has_line(l.out, "[rank " + rank + "]: tail " + rank)) << describe(l);
    EXPECT_TRUE(has_line(l.err, "[rank " + rank + "]: err " + rank)) << describe(l);
    EXPECT_FALSE(has_line(l.out, "[rank " + rank + "]: err " + rank)) << describe(l);
  }
  ASSERT_FALSE(l.out.empty());
  EXPECT_EQ(l.out.back(), '\n');
}

TEST(Supervisor, LinesOfDifferentRanksNeverInterleave) {
  // Each line is written in two pieces, so the launcher has to reassemble lines.
  const std::string long_text(200, 'x');
  Launch l = booster({"run", "--nproc_per_node", "4", "/bin/sh", "-c",
                      "i=0; while [ $i -lt 500 ]; do printf '%s-' \"$RANK\"; printf '%s\\n' \"" + long_text +
                          "\"; i=$((i+1)); done"});
  ASSERT_EQ(l.proc.exit_code, 0) << l.err;
  auto lines = lines_of(l.out);
  EXPECT_EQ(lines.size(), 2000u);
  std::regex good("\\[rank ([0-3])\\]: \\1-x{200}");
  int bad = 0;
  for (const auto& line : lines) {
    if (!std::regex_match(line, good) && bad++ < 5) ADD_FAILURE() << "mangled line: " << line;
  }
  EXPECT_EQ(bad, 0);
}

// Ranks write their pid and their background child's pid, then wait; rank 1 waits for the others
// to be running and then runs `fail`.
std::string failing_job_script(const std::string& fail) {
  return "sleep 60 & echo $! > \"$D/child$RANK\"; echo $$ > \"$D/pid$RANK\"\n"
         "if [ \"$RANK\" = 1 ]; then\n"
         "  while [ ! -s \"$D/pid0\" ] || [ ! -s \"$D/pid2\" ]; do sleep 0.05; done\n"
         "  echo 'rank one going down'\n"
         "  " + fail + "\n"
         "fi\n"
         "wait\n";
}

const std::vector<std::string> kPidFiles = {"pid0", "pid1", "pid2", "child0", "child1", "child2"};

TEST(Supervisor, FailingRankStopsTheJob) {
  bt::TempDir dir;
  Launch l = booster({"run", "--nproc_per_node", "3", "/bin/sh", "-c", failing_job_script("exit 3")},
                     {{"D", dir.path()}});
  EXPECT_FALSE(l.proc.timed_out);
  EXPECT_NE(l.proc.exit_code, 0) << describe(l);
  EXPECT_EQ(l.proc.exit_code, 1) << describe(l);
  EXPECT_LT(l.proc.seconds, 10.0);
  EXPECT_NE(l.err.find("rank 1"), std::string::npos) << describe(l);
  EXPECT_NE(l.err.find("code 3"), std::string::npos) << describe(l);
  EXPECT_TRUE(has_line(l.out, "[rank 1]: rank one going down")) << describe(l);
  auto pids = read_pids(dir, kPidFiles);
  EXPECT_EQ(pids.size(), kPidFiles.size());
  expect_all_dead(pids);
}

// --max_restarts (torchrun's elastic restarts): rank 1 fails in the first attempt while rank 0 would
// sleep for a minute; the job is stopped and started again with TORCHELASTIC_RESTART_COUNT = 1 and a
// new port, and succeeds. A job failing every time is restarted exactly K times, then exits 1.
TEST(Supervisor, MaxRestartsStartsEveryRankAgain) {
  const char* kFlaky =
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then if [ \"$RANK\" = 1 ]; then exit 3; fi; sleep 60; fi; "
      "echo \"ok rank $RANK restart $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS port $MASTER_PORT\"";
  Launch l = booster({"run", "--nproc_per_node", "2", "--max_restarts", "2", "/bin/sh", "-c", kFlaky});
  ASSERT_EQ(l.proc.exit_code, 0) << describe(l);
  EXPECT_LT(l.proc.seconds, 15.0) << describe(l);
  EXPECT_THAT(l.err, ::testing::HasSubstr("rank 1")) << describe(l);
  EXPECT_THAT(l.err, ::testing::HasSubstr("restarting all ranks (restart 1 of 2")) << describe(l);
  EXPECT_THAT(l.err, ::testing::Not(::testing::HasSubstr("restart 2 of 2"))) << describe(l);
  EXPECT_THAT(l.out, ::testing::HasSubstr("[rank 0]: ok rank 0 restart 1 of 2")) << describe(l);
  EXPECT_THAT(l.out, ::testing::HasSubstr("[rank 1]: ok rank 1 restart 1 of 2")) << describe(l);
  EXPECT_EQ(lines_of(l.out).size(), 2u) << describe(l);

  Launch always = booster({"run", "--nproc_per_node", "2", "--max_restarts", "2", "/bin/sh", "-c",
                           "echo \"attempt $TORCHELASTIC_RESTART_COUNT\"; [ \"$RANK\" = 0 ] || exit 4"});
  EXPECT_EQ(always.proc.exit_code, 1) << describe(always);
  EXPECT_THAT(always.err, ::testing::HasSubstr("restart 2 of 2")) << describe(always);
  EXPECT_THAT(always.err, ::testing::Not(::testing::HasSubstr("restart 3"))) << describe(always);
  EXPECT_THAT(always.out, ::testing::HasSubstr("[rank 1]: attempt 2")) << describe(always);

  Launch multi = booster({"run", "--nnodes", "2", "--max_restarts", "1", "/bin/true"});
  EXPECT_EQ(multi.proc.exit_code, 2) << describe(multi);
  EXPECT_THAT(multi.err, ::testing::HasSubstr("--max_restarts with --nnodes > 1")) << describe(multi);
}

TEST(Supervisor, RankKilledBySignalStopsTheJob) {
  bt::TempDir dir;
  Launch l = booster({"run", "--nproc_per_node", "3", "/bin/sh", "-c", failing_job_script("kill -9 $$")},
                     {{"D", dir.path()}});
  EXPECT_FALSE(l.proc.timed_out);
  EXPECT_NE(l.proc.exit_code, 0) << describe(l);
  EXPECT_LT(l.proc.seconds, 10.0);
  EXPECT_NE(l.err.find("rank 1"), std::string::npos) << describe(l);
  EXPECT_NE(l.err.find("signal 9 (SIGKILL)"), std::string::npos) << describe(l);
  auto pids = read_pids(dir, kPidFiles);
  EXPECT_EQ(pids.size(), kPidFiles.size());
  expect_all_dead(pids);
}

TEST(Supervisor, RanksIgnoringSigtermAreKilledAfterGrace) {
  bt::TempDir dir;
  // Rank 0 and its child ignore SIGTERM; they must get SIGKILL about 5 s after rank 1 fails.
  std::string script =
      "if [ \"$RANK\" = 0 ]; then trap '' TERM; fi\n" + failing_job_script("exit 4");
  Launch l = booster({"run", "--nproc_per_node", "3", "/bin/sh", "-c", script}, {{"D", dir.path()}});
  EXPECT_FALSE(l.proc.timed_out);
  EXPECT_EQ(l.proc.exit_code, 1) << describe(l);
  EXPECT_GT(l.proc.seconds, 4.0);
  EXPECT_LT(l.proc.seconds, 10.0);
  EXPECT_NE(l.err.find("code 4"), std::string::npos) << describe(l);
  auto pids = read_pids(dir, kPidFiles);
  EXPECT_EQ(pids.size(), kPidFiles.size());
  expect_all_dead(pids);
}

TEST(Supervisor, SigtermIsForwardedToRanks) {
  bt::TempDir dir, io;
  std::string script =
      "trap 'echo got-TERM; exit 7' TERM\n"
      "sleep 60 & echo $! > \"$D/child$RANK\"; echo $$ > \"$D/pid$RANK\"; wait\n";
  int pid = start_booster(io, {"run", "--nproc_per_node", "2", "/bin/sh", "-c", script}, {{"D", dir.path()}});
  bool started = wait_for_files({dir.file("pid0"), dir.file("pid1")}, 10);
  kill(pid, SIGTERM);
  Launch l = finish_booster(io, pid);
  ASSERT_TRUE(started) << describe(l);
  EXPECT_FALSE(l.proc.timed_out);
  EXPECT_NE(l.proc.exit_code, 0) << describe(l);
  EXPECT_EQ(l.proc.exit_code, 128 + SIGTERM) << describe(l);
  EXPECT_LT(l.proc.seconds, 10.0);
  EXPECT_TRUE(has_line(l.out, "[rank 0]: got-TERM")) << describe(l);
  EXPECT_TRUE(has_line(l.out, "[rank 1]: got-TERM")) << describe(l);
  auto pids = read_pids(dir, {"pid0", "pid1", "child0", "child1"});
  EXPECT_EQ(pids.size(), 4u);
  expect_all_dead(pids);
}

TEST(Supervisor, RanksDieWhenLauncherIsKilled) {
  // Become a subreaper for this test so the ranks, orphaned when the launcher dies, are re-parented
  // to us and can be reaped (some container inits never reap zombies).
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
  struct ResetSubreaper {
    ~ResetSubreaper() { prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0); }
  } reset;
  bt::TempDir dir, io;
  int pid = start_booster(
      io, {"run", "--nproc_per_node", "2", "/bin/sh", "-c", "echo $$ > \"$D/pid$RANK\"; exec sleep 60"},
      {{"D", dir.path()}});
  bool started = wait_for_files({dir.file("pid0"), dir.file("pid1")}, 10);
  kill(pid, SIGKILL);
  Launch l = finish_booster(io, pid);
  ASSERT_TRUE(started) << describe(l);
  EXPECT_EQ(l.proc.term_signal, SIGKILL);
  auto pids = read_pids(dir, {"pid0", "pid1"});
  ASSERT_EQ(pids.size(), 2u);
  // PR_SET_PDEATHSIG delivers SIGKILL to the ranks; give the kernel a moment.
  for (int i = 0; i < 250 && (bt::process_alive(pids[0]) || bt::process_alive(pids[1])); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  expect_all_dead(pids);
  for (int rank_pid : pids) {
    int status = 0;
    pid_t w = 0;
    for (int i = 0; i < 250 && (w = waitpid(rank_pid, &status, WNOHANG)) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(w, rank_pid) << "rank " << rank_pid << " was not re-parented to the test or not reaped";
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
  }
}

TEST(Supervisor, ProgramThatCannotBeExecuted) {
  Launch l = booster({"run", "--nproc_per_node", "2", "no_such_program_booster_test"});
  EXPECT_EQ(l.proc.exit_code, 127) << describe(l);
  EXPECT_NE(l.err.find("no_such_program_booster_test"), std::string::npos) << describe(l);

  bt::TempDir dir;
  std::string script = dir.file("not_executable.sh");
  bt::write_file(script, "#!/bin/sh\necho hi\n");
  chmod(script.c_str(), 0644);
  Launch m = booster({"run", script});
  EXPECT_EQ(m.proc.exit_code, 127) << describe(m);
  EXPECT_NE(m.err.find(script), std::string::npos) << describe(m);
}

}  // namespace
