// hybrid_test_util.h — the hybrid_parallel comparison shared by booster_dist_tests (hybrid_test.cpp,
// CPU) and booster_gpu_tests (gpu_hybrid_test.cpp, the same cases with booster.device = "cuda"):
// hybrid_worker ranks train hybrid_common.h's TinyLM and save it; single-process LibTorch trains the
// dense TinyLM (tp = 1) on the CPU on the same global batches; the saved model, the losses and the
// clipping norms must match (tolerances in hybrid_test.cpp's header).
// Needs BOOSTER_HYBRID_WORKER_PATH (the hybrid_worker executable).
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "booster/checkpoint/state_dict_io.h"
#include "dist/dist_test_util.h"
#include "dist/hybrid_common.h"

namespace booster::testing {

struct Reference {
  std::map<std::string, torch::Tensor> params;
  std::vector<double> losses, norms;
};

// Single-process training of the dense TinyLM (tp = 1) on the whole global batch of each step.
// short_step: that step's sequences are cut to their first kSeq / 2 tokens (other activation shapes).
inline Reference reference_lm(int64_t steps, int64_t batch, const std::string& optimizer, double max_norm = 0,
                       int64_t short_step = -1, int64_t blocks = kLayers) {
  const booster::nn::TensorParallelContext dense;  // tp = 1
  torch::manual_seed(7);
  TinyLM net(dense, blocks);
  auto opt = make_lm_optimizer(optimizer, net->parameters());
  auto data = make_token_batches(steps, batch, 11);
  Reference ref;
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t seq = s == short_step ? kSeq / 2 : kSeq;
    auto loss = tiny_lm_loss(net->forward(data.tokens[s].narrow(1, 0, seq)), data.targets[s].narrow(1, 0, seq), dense);
    loss.backward();
    ref.losses.push_back(loss.item<double>());
    if (max_norm > 0) ref.norms.push_back(torch::nn::utils::clip_grad_norm_(net->parameters(), max_norm));
    opt->step();
    opt->zero_grad();
  }
  for (const auto& item : net->named_parameters()) ref.params[item.key()] = item.value().detach().clone();
  return ref;
}

inline std::vector<ProcessResult> run_hybrid(int world, const std::vector<std::string>& args) {
  std::vector<std::string> argv{BOOSTER_HYBRID_WORKER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_ranks(argv, world, {{"OMP_NUM_THREADS", "1"}}, 120);
}

// "loss <step> <value>" and "norm <step> <value>" lines of a rank's log.
inline std::map<std::string, std::map<int64_t, double>> read_log(const std::string& path) {
  std::map<std::string, std::map<int64_t, double>> out;
  std::istringstream in(read_file(path));
  std::string kind;
  int64_t step;
  double v;
  while (in >> kind >> step >> v) out[kind][step] = v;
  return out;
}

inline void expect_model_close(const std::string& dir, const Reference& ref, double atol, double rtol, const std::string& what) {
  auto saved = booster::checkpoint::load_state_dict(dir);
  ASSERT_EQ(saved.size(), ref.params.size()) << what;
  double max_diff = 0;
  for (const auto& [name, t] : saved) {
    ASSERT_TRUE(ref.params.count(name)) << what << ": unexpected tensor " << name;
    const auto& want = ref.params.at(name);
    ASSERT_EQ(t.sizes(), want.sizes()) << what << ": " << name;
    auto got = t.to(torch::kFloat);
    const double diff = (got - want).abs().max().item<double>();
    max_diff = std::max(max_diff, diff);
    EXPECT_TRUE(torch::allclose(got, want, rtol, atol)) << what << ": " << name << " max |diff| " << diff;
  }
  std::cout << "[ compare  ] " << what << ": max |hybrid - reference| = " << max_diff << std::endl;
}

struct HybridCase {
  int world;
  std::vector<std::string> sets;
  std::string optimizer = "sgd";
  double max_norm = 0;
  bool bf16 = false;
  int64_t short_step = -1;  // a step with shorter sequences (hybrid_worker's short_step)
  int64_t blocks = kLayers;  // TinyLM's MLP blocks (pipeline layers: blocks + 2)
  bool tp_plan = false;      // TinyLM built dense and sharded by [plugin.tp_plan] (hybrid_worker's tp_plan=1)
  bool fp16 = false;         // precision = "fp16" (CUDA), compared within bf16's tolerances
};

inline void check_hybrid(const HybridCase& c) {
  TempDir dir;
  const int64_t steps = 3, batch = 8;
  std::vector<std::string> args{"out=" + dir.path(), "steps=" + std::to_string(steps), "batch=" + std::to_string(batch),
                                "optimizer=" + c.optimizer};
  std::string what = std::to_string(c.world) + " ranks";
  for (const auto& s : c.sets) {
    args.push_back("set=" + s);
    what += " " + s;
  }
  if (c.max_norm > 0) args.push_back("set=plugin.max_norm=" + std::to_string(c.max_norm));
  if (c.short_step >= 0) {
    args.push_back("short_step=" + std::to_string(c.short_step));
    what += " short_step=" + std::to_string(c.short_step);
  }
  args.push_back(std::string("set=plugin.precision=") + (c.fp16 ? "fp16" : c.bf16 ? "bf16" : "fp32"));
  const bool low = c.bf16 || c.fp16;
  if (c.blocks != kLayers) {
    args.push_back("blocks=" + std::to_string(c.blocks));
    what += " blocks=" + std::to_string(c.blocks);
  }
  if (c.tp_plan) {
    args.push_back("tp_plan=1");
    what += " tp_plan";
  }
  auto results = run_hybrid(c.world, args);
  expect_all_ok(results);
  const Reference ref = reference_lm(steps, batch, c.optimizer, c.max_norm, c.short_step, c.blocks);
  expect_model_close(dir.file("model"), ref, low ? 3e-2 : kAtol, low ? 0 : kRtol, what);
  // Losses (last stage) and clipping norms (every rank) match the reference's.
  int ranks_with_loss = 0;
  for (int r = 0; r < c.world; ++r) {
    auto log = read_log(dir.file("rank" + std::to_string(r) + ".txt"));
    if (!log["loss"].empty()) {
      ++ranks_with_loss;
      for (int64_t s = 0; s < steps; ++s)
        EXPECT_NEAR(log["loss"][s], ref.losses[s], low ? 2e-2 : 1e-5) << what << " rank " << r << " step " << s;
    }
    if (c.max_norm > 0) {
      ASSERT_EQ(log["norm"].size(), static_cast<size_t>(steps)) << what << " rank " << r;
      for (int64_t s = 0; s < steps; ++s) {
        EXPECT_NEAR(log["norm"][s], ref.norms[s], (low ? 2e-2 : 1e-5) * ref.norms[s]) << what << " rank " << r;
        EXPECT_GT(ref.norms[s], c.max_norm) << "the test should make clipping active";
      }
    }
  }
  EXPECT_GT(ranks_with_loss, 0) << what;
  // Pipelines on one machine: from the second run of a batch shape on (step 2 repeats step 0's shape
  // when step 1 is short), every rank's activations and gradients go through shared-memory rings,
  // so the results above hold for that path too; without the metadata cache everything stays on Gloo.
  bool pipelined = false, cache = true;
  for (const auto& s : c.sets) {
    if (s.rfind("plugin.pp_size=", 0) == 0 && std::stoi(s.substr(15)) > 1) pipelined = true;
    if (s == "plugin.enable_metadata_cache=false") cache = false;
  }
  for (int r = 0; pipelined && r < c.world; ++r) {
    auto log = read_log(dir.file("rank" + std::to_string(r) + ".txt"));
    ASSERT_EQ(log["shm_messages"].size(), static_cast<size_t>(steps)) << what << " rank " << r;
    // zbv: every W of TinyLM's chunks is the split one (from B's boundary gradients), none a whole
    // backward again.
    ASSERT_EQ(log["w_fallbacks"].size(), static_cast<size_t>(steps)) << what << " rank " << r;
    EXPECT_EQ(log["w_fallbacks"][steps - 1], 0) << what << " rank " << r;
    if (cache) {
      EXPECT_EQ(log["shm_messages"][0], 0) << what << " rank " << r << ": the first run goes through Gloo";
      EXPECT_GT(log["shm_messages"][2], log["shm_messages"][1]) << what << " rank " << r;
    } else {
      EXPECT_EQ(log["shm_messages"][2], 0) << what << " rank " << r;
    }
  }
}

}  // namespace booster::testing
