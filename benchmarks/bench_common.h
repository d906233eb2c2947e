// bench_common.h — small helpers shared by the benchmark programs (benchmarks/bench_*.cpp):
// "--key value" argument parsing, a monotonic clock, medians, and a tiny JSON writer. The programs
// print nothing a driver must parse except the JSON file they write with --out; the drivers
// (benchmarks/drivers/*.py) turn that into the tables of docs/benchmarks.md.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace booster::bench {

// "--key value" and "--key=value" pairs; a flag without a value (next token starts with "--" or
// is missing) becomes "1".
class Args {
 public:
  Args(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (a.rfind("--", 0) != 0) throw std::invalid_argument("unexpected argument '" + a + "'");
      a = a.substr(2);
      auto eq = a.find('=');
      if (eq != std::string::npos) {
        values_[a.substr(0, eq)] = a.substr(eq + 1);
      } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
        values_[a] = argv[++i];
      } else {
        values_[a] = "1";
      }
    }
  }
  bool has(const std::string& k) const { return values_.count(k) > 0; }
  std::string str(const std::string& k, const std::string& def) const {
    auto it = values_.find(k);
    return it == values_.end() ? def : it->second;
  }
  int64_t integer(const std::string& k, int64_t def) const { return std::stoll(str(k, std::to_string(def))); }
  double real(const std::string& k, double def) const { return std::stod(str(k, std::to_string(def))); }
  // Comma-separated list of integers ("1,16,128").
  std::vector<int64_t> integers(const std::string& k, const std::string& def) const {
    std::vector<int64_t> out;
    std::stringstream ss(str(k, def));
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) out.push_back(std::stoll(item));
    return out;
  }

 private:
  std::map<std::string, std::string> values_;
};

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median of the samples (mean of the middle two for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Minimal JSON building: values are already-serialised JSON text.
inline std::string json_str(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') { out += "\\n"; continue; }
    out += c;
  }
  return out + "\"";
}
inline std::string json_num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}
inline std::string json_int(int64_t v) { return std::to_string(v); }
inline std::string json_list(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + json_num(v[i]);
  return out + "]";
}
// {"k": v, ...} from (key, serialised value) pairs, in the given order.
inline std::string json_obj(const std::vector<std::pair<std::string, std::string>>& kv) {
  std::string out = "{";
  for (size_t i = 0; i < kv.size(); ++i) out += (i ? ", " : "") + json_str(kv[i].first) + ": " + kv[i].second;
  return out + "}";
}
inline std::string json_arr(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ",\n  " : "\n  ") + items[i];
  return out + "\n]";
}

inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path);
  f << text << "\n";
  if (!f) throw std::runtime_error("cannot write " + path);
}

// A benchmark's main(): runs `body`, prints "<name>: <error>" and returns 1 when it throws.
inline int guarded_main(const char* name, const std::function<int()>& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace booster::bench
