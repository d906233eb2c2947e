// plot_at_end.h — what the examples do after their last metrics row: draw output_dir/metrics.png
// with `booster plot` (the `booster` executable next to the example's own) when gnuplot is
// installed. A missing gnuplot is logged and skipped; a failing plot is a warning, never a failed
// run (the metrics.csv is already complete).
#pragma once

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "booster/logging.h"

extern char** environ;

namespace examples {

// True if `program` is an executable file in one of $PATH's directories.
inline bool on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (!dir.empty() && ::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
  return false;
}

// Runs `<dir of this executable>/booster plot output_dir` and waits (call on rank 0 only).
inline void plot_metrics_at_end(const std::string& output_dir) {
  if (!on_path("gnuplot")) {
    booster::log::info("plot: gnuplot not installed, no metrics.png (apt-get install gnuplot-nox; then booster plot " +
                       output_dir + ")");
    return;
  }
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string tool = (self.parent_path() / "booster").string();
  if (ec || ::access(tool.c_str(), X_OK) != 0) {
    booster::log::warn("plot: no booster executable next to this program (" + tool + "), no metrics.png");
    return;
  }
  std::vector<std::string> args{tool, "plot", output_dir};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int status = 0;
  if (posix_spawn(&pid, tool.c_str(), nullptr, nullptr, argv.data(), environ) != 0 || waitpid(pid, &status, 0) < 0 ||
      !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    booster::log::warn("plot: `booster plot " + output_dir + "` failed (see above); the metrics.csv is complete");
}

}  // namespace examples
