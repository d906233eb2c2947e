// dist_test_util.h — helpers for the multi-process tests: run dist_worker ranks, load what they
// saved, compare with a single-process reference within the stated tolerance.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/test_util.h"

namespace booster::testing {

inline constexpr double kAtol = 1e-5, kRtol = 1e-4;

inline std::vector<torch::Tensor> load_tensors(const std::string& path) {
  std::vector<torch::Tensor> t;
  torch::load(t, path);
  return t;
}

inline std::map<std::string, int64_t> load_stats(const std::string& path) {
  std::map<std::string, int64_t> m;
  std::istringstream in(read_file(path));
  std::string k;
  int64_t v;
  while (in >> k >> v) m[k] = v;
  return m;
}

// Max over tensors of max |a - b| - (atol + rtol |b|) (<= 0 means within tolerance), and max |a-b|.
inline void expect_close(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << what << " tensor " << i;
    EXPECT_TRUE(torch::allclose(got[i], want[i], kRtol, kAtol))
        << what << " tensor " << i << " max |diff| " << (got[i] - want[i]).abs().max().item<double>();
    max_diff = std::max(max_diff, (got[i] - want[i]).abs().max().item<double>());
  }
  std::cout << "[ compare  ] " << what << ": max |ddp - reference| = " << max_diff << std::endl;
}

inline std::vector<ProcessResult> run_workers(int world, const std::vector<std::string>& args, double timeout = 120) {
  std::vector<std::string> argv{BOOSTER_DIST_WORKER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_ranks(argv, world, {{"OMP_NUM_THREADS", "1"}}, timeout);
}

inline void expect_all_ok(const std::vector<ProcessResult>& results) {
  for (size_t r = 0; r < results.size(); ++r)
    ASSERT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n" << results[r].output;
}


}  // namespace booster::testing
