// run_args.h — the command line of `booster run` (the torchrun-like launcher): its options, their
// validation, and the launcher's exit codes. Parsing only; supervisor.h runs the job. No LibTorch
// and no process control here, so the parser is unit-tested in-process (tests/unit/run_args_test.cpp).
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace booster::cli {

// Exit codes of `booster run` (the launcher itself, not the ranks).
enum RunExitCode : int {
  kRunOk = 0,            // every rank exited with code 0
  kRunRankFailed = 1,    // a rank exited non-zero or was killed by a signal (torchrun also exits 1)
  kRunUsageError = 2,    // bad command line (missing program, nproc < 1, node_rank >= nnodes, ...)
  kRunCannotExec = 127,  // the program was not found or could not be executed
  // 128 + N: the launcher received signal N (SIGINT -> 130, SIGTERM -> 143, SIGHUP -> 129),
  // forwarded it to the ranks and stopped the job.
};

struct RunOptions {
  int nproc_per_node = 1;                 // ranks started on this node
  int nnodes = 1;                         // nodes in the job (one launcher per node)
  int node_rank = 0;                      // this node's index in [0, nnodes)
  std::string master_addr = "127.0.0.1";  // rendezvous host of rank 0 (MASTER_ADDR)
  int master_port = 29500;                // rendezvous port (MASTER_PORT), when given or nnodes > 1
  bool master_port_given = false;         // --master_port was on the command line
  int max_restarts = 0;                   // torchrun's --max_restarts (one node, or --hostfile)
  std::vector<std::string> command;       // program (looked up in PATH if it has no '/') + args
  double kill_grace_seconds = 5.0;        // after SIGTERM, wait this long before SIGKILL
  bool nnodes_given = false;              // --nnodes was on the command line
  bool node_rank_given = false;           // --node_rank was on the command line
  bool master_addr_given = false;         // --master_addr was on the command line

  // --hostfile mode (hostfile.h, ColossalAI's `colossalai run --hostfile`): this launcher starts one
  // launcher per host through ssh and supervises those ssh processes instead of ranks.
  std::string hostfile;                             // "" = this launcher runs its node's ranks
  std::string include;                              // comma-separated hosts to run on
  std::string exclude;                              // comma-separated hosts not to run on
  std::string ssh_command = "ssh -o BatchMode=yes";  // how a node is reached (words split at spaces)
  bool ssh_command_given = false;
  int ssh_port = 0;                                 // > 0: "-p PORT" after the ssh command
  // Set on the launchers started through ssh: end of file on stdin (the ssh connection, or the
  // launcher that started this one, is gone) stops the ranks like SIGTERM.
  bool stop_on_stdin_eof = false;
  // Set on the launchers --hostfile starts when it restarts jobs (--max_restarts): this launcher runs
  // attempt restart_count of the job (its ranks get TORCHELASTIC_RESTART_COUNT = restart_count and
  // TORCHELASTIC_MAX_RESTARTS = max_restarts) and never restarts by itself; -1: not set.
  int restart_count = -1;
  // Filled from the hostfile before run_launcher (main.cpp): the hosts (node_rank order), and what
  // node_command() needs to start `booster run` on each (hostfile.h).
  std::vector<std::string> node_hosts;
  std::string launcher_path;                  // this executable, the same path on every host
  std::string cwd;                            // the working directory, the same on every host
  std::vector<std::string> node_environment;  // "K=V" entries, filtered by node_command()
};

// Adds the `run` subcommand with its options to `app`, storing parsed values into `options`
// (which must outlive parsing). Everything from the program name on, including "--"-style
// arguments such as "--rank 3", is passed to the program untouched; a "--" right before the
// program is accepted and dropped. Returns the subcommand.
CLI::App* add_run_subcommand(CLI::App& app, RunOptions& options);

// The MASTER_PORT the ranks get: --master_port when given; else, on a single node, a port that is
// free on master_addr now (the kernel's choice, as torchrun --standalone), so two jobs on one
// machine do not meet on 29500; else (several nodes, which must agree) 29500, torchrun's default.
// Throws std::runtime_error when no free port can be found (socket/bind error text).
int resolve_master_port(const RunOptions& options);

// Returns "" if `options` describe a job that can be launched, else a one-line error message
// (nproc_per_node < 1, nnodes < 1, node_rank outside [0, nnodes), port outside [1, 65535],
// empty master_addr, no program, max_restarts < 0, or max_restarts > 0 with nnodes > 1; with
// --hostfile: --node_rank given; without it: --include, --exclude, --ssh_command or --ssh_port
// given; --include together with --exclude; ssh_port outside [0, 65535]; restart_count < -1).
std::string validate_run_options(const RunOptions& options);

}  // namespace booster::cli
