// config_fixtures.h — shared by config_test and options_test: the ConfigError message of a call
// and a small DDP config with a sub-table.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "booster/config.h"

namespace booster::testing::config_fixtures {

using booster::ConfigError;

// The message of the ConfigError that `fn` throws ("" and a test failure if it does not throw).
template <typename Fn>
inline std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

inline const char* const kDdp =
    "[booster]\n"
    "plugin = \"torch_ddp\"\n"
    "\n"
    "[plugin]\n"
    "bucket_cap_mb = 25\n"
    "broadcast_buffers = true\n"
    "max_norm = 1.5\n"
    "placement_policy = \"static\"\n"
    "\n"
    "[plugin.extra]\n"
    "k = 1\n";

}  // namespace booster::testing::config_fixtures
