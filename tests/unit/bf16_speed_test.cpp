// bf16_speed_test.cpp — the bf16 speed probe behind boost()'s warning (src/bf16_speed.h):
// the slowdown is a measured positive ratio, and the warning follows the threshold and is given once.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

#include "bf16_speed.h"

using booster::mixed_precision::bf16_matmul_slowdown;
using booster::mixed_precision::warn_if_bf16_is_slow;

TEST(Bf16Speed, SlowdownIsMeasuredAndTheWarningFollowsTheThreshold) {
  const double slowdown = bf16_matmul_slowdown();
  std::cout << "[ measure  ] bf16 / float32 matrix product time on this CPU: " << slowdown << std::endl;
  EXPECT_GT(slowdown, 0.0);
  EXPECT_TRUE(std::isfinite(slowdown));
  EXPECT_FALSE(warn_if_bf16_is_slow(slowdown, 1e9));
  EXPECT_FALSE(warn_if_bf16_is_slow(std::nan(""), 0.0));
  EXPECT_TRUE(warn_if_bf16_is_slow(slowdown, 0.0));
  EXPECT_TRUE(warn_if_bf16_is_slow(slowdown, 1e9));  // warned once: stays true, logs nothing more
}
