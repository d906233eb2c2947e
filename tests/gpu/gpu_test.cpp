// gpu_test.cpp — booster_gpu_tests: the CUDA device, the NCCL backend and the data-parallel plugins on
// one GPU. Every test skips, with the reason, on a machine where this process sees no CUDA device;
// scripts/gpu_check.sh packs this binary (with dist_worker beside it) for a GPU machine.
//
// What runs on one GPU:
//   - every adapter collective on NCCL at world size 1 (NCCL runs one rank per GPU), and sub-group
//     calls taking part in the parent's communicator split;
//   - every adapter collective with 2 ranks (threads) sharing the GPU over Gloo: CUDA tensors are
//     staged through host memory (process_group_device.cpp);
//   - torch_ddp and low_level_zero (stages 1, 2) training on the GPU, 1 rank on NCCL and 2 ranks
//     sharing the GPU over Gloo, against single-process LibTorch trained on the same GPU (fp32, bf16;
//     fp16 with 2 ranks against 1 rank; torch_fsdp's and gemini's fp16 too);
//   - the device errors a user can meet there.
// Tolerance of the training comparisons: dist_test_util.h's (1e-5 absolute + 1e-4 relative per
// element after 4 steps, fp32): the ranks differ from the reference only in the order of the
// gradient sums.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "booster/booster.h"
#include "booster/device.h"
#include "booster/dist/process_group.h"
#include "common/thread_ranks.h"
#include "dist/dist_common.h"
#include "dist/dist_test_util.h"

using namespace booster::testing;
using booster::dist::ProcessGroup;
using booster::dist::ReduceOp;
using booster::dist::RendezvousOptions;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace booster::testing {
// dist_worker beside this executable (the bundle keeps them together).
std::string worker_beside_exe() {
  return (std::filesystem::canonical("/proc/self/exe").parent_path() / "dist_worker").string();
}
}  // namespace booster::testing

namespace {

at::Tensor cuda_arange(int64_t n, double start, at::ScalarType dtype = at::kFloat) {
  return at::arange(start, start + static_cast<double>(n), at::TensorOptions().dtype(at::kDouble))
      .to(at::TensorOptions().dtype(dtype).device(at::kCUDA));
}

void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_TRUE(got.is_cuda()) << what << ": the result left the GPU";
  EXPECT_TRUE(at::equal(got.to(at::kCPU).to(at::kDouble), want.to(at::kCPU).to(at::kDouble)))
      << what << ": got " << got.to(at::kCPU) << " want " << want.to(at::kCPU);
}

// Every collective of the adapter on CUDA tensors of `g`; rank r contributes r + 1 (and arange
// shifted by r), so each result is known in closed form.
void check_collectives(ProcessGroup& g) {
  const int n = g.size(), r = g.rank();
  const double tri = n * (n + 1) / 2.0;  // 1 + ... + n
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  {
    at::Tensor t = at::full({1000}, r + 1.0, cuda);
    g.allreduce(t).wait();
    expect_equal(t, at::full({1000}, tri), "allreduce SUM");
    at::Tensor a = at::full({7}, r + 1.0, cuda);
    g.allreduce(a, ReduceOp::AVG).wait();
    expect_equal(a, at::full({7}, tri / n), "allreduce AVG");
    at::Tensor m = at::full({5}, r + 1.0, cuda);
    g.allreduce(m, ReduceOp::MAX).wait();
    expect_equal(m, at::full({5}, static_cast<double>(n)), "allreduce MAX");
    at::Tensor b = at::full({513}, r + 1.0, cuda.dtype(at::kBFloat16));
    g.allreduce(b).wait();
    EXPECT_EQ(b.scalar_type(), at::kBFloat16);
    expect_equal(b, at::full({513}, tri), "allreduce bf16");
    std::vector<at::Tensor> several{at::full({3}, r + 1.0, cuda), at::full({2, 2}, 2.0 * (r + 1), cuda)};
    g.allreduce(several).wait();
    expect_equal(several[0], at::full({3}, tri), "allreduce of a list (0)");
    expect_equal(several[1], at::full({2, 2}, 2 * tri), "allreduce of a list (1)");
  }
  {
    at::Tensor t = r == 0 ? cuda_arange(10, 5) : at::zeros({10}, cuda);
    g.broadcast(t, 0).wait();
    expect_equal(t, at::arange(5.0, 15.0), "broadcast");
    at::Tensor red = at::full({4}, r + 1.0, cuda);
    g.reduce(red, 0, ReduceOp::SUM).wait();
    if (r == 0) expect_equal(red, at::full({4}, tri), "reduce");
  }
  {
    std::vector<at::Tensor> outs;
    for (int i = 0; i < n; ++i) outs.push_back(at::empty({3}, cuda));
    g.allgather(outs, cuda_arange(3, 10.0 * r)).wait();
    for (int i = 0; i < n; ++i) expect_equal(outs[i], at::arange(10.0 * i, 10.0 * i + 3), "allgather " + std::to_string(i));
    at::Tensor out = at::empty({n * 4}, cuda);
    g.all_gather_into_tensor(out, cuda_arange(4, 100.0 * r)).wait();
    for (int i = 0; i < n; ++i)
      expect_equal(out.narrow(0, 4 * i, 4), at::arange(100.0 * i, 100.0 * i + 4), "all_gather_into_tensor");
    at::Tensor in_place = at::zeros({n * 4}, cuda);
    in_place.narrow(0, 4 * r, 4).copy_(cuda_arange(4, 100.0 * r));
    at::Tensor mine = in_place.narrow(0, 4 * r, 4);
    g.all_gather_into_tensor(in_place, mine).wait();
    expect_equal(in_place, out, "all_gather_into_tensor in place");
  }
  {
    at::Tensor in = cuda_arange(n * 6, 0) + r;
    at::Tensor out = at::empty({6}, cuda);
    g.reduce_scatter_tensor(out, in).wait();
    expect_equal(out, at::arange(6.0 * r, 6.0 * r + 6) * n + (tri - n), "reduce_scatter_tensor");
    at::Tensor avg = at::empty({6}, cuda);
    g.reduce_scatter_tensor(avg, in, ReduceOp::AVG).wait();
    expect_equal(avg, at::arange(6.0 * r, 6.0 * r + 6) + (tri - n) / n, "reduce_scatter_tensor AVG");
  }
  {
    // Uneven ranges: rank i owns i + 2 elements.
    std::vector<int64_t> counts;
    int64_t total = 0;
    for (int i = 0; i < n; ++i) counts.push_back(i + 2), total += i + 2;
    at::Tensor buffer = at::full({total}, r + 1.0, cuda);
    g.reduce_scatter_in_place(buffer, counts).wait();
    int64_t offset = 0;
    for (int i = 0; i < r; ++i) offset += counts[i];
    expect_equal(buffer.narrow(0, offset, counts[r]), at::full({counts[r]}, tri), "reduce_scatter_in_place");
    at::Tensor gathered = at::zeros({total}, cuda);
    gathered.narrow(0, offset, counts[r]).fill_(r + 1.0);
    g.all_gather_in_place(gathered, counts).wait();
    int64_t o = 0;
    for (int i = 0; i < n; ++i) {
      expect_equal(gathered.narrow(0, o, counts[i]), at::full({counts[i]}, i + 1.0), "all_gather_in_place");
      o += counts[i];
    }
  }
  g.barrier();
  EXPECT_DOUBLE_EQ(g.allreduce_scalar(r + 1.0, ReduceOp::SUM), tri);  // CPU tensors stay on Gloo
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The NCCL backend

TEST(Nccl, EveryCollectiveAtWorldSizeOne) {
  SKIP_WITHOUT_GPU();
  const c10::Device device = booster::select_device("cuda", 0, 1, "nccl");
  EXPECT_EQ(device, c10::Device(c10::kCUDA, 0));
  RendezvousOptions o;
  o.backend = "nccl";
  o.timeout_s = 60;
  auto world = ProcessGroup::rendezvous(o);
  EXPECT_EQ(world->backend(), "nccl");
  check_collectives(*world);
  // A sub-group of the world (a group of one rank has no backend: local copies).
  auto sub = world->new_group({0});
  ASSERT_TRUE(sub);
  check_collectives(*sub);
}

// Sub-groups on NCCL: every group's communicator is made when the group is, bound to the rank's
// device, so a sub-group's can be split from its parent's (ncclCommSplit), and a parent rank that
// gets no communicator from a new_group / split call takes part in that split with
// NCCL_SPLIT_NOCOLOR. At world size 1 every sub-group has one rank, so each call here is the
// NOCOLOR side (the member side needs two GPUs; tests/unit/device_backend_test.cpp checks on the CPU
// who calls which side with which color). The world's collectives must work after each.
TEST(Nccl, SubGroupCallsTakePartInTheSplitAndLeaveTheWorldWorking) {
  SKIP_WITHOUT_GPU();
  booster::select_device("cuda", 0, 1, "nccl");
  RendezvousOptions o;
  o.backend = "nccl";
  o.timeout_s = 60;
  auto world = ProcessGroup::rendezvous(o);
  auto a = world->new_group({0});
  auto b = world->split(0, 0);
  auto none = world->split(-1, 0);
  EXPECT_TRUE(a);
  EXPECT_TRUE(b);
  EXPECT_FALSE(none);
  for (int i = 0; i < 3; ++i) {
    at::Tensor t = at::full({64}, 2.0, at::TensorOptions().device(at::kCUDA));
    world->allreduce(t).wait();
    expect_equal(t, at::full({64}, 2.0), "world allreduce after sub-group calls");
    auto again = world->new_group({0});
    EXPECT_TRUE(again);
  }
}

TEST(Nccl, TwoRanksOnOneGpuAreRefusedWithTheFix) {
  SKIP_WITHOUT_GPU();
  const int count = booster::cuda_device_count();
  EXPECT_THAT([&] { booster::select_device("cuda", count, count + 1, "nccl"); },
              ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("LOCAL_RANK " + std::to_string(count)),
                                                         HasSubstr("one rank per GPU"), HasSubstr("\"gloo\""))));
  EXPECT_THAT([&] { booster::select_device("cuda", 0, count + 1, "nccl"); },
              ThrowsMessage<std::invalid_argument>(HasSubstr(std::to_string(count + 1) + " ranks on this node")));
  // Gloo shares the GPUs: rank `count` takes cuda:0 again.
  EXPECT_EQ(booster::select_device("cuda", count, count + 1, "gloo"), c10::Device(c10::kCUDA, 0));
}

// ---------------------------------------------------------------------------------------------
// Gloo with CUDA tensors: 2 ranks sharing the GPU

TEST(GlooOnGpu, EveryCollectiveWithTwoRanksSharingTheGpu) {
  SKIP_WITHOUT_GPU();
  auto errors = run_thread_ranks(2, [](const std::shared_ptr<ProcessGroup>& g) {
    booster::select_device("cuda", g->rank(), 2, "gloo");
    check_collectives(*g);
    // Point-to-point of a CUDA tensor (Gloo cannot send device memory: staged through the host).
    at::Tensor t = g->rank() == 0 ? cuda_arange(9, 3) : at::zeros({9}, at::TensorOptions().device(at::kCUDA));
    if (g->rank() == 0) g->send(t, 1, 5);
    else g->recv(t, 0, 5);
    expect_equal(t, at::arange(3.0, 12.0), "send/recv");
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

// ---------------------------------------------------------------------------------------------
// Training on the GPU against single-process LibTorch on the same GPU

namespace {
const c10::Device kGpu(c10::kCUDA, 0);
const std::string kCuda = "booster.device=\"cuda\"";
const std::string kGloo = "distributed.backend=\"gloo\"";
// low_level_zero's own precision option defaults to fp16 (ColossalAI's); these compare in fp32.
const std::string kZero = "booster.plugin=\"low_level_zero\"";
const std::string kZeroFp32 = "plugin.precision=\"fp32\"";

// A check_train case whose reference trains on the GPU.
TrainCase gpu_case(int world, const std::string& optimizer, std::vector<std::string> sets, int64_t accum = 1) {
  TrainCase c{};
  c.world = world;
  c.optimizer = optimizer;
  c.sets = std::move(sets);
  c.accum = accum;
  c.device = kGpu;
  return c;
}
}  // namespace

TEST(GpuTraining, TorchDdpOneRankOnNccl) {
  SKIP_WITHOUT_GPU();
  TrainCase c = gpu_case(1, "adamw", {kCuda});
  c.rank0_output_has = "device cuda:0, world size 1 (nccl)";
  check_train(c);
}

TEST(GpuTraining, TorchDdpTwoRanksSharingTheGpuOverGloo) {
  SKIP_WITHOUT_GPU();
  TrainCase c = gpu_case(2, "adamw", {kCuda, kGloo, "plugin.bucket_cap_mb=0.000001", "plugin.first_bucket_mb=0.000001"});
  c.rank0_output_has = "device cuda:0, world size 2 (gloo)";
  EXPECT_EQ(check_train(c)["buckets"], 8);
}

TEST(GpuTraining, TorchDdpClippingAndAccumulationOnTheGpu) {
  SKIP_WITHOUT_GPU();
  TrainCase c = gpu_case(2, "sgd", {kCuda, kGloo, "booster.max_norm=0.05"}, 2);
  c.max_norm = 0.05;
  check_train(c);
}

// bf16 autocast with 1 rank (NCCL) and 2 ranks sharing the GPU (Gloo), against LibTorch under CUDA
// bf16 autocast on the same GPU. One rank runs the reference's kernels on the same batch (AdamW,
// equal up to the fp32 tolerance). Two ranks run each bf16 matrix product on half the batch and sum
// fp32 gradients in another order; bf16 rounds activations to 2^-8 relative, so the parameters
// differ by the learning rate times that rounding: SGD (lr 0.1, momentum 0.9), 4 steps, within 2e-2
// relative + 1e-3 absolute. (With AdamW, whose step is about lr for any gradient, a near-zero
// gradient that changes sign moves a weight by 2 lr: measured 1.0e-2 on an H200.)
TEST(GpuTraining, TorchDdpBf16AutocastOneAndTwoRanks) {
  SKIP_WITHOUT_GPU();
  TrainCase one = gpu_case(1, "adamw", {kCuda, "booster.mixed_precision=\"bf16\""});
  one.autocast_bf16 = true;
  check_train(one);
  TrainCase two = gpu_case(2, "sgd", {kCuda, kGloo, "booster.mixed_precision=\"bf16\""});
  two.autocast_bf16 = true;
  two.rtol = 2e-2;
  two.atol = 1e-3;
  check_train(two);
}

TEST(GpuTraining, LowLevelZeroStagesOneAndTwo) {
  SKIP_WITHOUT_GPU();
  for (int stage : {1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    check_train(gpu_case(1, "adamw", {kCuda, kZero, kZeroFp32, "plugin.stage=" + std::to_string(stage)}));
    check_train(gpu_case(2, "adamw", {kCuda, kGloo, kZero, kZeroFp32, "plugin.stage=" + std::to_string(stage)}));
  }
}

// low_level_zero with bf16 weights and fp32 master slices (plugin.precision = "bf16"), stages 1 and
// 2, 1 rank (NCCL) and 2 ranks sharing the GPU (Gloo), against LibTorch under CUDA bf16 autocast on
// the same GPU: the tolerance of TorchDdpBf16AutocastOneAndTwoRanks (SGD, 2e-2 relative + 1e-3),
// which also covers the bf16 weights' own rounding (2^-9 relative).
TEST(GpuTraining, LowLevelZeroBf16OneAndTwoRanks) {
  SKIP_WITHOUT_GPU();
  for (int stage : {1, 2}) {
    for (int world : {1, 2}) {
      SCOPED_TRACE("stage " + std::to_string(stage) + ", " + std::to_string(world) + " rank(s)");
      std::vector<std::string> sets{kCuda, kZero, "plugin.precision=\"bf16\"", "plugin.stage=" + std::to_string(stage)};
      if (world == 2) sets.push_back(kGloo);
      TrainCase c = gpu_case(world, "sgd", sets);
      c.autocast_bf16 = true;
      c.rtol = 2e-2;
      c.atol = 1e-3;
      check_train(c);
    }
  }
}

namespace {
// dist_worker's "train" scenario (the MLP, 4 SGD steps, lr 0.1, momentum 0.9) on a global batch of 8
// samples split over `world` ranks, with `sets`; rank 0's parameters as float32 on the CPU (every
// rank's must equal them).
std::vector<at::Tensor> train_mlp(int world, const std::vector<std::string>& sets) {
  TempDir dir;
  std::vector<std::string> args{"scenario=train", "out=" + dir.path(), "steps=4", "batch=" + std::to_string(8 / world),
                                "accum=1", "optimizer=sgd"};
  for (const auto& s : sets) args.push_back("set=" + s);
  expect_all_ok(run_workers(world, args));
  std::vector<at::Tensor> rank0 = load_tensors(dir.file("rank0.pt"));
  for (int r = 1; r < world; ++r)
    expect_close(load_tensors(dir.file("rank" + std::to_string(r) + ".pt")), rank0, "rank " + std::to_string(r), 0, 0);
  for (auto& t : rank0) t = t.to(at::kFloat);
  return rank0;
}
}  // namespace

// fp16 (fp16 weights, fp32 masters, the dynamic loss scaler from 1024) under torch_ddp,
// low_level_zero stages 1 and 2, torch_fsdp and gemini with 2 ranks sharing the GPU over Gloo, against the same training on
// 1 rank (NCCL), which GpuFp16.* checks against PyTorch's GradScaler. The ranks compute fp16
// gradients of half the batch and sum them in another order, so the fp32 masters differ by float
// rounding and the fp16 weights by at most 2 fp16 ulps of each tensor's largest weight
// (2^-9 x max |w|) + 1e-5, GpuFp16's bound. Against fp32 LibTorch on the same GPU: within
// TorchDdpBf16AutocastOneAndTwoRanks's bf16 band (2e-2 relative + 1e-3), a check that the fp16
// training trains (a step lost or applied twice moves weights by lr x gradient, ~1e-2).
TEST(GpuTraining, Fp16TwoRanksSharingTheGpuEqualOneRank) {
  SKIP_WITHOUT_GPU();
  const std::vector<at::Tensor> fp32 = reference_mlp(4, 8, "sgd", 0, 2.0, nullptr, kGpu);
  struct Case {
    std::string name;
    std::vector<std::string> sets;
  };
  const std::vector<Case> cases{
      {"torch_ddp", {kCuda, "booster.mixed_precision=\"fp16\"", "mixed_precision.initial_scale=1024"}},
      {"low_level_zero stage 1", {kCuda, kZero, "plugin.precision=\"fp16\"", "plugin.initial_scale=1024", "plugin.stage=1"}},
      {"low_level_zero stage 2", {kCuda, kZero, "plugin.precision=\"fp16\"", "plugin.initial_scale=1024", "plugin.stage=2"}},
      // torch_fsdp: fp16 gathered parameters and gradients, fp32 shards.
      {"torch_fsdp", {kCuda, "booster.plugin=\"torch_fsdp\"", "plugin.sync_module_states=true",
                      "plugin.mixed_precision.param_dtype=\"fp16\"", "plugin.mixed_precision.initial_scale=1024"}},
      // Gemini: fp16 chunks (2 of the MLP's 4 layers each), fp32 master shards, the scaler decorating its step.
      {"gemini", {kCuda, "booster.plugin=\"gemini\"", "plugin.precision=\"fp16\"", "plugin.initial_scale=1024",
                  "plugin.min_chunk_size_m=0.0005", "plugin.search_range_m=0", "plugin.hidden_dim=16"}}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<at::Tensor> one = train_mlp(1, c.sets);
    std::vector<std::string> two_sets = c.sets;
    two_sets.push_back(kGloo);
    const std::vector<at::Tensor> two = train_mlp(2, two_sets);
    ASSERT_EQ(one.size(), fp32.size());
    ASSERT_EQ(two.size(), fp32.size());
    double apart = 0, from_fp32 = 0;
    for (size_t i = 0; i < one.size(); ++i) {
      const double diff = (two[i] - one[i]).abs().max().item<double>();
      EXPECT_LE(diff, one[i].abs().max().item<double>() / 512 + 1e-5) << "parameter " << i;
      apart = std::max(apart, diff);
      from_fp32 = std::max(from_fp32, (one[i] - fp32[i]).abs().max().item<double>());
    }
    expect_close(one, fp32, c.name + " fp16, 1 rank, against fp32", 2e-2, 1e-3);
    expect_close(two, fp32, c.name + " fp16, 2 ranks, against fp32", 2e-2, 1e-3);
    std::cout << "[ compare  ] " << c.name << " fp16: max |2 ranks - 1 rank| = " << apart
              << ", max |1 rank - fp32 LibTorch| = " << from_fp32 << std::endl;
  }
}
