// bench_startup — time from process start to the first optimizer step done with Booster (launch +
// rendezvous, plugin load, boost, one step), against an empty LibTorch program
// (benchmarks/startup_empty_libtorch.cpp: creates one tensor and exits), both started the same way
// by the driver (benchmarks/drivers/startup.py): alone, or as 2 ranks under `booster run`.
//
//   bench_startup --t0_ns NS [--rank R --world_size W --port P]   (or the torchrun variables)
//
// NS is the wall-clock time (CLOCK_REALTIME, ns since the epoch) the driver read just before it
// started the process (or the launcher), so every figure includes exec, dynamic loading of LibTorch
// and static initialisers. The program prints one line
//   BENCH_STARTUP {"rank": r, "world_size": w, "main_s": ..., "launch_s": ..., "plugin_s": ...,
//                  "boost_s": ..., "step_s": ..., "checksum": ..., "loss": ...}
// with the times (seconds since NS) at which main() was entered, the world was launched
// (rendezvous), the Booster (plugin .so) was loaded, boost() returned, and the first step finished.
// Correctness: every rank trains the same fixed batch, so after one DDP step the parameters must be
// the same on every rank and equal to a single-process run's; the driver compares the checksums.
#include <torch/torch.h>

#include <chrono>
#include <iostream>

#include "bench_common.h"
#include "booster/booster.h"

namespace {

double since(int64_t t0_ns) {
  auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                 std::chrono::system_clock::now().time_since_epoch()).count();
  return static_cast<double>(now - t0_ns) * 1e-9;
}

int64_t t0_ns = 0;

int run(int argc, char** argv) {
  double t_main = since(t0_ns);
  std::vector<std::string> args(argv + 1, argv + argc);
  // Our own --t0_ns goes first; the rest are launch flags for launch_from_config.
  std::vector<std::string> launch_args;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--t0_ns" && i + 1 < args.size()) { ++i; continue; }
    launch_args.push_back(args[i]);
  }

  auto config = booster::Config::from_string(
      "[booster]\nplugin = \"torch_ddp\"\n[distributed]\nthreads_per_rank = 1\ntimeout_s = 120\n");
  auto world = booster::launch_from_config(config, launch_args);
  if (!launch_args.empty()) throw std::invalid_argument("unknown argument '" + launch_args.front() + "'");
  double t_launch = since(t0_ns);
  booster::Booster booster(config);
  double t_plugin = since(t0_ns);

  torch::manual_seed(0);
  auto net = torch::nn::Sequential(torch::nn::Linear(64, 128), torch::nn::ReLU(), torch::nn::Linear(128, 10));
  auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto boosted = booster.boost(net.ptr(), adamw);
  double t_boost = since(t0_ns);

  // The same batch on every rank: DDP's averaged gradient equals the single-process one.
  auto x = torch::randn({32, 64}), y = torch::randint(0, 10, {32});
  auto loss = torch::nn::functional::cross_entropy(boosted.model.forward(x), y);
  booster.backward(loss, *boosted.optimizer);
  boosted.optimizer->step();
  boosted.optimizer->zero_grad();
  double t_step = since(t0_ns);

  double checksum = 0;
  for (auto& p : net->parameters()) checksum += p.detach().to(torch::kDouble).abs().sum().item<double>();
  using namespace booster::bench;
  std::cout << "BENCH_STARTUP "
            << json_obj({{"rank", json_int(world->rank())}, {"world_size", json_int(world->size())},
                         {"main_s", json_num(t_main)}, {"launch_s", json_num(t_launch)},
                         {"plugin_s", json_num(t_plugin)}, {"boost_s", json_num(t_boost)},
                         {"step_s", json_num(t_step)}, {"checksum", json_num(checksum)},
                         {"loss", json_num(loss.item<double>())}})
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--t0_ns") t0_ns = std::stoll(argv[i + 1]);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_startup: " << e.what() << "\n";
    return 1;
  }
}
