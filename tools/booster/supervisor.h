// supervisor.h — `booster run`'s process supervision: starts the local ranks of a distributed job
// as fresh processes, prefixes their output with "[rank R]: ", forwards signals to them and brings
// the whole job down as soon as one rank fails. No LibTorch here (see tools/CMakeLists.txt).
#pragma once

#include "run_args.h"

namespace booster::cli {

// Runs the job described by `options` and returns the launcher's exit code (RunExitCode in run_args.h).
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
// With max_restarts K > 0 (torchrun's elastic restarts, single node), a job stopped because a rank
// failed is started again, every rank afresh, up to K times, each restart logged on stderr
// ("booster run: restarting all ranks (restart 1 of 3, MASTER_PORT 41234)"); every rank gets
// TORCHELASTIC_RESTART_COUNT (0 for the first attempt) and TORCHELASTIC_MAX_RESTARTS, and a new
// free MASTER_PORT per attempt unless --master_port was given. A job stopped by a signal to the
// launcher is not restarted; the exit code is the last attempt's.
// With --stop_on_stdin_eof, end of file on the launcher's stdin stops the job like SIGTERM (exit 1).
// In --hostfile mode (options.node_hosts set, hostfile.h) the children are the per-node ssh
// commands (node_command()) instead of ranks: each runs in its own process group with the unchanged environment, its
// lines are copied without a prefix (the remote launcher already prefixes them with the rank), and
// its stdin is a pipe the launcher holds open and closes when the job stops, so the remote launcher
// (started with --stop_on_stdin_eof) stops its ranks even when only the connection is lost. A node
// whose ssh command fails is named ("node 1 (host-b) (pid 1234) exited with code 1; stopping the
// other nodes") and the other nodes are stopped as failed ranks are. With max_restarts K, every node
// is then started again, up to K times ("restarting all nodes (restart 1 of 3, MASTER_PORT 29501)"),
// each remote launcher with --restart_count = the attempt; without --master_port attempt k uses
// master_port + k. A launcher given restart_count >= 0 runs that one attempt and never restarts.
// Restarts of a single-node job may differ by a port only (a free one is picked per attempt).
// Errors (program not found or not executable, fork/pipe failure) are reported on stderr with the
// exit codes above; this function does not throw.
int run_launcher(const RunOptions& options);

}  // namespace booster::cli
