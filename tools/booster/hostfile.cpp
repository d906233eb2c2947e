// hostfile.cpp — hosts and per-node commands of `booster run --hostfile` (see hostfile.h).
#include "hostfile.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace booster::cli {

namespace {

std::string strip(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  const size_t begin = s.find_first_not_of(ws);
  if (begin == std::string::npos) return "";
  return s.substr(begin, s.find_last_not_of(ws) - begin + 1);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::string part;
  std::istringstream in(s);
  while (std::getline(in, part, sep)) parts.push_back(strip(part));
  if (!s.empty() && s.back() == sep) parts.push_back("");
  return parts;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

}  // namespace

std::vector<std::string> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the hostfile " + path + " (no such file or no permission)");
  std::vector<std::string> hosts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const std::string host = strip(line);
    if (host.empty() || host[0] == '#') continue;
    const std::string where = "hostfile " + path + ", line " + std::to_string(number) + ": ";
    if (host.find_first_of(" \t") != std::string::npos)
      throw std::runtime_error(where + "'" + host +
                               "' is not a host name (one host per line; the ranks per node are --nproc_per_node)");
    if (contains(hosts, host)) throw std::runtime_error(where + "host " + host + " is listed twice");
    hosts.push_back(host);
  }
  if (in.bad()) throw std::runtime_error("cannot read the hostfile " + path);
  if (hosts.empty())
    throw std::runtime_error("the hostfile " + path + " names no host (write one host name per line)");
  return hosts;
}

std::vector<std::string> select_hosts(const std::vector<std::string>& hosts, const std::string& include,
                                      const std::string& exclude, int nnodes) {
  if (!include.empty() && !exclude.empty())
    throw std::runtime_error("--include and --exclude are mutually exclusive: give one of them");
  const bool including = !include.empty();
  std::vector<std::string> names = split(including ? include : exclude, ',');
  for (const auto& name : names) {
    if (name.empty())
      throw std::runtime_error(std::string(including ? "--include" : "--exclude") +
                               " has an empty host name: write host names separated by commas (a,b)");
    if (!contains(hosts, name))
      throw std::runtime_error(std::string(including ? "--include" : "--exclude") + " names host '" + name +
                               "', which is not in the hostfile");
  }
  std::vector<std::string> selected;
  for (const auto& host : hosts) {
    const bool named = contains(names, host);
    if (names.empty() || named == including) selected.push_back(host);
  }
  if (selected.empty()) throw std::runtime_error("--exclude leaves no host of the hostfile to run on");
  if (nnodes > static_cast<int>(selected.size()))
    throw std::runtime_error("--nnodes " + std::to_string(nnodes) + " needs that many hosts, but the hostfile" +
                             (names.empty() ? std::string() : " after --include/--exclude") + " has " +
                             std::to_string(selected.size()));
  if (nnodes > 0) selected.resize(static_cast<size_t>(nnodes));
  return selected;
}

std::string shell_quote(const std::string& word) {
  std::string quoted = "'";
  for (char c : word) {
    if (c == '\'') quoted += "'\\''";
    else quoted += c;
  }
  return quoted + "'";
}

bool forwarded_to_nodes(const std::string& name) {
  static const char* const kHostOnly[] = {"HOME",  "HOSTNAME", "PWD",  "OLDPWD",  "SHLVL",
                                          "_",     "USER",     "LOGNAME", "SHELL", "TERM",
                                          "MAIL",  "DISPLAY",  "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME",
                                          "TP_SOCKET_IFNAME"};
  if (name.empty()) return false;
  for (const char* h : kHostOnly)
    if (name == h) return false;
  return name.rfind("SSH_", 0) != 0 && name.rfind("XDG_", 0) != 0;
}

std::vector<std::string> node_command(const RunOptions& o, const std::vector<std::string>& hosts, int node_rank,
                                      int master_port, const std::string& launcher_path, const std::string& cwd,
                                      const std::vector<std::string>& environment, int restart) {
  std::vector<std::string> argv;
  std::istringstream words(o.ssh_command);
  for (std::string w; words >> w;) argv.push_back(w);
  if (o.ssh_port > 0) {
    argv.push_back("-p");
    argv.push_back(std::to_string(o.ssh_port));
  }
  argv.push_back(hosts.at(static_cast<size_t>(node_rank)));

  std::string remote = "cd " + shell_quote(cwd) + " && exec env";
  for (const auto& kv : environment) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || kv.find('\n') != std::string::npos) continue;
    if (forwarded_to_nodes(kv.substr(0, eq))) remote += " " + shell_quote(kv);
  }
  const std::string master_addr = o.master_addr_given ? o.master_addr : hosts.front();
  std::vector<std::string> launcher = {launcher_path,
                                             "run",
                                             "--nnodes",
                                             std::to_string(hosts.size()),
                                             "--node_rank",
                                             std::to_string(node_rank),
                                             "--nproc_per_node",
                                             std::to_string(o.nproc_per_node),
                                             "--master_addr",
                                             master_addr,
                                             "--master_port",
                                             std::to_string(master_port),
                                             "--stop_on_stdin_eof"};
  if (o.max_restarts > 0)
    launcher.insert(launcher.end(),
                    {"--max_restarts", std::to_string(o.max_restarts), "--restart_count", std::to_string(restart)});
  for (const auto& w : launcher) remote += " " + shell_quote(w);
  for (const auto& w : o.command) remote += " " + shell_quote(w);
  argv.push_back(remote);
  return argv;
}

}  // namespace booster::cli
