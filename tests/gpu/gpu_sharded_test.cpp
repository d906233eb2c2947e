// gpu_sharded_test.cpp — booster_gpu_tests: torch_fsdp and hybrid_parallel on one GPU. Every test
// skips, with the reason, where this process sees no CUDA device (as gpu_test.cpp's).
//
//   - torch_fsdp, every sharding strategy, on cuda:0: 1 rank on NCCL and 2 or 4 ranks sharing the GPU
//     over Gloo (collectives staged through host memory), against single-process LibTorch trained
//     on the same GPU, the rate limiter synchronizing CUDA events (dist_test_util.h's check_train: 1e-5 absolute + 1e-4 relative per element
//     after 4 steps, fp32; the differences are the order of the gradient sums);
//   - torch_fsdp with cpu_offload (shards in pinned host memory) against the same reference;
//   - torch_fsdp with bf16 compute (param_dtype) against LibTorch under CUDA bf16 autocast: SGD, the
//     bf16 tolerance of gpu_test.cpp's TorchDdpBf16AutocastOneAndTwoRanks (2e-2 relative + 1e-3);
//   - a torch_fsdp checkpoint saved on the GPU continues on the CPU under torch_ddp, and one saved on
//     the CPU continues on the GPU under torch_fsdp: equal to the uninterrupted CPU run within the
//     fp32 tolerance above (GPU and CPU float32 kernels differ in the last bits);
//   - the peak device memory of torch_fsdp FULL_SHARD, low_level_zero stage 2 and gemini (static;
//     optimizer side in pinned host memory; auto with the default budget) per rank
//     (the caching allocator's peak over boost() and 3 AdamW steps) against the estimate's device
//     bytes for the same model and configuration: within 10%;
//   - hybrid_parallel on cuda:0, tp2, pp2 (1F1B), pp2 x tp2, dp2 x pp2 and dp2 x tp2 with zero_stage 2 and 3,
//     and fp16 with zero_stage 1 and 3, over Gloo, against the dense TinyLM
//     trained on the CPU (hybrid_test_util.h, the tolerances of hybrid_test.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "gpu/gpu_dist_util.h"
#include "dist/hybrid_test_util.h"

namespace booster::testing {
// hybrid_worker beside this executable (the bundle keeps them together). BOOSTER_HYBRID_WORKER_PATH
// names this function for hybrid_test_util.h.
std::string hybrid_worker_beside_exe() {
  return (std::filesystem::canonical("/proc/self/exe").parent_path() / "hybrid_worker").string();
}
}  // namespace booster::testing

using namespace booster::testing;

namespace {

// torch_fsdp on the GPU; the train scenario initialises ranks > 0 differently: sync_module_states.
std::vector<std::string> fsdp_on_gpu(const std::string& strategy, std::vector<std::string> more = {}) {
  std::vector<std::string> s{kOnGpu, "booster.plugin=\"torch_fsdp\"", "plugin.sharding_strategy=\"" + strategy + "\"",
                             "plugin.sync_module_states=true"};
  s.insert(s.end(), more.begin(), more.end());
  return s;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// torch_fsdp

TEST(GpuFsdp, EveryShardingStrategyEqualsSingleProcessOnTheGpu) {
  SKIP_WITHOUT_GPU();
  TrainCase one = reference_on_gpu({1, "adamw", fsdp_on_gpu("FULL_SHARD"), 1});
  one.rank0_output_has = "device cuda:0, world size 1 (nccl)";
  check_train(one);
  TrainCase two = reference_on_gpu({2, "sgd", fsdp_on_gpu("FULL_SHARD", {kOverGloo}), 1});
  two.rank0_output_has = "device cuda:0, world size 2 (gloo)";
  auto stats = check_train(two);
  EXPECT_EQ(stats["flat_parameters"], 4);
  EXPECT_EQ(stats["all_gathers"], 4 * 4 * 2);  // every unit gathered for forward and for backward
  EXPECT_EQ(stats["reduce_scatters"], 4 * 4);
  EXPECT_EQ(stats["reduce_scatters_overlapped"], 4 * 3);  // in flight through the next unit's backward
  EXPECT_EQ(stats["max_gathered_units"], 2);  // BACKWARD_PRE: the unit and the one prefetched
  // limit_all_gathers: the host synchronized CUDA events recorded after the frees (the count of
  // fsdp_test.cpp's TorchFSDP.FullShardTwoRanksSGDEqualsSingleProcess, same schedule).
  EXPECT_EQ(stats["rate_limiter_waits"], 5 + 3 * 8);
  auto grad_op = check_train(reference_on_gpu({2, "adamw", fsdp_on_gpu("SHARD_GRAD_OP", {kOverGloo}), 1}));
  EXPECT_EQ(grad_op["all_gathers"], 4 * 4);
  check_train(reference_on_gpu({2, "sgd", fsdp_on_gpu("NO_SHARD", {kOverGloo}), 1}));
  check_train(reference_on_gpu({4, "adamw", fsdp_on_gpu("HYBRID_SHARD", {kOverGloo, "plugin.shard_group_size=2"}), 1}));
}

TEST(GpuFsdp, ClippingAndNoSyncAccumulationOnTheGpu) {
  SKIP_WITHOUT_GPU();
  TrainCase c = reference_on_gpu({2, "sgd", fsdp_on_gpu("FULL_SHARD", {kOverGloo, "plugin.max_norm=0.05"}), 2});
  c.max_norm = 0.05;
  check_train(c);
}

// cpu_offload: the shards and gradient shards in pinned host memory, the step on the host (CPU Adam
// kernel), a copy to the GPU for each all-gather.
TEST(GpuFsdp, CpuOffloadEqualsSingleProcessOnTheGpu) {
  SKIP_WITHOUT_GPU();
  check_train(reference_on_gpu({1, "adamw", fsdp_on_gpu("FULL_SHARD", {"plugin.cpu_offload=true"}), 1}));
  check_train(reference_on_gpu({2, "adamw", fsdp_on_gpu("FULL_SHARD", {kOverGloo, "plugin.cpu_offload=true"}), 1}));
  TrainCase clip = reference_on_gpu({2, "sgd", fsdp_on_gpu("SHARD_GRAD_OP", {kOverGloo, "plugin.cpu_offload=true",
                                                                               "plugin.max_norm=0.05"}), 2});
  clip.max_norm = 0.05;
  check_train(clip);
}

TEST(GpuFsdp, Bf16ComputeEqualsLibTorchAutocastOnTheGpu) {
  SKIP_WITHOUT_GPU();
  const std::vector<std::string> bf16{"plugin.mixed_precision.param_dtype=\"bf16\"",
                                      "plugin.mixed_precision.reduce_dtype=\"fp32\""};
  check_bf16_against_autocast(fsdp_on_gpu("FULL_SHARD", bf16));
}

TEST(GpuFsdp, CheckpointsMoveBetweenTheGpuAndTheCpu) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  const auto want = uninterrupted_resume_run(6);  // on the CPU
  const std::vector<std::string> fsdp_cpu{"booster.plugin=\"torch_fsdp\"", "plugin.sync_module_states=true"};
  // Saved by 2 ranks on the GPU (sharded optimizer), continued on 1 CPU rank under torch_ddp.
  resume_run(2, dir.file("gpu_a"), 0, 3, "save=" + dir.file("from_gpu"), fsdp_on_gpu("FULL_SHARD", {kOverGloo}));
  resume_run(1, dir.file("cpu_b"), 3, 6, "load=" + dir.file("from_gpu"), {});
  expect_close(load_tensors(dir.file("cpu_b/rank0.pt")), want, "GPU torch_fsdp save -> CPU torch_ddp");
  // Saved by 2 CPU ranks under torch_fsdp, continued on the GPU: 1 rank on NCCL and 2 over Gloo.
  resume_run(2, dir.file("cpu_a"), 0, 3, "save=" + dir.file("from_cpu"), fsdp_cpu);
  resume_run(1, dir.file("gpu_b1"), 3, 6, "load=" + dir.file("from_cpu"), fsdp_on_gpu("FULL_SHARD"));
  expect_close(load_tensors(dir.file("gpu_b1/rank0.pt")), want, "CPU torch_fsdp save -> GPU torch_fsdp, 1 rank");
  resume_run(2, dir.file("gpu_b2"), 3, 6, "load=" + dir.file("from_cpu"), fsdp_on_gpu("FULL_SHARD", {kOverGloo}));
  for (int r = 0; r < 2; ++r)
    expect_close(load_tensors(dir.file("gpu_b2/rank" + std::to_string(r) + ".pt")), want,
                 "CPU torch_fsdp save -> GPU torch_fsdp, rank " + std::to_string(r) + " of 2");
}

// The peak device memory of a rank against the estimate of the same configuration (dist_worker's
// "memory" scenario: a 3-layer MLP of width 2048, 4.3M parameters, AdamW, 3 steps).
TEST(GpuMemory, ShardedPluginsPeakDeviceMemoryIsWithinTenPercentOfTheEstimate) {
  SKIP_WITHOUT_GPU();
  struct Case {
    std::string what;
    int world;
    std::vector<std::string> sets;
    int estimate_row;
  };
  const std::vector<Case> cases{
      {"torch_fsdp FULL_SHARD, 1 rank", 1, fsdp_on_gpu("FULL_SHARD"), 0},
      {"torch_fsdp FULL_SHARD, 2 ranks", 2, fsdp_on_gpu("FULL_SHARD", {kOverGloo}), 0},
      {"low_level_zero stage 2, 2 ranks", 2,
       {kOnGpu, kOverGloo, "booster.plugin=\"low_level_zero\"", "plugin.precision=\"fp32\"", "plugin.stage=2"}, 1},
      // Gemini's rows on cuda: everything on the device (0), the optimizer side in pinned host memory (1).
      {"gemini static, 2 ranks", 2, {kOnGpu, kOverGloo, "booster.plugin=\"gemini\"", "plugin.precision=\"fp32\""}, 0},
      {"gemini static, optimizer side in pinned host memory, 2 ranks", 2,
       {kOnGpu, kOverGloo, "booster.plugin=\"gemini\"", "plugin.precision=\"fp32\"", "plugin.offload_optim_frac=1.0"}, 1},
      // auto with the default budget (the GPU's memory): the optimizer side starts in pinned host
      // memory (ColossalAI's auto, no gpu_margin_mem_ratio) and no parameter shard needs evicting,
      // so its peak is row 1's.
      {"gemini auto, default budget, 2 ranks", 2,
       {kOnGpu, kOverGloo, "booster.plugin=\"gemini\"", "plugin.precision=\"fp32\"", "plugin.placement_policy=\"auto\""}, 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    TempDir dir;
    std::vector<std::string> args{"scenario=memory", "out=" + dir.path(), "width=2048", "steps=3", "batch=4",
                                  "estimate_row=" + std::to_string(c.estimate_row)};
    for (const auto& s : c.sets) args.push_back("set=" + s);
    expect_all_ok(run_workers(c.world, args));
    for (int r = 0; r < c.world; ++r) {
      auto stats = read_stats(dir.file("rank" + std::to_string(r) + "_device.txt"));
      const double peak = static_cast<double>(stats["device_peak_bytes"]);
      const double estimate = static_cast<double>(stats["estimate_device_bytes"]);
      std::cout << "[ memory   ] " << c.what << ", rank " << r << ": device peak " << peak / (1 << 20)
                << " MiB, estimate " << estimate / (1 << 20) << " MiB (" << peak / estimate << "x)" << std::endl;
      ASSERT_GT(estimate, 0) << "no estimate row for this configuration";
      EXPECT_NEAR(peak, estimate, 0.10 * estimate);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// hybrid_parallel

TEST(GpuHybrid, TensorAndPipelineParallelEqualSingleProcess) {
  SKIP_WITHOUT_GPU();
  check_hybrid({2, {kOnGpu, kOverGloo, "plugin.tp_size=2"}, "adamw"});
  check_hybrid({2, {kOnGpu, kOverGloo, "plugin.pp_size=2", "plugin.num_microbatches=4"}, "sgd"});
  check_hybrid({4, {kOnGpu, kOverGloo, "plugin.pp_size=2", "plugin.tp_size=2", "plugin.num_microbatches=4"}, "sgd", 0.05});
  // dp2·pp2: the dp average in the reducer's buckets during the schedule's last backward.
  check_hybrid({4, {kOnGpu, kOverGloo, "plugin.pp_size=2", "plugin.num_microbatches=4"}, "sgd"});
  // zero_stage 2 and 3 composed with tp on the GPU (dp2·tp2).
  check_hybrid({4, {kOnGpu, kOverGloo, "plugin.tp_size=2", "plugin.zero_stage=2"}, "adamw", 0.05});
  check_hybrid({4, {kOnGpu, kOverGloo, "plugin.tp_size=2", "plugin.zero_stage=3"}, "adamw", 0.05});
}

// fp16 (the dynamic loss scaler, fp32 masters) with zero_stage 1 over dp2·tp2 and zero_stage 3 (fp32
// shards gathered in fp16) over dp2·tp2 and dp2·pp2, within the bf16 tolerances of hybrid_test.cpp.
TEST(GpuHybrid, Fp16WithZeroStages1And3) {
  SKIP_WITHOUT_GPU();
  HybridCase c{4, {kOnGpu, kOverGloo, "plugin.tp_size=2", "plugin.zero_stage=1"}, "adamw"};
  c.fp16 = true;
  check_hybrid(c);
  c.sets = {kOnGpu, kOverGloo, "plugin.tp_size=2", "plugin.zero_stage=3"};
  check_hybrid(c);
  c.sets = {kOnGpu, kOverGloo, "plugin.pp_size=2", "plugin.num_microbatches=4", "plugin.zero_stage=3"};
  check_hybrid(c);
}

// tp_size x pp_size not dividing the world on cuda: the same clear error on every rank as on the CPU.
TEST(GpuHybrid, AMeshThatDoesNotDivideTheWorldIsAClearError) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  auto results = run_hybrid(2, {"out=" + dir.path(), "steps=1", "batch=8", "optimizer=sgd", "set=" + kOnGpu,
                                "set=" + kOverGloo, "set=plugin.tp_size=3"});
  for (const auto& r : results) {
    EXPECT_NE(r.exit_code, 0);
    EXPECT_THAT(r.output, ::testing::HasSubstr("does not divide the world size 2"));
  }
}

TEST(GpuHybrid, OneRankOnNccl) {
  SKIP_WITHOUT_GPU();
  check_hybrid({1, {kOnGpu, "plugin.zero_stage=1"}, "adamw"});
}
