// gpu_dist_util.h — what the GPU tests of the sharded plugins share (gpu_sharded_test.cpp,
// gpu_gemini_test.cpp): the settings that put a dist_worker run on the GPU, a check_train case whose
// reference trains there, the stats files the workers write, and dist_worker's "resume" scenario.
#pragma once

#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "dist/dist_common.h"
#include "dist/dist_test_util.h"

namespace booster::testing {

inline const c10::Device kGpu(c10::kCUDA, 0);
inline const std::string kOnGpu = "booster.device=\"cuda\"";
inline const std::string kOverGloo = "distributed.backend=\"gloo\"";

// A check_train case whose reference trains on the GPU.
inline TrainCase reference_on_gpu(TrainCase c) {
  c.device = kGpu;
  return c;
}

// "key value" lines of a worker's stats file.
inline std::map<std::string, int64_t> read_stats(const std::string& path) {
  std::map<std::string, int64_t> out;
  std::istringstream in(read_file(path));
  std::string k;
  int64_t v;
  while (in >> k >> v) out[k] = v;
  return out;
}

// `sets` (a bf16 configuration on the GPU) trained with SGD on 1 rank (NCCL) and 2 ranks sharing the
// GPU over Gloo, against LibTorch under CUDA bf16 autocast on the same GPU: 2e-2 relative + 1e-3.
inline void check_bf16_against_autocast(const std::vector<std::string>& sets) {
  for (int world : {1, 2}) {
    auto s = sets;
    if (world == 2) s.push_back(kOverGloo);
    TrainCase c = reference_on_gpu({world, "sgd", s, 1});
    c.autocast_bf16 = true;
    c.rtol = 2e-2;
    c.atol = 1e-3;
    check_train(c);
  }
}

// dist_worker's "resume" scenario (AdamW on the MLP, global batches of 8 rows, steps [start, stop)).
inline void resume_run(int world, const std::string& out, int64_t start, int64_t stop, const std::string& io_arg,
                       const std::vector<std::string>& sets) {
  std::filesystem::create_directories(out);
  std::vector<std::string> args{"scenario=resume",
                                "steps=6",
                                "global=8",
                                "optimizer=adamw",
                                "out=" + out,
                                "start=" + std::to_string(start),
                                "stop=" + std::to_string(stop),
                                io_arg};
  for (const auto& s : sets) args.push_back("set=" + s);
  expect_all_ok(run_workers(world, args));
}

}  // namespace booster::testing
