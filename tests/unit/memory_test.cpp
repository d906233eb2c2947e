// memory_test.cpp — MemoryReport's line (the CPU one, and the device part of a report on an
// accelerator) and its host/device split; where the model states are on the CPU: the Booster's
// report of a CPU run keeps everything on the host and its CPU line, ZeRO's cpu_offload on the CPU
// pins nothing and says so in the plugin's stats, and the estimate places a "cuda" request's memory
// on the device (a device column, CPU-only plugins not estimated) while a CPU request's table stays
// as it was (the same on a GPU: tests/gpu/gpu_memory_test.cpp); and process_memory(): touching fresh
// memory raises the resident size, the peak and the minor-fault count by what was touched; the
// memory visitor: MemoryReportBuilder's sums and a wrapper describing its parts to any visitor.
#include "booster/core/memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "booster/booster.h"
#include "booster/core/memory_estimate.h"
#include "booster/estimate.h"
#include "booster/optim/cpu_adam.h"
#include "booster/wrappers/zero_optimizer.h"
#include "common/tensor_test_util.h"
#include "common/test_util.h"

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MemoryReport, LineNamesEveryPartAndTheHeldCacheOnlyWhenThereIsOne) {
  booster::MemoryReport r;
  r.parameters = 3 << 20;
  r.gradients = 3 << 20;
  r.optimizer_states = 6 << 20;
  r.communication_buffers = 1 << 20;
  EXPECT_EQ(r.model_states(), 12 << 20);
  EXPECT_EQ(r.to_string(), "params 3.0 MiB, grads 3.0 MiB, master weights 0.0 MiB, optimizer states 6.0 MiB, "
                           "communication buffers 1.0 MiB; model states 12.0 MiB");
  r.host_cache_held = 5 << 19;
  EXPECT_THAT(r.to_string(), HasSubstr("; host cache holds 2.5 MiB free"));
}

// A report of a CPU run: the line is the CPU one whatever the split fields hold (nothing is on a device).
TEST(MemoryReport, ACpuReportKeepsTheCpuLine) {
  booster::MemoryReport r;
  EXPECT_EQ(r.device, "cpu");
  EXPECT_FALSE(r.on_accelerator());
  r.parameters = 3 << 20;
  r.optimizer_states = 6 << 20;
  EXPECT_EQ(r.model_states_on_device(), 0);
  EXPECT_EQ(r.model_states_on_host(), 9 << 20);
  const std::string cpu_line = "params 3.0 MiB, grads 0.0 MiB, master weights 0.0 MiB, optimizer states 6.0 MiB, "
                               "communication buffers 0.0 MiB; model states 9.0 MiB";
  EXPECT_EQ(r.to_string(), cpu_line);
  r.device = "";  // unset: as "cpu"
  r.device_allocated = 1 << 20;
  EXPECT_EQ(r.to_string(), cpu_line);
}

// A report on a GPU, as ZeRO stage 2 with cpu_offload makes it: parameters, gradients and buckets
// on the device, master weights and optimizer states in pinned host memory.
TEST(MemoryReport, ADeviceReportSaysWhereTheModelStatesAreAndWhatTheAllocatorHolds) {
  booster::MemoryReport r;
  r.device = "cuda:0";
  r.parameters = r.parameters_on_device = 4 << 20;
  r.gradients = r.gradients_on_device = 2 << 20;
  r.master_weights = 2 << 20;
  r.optimizer_states = 4 << 20;
  r.communication_buffers = r.communication_buffers_on_device = 1 << 20;
  r.pinned_host_bytes = 6 << 20;
  r.device_allocated = 7 << 20;
  r.device_peak_allocated = 9 << 20;
  r.device_reserved = 20 << 20;
  r.device_peak_reserved = 22 << 20;
  EXPECT_TRUE(r.on_accelerator());
  EXPECT_EQ(r.model_states(), 12 << 20);
  EXPECT_EQ(r.model_states_on_device(), 6 << 20);
  EXPECT_EQ(r.model_states_on_host(), 6 << 20);
  EXPECT_EQ(r.to_string(),
            "params 4.0 MiB, grads 2.0 MiB, master weights 2.0 MiB, optimizer states 4.0 MiB, communication buffers "
            "1.0 MiB; model states 12.0 MiB; on cuda:0: params 4.0 MiB, grads 2.0 MiB, master weights 0.0 MiB, "
            "optimizer states 0.0 MiB, communication buffers 1.0 MiB; model states 6.0 MiB; on the host: model states "
            "6.0 MiB (6.0 MiB pinned); cuda:0 allocator: allocated 7.0 MiB (peak 9.0), reserved 20.0 MiB (peak 22.0)");
  // The host cache's part stays between the CPU figures and the device part.
  r.host_cache_held = 1 << 20;
  EXPECT_THAT(r.to_string(), HasSubstr("model states 12.0 MiB; host cache holds 1.0 MiB free; on cuda:0: params"));
}

TEST(MemoryVisitor, TheBuilderSumsEachCategoryAndItsPlaces) {
  booster::MemoryReportBuilder b;
  EXPECT_TRUE(b.report().located);
  booster::PlacedBytes grads;
  grads.total = 100;
  grads.on_device = 60;
  grads.pinned = 30;
  b.visit(booster::MemoryCategory::kGradients, grads);
  b.visit_planned(booster::MemoryCategory::kGradients, 7, /*on_device=*/true);
  b.visit_planned(booster::MemoryCategory::kOptimizerStates, 50, /*on_device=*/false, /*pinned=*/true);
  b.visit_planned(booster::MemoryCategory::kCommunicationBuffers, 9, false, /*pinned=*/true);  // not a model state
  b.visit(booster::MemoryCategory::kMasterWeights, torch::zeros({4, 8}), false);             // 128 bytes, host
  b.visit(booster::MemoryCategory::kParameters, torch::Tensor(), false);                     // nothing
  const booster::MemoryReport& r = b.report();
  EXPECT_EQ(r.gradients, 107);
  EXPECT_EQ(r.gradients_on_device, 67);
  EXPECT_EQ(r.optimizer_states, 50);
  EXPECT_EQ(r.optimizer_states_on_device, 0);
  EXPECT_EQ(r.communication_buffers, 9);
  EXPECT_EQ(r.master_weights, 128);
  EXPECT_EQ(r.parameters, 0);
  EXPECT_EQ(r.pinned_host_bytes, 80);  // the gradients' 30 and the states' 50
}

// A visitor of its own sees each part the wrapper holds, and memory_report() is their sum.
TEST(MemoryVisitor, AWrapperDescribesItsPartsToAnyVisitor) {
  struct Listing : booster::MemoryVisitor {
    std::map<booster::MemoryCategory, std::vector<int64_t>> seen;
    void visit(booster::MemoryCategory c, const booster::PlacedBytes& b) override { seen[c].push_back(b.total); }
    using booster::MemoryVisitor::visit;
  };
  torch::manual_seed(0);
  torch::nn::Linear fc(8, 4);  // weight 32 + bias 4 floats
  auto opt = std::make_shared<torch::optim::AdamW>(fc->parameters(), torch::optim::AdamWOptions(1e-3));
  booster::OptimizerWrapper wrapper(opt, nullptr);
  Listing list;
  wrapper.visit_memory(list);
  EXPECT_EQ(list.seen[booster::MemoryCategory::kGradients], (std::vector<int64_t>{128, 16}));
  EXPECT_EQ(list.seen[booster::MemoryCategory::kOptimizerStates], (std::vector<int64_t>{2 * 144}));  // planned
  EXPECT_EQ(list.seen.count(booster::MemoryCategory::kMasterWeights), 0u);  // fp32: no master copies
  const booster::MemoryReport r = wrapper.memory_report();
  EXPECT_EQ(r.gradients, 144);
  EXPECT_EQ(r.optimizer_states, 288);
  EXPECT_TRUE(r.located);
}

TEST(ProcessMemory, TouchingFreshPagesShowsInRssPeakAndFaults) {
  constexpr size_t kBytes = 64 << 20;
  const booster::ProcessMemory before = booster::process_memory();
  ASSERT_GT(before.rss_bytes, 0);
  ASSERT_GE(before.peak_rss_bytes, before.rss_bytes);
  ASSERT_GE(before.minor_faults, 0);
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(p, 1, kBytes);
  const booster::ProcessMemory during = booster::process_memory();
  ::munmap(p, kBytes);
  const booster::ProcessMemory after = booster::process_memory();
  EXPECT_GE(during.rss_bytes - before.rss_bytes, static_cast<int64_t>(kBytes) * 9 / 10);
  EXPECT_GE(during.peak_rss_bytes, during.rss_bytes - (1 << 20));
  // 4 KiB pages: 16384 faults; with transparent huge pages fewer, but at least one per 2 MiB.
  EXPECT_GE(during.minor_faults - before.minor_faults, 32);
  EXPECT_LT(after.rss_bytes, during.rss_bytes - static_cast<int64_t>(kBytes) / 2);
  // The kernel's per-thread RSS counters are folded in lazily: allow 1 MiB of skew.
  EXPECT_GE(after.peak_rss_bytes, during.rss_bytes - (1 << 20));
}

namespace memory_report_test {

// A Booster from TOML text (the first one in the process launches a world of one).
booster::Booster booster_from(const std::string& toml) {
  booster::testing::ScopedEnv env;
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"}) env.unset(v);
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  return booster::Booster(booster::Config::from_string(toml, "memory_report_test.toml"));
}

}  // namespace memory_report_test

// ZeRO stage 2 with cpu_offload and HybridAdam on the CPU: everything is host memory, nothing pinned;
// the line is the CPU one; stats() gives the offloaded bytes, none pinned.
TEST(MemoryReportOnCpu, ZeroCpuOffloadIsAllHostMemoryAndNothingIsPinned) {
  auto booster = memory_report_test::booster_from(
      "[booster]\nplugin = \"low_level_zero\"\n[plugin]\nprecision = \"fp32\"\nstage = 2\ncpu_offload = true\n");
  torch::nn::Linear net(4, 2);  // 10 parameters
  auto adam = std::make_shared<booster::optim::HybridAdam>(net->parameters(), booster::optim::CPUAdamOptions(1e-2));
  auto boosted = booster.boost(net, adam);
  booster.backward(torch::mse_loss(boosted.model.forward(torch::randn({3, 4})), torch::randn({3, 2})),
                   *boosted.optimizer);
  boosted.optimizer->step();
  const booster::MemoryReport r = booster.memory_report(boosted.model, boosted.optimizer.get());
  EXPECT_EQ(r.device, "cpu");
  EXPECT_EQ(r.parameters, 10 * 4);
  EXPECT_EQ(r.gradients, 10 * 4);  // the gradient shard (world of one)
  EXPECT_EQ(r.master_weights, 10 * 4);
  EXPECT_EQ(r.optimizer_states, 2 * 10 * 4);
  EXPECT_EQ(r.model_states_on_device(), 0);
  EXPECT_EQ(r.communication_buffers_on_device, 0);
  EXPECT_EQ(r.model_states_on_host(), r.model_states());
  EXPECT_EQ(r.pinned_host_bytes, 0);
  EXPECT_EQ(r.device_allocated, 0);
  EXPECT_THAT(r.to_string(), Not(HasSubstr(" on ")));
  EXPECT_THAT(r.to_string(), Not(HasSubstr("allocator")));
  auto zero = std::dynamic_pointer_cast<booster::ZeroOptimizer>(boosted.optimizer);
  ASSERT_NE(zero, nullptr);
  EXPECT_FALSE(zero->offloads_from_device());
  auto stats = boosted.model.hooks().stats();
  EXPECT_EQ(stats["offload_host_bytes"], 10 * 4 + 2 * 10 * 4);
  EXPECT_EQ(stats["offload_pinned_bytes"], 0);
}

// Without cpu_offload the stats carry no offload keys.
TEST(MemoryReportOnCpu, ZeroWithoutOffloadHasNoOffloadStats) {
  auto booster = memory_report_test::booster_from(
      "[booster]\nplugin = \"low_level_zero\"\n[plugin]\nprecision = \"fp32\"\nstage = 1\n");
  torch::nn::Linear net(4, 2);
  auto adam = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-2));
  auto boosted = booster.boost(net, adam);
  EXPECT_EQ(boosted.model.hooks().stats().count("offload_host_bytes"), 0u);
  const booster::MemoryReport r = booster.memory_report(boosted.model, boosted.optimizer.get());
  EXPECT_TRUE(r.located);  // ZeRO places its own figures
  EXPECT_EQ(r.model_states_on_device(), 0);
}

// The estimate of a "cuda" request puts what a configuration holds on the device; a CPU request has
// no device figures and its table no device columns.
TEST(MemoryReportOnCpu, EstimateOfACudaRequestIsOnTheDevice) {
  booster::EstimateRequest r;
  r.parameters = r.largest_parameter = r.largest_unit = 1 << 20;
  r.world_size = 2;
  const booster::MemoryEstimate cpu = booster::zero_estimate(r, 2, r.parameters, 2, 4, 1 << 18, r.largest_parameter);
  EXPECT_EQ(cpu.device_bytes, 0);
  EXPECT_EQ(cpu.host_total(), cpu.total());
  EXPECT_EQ(cpu.states.model_states_on_device(), 0);
  r.device = "cuda";
  const booster::MemoryEstimate gpu = booster::zero_estimate(r, 2, r.parameters, 2, 4, 1 << 18, r.largest_parameter);
  EXPECT_EQ(gpu.total(), cpu.total());  // the same figures, placed
  EXPECT_EQ(gpu.device_bytes, gpu.total());
  EXPECT_EQ(gpu.host_total(), 0);
  EXPECT_EQ(gpu.states.model_states_on_device(), gpu.states.model_states());
  EXPECT_EQ(gpu.states.communication_buffers_on_device, gpu.states.communication_buffers);
  const booster::MemoryEstimate ddp = booster::replicated_estimate(r, r.parameters, 4, false, 0, r.largest_parameter);
  EXPECT_EQ(ddp.device_bytes, ddp.total());
  EXPECT_EQ(ddp.states.parameters_on_device, ddp.states.parameters);
}

// Every installed plugin estimates a cuda request; Gemini's offloading rows keep the optimizer side off
// the device.
TEST(MemoryReportOnCpu, EstimateTableOfACudaRequestHasDeviceColumnsAndOnlyCudaPlugins) {
  booster::testing::ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  booster::EstimateRequest r;
  r.parameters = r.largest_unit = r.largest_parameter = 1000;
  r.world_size = 2;
  const booster::EstimateTable cpu_table = booster::estimate_installed_plugins(r, booster::testing::world_of_one());
  const std::string cpu_text = booster::format_estimate_table(r, cpu_table, 100 << 20, 1 << 30, 8 << 20);
  EXPECT_THAT(cpu_text, HasSubstr("fits in 1024.0"));
  EXPECT_THAT(cpu_text, Not(HasSubstr("on cuda")));
  EXPECT_THAT(cpu_text, Not(HasSubstr("host fits")));
  // The device budget is ignored for a CPU request: the same table as without it.
  EXPECT_EQ(cpu_text, booster::format_estimate_table(r, cpu_table, 100 << 20, 1 << 30));

  r.device = "cuda";
  const booster::EstimateTable table = booster::estimate_installed_plugins(r, booster::testing::world_of_one());
  std::map<std::string, int> rows;
  for (const auto& e : table.rows) {
    ++rows[e.plugin];
    const bool offloaded = e.plugin == "gemini" && e.configuration.find("offload_optim_frac = 1") != std::string::npos;
    if (!offloaded) {
      EXPECT_EQ(e.device_bytes, e.total()) << e.plugin << ": " << e.configuration;
      continue;
    }
    // Gemini's optimizer side in pinned host memory or a file: the gradient shards, master shards
    // and states are off the device; the parameters, the backward's buffers and activations on it.
    EXPECT_EQ(e.states.parameters_on_device, e.states.parameters) << e.configuration;
    EXPECT_EQ(e.states.pinned_host_bytes, e.states.gradients + e.states.master_weights + e.states.optimizer_states)
        << e.configuration;
    EXPECT_LT(e.device_bytes, e.total() - e.states.gradients) << e.configuration;
    EXPECT_GE(e.device_bytes, e.states.parameters) << e.configuration;
  }
  for (const std::string plugin : {"torch_ddp", "low_level_zero", "torch_fsdp", "hybrid_parallel"})
    EXPECT_GT(rows[plugin], 0) << plugin;
  // Gemini: everything on the device; the optimizer side in pinned host memory; in an offload_dir file.
  EXPECT_EQ(rows["gemini"], 3);
  std::string failed;
  for (const auto& f : table.failed) failed += f + "\n";
  EXPECT_THAT(failed, Not(HasSubstr("gemini")));
  const std::string text = booster::format_estimate_table(r, table, 100 << 20, 1 << 30, 8 << 20);
  EXPECT_THAT(text, HasSubstr("on cuda"));
  EXPECT_THAT(text, HasSubstr("fits on cuda in 8.0"));
  EXPECT_THAT(text, HasSubstr("host fits in 1024.0"));
  EXPECT_THAT(booster::format_estimate_table(r, table, 100 << 20, 1 << 30), Not(HasSubstr("fits on cuda")));
}
