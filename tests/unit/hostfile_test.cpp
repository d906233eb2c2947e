// hostfile_test.cpp — tests of `booster run --hostfile` (tools/booster/hostfile.cpp and the --hostfile
// mode of supervisor.cpp): the hostfile format, --include / --exclude / --nnodes, shell quoting and
// the per-node command, then whole jobs through the `booster` binary (BOOSTER_CLI_PATH) with a stand-in
// for ssh that runs the command line on this machine in a session of its own, as sshd would: the
// environment each rank gets, a failing node stopping the others, and a killed launcher leaving no
// rank behind (the remote launchers see end of file on stdin).
#include "hostfile.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"

namespace bt = booster::testing;
using booster::cli::RunOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

// The message of the std::runtime_error `fn` throws ("" if none).
template <class Fn>
std::string error_of(Fn fn) {
  try {
    fn();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

// A stand-in for ssh: HOST COMMAND_LINE. It records the host and runs the command line here in a
// new session (setsid -w waits for it) with an environment of PATH only, as a remote login shell
// would start: signals to this process do not reach the remote side, and, as with sshd, only end of
// file on stdin tells the remote launcher that the connection is gone.
std::string fake_ssh(const bt::TempDir& dir) {
  const std::string path = dir.file("fake_ssh");
  write_text(path,
             "#!/bin/sh\n"
             "echo \"$1\" >> \"$FAKE_SSH_LOG\"\n"
             "exec env -i PATH=\"$PATH\" setsid -w /bin/sh -c \"$2\"\n");
  ::chmod(path.c_str(), 0755);
  return path;
}

bool wait_for_files(const std::vector<std::string>& paths, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    bool all = true;
    for (const auto& p : paths) all = all && !bt::read_file(p).empty();
    if (all) return true;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// Waits up to timeout_s for every pid in the files to be gone; kills survivors and returns false.
bool all_gone(const bt::TempDir& dir, const std::vector<std::string>& pid_files, double timeout_s) {
  const auto start = std::chrono::steady_clock::now();
  while (true) {
    bool any = false;
    for (const auto& f : pid_files) {
      const std::string text = bt::read_file(dir.file(f));
      if (!text.empty() && bt::process_alive(std::stoi(text))) any = true;
    }
    if (!any) return true;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > timeout_s) {
      for (const auto& f : pid_files) {
        const std::string text = bt::read_file(dir.file(f));
        if (!text.empty()) ::kill(std::stoi(text), SIGKILL);
      }
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Runs `booster run --hostfile DIR/hosts --nproc_per_node 2 ARGS... --ssh_command FAKE_SSH /bin/sh -c
// SCRIPT` with `env` added (FAKE_SSH_LOG = DIR/ssh_log, D = DIR) and waits up to 60 s.
bt::ProcessResult run_hostfile_job(const bt::TempDir& dir, const std::vector<std::string>& args,
                                   const std::string& script, std::map<std::string, std::string> env = {}) {
  std::vector<std::string> argv = {BOOSTER_CLI_PATH, "run", "--hostfile", dir.file("hosts"), "--nproc_per_node", "2"};
  argv.insert(argv.end(), args.begin(), args.end());
  argv.insert(argv.end(), {"--ssh_command", fake_ssh(dir), "/bin/sh", "-c", script});
  env["FAKE_SSH_LOG"] = dir.file("ssh_log");
  env["D"] = dir.path();
  return bt::run_process(argv, env, 60);
}

}  // namespace

TEST(Hostfile, OneHostPerLineWithBlankAndCommentLinesSkipped) {
  bt::TempDir dir;
  write_text(dir.file("hosts"), "# the cluster\nworker-0\n\n  worker-1  \n10.0.0.7\n");
  EXPECT_THAT(booster::cli::read_hostfile(dir.file("hosts")), ElementsAre("worker-0", "worker-1", "10.0.0.7"));
}

TEST(Hostfile, BadHostfilesAreClearErrorsNamingFileAndLine) {
  bt::TempDir dir;
  EXPECT_THAT(error_of([&] { booster::cli::read_hostfile(dir.file("missing")); }),
              HasSubstr("cannot read the hostfile " + dir.file("missing")));
  write_text(dir.file("empty"), "# nothing\n\n");
  EXPECT_THAT(error_of([&] { booster::cli::read_hostfile(dir.file("empty")); }), HasSubstr("names no host"));
  write_text(dir.file("twice"), "a\nb\na\n");
  EXPECT_THAT(error_of([&] { booster::cli::read_hostfile(dir.file("twice")); }),
              HasSubstr("line 3: host a is listed twice"));
  write_text(dir.file("slots"), "worker-0 slots=4\n");
  EXPECT_THAT(error_of([&] { booster::cli::read_hostfile(dir.file("slots")); }),
              HasSubstr("line 1: 'worker-0 slots=4' is not a host name"));
}

TEST(Hostfile, IncludeExcludeAndNnodesSelectHostsInHostfileOrder) {
  const std::vector<std::string> hosts = {"a", "b", "c", "d"};
  using booster::cli::select_hosts;
  EXPECT_THAT(select_hosts(hosts, "", "", 0), ElementsAre("a", "b", "c", "d"));
  EXPECT_THAT(select_hosts(hosts, "d,b", "", 0), ElementsAre("b", "d"));  // hostfile order decides node_rank
  EXPECT_THAT(select_hosts(hosts, "", "a,c", 0), ElementsAre("b", "d"));
  EXPECT_THAT(select_hosts(hosts, "", "b", 2), ElementsAre("a", "c"));
  EXPECT_THAT(error_of([&] { select_hosts(hosts, "a", "b", 0); }), HasSubstr("mutually exclusive"));
  EXPECT_THAT(error_of([&] { select_hosts(hosts, "a,x", "", 0); }), HasSubstr("--include names host 'x'"));
  EXPECT_THAT(error_of([&] { select_hosts(hosts, "", "x", 0); }), HasSubstr("--exclude names host 'x'"));
  EXPECT_THAT(error_of([&] { select_hosts(hosts, "a,", "", 0); }), HasSubstr("empty host name"));
  EXPECT_THAT(error_of([&] { select_hosts(hosts, "", "a,b,c,d", 0); }), HasSubstr("leaves no host"));
  EXPECT_THAT(error_of([&] { select_hosts(hosts, "a,b", "", 3); }), HasSubstr("--nnodes 3 needs that many hosts"));
}

TEST(Hostfile, ShellQuotedWordsReachTheCommandUnchanged) {
  for (const std::string word : {"", "plain", "two words", "it's", "$HOME `x` \"q\" \\ ;|&", "'"}) {
    bt::ProcessResult r = bt::run_process({"/bin/sh", "-c", "printf %s " + booster::cli::shell_quote(word)});
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.output, word);
  }
}

TEST(Hostfile, NodeCommandStartsThisLauncherWithTheNodesRankAndForwardsTheEnvironment) {
  RunOptions o;
  o.nproc_per_node = 2;
  o.ssh_command = "ssh  -o BatchMode=yes";
  o.ssh_port = 2222;
  o.command = {"./train", "--config", "my conf.toml"};
  const std::vector<std::string> argv = booster::cli::node_command(
      o, {"a", "b"}, 1, 29500, "/opt/bin/booster", "/work dir",
      {"FOO=bar", "GLOO_SOCKET_IFNAME=eth0", "HOME=/root", "SSH_AUTH_SOCK=/x", "MULTI=a\nb", "OMP_NUM_THREADS=4"});
  EXPECT_THAT(argv, ElementsAre("ssh", "-o", "BatchMode=yes", "-p", "2222", "b", ::testing::_));
  EXPECT_EQ(argv.back(),
            "cd '/work dir' && exec env 'FOO=bar' 'OMP_NUM_THREADS=4' '/opt/bin/booster' 'run' '--nnodes' '2' "
            "'--node_rank' '1' '--nproc_per_node' '2' '--master_addr' 'a' '--master_port' '29500' "
            "'--stop_on_stdin_eof' './train' '--config' 'my conf.toml'");
  o.master_addr = "10.0.0.1";
  o.master_addr_given = true;
  EXPECT_THAT(booster::cli::node_command(o, {"a", "b"}, 0, 29500, "/b", "/", {}).back(),
              HasSubstr("'--node_rank' '0' '--nproc_per_node' '2' '--master_addr' '10.0.0.1'"));
  o.max_restarts = 3;
  EXPECT_THAT(booster::cli::node_command(o, {"a", "b"}, 1, 29502, "/b", "/", {}, 2).back(),
              HasSubstr("'--stop_on_stdin_eof' '--max_restarts' '3' '--restart_count' '2' './train'"));
  EXPECT_FALSE(booster::cli::forwarded_to_nodes("XDG_RUNTIME_DIR"));
  EXPECT_TRUE(booster::cli::forwarded_to_nodes("LD_LIBRARY_PATH"));
}

TEST(Hostfile, UsageErrorsExitWith2AndSayWhy) {
  bt::TempDir dir;
  write_text(dir.file("hosts"), "a\nb\n");
  const std::string hosts = dir.file("hosts");
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--include", "a", "/bin/true"}, "--include only applies with --hostfile"},
      {{"--ssh_command", "rsh", "/bin/true"}, "--ssh_command only applies with --hostfile"},
      {{"--hostfile", hosts, "--include", "a", "--exclude", "b", "/bin/true"}, "mutually exclusive"},
      {{"--hostfile", hosts, "--node_rank", "1", "/bin/true"}, "--node_rank cannot be combined with --hostfile"},
      {{"--nnodes", "2", "--max_restarts", "1", "/bin/true"}, "start the job with --hostfile"},
      {{"--hostfile", hosts, "--max_restarts", "40000", "/bin/true"}, "within 65535"},
      {{"--hostfile", dir.file("nope"), "/bin/true"}, "cannot read the hostfile"},
      {{"--hostfile", hosts, "--nnodes", "3", "/bin/true"}, "--nnodes 3 needs that many hosts"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = {BOOSTER_CLI_PATH, "run"};
    argv.insert(argv.end(), args.begin(), args.end());
    bt::ProcessResult r = bt::run_process(argv, {}, 30);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_THAT(r.output, HasSubstr(message));
  }
}

// Two of three hosts (--exclude), 2 ranks each: ranks 0-3 with the torchrun variables of a 2-node
// job, MASTER_ADDR the first host, the launcher's environment forwarded except interface names.
TEST(Hostfile, JobRunsOnTheSelectedHostsAsNodesInHostfileOrder) {
  bt::TempDir dir;
  write_text(dir.file("hosts"), "# test hosts\nhost-a\nhost-c\nhost-b\n");
  const std::string rank_script =
      "echo \"RANK=$RANK WORLD_SIZE=$WORLD_SIZE LOCAL_RANK=$LOCAL_RANK GROUP_RANK=$GROUP_RANK "
      "MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT FOO=$FOO IF=$GLOO_SOCKET_IFNAME\"";
  bt::ProcessResult r = run_hostfile_job(dir, {"--exclude", "host-c", "--master_port", "29777"}, rank_script,
                                         {{"FOO", "bar baz"}, {"GLOO_SOCKET_IFNAME", "eth7"}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_THAT(r.output, HasSubstr("[rank " + std::to_string(rank) + "]: RANK=" + std::to_string(rank) +
                                    " WORLD_SIZE=4 LOCAL_RANK=" + std::to_string(rank % 2) +
                                    " GROUP_RANK=" + std::to_string(rank / 2) +
                                    " MASTER_ADDR=host-a MASTER_PORT=29777 FOO=bar baz IF=\n"));
  const std::string log = bt::read_file(dir.file("ssh_log"));
  EXPECT_TRUE(log == "host-a\nhost-b\n" || log == "host-b\nhost-a\n") << log;
}

// Rank 3 (node 1) fails while the others sleep: the launcher names the node, stops node 0 (whose
// remote launcher only sees its stdin closed) and exits 1; no rank is left.
TEST(Hostfile, AFailingNodeStopsTheOtherNodes) {
  bt::TempDir dir;
  write_text(dir.file("hosts"), "host-a\nhost-b\n");
  const std::string script =
      "echo $$ > \"$D/pid$RANK\"\n"
      "if [ \"$RANK\" = 3 ]; then\n"
      "  while [ ! -s \"$D/pid0\" ] || [ ! -s \"$D/pid1\" ] || [ ! -s \"$D/pid2\" ]; do sleep 0.05; done\n"
      "  exit 3\n"
      "fi\n"
      "exec sleep 60\n";
  bt::ProcessResult r = run_hostfile_job(dir, {}, script);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_THAT(r.output, HasSubstr("rank 3 (pid"));
  EXPECT_THAT(r.output, HasSubstr("node 1 (host-b) (pid"));
  EXPECT_THAT(r.output, HasSubstr("stopping the other nodes"));
  EXPECT_TRUE(all_gone(dir, {"pid0", "pid1", "pid2", "pid3"}, 15)) << r.output;
}

// SIGKILL to the launcher: its ssh processes die with it (PR_SET_PDEATHSIG), the remote launchers
// read end of file on stdin and stop their ranks.
TEST(Hostfile, KilledLauncherLeavesNoRankOnAnyNode) {
  bt::TempDir dir;
  write_text(dir.file("hosts"), "host-a\nhost-b\n");
  const int pid = bt::spawn_process(
      {BOOSTER_CLI_PATH, "run", "--hostfile", dir.file("hosts"), "--nproc_per_node", "2", "--ssh_command",
       fake_ssh(dir), "/bin/sh", "-c", "echo $$ > \"$D/pid$RANK\"; exec sleep 60"},
      {{"FAKE_SSH_LOG", dir.file("ssh_log")}, {"D", dir.path()}}, dir.file("out"));
  ASSERT_TRUE(wait_for_files({dir.file("pid0"), dir.file("pid1"), dir.file("pid2"), dir.file("pid3")}, 30))
      << bt::read_file(dir.file("out"));
  ::kill(pid, SIGKILL);
  bt::wait_process(pid, 10);
  EXPECT_TRUE(all_gone(dir, {"pid0", "pid1", "pid2", "pid3"}, 15)) << bt::read_file(dir.file("out"));
}

// --max_restarts 1 with --hostfile: rank 3 fails in the first attempt while the others sleep; every
// node is stopped and started again on the next port, and the second attempt's ranks see
// TORCHELASTIC_RESTART_COUNT = 1 of 1.
TEST(Hostfile, MaxRestartsStartsEveryNodeAgain) {
  bt::TempDir dir;
  write_text(dir.file("hosts"), "host-a\nhost-b\n");
  const std::string script =
      "if [ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then if [ \"$RANK\" = 3 ]; then exit 3; fi; exec sleep 60; fi\n"
      "echo \"ok rank $RANK restart $TORCHELASTIC_RESTART_COUNT of $TORCHELASTIC_MAX_RESTARTS port $MASTER_PORT\"\n";
  bt::ProcessResult r = run_hostfile_job(dir, {"--max_restarts", "1"}, script);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 30.0);
  EXPECT_THAT(r.output, HasSubstr("node 1 (host-b) (pid"));
  EXPECT_THAT(r.output, HasSubstr("restarting all nodes (restart 1 of 1, MASTER_PORT 29501)"));
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_THAT(r.output, HasSubstr("[rank " + std::to_string(rank) + "]: ok rank " + std::to_string(rank) +
                                    " restart 1 of 1 port 29501\n"));
  EXPECT_EQ(bt::read_file(dir.file("ssh_log")).size(), std::string("host-a\nhost-b\n").size() * 2);
}
