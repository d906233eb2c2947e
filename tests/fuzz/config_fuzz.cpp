// config_fuzz.cpp — libFuzzer target for the TOML config reader (booster/config.h): the input is
// TOML text, then its first line is also tried as a --set override. Any input must either be read
// or throw ConfigError; every key of every table is then read with each typed getter (each may only
// throw ConfigError), and the effective config must print (to_toml) and read back to the same text.
// Anything else — another exception, a crash, a sanitizer report, a leak — is a bug. Built by
// tests/fuzz/run_fuzz.sh config (no LibTorch: the config sources alone).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "booster/config.h"

using booster::Config;
using booster::ConfigError;
using booster::Options;

namespace {

void read_every_key(const Options& o, int depth) {
  for (const std::string& k : o.keys()) {
    try { o.get_bool(k, false); } catch (const ConfigError&) {}
    try { o.get_int(k, 0, -1000, 1000); } catch (const ConfigError&) {}
    try { o.get_double(k, 0.0, 0.0, 1e6); } catch (const ConfigError&) {}
    try { o.get_string(k, ""); } catch (const ConfigError&) {}
    try { o.get_choice(k, "a", {"a", "b"}); } catch (const ConfigError&) {}
    if (depth < 4) {
      try { read_every_key(o.table(k), depth + 1); } catch (const ConfigError&) {}
    }
  }
  try { o.check_unknown(); } catch (const ConfigError&) {}
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  Config c;
  try {
    c = Config::from_string(text, "fuzz.toml");
  } catch (const ConfigError&) {
    return 0;
  }
  try {
    c.apply_override(text.substr(0, text.find('\n')));
  } catch (const ConfigError&) {
  }
  for (const char* s : {"booster", "plugin", "train", "distributed", "mixed_precision", "auto"}) {
    try {
      read_every_key(c.section(s), 0);
    } catch (const ConfigError&) {  // the key is not a table
    }
  }
  try { c.check_sections({"booster", "plugin"}); } catch (const ConfigError&) {}
  const std::string once = c.to_toml();
  Config again;
  try {
    again = Config::from_string(once, "printed.toml");
  } catch (const ConfigError&) {
    std::abort();  // what the config prints must read back
  }
  if (again.to_toml() != once) std::abort();
  return 0;
}
