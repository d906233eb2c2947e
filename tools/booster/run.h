// run.h — `booster run`: a torchrun-like launcher that starts the local ranks of a distributed
// job as fresh processes, prefixes their output with "[rank R]: ", forwards signals to them and
// brings the whole job down as soon as one rank fails. No LibTorch here (see tools/CMakeLists.txt).
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
  int master_port = 29500;                // rendezvous port (MASTER_PORT)
  std::vector<std::string> command;       // program (looked up in PATH if it has no '/') + args
  double kill_grace_seconds = 5.0;        // after SIGTERM, wait this long before SIGKILL
};

// Adds the `run` subcommand with its options to `app`, storing parsed values into `options`
// (which must outlive parsing). Everything from the program name on, including "--"-style
// arguments such as "--rank 3", is passed to the program untouched; a "--" right before the
// program is accepted and dropped. Returns the subcommand.
CLI::App* add_run_subcommand(CLI::App& app, RunOptions& options);

// Returns "" if `options` describe a job that can be launched, else a one-line error message
// (nproc_per_node < 1, nnodes < 1, node_rank outside [0, nnodes), port outside [1, 65535],
// empty master_addr, no program).
std::string validate_run_options(const RunOptions& options);

// Runs the job described by `options` and returns the launcher's exit code (RunExitCode above).
//
// Each of the nproc_per_node local ranks is a fresh process (fork + execve of the program; the
// launcher holds no threads or OpenMP runtime) with the torchrun environment contract:
// RANK = node_rank * nproc_per_node + local_rank, LOCAL_RANK, WORLD_SIZE = nnodes * nproc_per_node,
// LOCAL_WORLD_SIZE, GROUP_RANK = node_rank, MASTER_ADDR, MASTER_PORT, and OMP_NUM_THREADS=1 unless
// already set; the rest of the environment is inherited, stdin is /dev/null. Every rank runs in its
// own process group (so its helper processes can be stopped with it) and gets SIGKILL if the
// launcher dies (PR_SET_PDEATHSIG). The launcher is a child subreaper, so the ranks' orphaned
// helpers are reaped by it rather than left as zombies.
//
// Each line a rank writes is copied to the launcher's stdout / stderr (same stream) prefixed with
// "[rank R]: ", whole lines per write so lines of different ranks never interleave; a last line
// without a newline is flushed (with a newline) when the rank's stream ends, and a line longer
// than 1 MiB is split.
//
// SIGINT, SIGTERM and SIGHUP received by the launcher are forwarded to every rank's process group
// (a second one escalates to SIGKILL). When a rank exits non-zero or is killed by a signal, one
// line naming it goes to stderr ("booster run: rank 1 (pid 1234) exited with code 3; stopping the
// other ranks"), every rank's process group gets SIGTERM and, after kill_grace_seconds, SIGKILL.
// When all ranks exited 0, processes they left behind in their groups are stopped the same way.
// Errors (program not found or not executable, fork/pipe failure) are reported on stderr with the
// exit codes above; this function does not throw.
int run_launcher(const RunOptions& options);

}  // namespace booster::cli
