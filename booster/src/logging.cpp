// logging.cpp — booster::log: one thread-safe spdlog logger on stdout whose line prefix carries the
// rank, rank-0-only info/warn, and the rank-0 ProgressBar (redrawn on a terminal, plain lines otherwise).
#include "booster/logging.h"

#include <spdlog/logger.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <utility>

namespace booster::log {

// ---- logger state

namespace {

std::atomic<int> g_rank{0};

std::string pattern_for(int rank) {
  return "[%Y-%m-%d %H:%M:%S.%e] [rank " + std::to_string(rank) + "] [%^%l%$] %v";
}

// Parses a level name; returns false for an unknown one.
bool parse_level(std::string name, spdlog::level::level_enum* out) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (name == "trace") *out = spdlog::level::trace;
  else if (name == "debug") *out = spdlog::level::debug;
  else if (name == "info") *out = spdlog::level::info;
  else if (name == "warn" || name == "warning") *out = spdlog::level::warn;
  else if (name == "error") *out = spdlog::level::err;
  else if (name == "off" || name == "none") *out = spdlog::level::off;
  else return false;
  return true;
}

// The one logger, not registered in spdlog's global registry (so an application using spdlog itself
// cannot collide with it). The colour sink only colours when stdout is a colour terminal. Never
// destroyed, so static destructors may still log during exit.
spdlog::logger& logger() {
  static spdlog::logger* const instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stdout_color_sink_mt>();
    auto* lg = new spdlog::logger("booster", std::move(sink));
    lg->set_pattern(pattern_for(g_rank.load()));
    lg->flush_on(spdlog::level::trace);  // every line reaches stdout at once (multi-rank logs, pipes)
    spdlog::level::level_enum level = spdlog::level::info;
    const char* env = std::getenv("BOOSTER_LOG_LEVEL");
    bool bad_env = env != nullptr && *env != '\0' && !parse_level(env, &level);
    lg->set_level(level);
    if (bad_env) {
      lg->warn("ignoring BOOSTER_LOG_LEVEL='{}' (expected debug, info, warn, error or off)", env);
    }
    return lg;
  }();
  return *instance;
}

}  // namespace

// ---- log functions

void info(const std::string& message) {
  if (g_rank.load(std::memory_order_relaxed) == 0) logger().info(message);
}

void warn(const std::string& message) {
  if (g_rank.load(std::memory_order_relaxed) == 0) logger().warn(message);
}

void info_all(const std::string& message) { logger().info(message); }

void warn_all(const std::string& message) { logger().warn(message); }

void error_all(const std::string& message) { logger().error(message); }

void set_level(const std::string& level) {
  spdlog::level::level_enum parsed;
  if (!parse_level(level, &parsed)) {
    throw std::invalid_argument("booster::log::set_level: unknown level '" + level +
                                "' (expected debug, info, warn, error or off)");
  }
  logger().set_level(parsed);
}

void set_rank(int rank) {
  static std::mutex mutex;  // keeps rank and pattern consistent under concurrent set_rank calls
  std::lock_guard<std::mutex> lock(mutex);
  g_rank.store(rank);
  logger().set_pattern(pattern_for(rank));
}

// ---- ProgressBar

namespace {

constexpr int kBarWidth = 30;

void write_stdout(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
  std::fflush(stdout);
}

std::string bar_line(const std::string& label, int64_t step, int64_t total, const std::string& suffix) {
  const int64_t clamped = std::clamp<int64_t>(step, 0, total);
  const int filled = total > 0 ? static_cast<int>(clamped * kBarWidth / total) : kBarWidth;
  std::string line = label;
  if (!line.empty()) line += ' ';
  line += '[';
  line.append(static_cast<size_t>(filled), '#');
  line.append(static_cast<size_t>(kBarWidth - filled), '.');
  line += "] " + std::to_string(step) + "/" + std::to_string(total);
  if (!suffix.empty()) line += " " + suffix;
  return line;
}

}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total, int64_t plain_every)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 0)),
      plain_every_(plain_every),
      active_(g_rank.load() == 0 && logger().should_log(spdlog::level::info)),
      tty_(::isatty(STDOUT_FILENO) == 1) {
  if (active_ && tty_) write_stdout("\r" + bar_line(label_, 0, total_, "") + "\x1b[K");
}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(int64_t step, const std::string& suffix) {
  if (!active_ || finished_) return;
  if (tty_) {
    // Carriage return, redraw, clear what a longer previous line left behind.
    write_stdout("\r" + bar_line(label_, step, total_, suffix) + "\x1b[K");
  } else if ((plain_every_ > 0 && step % plain_every_ == 0) || step == total_) {
    std::string line = label_.empty() ? "" : label_ + " ";
    line += std::to_string(step) + "/" + std::to_string(total_);
    if (!suffix.empty()) line += " " + suffix;
    logger().info(line);
  }
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (active_ && tty_) write_stdout("\n");
}

}  // namespace booster::log
