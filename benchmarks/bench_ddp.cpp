// bench_ddp — one rank of the DDP throughput benchmark (issue 6, benchmark 1). Trains a model with
// the TorchDDP plugin on synthetic data and prints one JSON line (rank 0) with samples/s, the final
// loss and a parameter checksum. The Python peer (benchmarks/ddp_peer.py) runs the same model, data,
// initial weights, optimizer and steps with torch.nn.parallel.DistributedDataParallel; the driver
// (benchmarks/drivers/ddp_throughput.py) starts both and compares.
//
//   bench_ddp --model cnn|mlp --mode hooks|after_backward --rank R --world_size W --port P
//             [--steps 20 --warmup 3 --batch 64 --threads 1 --seed 0 --lr 0.01 --bucket_cap_mb 25
//              --dump_params FILE --out FILE]
//             [--plugin NAME --plugin_toml LINES --booster_toml LINES --strategy FULL_SHARD|... --ckpt_dir DIR
//              --malloc cache|retain|return|system]
//
// samples_per_s = world_size * batch / (median wall time of one step on rank 0, after warmup): robust
// to bursts of load on a shared machine; samples_per_s_mean = all timed samples / elapsed.
//
// Modes: hooks = the plugin's bucketed allreduce launched from gradient hooks during backward
// (overlapped); after_backward = backward under booster.no_sync, then the same buckets (25 MiB, reverse
// registration order, gradients divided by W while copied in) allreduced after backward (no overlap).
//
// Other plugins (--plugin NAME, mode hooks; [plugin] lines from --plugin_toml, torch_fsdp's strategy
// from --strategy): the same training, each Linear of the MLP and each layer of the CNN one shard
// unit (booster::nn::Unit, a pass-through under DDP), so every plugin can be timed against our DDP
// on the same model (benchmarks/drivers/main_job_plugins.py). Their parameters may be views of
// freed storage between iterations, so their checksums come from the trained model saved with
// Booster::save_model into --ckpt_dir and read back with booster::checkpoint::load_state_dict
// (after the timed steps); --dump_params is refused. The JSON line also gives the highest rank's
// RSS after the timed steps and peak RSS (VmRSS, VmHWM) and the host cache's held bytes.
//
// Everything random comes from torch::manual_seed + torch::randn/randint in a fixed order, which
// gives the same values as Python's torch.manual_seed + torch.randn/randint (the same libtorch_cpu).
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "booster/booster.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/core/host_cache.h"
#include "booster/core/memory.h"
#include "booster/nn/unit.h"
#include "fashion_mnist/net.h"

namespace {

// The CNN is examples/fashion_mnist's net (fashion_mnist/net.h) with dropout p = 0 (deterministic).

// 784 -> 4096 -> 4096 -> 10 with ReLU: 20.0M parameters (80 MB of fp32 gradients per step). Each
// Linear is a booster::nn::Unit (an FSDP shard unit; names, outputs and gradients unchanged).
struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(int64_t hidden) : fc1(784, hidden), fc2(hidden, hidden), fc3(hidden, 10) {
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("fc3", fc3);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::relu(fc1(x.flatten(1)));
    h = torch::relu(fc2(h));
    return fc3(h);
  }
  booster::nn::Unit<torch::nn::Linear> fc1, fc2, fc3;
};
TORCH_MODULE(Mlp);

// Same in ddp_peer.py: in registration order, matrices/kernels ~ N(0, 2/fan_in) from the seeded
// generator, 1-D weights (BatchNorm) = 1, biases = 0.
void init_parameters(torch::nn::Module& m, int64_t seed) {
  torch::NoGradGuard ng;
  torch::manual_seed(seed);
  for (auto& item : m.named_parameters(true)) {
    const std::string& name = item.key();
    torch::Tensor p = item.value();
    if (p.dim() >= 2) {
      double fan_in = static_cast<double>(p.numel() / p.size(0));
      p.copy_(torch::randn(p.sizes()) * std::sqrt(2.0 / fan_in));
    } else if (name.size() >= 6 && name.compare(name.size() - 6, 6, "weight") == 0) {
      p.fill_(1.0);
    } else {
      p.zero_();
    }
  }
}

struct Bucket {
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> views;
  torch::Tensor flat;
};

// Buckets for the after_backward mode, as the reducer assigns them (reverse registration order,
// a new bucket once one reached its cap; first bucket 1 MiB).
std::vector<Bucket> make_buckets(const std::vector<torch::Tensor>& params, int64_t cap_bytes, int64_t first_bytes) {
  std::vector<std::vector<torch::Tensor>> groups(1);
  int64_t bytes = 0, cap = first_bytes;
  for (size_t k = params.size(); k-- > 0;) {
    groups.back().push_back(params[k]);
    bytes += params[k].numel() * 4;
    if (bytes >= cap) {
      groups.emplace_back();
      bytes = 0;
      cap = cap_bytes;
    }
  }
  if (groups.back().empty()) groups.pop_back();
  std::vector<Bucket> out;
  for (auto& g : groups) {
    Bucket b;
    int64_t n = 0;
    for (auto& p : g) n += p.numel();
    b.flat = torch::zeros({n});
    int64_t off = 0;
    for (auto& p : g) {
      b.params.push_back(p);
      b.views.push_back(b.flat.narrow(0, off, p.numel()).view(p.sizes()));
      off += p.numel();
    }
    out.push_back(std::move(b));
  }
  return out;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Minor page faults of the process so far (fresh memory touched: a sign of allocator churn).
long minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Args {
  std::string model = "cnn", mode = "hooks", host = "127.0.0.1", dump_params, out;
  std::string plugin = "torch_ddp", strategy = "FULL_SHARD", ckpt_dir;
  std::string malloc_mode;  // [booster] malloc ("": the plugin's default)
  std::string plugin_toml, booster_toml;  // extra lines for [plugin] and [booster]
  int rank = 0, world_size = 1, port = 29500, threads = 1;
  int64_t steps = 20, warmup = 3, batch = 64, seed = 0, nbatches = 4, hidden = 4096;
  double lr = 0.01, momentum = 0.9, bucket_cap_mb = 25.0;
};

template <class Model>
int train(Model net, const Args& a) {
  auto world = booster::dist::world();
  const int rank = world->rank(), ws = world->size();
  init_parameters(*net, a.seed);

  // Data: a pool of nbatches * world_size * batch samples, drawn after the weights from seed + 1.
  // Step s on rank r uses batch ((s % nbatches) * world_size + r).
  torch::manual_seed(a.seed + 1);
  const int64_t pool = a.nbatches * ws * a.batch;
  torch::Tensor x = a.model == "cnn" ? torch::randn({pool, 1, 28, 28}) : torch::randn({pool, 784});
  torch::Tensor y = torch::randint(0, 10, {pool}, torch::TensorOptions().dtype(torch::kLong));

  const bool fsdp = a.plugin == "torch_fsdp";
  // Plugins other than torch_ddp may free or re-lay out the parameters between steps: their
  // checksum is read back from the saved model.
  const bool checksum_from_save = a.plugin != "torch_ddp";
  const std::string head = "[booster]\n" +
                           (a.malloc_mode.empty() ? std::string() : "malloc = \"" + a.malloc_mode + "\"\n") +
                           a.booster_toml + "\nplugin = \"" + a.plugin + "\"\n[plugin]\n";
  std::string toml = head + (fsdp ? "sharding_strategy = \"" + a.strategy + "\"\n"
                                  : a.plugin == "torch_ddp" ? "bucket_cap_mb = " + std::to_string(a.bucket_cap_mb) + "\n"
                                                            : std::string()) +
                     a.plugin_toml + "\n";
  booster::Booster booster(booster::Config::from_string(toml));
  auto sgd = std::make_shared<torch::optim::SGD>(net->parameters(),
                                                 torch::optim::SGDOptions(a.lr).momentum(a.momentum));
  booster::Criterion ce = [](const torch::Tensor& out, const torch::Tensor& t) {
    return torch::nn::functional::cross_entropy(out, t);
  };
  auto boosted = booster.boost(net, sgd, ce);
  auto& model = boosted.model;
  auto& opt = *boosted.optimizer;
  auto& criterion = boosted.criterion;

  const bool after_backward = a.mode == "after_backward";
  std::vector<torch::Tensor> params = net->parameters();
  std::vector<Bucket> buckets;
  if (after_backward) buckets = make_buckets(params, static_cast<int64_t>(a.bucket_cap_mb * (1 << 20)), 1 << 20);
  // 1/W as a wrapped-number tensor (as PyTorch's reducer): mul_out with a Scalar would compute into a
  // temporary and copy (LibTorch 1.13's out= of mul.Scalar), touching a fresh gradient-sized buffer.
  torch::Tensor inv_world = c10::scalar_to_tensor(1.0 / ws);
  inv_world.unsafeGetTensorImpl()->set_wrapped_number(true);

  // Per timed step: total, forward (+ loss), backward (+ allreduce), allreduce after backward, step.
  std::vector<double> d_total, d_fwd, d_bwd, d_comm, d_step;
  double t0 = 0;
  long faults0 = 0;
  double last_loss = 0;
  const int64_t total = a.warmup + a.steps;
  for (int64_t s = 0; s < total; ++s) {
    if (s == a.warmup) {
      world->barrier();
      t0 = now_s();
      faults0 = minor_faults();
    }
    int64_t start = ((s % a.nbatches) * ws + rank) * a.batch;
    torch::Tensor xb = x.narrow(0, start, a.batch), yb = y.narrow(0, start, a.batch);
    double ta = now_s(), t_comm = 0;
    torch::Tensor loss = criterion(model.forward(xb), yb);
    double tb = now_s();
    if (!after_backward) {
      booster.backward(loss, opt);
    } else {
      {
        auto guard = booster.no_sync(model);
        booster.backward(loss, opt);
      }
      if (ws > 1) {
        double tc0 = now_s();
        std::vector<booster::dist::Work> works;
        for (auto& b : buckets) {
          for (size_t i = 0; i < b.params.size(); ++i) at::mul_out(b.views[i], b.params[i].grad(), inv_world);
          works.push_back(world->allreduce(b.flat, booster::dist::ReduceOp::SUM));
        }
        for (size_t k = 0; k < buckets.size(); ++k) {
          works[k].wait();
          for (size_t i = 0; i < buckets[k].params.size(); ++i) buckets[k].params[i].grad().copy_(buckets[k].views[i]);
        }
        t_comm = now_s() - tc0;
      }
    }
    double tc = now_s();
    opt.step();
    opt.zero_grad();
    double td = now_s();
    last_loss = loss.item<double>();
    if (s >= a.warmup) {
      d_total.push_back(now_s() - ta);
      d_fwd.push_back(tb - ta);
      d_bwd.push_back(tc - tb);
      d_comm.push_back(t_comm);
      d_step.push_back(td - tc);
    }
  }
  double elapsed = now_s() - t0;
  double faults_per_step = static_cast<double>(minor_faults() - faults0) / static_cast<double>(a.steps);
  // Host memory after the timed steps (steady state) and the run's peak, the highest rank's.
  const booster::ProcessMemory mem = booster::process_memory();
  const double rss_mib = world->allreduce_scalar(static_cast<double>(mem.rss_bytes) / (1 << 20), booster::dist::ReduceOp::MAX);
  const double peak_mib =
      world->allreduce_scalar(static_cast<double>(mem.peak_rss_bytes) / (1 << 20), booster::dist::ReduceOp::MAX);
  const double held_mib = static_cast<double>(booster::host_cache_stats().held_bytes) / (1 << 20);

  double checksum = 0, abs_checksum = 0;
  std::map<std::string, int64_t> stats = model.hooks().stats();
  {
    torch::NoGradGuard ng;
    auto add = [&](const torch::Tensor& p) {
      checksum += p.to(torch::kDouble).sum().item<double>();
      abs_checksum += p.to(torch::kDouble).abs().sum().item<double>();
    };
    if (checksum_from_save) {
      // The parameters may be views of freed storage now: checksum the model as saved.
      booster.save_model(model, a.ckpt_dir);
      for (auto& [name, t] : booster::checkpoint::load_state_dict(a.ckpt_dir, "model")) add(t);
    } else {
      for (auto& p : params) add(p);
    }
  }
  if (rank == 0 && !a.dump_params.empty()) {
    std::ofstream f(a.dump_params, std::ios::binary);
    for (auto& p : params) {
      torch::Tensor c = p.detach().contiguous();
      f.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * sizeof(float));
    }
  }
  int64_t nparams = 0;
  for (auto& p : params) nparams += p.numel();
  world->barrier();
  if (rank == 0) {
    const double med_step = median(d_total);
    char line[2048];
    std::snprintf(line, sizeof line,
        "{\"impl\": \"booster\", \"model\": \"%s\", \"mode\": \"%s\", \"world_size\": %d, \"batch\": %lld, "
        "\"steps\": %lld, \"params\": %lld, \"samples_per_s\": %.6f, \"samples_per_s_mean\": %.6f, "
        "\"elapsed_s\": %.6f, \"step_total_ms\": %.4f, \"final_loss\": %.9g, "
        "\"param_checksum\": %.12g, \"param_abs_checksum\": %.12g, \"fwd_ms\": %.4f, \"bwd_ms\": %.4f, "
        "\"comm_after_bwd_ms\": %.4f, \"step_ms\": %.4f, \"minor_faults_per_step\": %.1f, \"threads\": %d, "
        "\"plugin\": \"%s\", \"strategy\": \"%s\", \"all_gathers\": %lld, \"reduce_scatters\": %lld, "
        "\"max_gathered_bytes\": %lld, \"rss_mib\": %.1f, \"peak_rss_mib\": %.1f, \"host_cache_held_mib\": %.1f}\n",
        a.model.c_str(), a.mode.c_str(), ws, static_cast<long long>(a.batch), static_cast<long long>(a.steps),
        static_cast<long long>(nparams), static_cast<double>(a.batch * ws) / med_step,
        static_cast<double>(a.steps * a.batch * ws) / elapsed, elapsed, 1000 * med_step, last_loss, checksum,
        abs_checksum, 1000 * median(d_fwd), 1000 * median(d_bwd), 1000 * median(d_comm), 1000 * median(d_step),
        faults_per_step, at::get_num_threads(), a.plugin.c_str(), fsdp ? a.strategy.c_str() : "",
        static_cast<long long>(stats["all_gathers"]), static_cast<long long>(stats["reduce_scatters"]),
        static_cast<long long>(stats["max_gathered_bytes"]), rss_mib, peak_mib, held_mib);
    std::fputs(line, stdout);
    std::fflush(stdout);
    if (!a.out.empty()) std::ofstream(a.out) << line;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"bench_ddp: one rank of the DDP throughput benchmark"};
  app.add_option("--model", a.model)->check(CLI::IsMember({"cnn", "mlp"}));
  app.add_option("--mode", a.mode)->check(CLI::IsMember({"hooks", "after_backward"}));
  app.add_option("--rank", a.rank);
  app.add_option("--world_size", a.world_size);
  app.add_option("--host", a.host);
  app.add_option("--port", a.port);
  app.add_option("--threads", a.threads);
  app.add_option("--steps", a.steps);
  app.add_option("--warmup", a.warmup);
  app.add_option("--batch", a.batch, "samples per rank per step");
  app.add_option("--seed", a.seed);
  app.add_option("--nbatches", a.nbatches, "distinct batches per rank, cycled");
  app.add_option("--hidden", a.hidden, "MLP hidden width");
  app.add_option("--lr", a.lr);
  app.add_option("--momentum", a.momentum);
  app.add_option("--bucket_cap_mb", a.bucket_cap_mb);
  app.add_option("--dump_params", a.dump_params, "rank 0 writes the final parameters (raw float32, registration order)");
  app.add_option("--out", a.out, "rank 0 also writes the JSON line to this file");
  app.add_option("--plugin", a.plugin, "any installed plugin (torch_ddp: bucket_cap_mb; torch_fsdp: --strategy)");
  app.add_option("--plugin_toml", a.plugin_toml, "extra lines for [plugin], e.g. 'stage = 2'");
  app.add_option("--booster_toml", a.booster_toml, "extra lines for [booster], e.g. 'mixed_precision = \"bf16\"'");
  app.add_option("--strategy", a.strategy, "torch_fsdp sharding_strategy")
      ->check(CLI::IsMember({"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"}));
  app.add_option("--ckpt_dir", a.ckpt_dir, "torch_fsdp: where the trained model is saved for its checksum");
  app.add_option("--malloc", a.malloc_mode, "[booster] malloc: cache, retain, return or system (default: the plugin's)")
      ->check(CLI::IsMember({"cache", "retain", "return", "system"}));
  CLI11_PARSE(app, argc, argv);
  if (a.plugin != "torch_ddp" && (a.mode != "hooks" || !a.dump_params.empty() || a.ckpt_dir.empty())) {
    std::fprintf(stderr, "bench_ddp: --plugin %s needs --mode hooks and --ckpt_dir, and cannot --dump_params (its "
                         "parameters may be sharded)\n", a.plugin.c_str());
    return 2;
  }
  try {
    booster::dist::LaunchOptions lo;
    lo.threads_per_rank = a.threads;
    lo.timeout_s = 300;
    booster::dist::launch(a.rank, a.world_size, a.host, a.port, "gloo", lo);
    at::set_num_threads(a.threads);
    if (a.model == "cnn") return train(Net(0.0), a);
    return train(Mlp(a.hidden), a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ddp: rank %d: %s\n", a.rank, e.what());
    return 1;
  }
}
