// hybrid_test.cpp — the hybrid_parallel plugin on 2 and 4 ranks (hybrid_worker processes) against
// single-process LibTorch: every mesh shape that fits (tp, pp, dp·tp, dp·pp, pp·tp, tp4, pp4), the
// 1F1B, interleaved and GPipe schedules, zero_stage 0 and 1, SGD and AdamW, clipping, bf16; and
// checkpoints moving between mesh shapes and plugins.
// Tolerances: float32 runs within kAtol = 1e-5 + kRtol = 1e-4 * |reference| (sums in another order:
// tp splits the matmuls, dp and micro-batches split the batch); bf16 runs within 3e-2 absolute
// (bf16 weights rounded at every step; the parameters are O(1)).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>
#include <sstream>

#include "booster/checkpoint/state_dict_io.h"
#include "booster/nn/tensor_parallel.h"
#include "dist/dist_test_util.h"
#include "dist/hybrid_common.h"

namespace booster::testing {
namespace {

struct Reference {
  std::map<std::string, torch::Tensor> params;
  std::vector<double> losses, norms;
};

// Single-process training of the dense TinyLM (tp = 1) on the whole global batch of each step.
Reference reference_lm(int64_t steps, int64_t batch, const std::string& optimizer, double max_norm = 0) {
  booster::nn::set_tensor_parallel_context(booster::nn::TensorParallelContext{});
  torch::manual_seed(7);
  TinyLM net;
  auto opt = make_lm_optimizer(optimizer, net->parameters());
  auto data = make_token_batches(steps, batch, 11);
  Reference ref;
  for (int64_t s = 0; s < steps; ++s) {
    auto loss = tiny_lm_loss(net->forward(data.tokens[s]), data.targets[s]);
    loss.backward();
    ref.losses.push_back(loss.item<double>());
    if (max_norm > 0) ref.norms.push_back(torch::nn::utils::clip_grad_norm_(net->parameters(), max_norm));
    opt->step();
    opt->zero_grad();
  }
  for (const auto& item : net->named_parameters()) ref.params[item.key()] = item.value().detach().clone();
  booster::nn::set_tensor_parallel_context(std::nullopt);
  return ref;
}

std::vector<ProcessResult> run_hybrid(int world, const std::vector<std::string>& args) {
  std::vector<std::string> argv{BOOSTER_HYBRID_WORKER_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_ranks(argv, world, {{"OMP_NUM_THREADS", "1"}}, 120);
}

// "loss <step> <value>" and "norm <step> <value>" lines of a rank's log.
std::map<std::string, std::map<int64_t, double>> read_log(const std::string& path) {
  std::map<std::string, std::map<int64_t, double>> out;
  std::istringstream in(read_file(path));
  std::string kind;
  int64_t step;
  double v;
  while (in >> kind >> step >> v) out[kind][step] = v;
  return out;
}

void expect_model_close(const std::string& dir, const Reference& ref, double atol, double rtol, const std::string& what) {
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
};

void check_hybrid(const HybridCase& c) {
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
  args.push_back(std::string("set=plugin.precision=") + (c.bf16 ? "bf16" : "fp32"));
  auto results = run_hybrid(c.world, args);
  expect_all_ok(results);
  const Reference ref = reference_lm(steps, batch, c.optimizer, c.max_norm);
  expect_model_close(dir.file("model"), ref, c.bf16 ? 3e-2 : kAtol, c.bf16 ? 0 : kRtol, what);
  // Losses (last stage) and clipping norms (every rank) match the reference's.
  int ranks_with_loss = 0;
  for (int r = 0; r < c.world; ++r) {
    auto log = read_log(dir.file("rank" + std::to_string(r) + ".txt"));
    if (!log["loss"].empty()) {
      ++ranks_with_loss;
      for (int64_t s = 0; s < steps; ++s)
        EXPECT_NEAR(log["loss"][s], ref.losses[s], c.bf16 ? 2e-2 : 1e-5) << what << " rank " << r << " step " << s;
    }
    if (c.max_norm > 0) {
      ASSERT_EQ(log["norm"].size(), static_cast<size_t>(steps)) << what << " rank " << r;
      for (int64_t s = 0; s < steps; ++s) {
        EXPECT_NEAR(log["norm"][s], ref.norms[s], (c.bf16 ? 2e-2 : 1e-5) * ref.norms[s]) << what << " rank " << r;
        EXPECT_GT(ref.norms[s], c.max_norm) << "the test should make clipping active";
      }
    }
  }
  EXPECT_GT(ranks_with_loss, 0) << what;
}

const std::string kHybrid = "booster.plugin=hybrid_parallel";

TEST(HybridParallel, TensorParallel2MatchesSingleProcess) {
  check_hybrid({2, {"plugin.tp_size=2"}, "adamw"});
}
TEST(HybridParallel, Pipeline2OneFOneBMatchesSingleProcess) {
  check_hybrid({2, {"plugin.pp_size=2", "plugin.num_microbatches=4"}, "sgd"});
}
TEST(HybridParallel, Pipeline2GPipeMatchesSingleProcess) {
  check_hybrid({2, {"plugin.pp_size=2", "plugin.num_microbatches=2", "plugin.pp_style=gpipe"}, "sgd"});
}
TEST(HybridParallel, DataTensor2x2AdamWClippedMatchesSingleProcess) {
  check_hybrid({4, {"plugin.tp_size=2"}, "adamw", 0.05});
}
TEST(HybridParallel, DataPipeline2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.num_microbatches=2"}, "adamw"});
}
TEST(HybridParallel, PipelineTensor2x2ClippedMatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.tp_size=2", "plugin.num_microbatches=4"}, "sgd", 0.05});
}
TEST(HybridParallel, Tensor4MatchesSingleProcess) {
  check_hybrid({4, {"plugin.tp_size=4"}, "adamw"});
}
TEST(HybridParallel, Pipeline4MatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=4", "plugin.num_microbatches=4"}, "adamw", 0.05});
}
TEST(HybridParallel, InterleavedPipeline2x2ChunksMatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.pp_style=interleaved", "plugin.num_model_chunks=2",
                    "plugin.num_microbatches=4"}, "adamw"});
}
TEST(HybridParallel, ZeroStage1DataTensor2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.tp_size=2", "plugin.zero_stage=1"}, "adamw", 0.05});
}
TEST(HybridParallel, ZeroStage1DataPipeline2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.zero_stage=1", "plugin.num_microbatches=2"}, "sgd"});
}
TEST(HybridParallel, Bf16PipelineTensor2x2TracksSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.tp_size=2", "plugin.num_microbatches=2"}, "adamw", 0, true});
}

}  // namespace
}  // namespace booster::testing
