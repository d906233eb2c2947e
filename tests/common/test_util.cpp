// test_util.cpp — see test_util.h.
#include "common/test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace booster::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/booster_test_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    throw std::runtime_error("free_port: bind failed");
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

int spawn_test_child(const std::string& test, std::map<std::string, std::string> env, const std::string& output_file) {
  for (const char* v : {"GTEST_OUTPUT", "GTEST_SHARD_INDEX", "GTEST_TOTAL_SHARDS", "GTEST_SHARD_STATUS_FILE", "GTEST_REPEAT"})
    env[v] = "\x01unset";
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) throw std::runtime_error("spawn_test_child: cannot read /proc/self/exe");
  self[n] = '\0';
  return spawn_process({self, "--gtest_also_run_disabled_tests", "--gtest_filter=" + test}, env, output_file);
}

KilledChild kill_test_child_while_writing(const std::string& test, std::map<std::string, std::string> env,
                                          const std::string& progress, const std::string& log_file, int delay_ms) {
  std::remove(progress.c_str());
  const int pid = spawn_test_child(test, std::move(env), log_file);
  KilledChild k;
  const auto t0 = std::chrono::steady_clock::now();
  while (k.first_recorded < 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60) &&
         process_alive(pid)) {
    const std::string text = read_file(progress);
    if (!text.empty()) k.first_recorded = std::atoll(text.c_str());
    if (k.first_recorded < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  ::kill(pid, SIGKILL);
  k.result = wait_process(pid, 30);
  k.log = read_file(log_file);
  const std::string after_kill = read_file(progress);
  if (!after_kill.empty()) k.recorded = std::atoll(after_kill.c_str());
  return k;
}

int spawn_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  const std::string& output_file) {
  std::map<std::string, std::string> merged;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) merged[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : env) {
    if (v == "\x01unset") merged.erase(k); else merged[k] = v;
  }
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : merged) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp, args;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& s : argv_copy) args.push_back(s.data());
  args.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!output_file.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, output_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
  }
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);  // own process group: a timeout kills the whole tree
  pid_t pid = 0;
  int rc = posix_spawn(&pid, args[0], &actions, &attr, args.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) throw std::runtime_error("posix_spawn " + argv[0] + ": " + std::strerror(rc));
  return pid;
}

ProcessResult wait_process(int pid, double timeout_s) {
  ProcessResult r;
  auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (true) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed > timeout_s) {
      r.timed_out = true;
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.term_signal = WTERMSIG(status);
  return r;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env, double timeout_s) {
  TempDir dir;
  std::string out = dir.file("output.txt");
  int pid = spawn_process(argv, env, out);
  ProcessResult r = wait_process(pid, timeout_s);
  r.output = read_file(out);
  return r;
}

std::vector<ProcessResult> run_ranks(const std::vector<std::string>& argv, int world_size,
                                     const std::map<std::string, std::string>& env, double timeout_s) {
  TempDir dir;
  int port = free_port();
  std::vector<int> pids;
  for (int r = 0; r < world_size; ++r) {
    auto e = env;
    e["RANK"] = std::to_string(r);
    e["LOCAL_RANK"] = std::to_string(r);
    e["WORLD_SIZE"] = std::to_string(world_size);
    e["LOCAL_WORLD_SIZE"] = std::to_string(world_size);
    e["MASTER_ADDR"] = "127.0.0.1";
    e["MASTER_PORT"] = std::to_string(port);
    pids.push_back(spawn_process(argv, e, dir.file("rank" + std::to_string(r) + ".txt")));
  }
  std::vector<ProcessResult> results;
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < world_size; ++r) {
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    results.push_back(wait_process(pids[r], std::max(1.0, timeout_s - elapsed)));
    results.back().output = read_file(dir.file("rank" + std::to_string(r) + ".txt"));
  }
  return results;
}

bool process_alive(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  auto close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return false;
  char state = line[close_paren + 2];
  return state != 'Z' && state != 'X';
}

std::string latest_checkpoint(const std::string& root) {
  std::string name = read_file(root + "/latest");
  while (!name.empty() && name.back() == '\n') name.pop_back();
  return name.empty() ? "" : root + "/" + name;
}

int64_t checkpoint_next_epoch(const std::string& checkpoint) {
  const std::string text = read_file(checkpoint + "/trainer_state.json");
  const size_t at = text.find("\"epoch\":");
  if (at == std::string::npos) return -1;
  return std::strtoll(text.c_str() + at + 8, nullptr, 10);
}

std::set<std::string> list_dir(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

}  // namespace booster::testing
