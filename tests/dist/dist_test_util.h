// dist_test_util.h — helpers for the multi-process tests: run dist_worker ranks, load what they
// saved, compare with a single-process reference within the stated tolerance.
#pragma once

#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/debiased_momentum.h"
#include "common/test_util.h"
#include "dist/dist_common.h"

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
                  const std::string& what, double rtol = kRtol, double atol = kAtol) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].sizes(), want[i].sizes()) << what << " tensor " << i;
    // A result in a narrower dtype (bf16 / fp16 weights) is compared in the reference's dtype.
    const torch::Tensor g = got[i].to(want[i].scalar_type());
    EXPECT_TRUE(torch::allclose(g, want[i], rtol, atol))
        << what << " tensor " << i << " max |diff| " << (g - want[i]).abs().max().item<double>();
    max_diff = std::max(max_diff, (g - want[i]).abs().max().item<double>());
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



// ---------------------------------------------------------------------------------------------
// Shared checks of the data-parallel plugins (DDP, ZeRO) against single-process training

// Single-process reference: the MLP trained on the whole global batch of each step.
// With max_norm > 0 the gradients are clipped with torch::nn::utils::clip_grad_norm_ and its
// returned norms collected in *norms.
// `device`: where the reference trains (the GPU tests train it on the GPU); the result is on the CPU.
// `autocast_bf16`: its forward runs under bf16 autocast of that device (the loss in fp32).
inline std::vector<torch::Tensor> reference_mlp(int64_t steps, int64_t global_batch, const std::string& optimizer,
                                         double max_norm = 0, double norm_type = 2.0,
                                         std::vector<double>* norms = nullptr, const c10::Device& device = c10::kCPU,
                                         bool autocast_bf16 = false) {
  torch::manual_seed(7);
  MLP net;
  net->to(device);
  // dist_worker's make_any_optimizer: dist_common.h's built-ins and the user-registered one.
  auto opt = optimizer == "debiased_momentum" ? make_debiased_momentum(net->parameters())
                                              : make_optimizer(optimizer, net->parameters());
  auto batches = make_batches(steps, global_batch, 11);
  for (int64_t s = 0; s < steps; ++s) {
    at::Tensor out;
    if (autocast_bf16) {
      const bool was = at::autocast::is_autocast_enabled(device.type());
      const at::ScalarType was_dtype = at::autocast::get_autocast_dtype(device.type());
      at::autocast::set_autocast_enabled(device.type(), true);
      at::autocast::set_autocast_dtype(device.type(), at::kBFloat16);
      at::autocast::increment_nesting();
      out = net->forward(batches.inputs[s].to(device));
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      at::autocast::set_autocast_enabled(device.type(), was);
      at::autocast::set_autocast_dtype(device.type(), was_dtype);
    } else {
      out = net->forward(batches.inputs[s].to(device));
    }
    auto loss = torch::mse_loss(out.to(torch::kFloat), batches.targets[s].to(device));
    loss.backward();
    if (max_norm > 0) {
      double n = torch::nn::utils::clip_grad_norm_(net->parameters(), max_norm, norm_type);
      if (norms) norms->push_back(n);
    }
    opt->step();
    opt->zero_grad();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().to(torch::kCPU).clone());
  return out;
}

struct TrainCase {
  int world;
  std::string optimizer;
  std::vector<std::string> sets;
  int64_t accum;
  double max_norm = 0;  // also pass "booster.max_norm=..." in sets
  double norm_type = 2.0;
  std::string rank0_output_has;  // non-empty: rank 0's output must contain it (e.g. a log line)
  bool accum_sync = false;  // every micro-batch's backward synchronises (no no_sync)
  c10::Device device = c10::kCPU;  // where the reference trains (set booster.device in sets to match)
  bool autocast_bf16 = false;      // the reference's forward under bf16 autocast (booster.mixed_precision = "bf16")
  double rtol = kRtol, atol = kAtol;  // per element, against the reference
};

// dist_worker's "resume" scenario run uninterrupted in this process on the CPU: the MLP (seed 7) with
// AdamW on global batches of 8 rows (make_batches seed 23) for `steps` steps; its parameters.
inline std::vector<torch::Tensor> uninterrupted_resume_run(int64_t steps) {
  torch::manual_seed(7);
  MLP net;
  auto opt = make_optimizer("adamw", net->parameters());
  auto batches = make_batches(steps, 8, 23);
  for (int64_t s = 0; s < steps; ++s) {
    torch::mse_loss(net->forward(batches.inputs[s]), batches.targets[s]).backward();
    opt->step();
    opt->zero_grad();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

// Runs the "train" scenario and checks every rank against the reference; returns rank 0's stats.
inline std::map<std::string, int64_t> check_train(const TrainCase& c) {
  TempDir dir;
  const int64_t steps = 4, batch = 4;
  std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=" + std::to_string(steps),
                                "batch=" + std::to_string(batch), "accum=" + std::to_string(c.accum),
                                "optimizer=" + c.optimizer};
  if (c.accum_sync) args.push_back("accum_sync=true");
  for (const auto& s : c.sets) args.push_back("set=" + s);
  auto results = run_workers(c.world, args);
  expect_all_ok(results);
  if (!c.rank0_output_has.empty() && !results.empty()) {
    EXPECT_NE(results[0].output.find(c.rank0_output_has), std::string::npos)
        << "rank 0's output lacks \"" << c.rank0_output_has << "\":\n" << results[0].output;
  }
  std::vector<double> norms;
  auto want = reference_mlp(steps, batch * c.world * c.accum, c.optimizer, c.max_norm, c.norm_type, &norms, c.device,
                            c.autocast_bf16);
  for (int r = 0; r < c.world; ++r) {
    std::string rs = std::to_string(r);
    expect_close(load_tensors(dir.file("rank" + rs + ".pt")), want, std::to_string(c.world) + " ranks, rank " + rs,
                 c.rtol, c.atol);
    if (c.max_norm > 0) {
      // The reported global norm equals clip_grad_norm_'s on the full batch (float32 there, float64 here).
      auto got = load_tensors(dir.file("rank" + rs + "_norms.pt"))[0];
      EXPECT_EQ(got.numel(), static_cast<int64_t>(norms.size()));
      if (got.numel() != static_cast<int64_t>(norms.size())) continue;
      for (size_t s = 0; s < norms.size(); ++s) {
        EXPECT_NEAR(got[s].item<double>(), norms[s], 1e-5 * norms[s]) << "step " << s;
        EXPECT_GT(norms[s], c.max_norm) << "the test should make clipping active";
      }
    }
  }
  return load_stats(dir.file("rank0.txt"));
}

// Loss scaling: an inf injected into rank 1's gradients at step 1 (after the reduction, so only rank 1
// sees it) makes every rank skip that step; extra_args select the optimizer (e.g. zero_stage=2).
inline void check_overflow(const std::vector<std::string>& extra_args) {
  TempDir dir;
  const int64_t steps = 4, batch = 4;
  std::vector<std::string> args{"scenario=overflow", "out=" + dir.path(), "steps=4", "batch=4", "bad_step=1",
                                "bad_rank=1"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  auto results = run_workers(2, args);
  expect_all_ok(results);
  // Reference: plain SGD on the full batch that skips step 1 (power-of-two loss scales are exact).
  torch::manual_seed(7);
  MLP net;
  auto opt = make_optimizer("sgd", net->parameters());
  auto batches = make_batches(steps, batch * 2, 11);
  std::vector<std::vector<torch::Tensor>> want;
  for (int64_t s = 0; s < steps; ++s) {
    torch::mse_loss(net->forward(batches.inputs[s]), batches.targets[s]).backward();
    if (s != 1) opt->step();
    opt->zero_grad();
    std::vector<torch::Tensor> p;
    for (auto& t : net->parameters()) p.push_back(t.detach().clone());
    want.push_back(p);
  }
  for (int r = 0; r < 2; ++r) {
    std::string rs = std::to_string(r);
    auto info = load_tensors(dir.file("rank" + rs + "_steps.pt"));
    // taken: 1, 0 (skipped), 1, 1 on every rank; scale: 1024, backoff to 512 (hysteresis 1),
    // 512, then growth after growth_interval = 2 clean steps -> 1024.
    EXPECT_TRUE(torch::equal(info[0], torch::tensor({1.0, 0.0, 1.0, 1.0}, torch::kDouble))) << info[0];
    EXPECT_TRUE(torch::equal(info[1], torch::tensor({1024.0, 512.0, 512.0, 1024.0}, torch::kDouble))) << info[1];
    EXPECT_EQ(load_stats(dir.file("rank" + rs + ".txt"))["skipped_steps"], 1);
    for (int64_t s = 0; s < steps; ++s)
      expect_close(load_tensors(dir.file("rank" + rs + "_step" + std::to_string(s) + ".pt")), want[s],
                   "overflow test rank " + rs + " after step " + std::to_string(s));
    // The skipped step left the parameters exactly unchanged.
    auto p0 = load_tensors(dir.file("rank" + rs + "_step0.pt")), p1 = load_tensors(dir.file("rank" + rs + "_step1.pt"));
    for (size_t i = 0; i < p0.size(); ++i) EXPECT_TRUE(torch::equal(p0[i], p1[i]));
  }
  // And the ranks are identical to each other, bit for bit.
  for (int64_t s = 0; s < steps; ++s) {
    auto a = load_tensors(dir.file("rank0_step" + std::to_string(s) + ".pt"));
    auto b = load_tensors(dir.file("rank1_step" + std::to_string(s) + ".pt"));
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i]));
  }
}

#if defined(BOOSTER_CLI_PATH) && defined(BOOSTER_BINARY_DIR) && defined(BOOSTER_SOURCE_DIR)
// The Fashion-MNIST example on 2 ranks under `booster run` for 2 epochs of its first train_subset
// samples (test_subset evaluated, 2 warm-up steps) with `config` and extra --set assignments;
// 180 s timeout.
inline ProcessResult run_fashion_mnist_two_ranks(const std::string& config, const std::string& out,
                                                 std::vector<std::string> sets, int train_subset, int test_subset) {
  std::vector<std::string> argv{BOOSTER_CLI_PATH, "run", "--nproc_per_node", "2", "--master_port",
                                std::to_string(free_port()), kFashionMnistBinary, "--config", config, "--output_dir", out};
  for (std::string s : {std::string("train.epochs=2"), "train.train_subset=" + std::to_string(train_subset),
                        "train.test_subset=" + std::to_string(test_subset), std::string("train.lr_scheduler.warmup_steps=2")})
    sets.push_back(s);
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  return run_process(argv, {}, 180);
}
#endif

}  // namespace booster::testing
