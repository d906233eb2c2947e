// bench_cuda_kernels — the CUDA kernels of kernels/cuda (booster/kernels/cuda_adam.h) against what
// PyTorch runs for the same work, on one GPU, in one process, on the same tensors:
//   Adam     multi_tensor_adam vs at::_fused_adamw_ (what torch.optim.AdamW(fused=True) calls), fp32
//            params, grads and moments, AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01),
//            on 100M params in 1 tensor, 1B params in 1 tensor (skipped, with the reason printed,
//            when less than 24 GB of device memory is free) and 10M params in 2000 tensors of 5000.
//   scale    multi_tensor_scale (fp32 -> fp32, with a found-inf flag) vs a device-to-device copy
//            (dst.copy_(src)) of the same 256 MiB: bandwidth = bytes read + written / time.
//   l2norm   multi_tensor_l2norm (total and per-tensor norms) vs at::_foreach_norm on 1B and 100M
//            fp32 elements: bandwidth = bytes read / time.
// Timing: CUDA events on the current stream around each call; `--warmup` untimed calls of each, then
// `--iters` timed rounds, each round one call of ours then one of PyTorch's (interleaved); the median
// of each. Adam's step number stays fixed, so every timed step does the same work.
// Correctness, printed and not asserted: one AdamW step of each from the same state on the 100M
// tensor (max relative difference of param, exp_avg, exp_avg_sq), and the two norms of 100M elements.
//
//   bench_cuda_kernels [--out FILE] [--iters N] [--warmup N]
//
// Prints the GPU and a markdown table (measure | ours | PyTorch | ratio), also written to FILE.
// Without a CUDA device it prints "SKIPPED: no CUDA device" and exits 0.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "booster/kernels/cuda_adam.h"

namespace kc = booster::kernels::cuda;

namespace {

constexpr double kLr = 1e-3, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8, kWd = 0.01;
constexpr int64_t kAdamStep = 10;
constexpr double kGB = 1e9, kTB = 1e12;

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

// Times `ours` and `theirs` on `stream`: warmup untimed calls of each, then iters rounds of one timed
// call of each (events recorded around each call, read after one synchronisation at the end).
// Returns the medians in milliseconds.
std::pair<double, double> time_pair(cudaStream_t stream, int warmup, int iters, const std::function<void()>& ours,
                                    const std::function<void()>& theirs) {
  for (int i = 0; i < warmup; ++i) ours(), theirs();
  check(cudaStreamSynchronize(stream), "warm-up");
  std::vector<cudaEvent_t> ev(4 * static_cast<size_t>(iters));
  for (auto& e : ev) check(cudaEventCreate(&e), "cudaEventCreate");
  for (int i = 0; i < iters; ++i) {
    check(cudaEventRecord(ev[4 * i], stream), "cudaEventRecord");
    ours();
    check(cudaEventRecord(ev[4 * i + 1], stream), "cudaEventRecord");
    check(cudaEventRecord(ev[4 * i + 2], stream), "cudaEventRecord");
    theirs();
    check(cudaEventRecord(ev[4 * i + 3], stream), "cudaEventRecord");
  }
  check(cudaStreamSynchronize(stream), "timed rounds");
  std::vector<double> a, b;
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    check(cudaEventElapsedTime(&ms, ev[4 * i], ev[4 * i + 1]), "cudaEventElapsedTime");
    a.push_back(ms);
    check(cudaEventElapsedTime(&ms, ev[4 * i + 2], ev[4 * i + 3]), "cudaEventElapsedTime");
    b.push_back(ms);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  return {median(a), median(b)};
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

struct Row {
  std::string measure, ours, theirs, ratio;
};

// A time row: ratio = PyTorch's time / ours (above 1: ours is faster); cells give ms and TB/s.
Row time_row(const std::string& measure, double ours_ms, double theirs_ms, double bytes) {
  return {measure, fmt("%.3f ms", ours_ms) + fmt(" (%.2f TB/s)", bytes / (ours_ms * 1e-3) / kTB),
          fmt("%.3f ms", theirs_ms) + fmt(" (%.2f TB/s)", bytes / (theirs_ms * 1e-3) / kTB),
          fmt("%.2fx", theirs_ms / ours_ms)};
}

// A bandwidth row: ratio = our bandwidth / PyTorch's.
Row bandwidth_row(const std::string& measure, double ours_ms, double theirs_ms, double bytes) {
  return {measure, fmt("%.2f TB/s", bytes / (ours_ms * 1e-3) / kTB) + fmt(" (%.3f ms)", ours_ms),
          fmt("%.2f TB/s", bytes / (theirs_ms * 1e-3) / kTB) + fmt(" (%.3f ms)", theirs_ms),
          fmt("%.2fx", theirs_ms / ours_ms)};
}

Row skipped_row(const std::string& measure, const std::string& why) { return {measure, "skipped", "skipped", why}; }

// Empties LibTorch's cache of device memory; returns the bytes the device has free.
double free_device_bytes() {
  c10::cuda::CUDACachingAllocator::emptyCache();
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return static_cast<double>(free);
}

// max |a - b| / max(|b|, 1e-30) over all elements.
double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return ((a - b).abs() / b.abs().clamp_min(1e-30)).max().item<double>();
}

// The state of an fp32 Adam step: `tensors` parameters of `numel` elements each.
struct AdamState {
  std::vector<at::Tensor> param, grad, exp_avg, exp_avg_sq, steps;

  AdamState(int64_t tensors, int64_t numel) {
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
    for (int64_t t = 0; t < tensors; ++t) {
      param.push_back(at::randn({numel}, opts));
      grad.push_back(at::randn({numel}, opts).mul_(1e-3));
      exp_avg.push_back(at::randn({numel}, opts).mul_(1e-4));
      exp_avg_sq.push_back(at::rand({numel}, opts).mul_(1e-6));
      steps.push_back(at::full({}, static_cast<double>(kAdamStep), opts));
    }
  }
  std::vector<kc::AdamTensor> views() const {
    std::vector<kc::AdamTensor> v;
    for (size_t t = 0; t < param.size(); ++t) {
      kc::AdamTensor x;
      x.numel = param[t].numel();
      x.param = param[t].data_ptr<float>();
      x.grad_fp32 = grad[t].data_ptr<float>();
      x.exp_avg = exp_avg[t].data_ptr<float>();
      x.exp_avg_sq = exp_avg_sq[t].data_ptr<float>();
      v.push_back(x);
    }
    return v;
  }
};

kc::AdamConfig adamw_config() {
  kc::AdamConfig c;
  c.lr = static_cast<float>(kLr);
  c.beta1 = static_cast<float>(kBeta1);
  c.beta2 = static_cast<float>(kBeta2);
  c.eps = static_cast<float>(kEps);
  c.weight_decay = static_cast<float>(kWd);
  c.adamw_mode = true;
  c.bias_correction = true;
  c.step = kAdamStep;
  return c;
}

void torch_adamw(AdamState& s) {
  at::_fused_adamw_(s.param, s.grad, s.exp_avg, s.exp_avg_sq, at::TensorList{}, s.steps, kLr, kBeta1, kBeta2, kWd, kEps,
                    /*amsgrad=*/false, /*maximize=*/false);
}

// One AdamW step of each kernel from the same state; prints the largest relative differences.
void check_adam(AdamState& s, cudaStream_t stream) {
  AdamState copy(0, 0);
  for (size_t t = 0; t < s.param.size(); ++t) {
    copy.param.push_back(s.param[t].clone());
    copy.grad.push_back(s.grad[t]);
    copy.exp_avg.push_back(s.exp_avg[t].clone());
    copy.exp_avg_sq.push_back(s.exp_avg_sq[t].clone());
    copy.steps.push_back(s.steps[t].clone());
  }
  kc::multi_tensor_adam(adamw_config(), s.views(), nullptr, stream);
  torch_adamw(copy);
  check(cudaStreamSynchronize(stream), "Adam check");
  std::printf("check: one AdamW step, ours vs at::_fused_adamw_, %lld params: max relative difference param %.3g, "
              "exp_avg %.3g, exp_avg_sq %.3g\n",
              static_cast<long long>(s.param[0].numel()), max_rel_diff(s.param[0], copy.param[0]),
              max_rel_diff(s.exp_avg[0], copy.exp_avg[0]), max_rel_diff(s.exp_avg_sq[0], copy.exp_avg_sq[0]));
}

Row bench_adam(const std::string& measure, int64_t tensors, int64_t numel, cudaStream_t stream, int warmup, int iters,
               bool check_first) {
  AdamState s(tensors, numel);
  if (check_first) check_adam(s, stream);
  const std::vector<kc::AdamTensor> views = s.views();
  const kc::AdamConfig config = adamw_config();
  auto [ours, theirs] = time_pair(
      stream, warmup, iters, [&] { kc::multi_tensor_adam(config, views, nullptr, stream); }, [&] { torch_adamw(s); });
  const double bytes = 28.0 * static_cast<double>(tensors) * static_cast<double>(numel);  // r: p g m v, w: p m v
  return time_row(measure, ours, theirs, bytes);
}

Row bench_scale(cudaStream_t stream, int warmup, int iters) {
  const int64_t n = (int64_t{256} << 20) / 4;
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  at::Tensor src = at::randn({n}, opts), dst = at::empty({n}, opts), copy_dst = at::empty({n}, opts);
  at::Tensor found_inf = at::zeros({1}, opts.dtype(at::kInt));
  const std::vector<kc::ScaleTensor> views = {
      {n, src.data_ptr<float>(), kc::DType::kFloat32, dst.data_ptr<float>(), kc::DType::kFloat32}};
  auto [ours, theirs] = time_pair(
      stream, warmup, iters, [&] { kc::multi_tensor_scale(0.5f, views, found_inf.data_ptr<int>(), stream); },
      [&] { copy_dst.copy_(src); });
  return bandwidth_row("scale 256 MiB fp32 (vs D2D copy of the same bytes)", ours, theirs, 2.0 * 4.0 * double(n));
}

Row bench_l2norm(const std::string& measure, int64_t n, cudaStream_t stream, int warmup, int iters, bool check_first) {
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kFloat);
  at::Tensor x = at::randn({n}, opts);
  at::Tensor total = at::empty({1}, opts), per = at::empty({1}, opts);
  const std::vector<kc::NormTensor> views = {{n, x.data_ptr<float>(), kc::DType::kFloat32}};
  if (check_first) {
    kc::multi_tensor_l2norm(views, total.data_ptr<float>(), per.data_ptr<float>(), stream);
    const double ours = total.item<double>(), theirs = at::_foreach_norm({x})[0].item<double>();
    std::printf("check: L2 norm of %lld elements: ours %.9g, at::_foreach_norm %.9g, relative difference %.3g\n",
                static_cast<long long>(n), ours, theirs, std::abs(ours - theirs) / theirs);
  }
  auto [ours, theirs] = time_pair(
      stream, warmup, iters,
      [&] { kc::multi_tensor_l2norm(views, total.data_ptr<float>(), per.data_ptr<float>(), stream); },
      [&] { (void)at::_foreach_norm({x}); });
  return bandwidth_row(measure, ours, theirs, 4.0 * double(n));
}

std::string table(const std::vector<Row>& rows) {
  std::ostringstream s;
  s << "| measure | ours | PyTorch | ratio |\n|---|---|---|---|\n";
  for (const Row& r : rows) s << "| " << r.measure << " | " << r.ours << " | " << r.theirs << " | " << r.ratio << " |\n";
  s << "\nratio: PyTorch's time / ours (above 1: ours is faster). Medians of CUDA-event times.\n";
  return s.str();
}

int run(int argc, char** argv) {
  std::string out;
  int iters = 25, warmup = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--out") out = value();
    else if (a == "--iters") iters = std::stoi(value());
    else if (a == "--warmup") warmup = std::stoi(value());
    else if (a == "--help" || a == "-h") {
      std::printf("bench_cuda_kernels [--out FILE] [--iters N (>= 20, default 25)] [--warmup N (default 5)]\n");
      return 0;
    } else {
      throw std::invalid_argument("unknown argument " + a + " (see --help)");
    }
  }
  if (iters < 20) throw std::invalid_argument("--iters must be >= 20");

  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n", err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
    return 0;
  }
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::ostringstream head;
  head << "GPU: " << prop.name << " (" << prop.multiProcessorCount << " SMs, "
       << fmt("%.1f GB", double(prop.totalGlobalMem) / kGB) << "), driver " << driver / 1000 << "."
       << driver % 1000 / 10 << ", runtime " << runtime / 1000 << "." << runtime % 1000 / 10 << ", LibTorch "
       << TORCH_VERSION << "\n";
  std::cout << head.str() << std::flush;

  at::manual_seed(42);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  std::vector<Row> rows;
  rows.push_back(bench_adam("AdamW step, 100M params in 1 tensor", 1, 100'000'000, stream, warmup, iters, true));
  const double free_bytes = free_device_bytes();
  if (free_bytes < 24e9) {
    const std::string why = fmt("%.1f GB of device memory free, 24 GB needed", free_bytes / kGB);
    std::printf("skipping AdamW on 1B params: %s\n", why.c_str());
    rows.push_back(skipped_row("AdamW step, 1B params in 1 tensor", why));
  } else {
    rows.push_back(bench_adam("AdamW step, 1B params in 1 tensor", 1, 1'000'000'000, stream, warmup, iters, false));
  }
  free_device_bytes();
  rows.push_back(bench_adam("AdamW step, 10M params in 2000 tensors", 2000, 5000, stream, warmup, iters, false));
  free_device_bytes();
  rows.push_back(bench_scale(stream, warmup, iters));
  free_device_bytes();
  rows.push_back(bench_l2norm("L2 norm, 1B fp32 elements (vs at::_foreach_norm)", 1'000'000'000, stream, warmup, iters,
                              false));
  free_device_bytes();
  rows.push_back(bench_l2norm("L2 norm, 100M fp32 elements (vs at::_foreach_norm)", 100'000'000, stream, warmup, iters,
                              true));

  const std::string result = head.str() + "\n" + table(rows);
  std::cout << "\n" << table(rows) << std::flush;
  if (!out.empty()) {
    std::ofstream f(out);
    f << result;
    if (!f) throw std::runtime_error("cannot write " + out);
    std::printf("written to %s\n", out.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
}
