// step_profiler.h — an optional Kineto trace of some training steps of an example, for telling where
// a step's time goes on a GPU (scripts/gpu_run.sh's profile step; its PyTorch peers write the same
// trace with torch.profiler).
//
//   BOOSTER_EXAMPLE_PROFILE="FIRST-LAST:PATH"   e.g. "201-210:/tmp/gpt.json"
//
// records CPU operators and, on a CUDA build that sees a GPU, CUDA runtime calls and kernels from the
// start of training step FIRST to the end of step LAST (1-based optimizer steps), then writes them to
// PATH as a Chrome trace (JSON; chrome://tracing, Perfetto). Unset or empty: nothing, no cost. A
// malformed value throws std::invalid_argument naming the expected form. The trace is written by the
// process that records it (every rank of a multi-rank job would write the same PATH: profile one
// rank). Uses LibTorch's own profiler (torch/csrc/autograd/profiler_kineto.h), as
// torch.profiler.profile does.
#pragma once

#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>

namespace examples {

class StepProfiler {
 public:
  // Reads BOOSTER_EXAMPLE_PROFILE (see the top of this file).
  StepProfiler() {
    const char* env = std::getenv("BOOSTER_EXAMPLE_PROFILE");
    if (!env || !*env) return;
    const std::string v = env;
    const auto dash = v.find('-'), colon = v.find(':');
    try {
      if (dash == std::string::npos || colon == std::string::npos || colon < dash) throw std::invalid_argument(v);
      first_ = std::stoll(v.substr(0, dash));
      last_ = std::stoll(v.substr(dash + 1, colon - dash - 1));
      path_ = v.substr(colon + 1);
    } catch (const std::exception&) {
      throw std::invalid_argument("BOOSTER_EXAMPLE_PROFILE=\"" + v +
                                  "\": expected FIRST-LAST:PATH, e.g. \"201-210:/tmp/trace.json\"");
    }
    if (first_ < 1 || last_ < first_ || path_.empty())
      throw std::invalid_argument("BOOSTER_EXAMPLE_PROFILE=\"" + v +
                                  "\": expected FIRST-LAST:PATH with 1 <= FIRST <= LAST and a PATH");
  }

  // Call before training step `step` (1-based) starts.
  void begin_step(int64_t step) {
    if (path_.empty() || active_ || step != first_) return;
    namespace prof = torch::profiler::impl;
    std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
    if (torch::cuda::is_available()) activities.insert(prof::ActivityType::CUDA);
    const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    active_ = true;
  }

  // Call after training step `step` ended (optimizer step, scheduler step, loss read).
  void end_step(int64_t step) {
    if (!active_ || step != last_) return;
    if (torch::cuda::is_available()) torch::cuda::synchronize();
    auto result = torch::autograd::profiler::disableProfiler();
    active_ = false;
    result->save(path_);
    std::cerr << "step_profiler: steps " << first_ << "-" << last_ << " traced to " << path_ << " ("
              << result->events().size() << " events)" << std::endl;
  }

 private:
  int64_t first_ = 0, last_ = 0;
  std::string path_;
  bool active_ = false;
};

}  // namespace examples
