// run_args_test.cpp — tests of `booster run`'s command line (tools/booster/run_args.cpp): options
// and their defaults, pass-through of the program's arguments, and the usage errors. The parser is
// called in-process; the last two tests run the `booster` binary (BOOSTER_CLI_PATH) to check that
// a usage error reaches the user as exit code 2 with the message on stderr, and --help as exit 0.
#include "run_args.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <map>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace bt = booster::testing;
using booster::cli::RunOptions;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

// ---- in-process parsing

struct Parsed {
  RunOptions options;
  std::string error;  // CLI11's parse error or validate_run_options' message; "" if none
};

// Parses `booster run ARGS...` the way main.cpp does: CLI11 first, then validate_run_options.
Parsed parse_run(const std::vector<std::string>& args) {
  Parsed p;
  CLI::App app{"test", "booster"};
  booster::cli::add_run_subcommand(app, p.options);
  std::vector<std::string> words = {"booster", "run"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<const char*> argv;
  for (const auto& w : words) argv.push_back(w.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    p.error = e.what();
    return p;
  }
  p.error = booster::cli::validate_run_options(p.options);
  return p;
}

std::string joined(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += a + " ";
  return out;
}

TEST(RunArgs, Defaults) {
  Parsed p = parse_run({"/bin/true"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.options.nproc_per_node, 1);
  EXPECT_EQ(p.options.nnodes, 1);
  EXPECT_EQ(p.options.node_rank, 0);
  EXPECT_EQ(p.options.master_addr, "127.0.0.1");
  EXPECT_EQ(p.options.master_port, 29500);
  EXPECT_FALSE(p.options.master_port_given);
  EXPECT_DOUBLE_EQ(p.options.kill_grace_seconds, 5.0);
  EXPECT_THAT(p.options.command, ElementsAre("/bin/true"));
}

TEST(RunArgs, UnderscoreAndDashSpellings) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--nproc_per_node", "3", "--nnodes", "2", "--node_rank", "1", "--master_addr",
                                 "10.1.2.3", "--master_port", "23456", "prog"},
        std::vector<std::string>{"--nproc-per-node", "3", "--nnodes", "2", "--node-rank", "1", "--master-addr",
                                 "10.1.2.3", "--master-port", "23456", "prog"}}) {
    Parsed p = parse_run(args);
    ASSERT_EQ(p.error, "") << joined(args);
    EXPECT_EQ(p.options.nproc_per_node, 3) << joined(args);
    EXPECT_EQ(p.options.nnodes, 2) << joined(args);
    EXPECT_EQ(p.options.node_rank, 1) << joined(args);
    EXPECT_EQ(p.options.master_addr, "10.1.2.3") << joined(args);
    EXPECT_EQ(p.options.master_port, 23456) << joined(args);
    EXPECT_TRUE(p.options.master_port_given) << joined(args);
    EXPECT_EQ(booster::cli::resolve_master_port(p.options), 23456) << joined(args);
    EXPECT_THAT(p.options.command, ElementsAre("prog"));
  }
}

TEST(RunArgs, ProgramArgumentsPassThroughUntouched) {
  // Everything from the program name on belongs to the program, launcher-like options included.
  Parsed p = parse_run({"--nproc-per-node", "1", "sh", "-c", "echo", "sh", "--rank", "3", "-h",
                        "--nproc_per_node", "9", "--", "x"});
  ASSERT_EQ(p.error, "");
  EXPECT_EQ(p.options.nproc_per_node, 1);
  EXPECT_THAT(p.options.command,
              ElementsAre("sh", "-c", "echo", "sh", "--rank", "3", "-h", "--nproc_per_node", "9", "--", "x"));

  // A "--" right before the program ends the launcher's options and is dropped.
  Parsed q = parse_run({"--", "/bin/sh", "-c", "echo ok"});
  ASSERT_EQ(q.error, "");
  EXPECT_THAT(q.options.command, ElementsAre("/bin/sh", "-c", "echo ok"));
}

TEST(RunArgs, ValidationNamesTheProblem) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{}, "missing the program to run (usage: booster run [OPTIONS] PROGRAM [ARGS...])"},
      {{"--nproc_per_node", "2"}, "missing the program"},
      {{"--nproc_per_node", "0", "/bin/true"}, "--nproc_per_node must be at least 1 (got 0)"},
      {{"--nnodes", "0", "/bin/true"}, "--nnodes must be at least 1 (got 0)"},
      {{"--nnodes", "2", "--node_rank", "2", "/bin/true"}, "--node_rank must be in [0, nnodes) = [0, 2) (got 2)"},
      {{"--node_rank", "-1", "/bin/true"}, "--node_rank must be in [0, nnodes) = [0, 1) (got -1)"},
      {{"--master_port", "0", "/bin/true"}, "--master_port must be in [1, 65535] (got 0)"},
      {{"--master_port", "70000", "/bin/true"}, "--master_port must be in [1, 65535] (got 70000)"},
      {{"--master_addr", "", "/bin/true"}, "--master_addr must not be empty"},
      {{"--nnodes", "100000", "--nproc_per_node", "100000", "/bin/true"}, "too large"},
  };
  for (const auto& c : cases) {
    Parsed p = parse_run(c.args);
    EXPECT_THAT(p.error, HasSubstr(c.message)) << joined(c.args);
  }
}

TEST(RunArgs, ParseErrorsNameTheOption) {
  EXPECT_THAT(parse_run({"--nproc_per_node", "many", "/bin/true"}).error, HasSubstr("nproc_per_node"));
  EXPECT_THAT(parse_run({"--bogus", "/bin/true"}).error, HasSubstr("--bogus"));
}

TEST(RunArgs, SubcommandHelpListsOptionsAndExitCodes) {
  RunOptions options;
  CLI::App app{"test", "booster"};
  CLI::App* run = booster::cli::add_run_subcommand(app, options);
  std::string help = run->help();
  for (const char* opt : {"--nproc_per_node", "--nnodes", "--node_rank", "--master_addr", "--master_port",
                          "program", "Exit codes"})
    EXPECT_THAT(help, HasSubstr(opt));
}

// ---- through the `booster` binary

struct ToolResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `booster ARGS...` with stdout and stderr captured separately.
ToolResult run_booster(const std::vector<std::string>& args) {
  bt::TempDir io;
  // sh execs the tool with stderr redirected (spawn_process sends both streams to one file).
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$@\" 2>\"$BOOSTER_TEST_STDERR\"", "sh",
                                   BOOSTER_CLI_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  std::map<std::string, std::string> env = {{"BOOSTER_TEST_STDERR", io.file("stderr.txt")}};
  ToolResult r;
  r.exit_code = bt::wait_process(bt::spawn_process(argv, env, io.file("stdout.txt")), 30).exit_code;
  r.out = bt::read_file(io.file("stdout.txt"));
  r.err = bt::read_file(io.file("stderr.txt"));
  return r;
}

std::string describe(const ToolResult& r) {
  return "exit=" + std::to_string(r.exit_code) + "\n--- stdout:\n" + r.out + "--- stderr:\n" + r.err;
}

TEST(RunArgs, BadUsage) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"run"}, "missing the program"},
      {{"run", "--nproc_per_node", "2"}, "missing the program"},
      {{"run", "--nproc_per_node", "0", "/bin/true"}, "--nproc_per_node"},
      {{"run", "--nproc_per_node", "many", "/bin/true"}, "nproc_per_node"},
      {{"run", "--nnodes", "2", "--node_rank", "2", "/bin/true"}, "--node_rank"},
      {{"run", "--master_port", "70000", "/bin/true"}, "--master_port"},
      {{"run", "--bogus", "/bin/true"}, "--bogus"},
      {{}, "subcommand"},
      {{"frobnicate"}, "unknown subcommand 'frobnicate'"},
  };
  for (const auto& c : cases) {
    ToolResult r = run_booster(c.args);
    EXPECT_NE(r.exit_code, 0) << joined(c.args) << describe(r);
    EXPECT_EQ(r.exit_code, 2) << joined(c.args) << describe(r);
    EXPECT_NE(r.err.find(c.message), std::string::npos) << joined(c.args) << describe(r);
  }
}

TEST(RunArgs, HelpListsOptions) {
  ToolResult top = run_booster({"--help"});
  EXPECT_EQ(top.exit_code, 0) << describe(top);
  EXPECT_NE(top.out.find("run"), std::string::npos) << describe(top);

  ToolResult run = run_booster({"run", "--help"});
  EXPECT_EQ(run.exit_code, 0) << describe(run);
  for (const char* opt : {"--nproc_per_node", "--nnodes", "--node_rank", "--master_addr", "--master_port"})
    EXPECT_NE(run.out.find(opt), std::string::npos) << opt << "\n" << describe(run);
}

}  // namespace
