// hostfile.h — `booster run --hostfile`: the hosts of a multi-node job and the command that starts
// each node's launcher through ssh (ColossalAI's `colossalai run --hostfile`). Parsing and command
// assembly only; supervisor.h runs the ssh processes. No LibTorch, no process control here.
#pragma once

#include <string>
#include <vector>

#include "run_args.h"

namespace booster::cli {

// Reads a hostfile in ColossalAI's format: one host name (or address) per line. Surrounding
// whitespace is stripped; blank lines and lines starting with '#' are skipped.
// Throws std::runtime_error naming the file (and line) when it cannot be read, names no host, names a
// host twice, or has a line with whitespace inside it (e.g. DeepSpeed's "worker-0 slots=4": the
// ranks per node are --nproc_per_node here).
std::vector<std::string> read_hostfile(const std::string& path);

// The hosts that run the job, in hostfile order (node_rank = index): `include` keeps only the named
// hosts, `exclude` drops them (comma-separated names, as ColossalAI's --include / --exclude; at most
// one of the two non-empty); then, when nnodes > 0, the first nnodes hosts (ColossalAI's --num_nodes).
// Throws std::runtime_error when both filters are given, a filter names a host that is not in the
// hostfile, no host is left, or nnodes exceeds the hosts left.
std::vector<std::string> select_hosts(const std::vector<std::string>& hosts, const std::string& include,
                                      const std::string& exclude, int nnodes);

// `word` quoted for a POSIX shell: in single quotes, each ' written as '\'' ("" becomes '').
std::string shell_quote(const std::string& word);

// Whether the environment variable `name` is passed to the launchers on the other nodes. Everything
// is, as ColossalAI does, except what describes this host or session: HOME, HOSTNAME, PWD, OLDPWD,
// SHLVL, _, USER, LOGNAME, SHELL, TERM, MAIL, DISPLAY, SSH_*, XDG_*, and the network interface names
// GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME and TP_SOCKET_IFNAME (each node sets its own).
bool forwarded_to_nodes(const std::string& name);

// The argv that starts node `node_rank` of the job on hosts[node_rank]: the words of
// options.ssh_command (split at whitespace), "-p PORT" when options.ssh_port > 0, the host, and one
// shell command line for the remote side:
//   cd CWD && exec env K=V... LAUNCHER run --nnodes N --node_rank K --nproc_per_node P
//       --master_addr A --master_port PORT --stop_on_stdin_eof
//       [--max_restarts R --restart_count C] PROGRAM ARGS...
// with every word shell-quoted (the bracket when options.max_restarts R > 0; C = `restart`, the
// attempt). `environment` holds "K=V" entries; those forwarded_to_nodes() accepts and whose value has
// no newline are passed. A = options.master_addr when given, else hosts[0].
std::vector<std::string> node_command(const RunOptions& options, const std::vector<std::string>& hosts,
                                      int node_rank, int master_port, const std::string& launcher_path,
                                      const std::string& cwd, const std::vector<std::string>& environment,
                                      int restart = 0);

}  // namespace booster::cli
