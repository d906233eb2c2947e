// logging.h — rank-aware logging (spdlog underneath) and a rank-0 progress bar.
//
// Every line carries the rank: "[2026-11-21 22:50:01.123] [rank 0] [info] epoch 1 ...".
// info()/warn() print on rank 0 only (user-facing progress); *_all() print on every rank.
// The rank in the prefix is set by set_rank(), which every booster::dist::launch* calls (0 before).
#pragma once

#include <cstdint>
#include <string>

#include "booster/export.h"

namespace booster::log {

BOOSTER_API void info(const std::string& message);
BOOSTER_API void warn(const std::string& message);
BOOSTER_API void info_all(const std::string& message);
BOOSTER_API void warn_all(const std::string& message);
BOOSTER_API void error_all(const std::string& message);
// "debug" | "info" | "warn" | "error" | "off"; also set by env BOOSTER_LOG_LEVEL.
BOOSTER_API void set_level(const std::string& level);
// Re-reads the rank for the line prefix (called by launch()).
BOOSTER_API void set_rank(int rank);

// A progress bar over `total` steps, drawn on rank 0 only. When stdout is a terminal it redraws one
// line ("epoch 1/5 [#####.....] 120/469 loss 0.412 3051 samples/s"); otherwise it prints a plain
// line every `plain_every` steps and at the end (logs stay readable).
class BOOSTER_API ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total, int64_t plain_every = 100);
  ~ProgressBar();  // finishes the line
  // Advances to `step` (1-based) with a suffix such as "loss 0.41".
  void update(int64_t step, const std::string& suffix = "");
  void finish();

 private:
  std::string label_;
  int64_t total_, plain_every_;
  bool active_, tty_, finished_ = false;
};

}  // namespace booster::log
