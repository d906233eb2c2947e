// gpu_gemini_test.cpp — booster_gpu_tests: the gemini plugin with a CUDA compute device (chunks,
// gathered parameters and the compute tier on the GPU; the offload tier in pinned host memory or an
// offload_dir file). Every test skips, with the reason, where this process sees no CUDA device.
//
//   - static placement (everything on the device; optimizer sides and parameter shards offloaded to
//     host memory; to an offload_dir file) and auto placement (optimizer sides offloaded; moved back
//     to the device by gpu_margin_mem_ratio) with 1 rank on NCCL and 2 ranks sharing the GPU over
//     Gloo, against single-process LibTorch trained on the same GPU (dist_test_util.h's check_train:
//     1e-5 absolute + 1e-4 relative per element after 4 steps, fp32: the order of the gradient sums,
//     and the CPU Adam kernel against LibTorch's CUDA AdamW for a master in host memory);
//   - bf16 chunks against LibTorch under CUDA bf16 autocast (SGD; the bf16 band of gpu_sharded_test's
//     torch_fsdp case, 2e-2 relative + 1e-3);
//   - a model whose states (16 bytes per parameter in bf16 with fp32 masters and AdamW) are larger
//     than memory_budget_mb trains under placement_policy = "auto" (optimizer sides in host memory,
//     parameter shards evicted to it), with the device peak under the budget, and equals the run
//     without a budget within the bf16 band;
//   - a memory_budget_mb too small for one unit's chunks is a clear error on the GPU;
//   - a gemini checkpoint saved on the GPU continues on the CPU under torch_ddp, and one saved on the
//     CPU continues on the GPU under gemini (fp32 tolerance above).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gpu/gpu_dist_util.h"

using namespace booster::testing;
using ::testing::HasSubstr;

namespace {

// gemini on the GPU in fp32 with gemini_test.cpp's small chunks (5 chunks of 1024 elements).
std::vector<std::string> gemini_on_gpu(std::vector<std::string> more = {}) {
  std::vector<std::string> s{kOnGpu,
                             "booster.plugin=\"gemini\"",
                             "plugin.precision=\"fp32\"",
                             "plugin.min_chunk_size_m=0.0005",
                             "plugin.search_range_m=0",
                             "plugin.hidden_dim=16"};
  s.insert(s.end(), more.begin(), more.end());
  return s;
}

}  // namespace

TEST(GpuGemini, StaticPlacementEqualsSingleProcessOnTheGpu) {
  SKIP_WITHOUT_GPU();
  TrainCase one = reference_on_gpu({1, "adamw", gemini_on_gpu(), 1});
  one.rank0_output_has = "device cuda:0, world size 1 (nccl)";
  check_train(one);
  auto two = check_train(reference_on_gpu({2, "adamw", gemini_on_gpu({kOverGloo}), 1}));
  EXPECT_EQ(two["chunks"], 5);
  EXPECT_EQ(two["chunks_optim_offloaded"], 0);
  // Optimizer sides and parameter shards in pinned host memory: the masters step through the CPU
  // Adam kernel, the shards are copied to the GPU for every all-gather.
  auto host = check_train(reference_on_gpu(
      {2, "adamw", gemini_on_gpu({kOverGloo, "plugin.offload_optim_frac=1.0", "plugin.offload_param_frac=1.0"}), 1}));
  EXPECT_EQ(host["chunks_optim_offloaded"], host["chunks"]);
  EXPECT_EQ(host["chunks_param_offloaded"], host["chunks"]);
  TempDir off;
  auto disk = check_train(
      reference_on_gpu({2, "sgd",
                        gemini_on_gpu({kOverGloo, "plugin.offload_optim_frac=0.5", "plugin.offload_param_frac=0.5",
                                       "plugin.offload_dir=\"" + off.path() + "\""}),
                        1}));
  EXPECT_GT(disk["offload_bytes_written"], 0);
  // Clipping across chunks on the device and in host memory.
  TrainCase clip = reference_on_gpu(
      {2, "sgd", gemini_on_gpu({kOverGloo, "plugin.offload_optim_frac=0.5", "plugin.max_norm=0.05"}), 1});
  clip.max_norm = 0.05;
  check_train(clip);
}

TEST(GpuGemini, AutoPlacementEqualsSingleProcessOnTheGpu) {
  SKIP_WITHOUT_GPU();
  // Optimizer sides offloaded to host memory (auto's start), then all moved back to the device by
  // gpu_margin_mem_ratio at the first step (master and AdamW state moved with Tensor::set_data).
  auto margin =
      check_train(reference_on_gpu({2, "adamw",
                                    gemini_on_gpu({kOverGloo, "plugin.placement_policy=\"auto\"",
                                                   "plugin.memory_budget_mb=64", "plugin.gpu_margin_mem_ratio=1.0"}),
                                    1}));
  EXPECT_EQ(margin["chunks_optim_offloaded"], 0);
  EXPECT_GT(margin["optim_bytes_in_margin"], 0);
  auto host = check_train(reference_on_gpu(
      {2, "adamw", gemini_on_gpu({kOverGloo, "plugin.placement_policy=\"auto\"", "plugin.memory_budget_mb=64"}), 1}));
  EXPECT_EQ(host["chunks_optim_offloaded"], host["chunks"]);
  TempDir off;
  check_train(reference_on_gpu({1, "adamw",
                                gemini_on_gpu({"plugin.placement_policy=\"auto\"", "plugin.memory_budget_mb=64",
                                               "plugin.offload_dir=\"" + off.path() + "\""}),
                                1}));
  // A budget too small for one unit's chunks: a clear error on every rank.
  TempDir dir;
  std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=2", "batch=4", "optimizer=adamw"};
  for (const auto& s : gemini_on_gpu({kOverGloo, "plugin.placement_policy=\"auto\"", "plugin.memory_budget_mb=0.001"}))
    args.push_back("set=" + s);
  for (const auto& r : run_workers(2, args)) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_THAT(r.output, HasSubstr("memory_budget_mb is too small for one unit's chunks"));
  }
}

TEST(GpuGemini, Bf16ChunksEqualLibTorchAutocastOnTheGpu) {
  SKIP_WITHOUT_GPU();
  check_bf16_against_autocast(gemini_on_gpu({"plugin.precision=\"bf16\""}));
}

// dist_worker's "memory" scenario (a 3-layer MLP of width 2048, 4.3M parameters, AdamW, 3 steps) on
// 1 rank in bf16 chunks of one layer each: its model states are 16 bytes per parameter (bf16
// parameter and gradient, fp32 master, two fp32 AdamW states), 66 MiB. Under a 48 MiB budget with
// placement_policy = "auto" (the warm-up keeps 30% of the budget for non-model data) the optimizer
// sides live in pinned host memory and parameter shards are evicted there; the device peak stays
// under the budget and the weights equal the run without a budget within the bf16 band.
TEST(GpuGemini, AModelLargerThanTheGpuBudgetTrainsWithItsStatesOffloaded) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::string> base = {kOnGpu, "booster.plugin=\"gemini\"", "plugin.precision=\"bf16\"",
                                         "plugin.min_chunk_size_m=0", "plugin.search_range_m=0"};
  auto run = [&](const std::string& out, std::vector<std::string> more) {
    std::vector<std::string> args{"scenario=memory", "out=" + out, "width=2048", "steps=3", "batch=4", "save_params=1"};
    for (const auto& s : base) args.push_back("set=" + s);
    for (const auto& s : more) args.push_back("set=" + s);
    expect_all_ok(run_workers(1, args));
  };
  TempDir free_run, capped;
  run(free_run.path(), {});
  const int64_t budget_mb = 48;
  run(capped.path(), {"plugin.placement_policy=\"auto\"", "plugin.memory_budget_mb=" + std::to_string(budget_mb),
                      "plugin.warmup_non_model_data_ratio=0.3"});
  const auto numel = read_stats(capped.file("rank0.txt"))["numel"];
  const auto device = read_stats(capped.file("rank0_device.txt"));
  const auto unbounded = read_stats(free_run.file("rank0_device.txt"));
  const double states = 16.0 * static_cast<double>(numel);
  std::cout << "[ memory   ] gemini auto, budget " << budget_mb << " MiB, model states " << states / (1 << 20)
            << " MiB: device peak " << device.at("device_peak_bytes") / double(1 << 20) << " MiB (without a budget "
            << unbounded.at("device_peak_bytes") / double(1 << 20) << " MiB)" << std::endl;
  EXPECT_GT(states, budget_mb * double(1 << 20));
  EXPECT_LE(device.at("device_peak_bytes"), budget_mb << 20);
  expect_close(load_tensors(capped.file("rank0.pt")), load_tensors(free_run.file("rank0.pt")),
               "auto under the budget against no budget", 2e-2, 1e-3);
}

TEST(GpuGemini, CheckpointsMoveBetweenTheGpuAndTheCpu) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  const auto want = uninterrupted_resume_run(6);  // on the CPU
  const std::vector<std::string> gemini_cpu{"booster.plugin=\"gemini\"", "plugin.precision=\"fp32\"",
                                            "plugin.min_chunk_size_m=0.0005", "plugin.search_range_m=0",
                                            "plugin.hidden_dim=16"};
  // Saved by 2 ranks on the GPU (optimizer sides half in host memory), continued on 1 CPU rank under torch_ddp.
  resume_run(2, dir.file("gpu_a"), 0, 3, "save=" + dir.file("from_gpu"),
             gemini_on_gpu({kOverGloo, "plugin.offload_optim_frac=0.5"}));
  resume_run(1, dir.file("cpu_b"), 3, 6, "load=" + dir.file("from_gpu"), {});
  expect_close(load_tensors(dir.file("cpu_b/rank0.pt")), want, "GPU gemini save -> CPU torch_ddp");
  // Saved by 2 CPU ranks under gemini, continued on the GPU by 1 rank on NCCL.
  resume_run(2, dir.file("cpu_a"), 0, 3, "save=" + dir.file("from_cpu"), gemini_cpu);
  resume_run(1, dir.file("gpu_b"), 3, 6, "load=" + dir.file("from_cpu"), gemini_on_gpu());
  expect_close(load_tensors(dir.file("gpu_b/rank0.pt")), want, "CPU gemini save -> GPU gemini, 1 rank");
}
