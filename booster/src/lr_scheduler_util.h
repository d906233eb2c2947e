// lr_scheduler_util.h — helpers shared by the LR scheduler sources (private to libbooster): Python's
// number formatting and modulo, state-field access with errors naming the scheduler, PyTorch's
// cosine annealing recursion, option checks.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "number_text.h"

namespace booster::lr_detail {

// Python's math.pi (3.141592653589793 is its repr, which round-trips).
inline constexpr double kPi = 3.141592653589793;

inline std::string num(double v) { return text::shortest_double(v); }

[[noreturn]] inline void invalid(const std::string& msg) { throw std::invalid_argument(msg); }

// Python's a % m for m > 0 (non-negative result).
inline int64_t py_mod(int64_t a, int64_t m) {
  const int64_t r = a % m;
  return r < 0 ? r + m : r;
}

inline double extra_double(const std::map<std::string, double>& extra, const std::string& type, const std::string& key) {
  auto it = extra.find(key);
  if (it == extra.end()) invalid(type + "::load_state_dict: the state has no '" + key + "' entry");
  if (!std::isfinite(it->second)) {
    invalid(type + "::load_state_dict: '" + key + "' = " + num(it->second) + " is not a finite number");
  }
  return it->second;
}

inline int64_t extra_int(const std::map<std::string, double>& extra, const std::string& type, const std::string& key) {
  const double v = extra_double(extra, type, key);
  if (std::trunc(v) != v || std::fabs(v) > 9.0e15) {
    invalid(type + "::load_state_dict: '" + key + "' = " + num(v) + " is not an integer");
  }
  return static_cast<int64_t>(v);
}

// torch.optim.lr_scheduler.CosineAnnealingLR.get_lr (2.11), for epoch >= 0. The current lrs come
// back unchanged only from the scheduler's initial step in its constructor (`_is_initial`, 2.x;
// 1.13 tested last_epoch == 0 instead): `initial` says whether this call is that step. A cosine
// scheduler that another one drives from outside its constructor (ColossalAI's warmup hand-over
// calls its get_lr at last_epoch 0) takes the recursive formula at epoch 0 too, as 2.11 does. The
// branch `_step_count == 1 and last_epoch > 0` only applies to a scheduler constructed with
// last_epoch > -1, which this API does not offer.
inline std::vector<double> cosine_annealing(int64_t epoch, int64_t T_max, double eta_min, const std::vector<double>& base,
                                     const std::vector<double>& current, bool initial) {
  if (epoch == 0 && initial) return current;
  std::vector<double> out(current.size());
  const double T = static_cast<double>(T_max);
  if (py_mod(epoch - 1 - T_max, 2 * T_max) == 0) {
    for (size_t i = 0; i < current.size(); ++i) {
      out[i] = current[i] + (base[i] - eta_min) * (1 - std::cos(kPi / T)) / 2;
    }
    return out;
  }
  const double e = static_cast<double>(epoch);
  const double factor = (1 + std::cos(kPi * e / T)) / (1 + std::cos(kPi * static_cast<double>(epoch - 1) / T));
  for (size_t i = 0; i < current.size(); ++i) out[i] = factor * (current[i] - eta_min) + eta_min;
  return out;
}

inline void check_gamma(const std::string& type, double gamma) {
  if (!(gamma > 0) || !std::isfinite(gamma)) invalid(type + ": gamma must be > 0, got " + num(gamma));
}

inline void check_eta_min(const std::string& type, double eta_min) {
  if (!(eta_min >= 0) || !std::isfinite(eta_min)) invalid(type + ": eta_min must be >= 0, got " + num(eta_min));
}

inline void check_warmup(const std::string& type, int64_t total_steps, int64_t warmup_steps) {
  if (total_steps <= 0) invalid(type + ": total_steps must be > 0, got " + std::to_string(total_steps));
  if (warmup_steps < 0) invalid(type + ": warmup_steps must be >= 0, got " + std::to_string(warmup_steps));
  if (warmup_steps > total_steps) {
    invalid(type + ": warmup_steps (" + std::to_string(warmup_steps) + ") must not exceed total_steps (" +
            std::to_string(total_steps) + ")");
  }
}

}  // namespace booster::lr_detail
