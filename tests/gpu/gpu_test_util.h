// gpu_test_util.h — shared by the GPU tests (tests/gpu/): the skip every test starts with, and where
// dist_worker and hybrid_worker are. Include it before dist/dist_test_util.h.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "booster/device.h"

namespace booster::testing {
// dist_worker beside this executable (the GPU bundle keeps them together; defined in gpu_test.cpp).
// BOOSTER_DIST_WORKER_PATH names this function for dist_test_util.h.
std::string worker_beside_exe();
// hybrid_worker beside this executable (defined in gpu_sharded_test.cpp); BOOSTER_HYBRID_WORKER_PATH
// names it for dist/hybrid_test_util.h.
std::string hybrid_worker_beside_exe();
}  // namespace booster::testing

// Every GPU test starts with it: skipped, with the reason, where this process sees no CUDA device.
#define SKIP_WITHOUT_GPU()                                                                                   \
  do {                                                                                                       \
    if (booster::cuda_device_count() == 0)                                                                   \
      GTEST_SKIP() << "no CUDA device visible to this process (no GPU, no driver, or no CUDA support built)"; \
  } while (0)
