// number_text.h — the shortest decimal text of a double that reads back as the same double (private
// to libbooster). One definition for every message and comparison that prints a number: config
// values, LR scheduler state, a plugin's shadowed settings.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

namespace booster::text {

// "%.{p}g" with the smallest p in 1..17 that round-trips: "1", "0.05", "0.30000000000000004",
// "1e-07", "inf", "nan". Equal text <=> equal value (nan aside).
inline std::string shortest_double(double v) {
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

}  // namespace booster::text
