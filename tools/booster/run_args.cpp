// run_args.cpp — the command line of `booster run` (see run_args.h for the contract).
#include "run_args.h"

#include <CLI/CLI.hpp>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

namespace booster::cli {

CLI::App* add_run_subcommand(CLI::App& app, RunOptions& o) {
  CLI::App* run = app.add_subcommand(
      "run", "Launch a distributed job: start --nproc_per_node local ranks of a program (like torchrun)");
  run->add_option("--nproc_per_node,--nproc-per-node", o.nproc_per_node,
                  "Number of ranks (processes) to start on this node")
      ->capture_default_str();
  run->add_option("--nnodes", o.nnodes,
                  "Number of nodes in the job (run one launcher per node; with --hostfile, use the first "
                  "nnodes hosts)")
      ->capture_default_str()
      ->each([&o](const std::string&) { o.nnodes_given = true; });
  run->add_option("--node_rank,--node-rank", o.node_rank, "Index of this node, in [0, nnodes)")
      ->capture_default_str()
      ->each([&o](const std::string&) { o.node_rank_given = true; });
  run->add_option("--master_addr,--master-addr", o.master_addr,
                  "Address of the node running rank 0 (MASTER_ADDR); with --hostfile, default: the first host")
      ->capture_default_str()
      ->each([&o](const std::string&) { o.master_addr_given = true; });
  run->add_option("--hostfile", o.hostfile,
                  "File of hosts, one per line: start the job on them through ssh (node_rank = line order)");
  run->add_option("--include", o.include, "With --hostfile: run only on these hosts (host1,host2)");
  run->add_option("--exclude", o.exclude, "With --hostfile: do not run on these hosts (host1,host2)");
  run->add_option("--ssh_command,--ssh-command", o.ssh_command,
                  "With --hostfile: the command that runs a command line on a host (its words, then the host, "
                  "then the command line)")
      ->capture_default_str()
      ->each([&o](const std::string&) { o.ssh_command_given = true; });
  run->add_option("--ssh_port,--ssh-port", o.ssh_port, "With --hostfile: ssh port of the hosts (ssh -p)");
  run->add_flag("--stop_on_stdin_eof", o.stop_on_stdin_eof,
                "Stop the ranks when stdin reaches end of file (set on the launchers --hostfile starts)");
  run->add_option("--restart_count", o.restart_count,
                  "Run attempt N of a job another launcher restarts (set by --hostfile with --max_restarts): "
                  "TORCHELASTIC_RESTART_COUNT=N, no restart here");
  run->add_option("--master_port,--master-port", o.master_port,
                  "Rendezvous port on master_addr (MASTER_PORT); default: a free port on a single node, "
                  "29500 with several nodes")
      ->each([&o](const std::string&) { o.master_port_given = true; });
  run->add_option("--max_restarts,--max-restarts", o.max_restarts,
                  "Restart all ranks up to this many times when one fails (torchrun's meaning; each "
                  "attempt gets TORCHELASTIC_RESTART_COUNT and, without --master_port, a new port; with "
                  "--hostfile every node is started again)")
      ->capture_default_str();
  run->add_option("program", o.command,
                  "Program to run (looked up in PATH if it has no '/'), then its arguments, passed "
                  "through untouched");
  // Once the program name is seen, every later argument (even "--rank 3" or "-h") is a positional
  // belonging to the program: CLI11's positionals_at_end gives torchrun's "options stop at the
  // script" behaviour, and unknown launcher options before the program are still reported.
  run->positionals_at_end();
  run->footer(
      "\nEach rank gets RANK = node_rank * nproc_per_node + local_rank, LOCAL_RANK, WORLD_SIZE,\n"
      "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, and OMP_NUM_THREADS=1 unless set.\n"
      "Output lines are prefixed with \"[rank R]: \". SIGINT/SIGTERM/SIGHUP are forwarded to the ranks;\n"
      "when one rank fails the others get SIGTERM, then SIGKILL after 5 s; with --max_restarts K the\n"
      "job is then started again (TORCHELASTIC_RESTART_COUNT = 1..K).\n"
      "With --hostfile the launcher starts `booster run` on every host through ssh (in the same\n"
      "directory, with this environment except host-specific variables) and stops all of them when\n"
      "one node fails; every host needs the same paths.\n"
      "Exit codes: 0 all ranks exited 0; 1 a rank failed; 2 usage error; 127 program cannot be\n"
      "executed; 128+N the launcher received signal N.\n"
      "Example: booster run --nproc_per_node 4 ./train --config configs/ddp.toml\n"
      "         booster run --hostfile hosts --exclude node3 --nproc_per_node 2 ./train --config c.toml");
  return run;
}

int resolve_master_port(const RunOptions& o) {
  if (o.master_port_given || o.nnodes > 1) return o.master_port;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(o.master_addr.c_str(), "0", &hints, &found); rc != 0)
    throw std::runtime_error("cannot resolve --master_addr " + o.master_addr + ": " + ::gai_strerror(rc));
  std::string error = "no address";
  int port = 0;
  for (addrinfo* a = found; a != nullptr && port == 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    sockaddr_storage bound{};
    socklen_t len = sizeof bound;
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
      port = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    } else {
      error = std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (port == 0)
    throw std::runtime_error("cannot find a free port on " + o.master_addr + " (" + error +
                             "); pass --master_port");
  return port;
}

std::string validate_run_options(const RunOptions& o) {
  if (o.command.empty() || o.command[0].empty())
    return "missing the program to run (usage: booster run [OPTIONS] PROGRAM [ARGS...])";
  if (o.hostfile.empty()) {
    const std::pair<bool, const char*> hostfile_only[] = {{!o.include.empty(), "--include"},
                                                          {!o.exclude.empty(), "--exclude"},
                                                          {o.ssh_command_given, "--ssh_command"},
                                                          {o.ssh_port != 0, "--ssh_port"}};
    for (const auto& [given, name] : hostfile_only)
      if (given) return std::string(name) + " only applies with --hostfile (the hosts to start the job on through ssh)";
  } else {
    if (o.node_rank_given)
      return "--node_rank cannot be combined with --hostfile: a host's node rank is its position in the hostfile";
    if (!o.include.empty() && !o.exclude.empty())
      return "--include and --exclude are mutually exclusive: give one of them";
    if (o.ssh_port < 0 || o.ssh_port > 65535)
      return "--ssh_port must be in [1, 65535] (got " + std::to_string(o.ssh_port) + ")";
    if (o.ssh_command.find_first_not_of(" \t") == std::string::npos) return "--ssh_command must not be empty";
    if (!o.master_port_given && o.max_restarts > 0 && o.master_port + o.max_restarts > 65535)
      return "--master_port + --max_restarts must stay within 65535 (each restart uses the next port)";
  }
  if (o.nproc_per_node < 1)
    return "--nproc_per_node must be at least 1 (got " + std::to_string(o.nproc_per_node) + ")";
  if (o.nnodes < 1) return "--nnodes must be at least 1 (got " + std::to_string(o.nnodes) + ")";
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    return "--node_rank must be in [0, nnodes) = [0, " + std::to_string(o.nnodes) + ") (got " +
           std::to_string(o.node_rank) + ")";
  if (o.master_port < 1 || o.master_port > 65535)
    return "--master_port must be in [1, 65535] (got " + std::to_string(o.master_port) + ")";
  if (o.master_addr.empty()) return "--master_addr must not be empty";
  if (o.max_restarts < 0) return "--max_restarts must be at least 0 (got " + std::to_string(o.max_restarts) + ")";
  if (o.restart_count < -1) return "--restart_count must be at least 0 (got " + std::to_string(o.restart_count) + ")";
  if (o.max_restarts > 0 && o.nnodes > 1 && o.hostfile.empty() && o.restart_count < 0)
    return "--max_restarts with --nnodes > 1 needs one launcher that restarts every node: start the job with "
           "--hostfile (or restart it with torchrun --max_restarts, which our ranks support)";
  if (static_cast<long long>(o.nnodes) * o.nproc_per_node > 1000000000LL)
    return "--nnodes * --nproc_per_node is too large";
  return "";
}

}  // namespace booster::cli
