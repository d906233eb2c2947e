// gpu_memory_test.cpp — booster_gpu_tests: memory on the GPU. Every test skips, with the reason, on a
// machine where this process sees no CUDA device (as gpu_test.cpp's).
//
//   - the memory report of a model boosted on cuda:0 (torch_ddp; low_level_zero stage 2 with
//     cpu_offload) puts the model states where they are, and the device bytes it reports match what
//     LibTorch's caching allocator holds for them;
//   - ZeRO cpu_offload on the GPU keeps the master slices and optimizer states in pinned host memory;
//   - ZeRO stage 2 with cpu_offload trained on the GPU (1 rank on NCCL, 2 ranks sharing the GPU over
//     Gloo) equals single-process LibTorch AdamW trained on the same GPU, for AdamW and HybridAdam
//     (both step the host masters through the CPU Adam kernel; HybridAdam with dist_common.h's options
//     is AdamW with the same hyper-parameters, so the reference is LibTorch's AdamW in both cases).
//
// Tolerances. Allocator: the device bytes the allocator gained over boost() and one step (its
// "allocated" figure, process-wide) equal the model states + buffers the report puts on the device
// within 8 MiB: the caching allocator rounds each block to 512 bytes and may hand a large tensor a
// whole segment's tail (under 1 MiB), and the test's batch lives there too; the model states are
// 64-160 MiB. Training: dist_test_util.h's (1e-5 absolute + 1e-4 relative per element after 4 steps, fp32).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "booster/booster.h"
#include "booster/device.h"
#include "booster/optim/cpu_adam.h"
#include "booster/optim/optimizer_registry.h"
#include "booster/optim/optimizer_state.h"
#include "booster/wrappers/zero_optimizer.h"
#include "dist/dist_common.h"
#include "dist/dist_test_util.h"

using namespace booster::testing;
using ::testing::HasSubstr;

namespace {

const c10::Device kGpu(c10::kCUDA, 0);
constexpr int64_t kMiB = 1 << 20;
constexpr int64_t kAllocatorSlack = 8 * kMiB;

// A Booster on cuda:0 in this process (a world of one; NCCL, the default on CUDA). The bundle's
// run.sh sets BOOSTER_PLUGIN_PATH; from a build tree the build's plugin directory is used.
booster::Booster gpu_booster(const std::string& toml) {
  ::setenv("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR, /*overwrite=*/0);
  return booster::Booster(booster::Config::from_string("[booster]\ndevice = \"cuda\"\n" + toml, "gpu_memory.toml"));
}

// Large enough that the model states dwarf the allocator's rounding: 8.4M parameters (32 MiB fp32).
torch::nn::Sequential wide_mlp() {
  torch::manual_seed(3);
  return torch::nn::Sequential(torch::nn::Linear(1024, 2048), torch::nn::Tanh(), torch::nn::Linear(2048, 2048),
                               torch::nn::Tanh(), torch::nn::Linear(2048, 1024));
}

// cuBLAS / cuBLASLt workspaces come from the caching allocator at the first matmul on a stream: make
// them before the allocator is read, so the difference is the model's.
void warm_up_the_gpu() {
  torch::nn::Linear w(64, 64);
  w->to(kGpu);
  w->forward(torch::randn({8, 64}, kGpu)).sum().backward();
  torch::cuda::synchronize();
}

int64_t allocated_now() {
  torch::cuda::synchronize();
  return booster::device_memory(kGpu).allocated;
}

// One training step of the boosted wide MLP on a batch of 8 on the GPU.
template <class Boosted>
void one_step(booster::Booster& b, Boosted& boosted) {
  const at::Tensor x = torch::randn({8, 1024}, kGpu), y = torch::randn({8, 1024}, kGpu);
  b.backward(torch::mse_loss(boosted.model.forward(x), y), *boosted.optimizer);
  boosted.optimizer->step();
  boosted.optimizer->zero_grad();
}

// Every state tensor of the optimizer is a pinned host tensor (and there is state).
void expect_pinned_host_states(torch::optim::Optimizer& optimizer) {
  const auto& info = booster::optimizer_type_info(optimizer);
  ASSERT_FALSE(optimizer.state().empty());
  for (auto& [key, st] : optimizer.state()) {
    for (auto& [name, t] : info.extract_state(*st).tensors) {
      EXPECT_TRUE(t.device().is_cpu()) << name << " is on " << t.device();
      EXPECT_TRUE(t.is_pinned()) << name << " is not in pinned memory";
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The memory report on the GPU

TEST(GpuMemoryReport, TorchDdpPutsTheModelStatesOnTheGpuAndTheAllocatorAgrees) {
  SKIP_WITHOUT_GPU();
  auto b = gpu_booster("");
  warm_up_the_gpu();
  const int64_t before = allocated_now();
  auto net = wide_mlp();
  auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto boosted = b.boost(net, adamw);
  one_step(b, boosted);  // Adam's states exist from here
  const int64_t gained = allocated_now() - before;
  const booster::MemoryReport r = b.memory_report(boosted.model, boosted.optimizer.get());
  EXPECT_EQ(r.device, "cuda:0");
  EXPECT_GT(r.parameters, 32 * kMiB);
  // Everything DDP keeps is on the GPU.
  EXPECT_EQ(r.parameters_on_device, r.parameters);
  EXPECT_EQ(r.gradients_on_device, r.gradients);
  EXPECT_EQ(r.master_weights_on_device, r.master_weights);
  EXPECT_EQ(r.optimizer_states_on_device, r.optimizer_states);
  EXPECT_EQ(r.optimizer_states, 2 * r.parameters);
  EXPECT_EQ(r.communication_buffers_on_device, r.communication_buffers);
  EXPECT_EQ(r.model_states_on_host(), 0);
  EXPECT_EQ(r.pinned_host_bytes, 0);
  // The allocator's figures, and what it gained for them.
  EXPECT_GT(r.device_allocated, 0);
  EXPECT_GE(r.device_allocated, gained);
  EXPECT_GE(r.device_peak_allocated, r.device_allocated);
  EXPECT_GE(r.device_reserved, r.device_allocated);
  const int64_t on_device = r.model_states_on_device() + r.communication_buffers_on_device;
  EXPECT_NEAR(static_cast<double>(gained), static_cast<double>(on_device), static_cast<double>(kAllocatorSlack))
      << r.to_string();
  EXPECT_THAT(r.to_string(), HasSubstr("; on cuda:0: params "));
  EXPECT_THAT(r.to_string(), HasSubstr("cuda:0 allocator: allocated "));
}

TEST(GpuMemoryReport, ZeroCpuOffloadSplitsTheModelStatesBetweenGpuAndPinnedHostMemory) {
  SKIP_WITHOUT_GPU();
  auto b = gpu_booster("plugin = \"low_level_zero\"\n[plugin]\nprecision = \"fp32\"\nstage = 2\ncpu_offload = true\n");
  warm_up_the_gpu();
  const int64_t before = allocated_now();
  booster::reset_device_peak(kGpu);
  auto net = wide_mlp();
  auto adam = std::make_shared<booster::optim::HybridAdam>(net->parameters(),
                                                           booster::optim::CPUAdamOptions(1e-3).weight_decay(0.01));
  auto boosted = b.boost(net, adam);
  auto zero = std::dynamic_pointer_cast<booster::ZeroOptimizer>(boosted.optimizer);
  ASSERT_NE(zero, nullptr);
  ASSERT_TRUE(zero->offloads_from_device());
  // The master slice: fp32, on the host, pinned; the model's flat buffer on the GPU.
  EXPECT_TRUE(zero->master_slice(0).device().is_cpu());
  EXPECT_TRUE(zero->master_slice(0).is_pinned());
  EXPECT_TRUE(zero->flat_parameters(0).is_cuda());
  // Planned at boost(): the states will be pinned host tensors too.
  const booster::MemoryReport planned = b.memory_report(boosted.model, boosted.optimizer.get());
  EXPECT_EQ(planned.pinned_host_bytes, planned.master_weights + planned.optimizer_states);

  one_step(b, boosted);
  one_step(b, boosted);  // a second step: the pinned states are used in place
  // What stays allocated after the steps: the model states on the device. ZeRO's reduce buckets are
  // transient (allocated in backward, freed after it; the report counts those resident at once in
  // backward), so they are compared with the allocator's peak separately below.
  const int64_t gained = allocated_now() - before;
  const int64_t peak_gained = booster::device_memory(kGpu).peak_allocated - before;
  expect_pinned_host_states(zero->optimizer());
  // The host master equals the model (the non-blocking upload has landed).
  EXPECT_TRUE(at::equal(zero->master_slice(0), zero->flat_parameters(0).to(at::kCPU)));

  const booster::MemoryReport r = b.memory_report(boosted.model, boosted.optimizer.get());
  EXPECT_EQ(r.device, "cuda:0");
  EXPECT_EQ(r.parameters_on_device, r.parameters);
  EXPECT_EQ(r.gradients_on_device, r.gradients);  // the gradient shard
  EXPECT_EQ(r.master_weights_on_device, 0);
  EXPECT_EQ(r.optimizer_states_on_device, 0);
  EXPECT_EQ(r.master_weights, zero->master_slice(0).numel() * 4);
  EXPECT_EQ(r.optimizer_states, 2 * r.master_weights);
  EXPECT_EQ(r.model_states_on_device(), r.parameters + r.gradients);
  EXPECT_EQ(r.model_states_on_host(), r.master_weights + r.optimizer_states);
  EXPECT_EQ(r.pinned_host_bytes, r.model_states_on_host());
  EXPECT_NEAR(static_cast<double>(gained), static_cast<double>(r.model_states_on_device()),
              static_cast<double>(kAllocatorSlack))
      << r.to_string();
  // At its peak the device held the states and the buckets (and, at boost(), the model's own
  // parameters once more while they were flattened).
  EXPECT_GE(peak_gained + kAllocatorSlack, r.model_states_on_device() + r.communication_buffers_on_device) << r.to_string();
  EXPECT_THAT(r.to_string(), HasSubstr("pinned)"));
  auto stats = boosted.model.hooks().stats();
  EXPECT_EQ(stats["offload_host_bytes"], r.model_states_on_host());
  EXPECT_EQ(stats["offload_pinned_bytes"], r.model_states_on_host());
}

// ---------------------------------------------------------------------------------------------
// ZeRO stage 2 with cpu_offload trained on the GPU against LibTorch on the same GPU

namespace {
const std::string kGloo = "distributed.backend=\"gloo\"";
// ZeRO with cpu_offload on the GPU, fp32 (low_level_zero's own precision defaults to fp16), at `stage`.
std::vector<std::string> zero_offload(int stage) {
  return {"booster.device=\"cuda\"", "booster.plugin=\"low_level_zero\"", "plugin.precision=\"fp32\"",
          "plugin.stage=" + std::to_string(stage), "plugin.cpu_offload=true"};
}

std::vector<std::string> with(std::vector<std::string> sets, const std::vector<std::string>& more) {
  sets.insert(sets.end(), more.begin(), more.end());
  return sets;
}

// dist_worker's "train" scenario with `optimizer` on `world` ranks against reference_mlp trained with
// `reference_optimizer` on the GPU (check_train with the reference's optimizer named apart); returns
// rank 0's stats.
std::map<std::string, int64_t> check_offload_train(int world, const std::string& optimizer,
                                                   const std::string& reference_optimizer,
                                                   const std::vector<std::string>& sets) {
  TempDir dir;
  const int64_t steps = 4, batch = 4;
  std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=" + std::to_string(steps),
                                "batch=" + std::to_string(batch), "accum=1", "optimizer=" + optimizer};
  for (const auto& s : sets) args.push_back("set=" + s);
  auto results = run_workers(world, args);
  expect_all_ok(results);
  if (!results.empty()) {
    EXPECT_THAT(results[0].output, HasSubstr("optimizer states are in pinned host memory")) << results[0].output;
  }
  auto want = reference_mlp(steps, batch * world, reference_optimizer, 0, 2.0, nullptr, kGpu);
  for (int r = 0; r < world; ++r)
    expect_close(load_tensors(dir.file("rank" + std::to_string(r) + ".pt")), want,
                 optimizer + ", " + std::to_string(world) + " ranks, rank " + std::to_string(r));
  return load_stats(dir.file("rank0.txt"));
}

void expect_pinned_offload(const std::map<std::string, int64_t>& stats, int stage = 2) {
  ASSERT_TRUE(stats.count("offload_host_bytes")) << "no offload stats";
  EXPECT_EQ(stats.at("stage"), stage);
  EXPECT_GT(stats.at("offload_host_bytes"), 0);
  EXPECT_EQ(stats.at("offload_pinned_bytes"), stats.at("offload_host_bytes"));
}
}  // namespace

TEST(GpuTraining, ZeroStageTwoCpuOffloadOneRankOnNccl) {
  SKIP_WITHOUT_GPU();
  expect_pinned_offload(check_offload_train(1, "adamw", "adamw", zero_offload(2)));
  expect_pinned_offload(check_offload_train(1, "hybridadam", "adamw", zero_offload(2)));
}

TEST(GpuTraining, ZeroStageTwoCpuOffloadTwoRanksSharingTheGpuOverGloo) {
  SKIP_WITHOUT_GPU();
  expect_pinned_offload(check_offload_train(2, "adamw", "adamw", with(zero_offload(2), {kGloo})));
  // Small buckets: several reductions per backward, each gradient slice still one copy per group.
  expect_pinned_offload(check_offload_train(2, "hybridadam", "adamw",
                                            with(zero_offload(2), {kGloo, "plugin.reduce_bucket_size_in_m=0.0002"})));
}

TEST(GpuTraining, ZeroStageOneCpuOffloadOnTheGpu) {
  SKIP_WITHOUT_GPU();
  expect_pinned_offload(check_offload_train(2, "hybridadam", "adamw", with(zero_offload(1), {kGloo})), 1);
}
