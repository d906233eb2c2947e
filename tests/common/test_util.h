// test_util.h — helpers shared by the test binaries: temporary directories, free ports, and
// running child processes (fresh processes via posix_spawn, never fork-after-OpenMP).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace booster::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
int free_port();

struct ProcessResult {
  int exit_code = -1;    // exit status when exited normally, else -1
  int term_signal = 0;   // signal that killed it, else 0
  bool timed_out = false;  // killed by us after the timeout
  std::string output;    // stdout and stderr, interleaved
  double seconds = 0;    // wall time
};

// Starts `argv` (argv[0] is a path) with extra environment variables added to ours (a value of
// "\x01unset" removes the variable), returns its pid; output goes to `output_file` if non-empty.
int spawn_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                  const std::string& output_file);
// Starts this test binary again running only `test` ("Suite.DISABLED_Name": the body of a child
// process, e.g. one that writes until it is killed), with `env` added and the parent's gtest
// output, sharding and repeat variables removed; output goes to `output_file`. Returns its pid.
int spawn_test_child(const std::string& test, std::map<std::string, std::string> env, const std::string& output_file);
// The SIGKILL harness of the crash-safety tests. The child (`test`, via spawn_test_child) writes
// versions in a loop and records the last completed one in the text file `progress` after each.
// This starts it, waits (up to 60 s) until it has recorded a version, sleeps delay_ms so the kill
// lands inside a later write, SIGKILLs it and waits for it. first_recorded: the version seen
// before the kill (-1: none); recorded: the dead child's record (-1 when the kill came while the
// record was being rewritten). Read after the kill, so no write completes in between.
struct KilledChild {
  int64_t first_recorded = -1;
  int64_t recorded = -1;
  ProcessResult result;
  std::string log;
};
KilledChild kill_test_child_while_writing(const std::string& test, std::map<std::string, std::string> env,
                                          const std::string& progress, const std::string& log_file, int delay_ms);
// Waits for pid up to timeout_s, then SIGKILLs its process group; fills exit_code/term_signal.
ProcessResult wait_process(int pid, double timeout_s);
// spawn + wait, capturing output.
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::map<std::string, std::string>& env = {}, double timeout_s = 120);
// Starts `world_size` copies of argv with RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/
// MASTER_PORT set (the torchrun contract), waits for all; result i is rank i's.
std::vector<ProcessResult> run_ranks(const std::vector<std::string>& argv, int world_size,
                                     const std::map<std::string, std::string>& env = {},
                                     double timeout_s = 300);
// Sets / unsets environment variables and restores every touched one on destruction.
class ScopedEnv {
 public:
  ScopedEnv() = default;
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;
  ~ScopedEnv() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }
  void set(const std::string& name, const std::string& value) {
    save(name);
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  void unset(const std::string& name) {
    save(name);
    ::unsetenv(name.c_str());
  }

 private:
  void save(const std::string& name) {
    for (const auto& s : saved_)
      if (s.first == name) return;
    const char* v = std::getenv(name.c_str());
    saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// True if a process with this pid still exists (and is not a zombie).
bool process_alive(int pid);
// Reads a whole file ("" if absent).
std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& text);
// The newest checkpoint directory under a checkpoint_dir (its `latest` pointer; see
// checkpoint/checkpoint_manager.h), "" when there is none.
std::string latest_checkpoint(const std::string& root);
// The "epoch" of a checkpoint's trainer_state.json (the epoch a resumed run continues; one past the
// last finished epoch for a checkpoint saved at an epoch end), -1 when unreadable.
int64_t checkpoint_next_epoch(const std::string& checkpoint);

// The names of the entries of directory `dir` (files and directories, not recursive).
std::set<std::string> list_dir(const std::string& dir);

#if defined(BOOSTER_BINARY_DIR) && defined(BOOSTER_SOURCE_DIR)
// The Fashion-MNIST example's binary and its DDP config (the test targets define both macros).
inline const std::string kFashionMnistBinary = std::string(BOOSTER_BINARY_DIR) + "/bin/fashion_mnist";
inline const std::string kDdpConfig = std::string(BOOSTER_SOURCE_DIR) + "/examples/configs/ddp.toml";
#endif

}  // namespace booster::testing
