// gpu_precision_test.cpp — mixed precision on one GPU (part of booster_gpu_tests; every test skips
// with the reason where no CUDA device is visible).
//
//   - fp16 (fp16 weights, fp32 master weights, the dynamic loss scaler with hysteresis 1) under
//     torch_ddp and low_level_zero stages 1 and 2, against PyTorch 2.11 on the same GPU: the same MLP,
//     data and SGD, trained with torch.autocast("cuda", float16) and torch.amp.GradScaler. The run
//     starts at a loss scale of 2^30, so its first steps overflow and are skipped. Expected: the
//     same loss scale and the same skip decision at every step (exact), and the parameters the
//     Booster saves (its fp16 parameters: the round-to-nearest of its fp32 masters) equal to
//     PyTorch's fp32 parameters rounded to fp16 within 2 fp16 ulps of each tensor's largest weight
//     (2^-9 x max |w|) + 1e-5. Both run the same fp16 forward and backward and the same fp32 update;
//     measured on an H100: 1.2e-4 at most after 24 steps (weights up to ~0.5). A wrong loss scale,
//     unscale or master update moves weights by lr x gradient, ~1e-2.
//   - bf16 autocast under torch_ddp on one rank against single-process LibTorch under CUDA bf16
//     autocast on the same GPU: the same kernels on the same data, so equal to 1e-6.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "booster/booster.h"
#include "booster/checkpoint/safetensors.h"
#include "booster/device.h"
#include "common/test_util.h"
#include "dist/dist_common.h"

using namespace booster::testing;

namespace {

constexpr int64_t kSteps = 24, kBatch = 8;

// The PyTorch side of the fp16 comparison: argv = data.safetensors out.safetensors steps.
const char* kPeer = R"PY(
import sys, torch
from safetensors.torch import load_file, save_file
d = load_file(sys.argv[1])
steps = int(sys.argv[3])
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                          torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).cuda()
layers = {"l1": net[0], "l2": net[2], "l3": net[4], "l4": net[6]}
with torch.no_grad():
    for name, layer in layers.items():
        layer.weight.copy_(d[name + ".weight"])
        layer.bias.copy_(d[name + ".bias"])
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 30, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
scales, skipped = [], []
for s in range(steps):
    x, y = d["x%d" % s].cuda(), d["y%d" % s].cuda()
    with torch.autocast("cuda", dtype=torch.float16):
        out = net(x)
    loss = torch.nn.functional.mse_loss(out.float(), y)
    scale = scaler.get_scale()
    scales.append(scale)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    skipped.append(1.0 if scaler.get_scale() < scale else 0.0)
    opt.zero_grad()
result = {"scales": torch.tensor(scales, dtype=torch.float64), "skipped": torch.tensor(skipped, dtype=torch.float64)}
for name, layer in layers.items():
    result[name + ".weight"] = layer.weight.detach().float().cpu().contiguous()
    result[name + ".bias"] = layer.bias.detach().float().cpu().contiguous()
save_file(result, sys.argv[2])
)PY";

std::string python() {
  const char* env = std::getenv("BOOSTER_PYTHON");
  return env && *env ? env : "python3";
}

struct Fp16Run {
  std::vector<double> scales, skipped;
  std::map<std::string, at::Tensor> params;  // fp32, CPU
};

// The data both sides train on: the MLP's initial parameters (seed 7) and kSteps batches.
booster::checkpoint::StateDict fp16_data() {
  torch::manual_seed(7);
  MLP net;
  booster::checkpoint::StateDict d;
  for (const auto& item : net->named_parameters()) d.emplace_back(item.key(), item.value().detach().clone());
  auto batches = make_batches(kSteps, kBatch, 31);
  for (int64_t s = 0; s < kSteps; ++s) {
    d.emplace_back("x" + std::to_string(s), batches.inputs[s]);
    d.emplace_back("y" + std::to_string(s), batches.targets[s]);
  }
  return d;
}

Fp16Run run_peer(const TempDir& dir) {
  booster::checkpoint::write_safetensors(dir.file("data.safetensors"), fp16_data());
  std::ofstream(dir.file("peer.py")) << kPeer;
  const std::string cmd = python() + " " + dir.file("peer.py") + " " + dir.file("data.safetensors") + " " +
                          dir.file("torch.safetensors") + " " + std::to_string(kSteps) + " 2>&1";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << cmd << " failed (PyTorch 2.11 with CUDA and safetensors must be importable by " << python()
                   << "; set BOOSTER_PYTHON)";
  Fp16Run run;
  if (rc != 0) return run;
  for (auto& [name, t] : booster::checkpoint::load_safetensors(dir.file("torch.safetensors"))) {
    if (name == "scales") for (int64_t i = 0; i < t.numel(); ++i) run.scales.push_back(t[i].item<double>());
    else if (name == "skipped") for (int64_t i = 0; i < t.numel(); ++i) run.skipped.push_back(t[i].item<double>());
    else run.params[name] = t;
  }
  return run;
}

// The same training through the Booster on cuda:0 (world size 1, NCCL), `extra` TOML in [booster]
// and after it.
Fp16Run run_booster(const std::string& toml) {
  auto config = booster::Config::from_string(toml, "fp16.toml");
  booster::Booster booster(config);
  torch::manual_seed(7);
  MLP net;
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  booster::Criterion mse = [](const torch::Tensor& out, const torch::Tensor& y) { return torch::mse_loss(out, y); };
  auto boosted = booster.boost(net.ptr(), sgd, mse);
  auto data = fp16_data();
  std::map<std::string, at::Tensor> by_name(data.begin(), data.end());
  Fp16Run run;
  for (int64_t s = 0; s < kSteps; ++s) {
    auto x = by_name.at("x" + std::to_string(s)).to(booster.device());
    auto y = by_name.at("y" + std::to_string(s)).to(booster.device());
    const double scale = boosted.optimizer->loss_scale();
    const int64_t skipped_before = boosted.optimizer->skipped_steps();
    auto loss = boosted.criterion(boosted.model.forward(x), y);
    booster.backward(loss, *boosted.optimizer);
    boosted.optimizer->step();
    boosted.optimizer->zero_grad();
    run.scales.push_back(scale);
    run.skipped.push_back(boosted.optimizer->skipped_steps() > skipped_before ? 1.0 : 0.0);
  }
  // The parameters through a model save: the model's fp16 parameters, read back as fp32.
  TempDir dir;
  booster.save_model(boosted.model, dir.file("model"));
  for (auto& [name, t] : booster::checkpoint::load_state_dict(dir.file("model"))) run.params[name] = t.to(at::kFloat);
  return run;
}

void expect_same_training(const Fp16Run& ours, const Fp16Run& torch_run, const std::string& what) {
  EXPECT_EQ(ours.scales, torch_run.scales) << what << ": loss scale per step";
  EXPECT_EQ(ours.skipped, torch_run.skipped) << what << ": skipped steps";
  double skipped = 0;
  for (double v : torch_run.skipped) skipped += v;
  EXPECT_GE(skipped, 2) << "the run should overflow at its first steps";
  ASSERT_EQ(ours.params.size(), torch_run.params.size()) << what;
  double max_diff = 0;
  for (const auto& [name, want] : torch_run.params) {
    ASSERT_TRUE(ours.params.count(name)) << what << ": no " << name;
    const at::Tensor got = ours.params.at(name);
    const at::Tensor want16 = want.to(at::kHalf).to(at::kFloat);
    const double diff = (got - want16).abs().max().item<double>();
    const double bound = want16.abs().max().item<double>() / 512 + 1e-5;
    EXPECT_LE(diff, bound) << what << " " << name;
    max_diff = std::max(max_diff, diff);
  }
  std::cout << "[ compare  ] " << what << ": max |booster - PyTorch| = " << max_diff << std::endl;
}

const std::string kScaler = "initial_scale = 1073741824.0\ngrowth_interval = 3\nhysteresis = 1\n";

}  // namespace

TEST(GpuFp16, TorchDdpMatchesPyTorchGradScaler) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  Fp16Run torch_run = run_peer(dir);
  if (torch_run.scales.empty()) return;
  Fp16Run ours = run_booster("[booster]\nplugin = \"torch_ddp\"\ndevice = \"cuda\"\nmixed_precision = \"fp16\"\n"
                             "[mixed_precision]\n" + kScaler);
  expect_same_training(ours, torch_run, "torch_ddp fp16");
}

TEST(GpuFp16, LowLevelZeroMatchesPyTorchGradScaler) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  Fp16Run torch_run = run_peer(dir);
  if (torch_run.scales.empty()) return;
  for (int stage : {1, 2}) {
    Fp16Run ours = run_booster("[booster]\nplugin = \"low_level_zero\"\ndevice = \"cuda\"\n[plugin]\nprecision = \"fp16\"\n"
                               "stage = " + std::to_string(stage) + "\n" + kScaler);
    expect_same_training(ours, torch_run, "low_level_zero stage " + std::to_string(stage) + " fp16");
  }
}

TEST(GpuBf16, TorchDdpAutocastEqualsSingleProcessAutocast) {
  SKIP_WITHOUT_GPU();
  const c10::Device gpu(c10::kCUDA, 0);
  auto batches = make_batches(4, kBatch, 11);
  auto train = [&](bool through_booster) {
    torch::manual_seed(7);
    MLP net;
    auto opt = make_optimizer("adamw", net->parameters());
    std::vector<torch::Tensor> out;
    if (through_booster) {
      booster::Booster booster(booster::Config::from_string(
          "[booster]\nplugin = \"torch_ddp\"\ndevice = \"cuda\"\nmixed_precision = \"bf16\"\n", "bf16.toml"));
      booster::Criterion mse = [](const torch::Tensor& o, const torch::Tensor& y) { return torch::mse_loss(o, y); };
      auto b = booster.boost(net.ptr(), opt, mse);
      for (int64_t s = 0; s < 4; ++s) {
        auto y_hat = b.model.forward(batches.inputs[s].to(gpu));
        EXPECT_EQ(y_hat.scalar_type(), at::kBFloat16) << "the forward should run under CUDA bf16 autocast";
        booster.backward(b.criterion(y_hat, batches.targets[s].to(gpu)), *b.optimizer);
        b.optimizer->step();
        b.optimizer->zero_grad();
      }
    } else {
      net->to(gpu);
      for (int64_t s = 0; s < 4; ++s) {
        at::Tensor y_hat;
        {
          at::autocast::set_autocast_enabled(at::kCUDA, true);
          at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
          at::autocast::increment_nesting();
          y_hat = net->forward(batches.inputs[s].to(gpu));
          if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
          at::autocast::set_autocast_enabled(at::kCUDA, false);
        }
        torch::mse_loss(y_hat.to(at::kFloat), batches.targets[s].to(gpu)).backward();
        opt->step();
        opt->zero_grad();
      }
    }
    for (auto& p : net->parameters()) out.push_back(p.detach().to(at::kCPU).clone());
    return out;
  };
  auto want = train(false);
  auto got = train(true);
  ASSERT_EQ(got.size(), want.size());
  double max_diff = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].scalar_type(), at::kFloat) << "bf16 autocast keeps fp32 parameters";
    max_diff = std::max(max_diff, (got[i] - want[i]).abs().max().item<double>());
  }
  EXPECT_LE(max_diff, 1e-6);
  std::cout << "[ compare  ] torch_ddp bf16 autocast, 1 rank: max |booster - LibTorch| = " << max_diff << std::endl;
}
