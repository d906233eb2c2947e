// bench_fsdp_peer — one rank of the FSDP-vs-FSDP2 benchmark (benchmarks/drivers/fsdp2_peer.py): trains
// an MLP with the torch_fsdp plugin (FULL_SHARD by default), every Linear one shard unit
// (booster::nn::Unit<torch::nn::Linear>), with AdamW and cross-entropy, from initial weights and
// batches read from files, and prints one JSON line per rank. Its peer is benchmarks/peers/fsdp2_peer.py
// (PyTorch's fully_shard on the same model, files and steps).
//
//   bench_fsdp_peer --rank R --world_size W --port P --dims 784,2048,2048,10 --init FILE --data FILE
//                   [--host 127.0.0.1 --threads 1 --warmup 2 --steps 8 --lr 1e-3 --weight_decay 0.01
//                    --strategy FULL_SHARD --plugin_toml "forward_prefetch = true"
//                    --booster_toml 'malloc = "retain"' --save_dir DIR]
// --plugin_toml / --booster_toml: extra lines for the [plugin] / [booster] table of the config (the
// driver passes neither: both sides run with their defaults).
//
// Model: torch::nn::Sequential of Unit<Linear(dims[i], dims[i+1])> with a ReLU between consecutive
// Linears (none after the last), so parameter names are "0.weight", "0.bias", "2.weight", ...
// --init: a state dict file (torch.save .bin or .safetensors, read with
// booster::checkpoint::load_state_dict) holding exactly those names and shapes; copied into the model
// before boost(). --data: a state dict with "x" float32 [nbatches, W * batch, dims[0]] and "y" int64
// [nbatches, W * batch]; step s on rank r trains rows [r * batch, (r + 1) * batch) of batch s % nbatches.
// batch per rank = x.size(1) / W.
//
// Output, one line per rank on stdout:
//   FSDP_PEER {"impl": "booster", "rank", "world_size", "batch", "params", "warmup", "steps",
//              "losses": [every step's local loss, warmup included], "step_ms": [timed steps],
//              "fwd_ms", "bwd_ms", "opt_ms": [timed steps], "all_gathers", "reduce_scatters",
//              "max_gathered_bytes", "minor_faults_per_step", "threads"}
// A step's time runs from the start of its forward to the end of zero_grad (the loss's .item() is
// read after). The timed steps start after a barrier that follows the warmup steps.
// --save_dir: after the steps, Booster::save_model writes the full model as DIR/pytorch_model.bin
// (torch.save format, what torch.load reads); FSDP's parameters are views of freed storage between
// iterations, so this is the way to read the trained weights.
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>

#include "bench_common.h"
#include "booster/booster.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/nn/unit.h"

namespace {

struct Args {
  std::string host = "127.0.0.1", dims = "784,2048,2048,10", init, data, strategy = "FULL_SHARD";
  std::string plugin_toml, booster_toml, save_dir;
  int rank = 0, world_size = 1, port = 29500, threads = 1;
  int64_t warmup = 2, steps = 8;
  double lr = 1e-3, weight_decay = 0.01;
};

std::vector<int64_t> parse_dims(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(std::stoll(item));
  if (out.size() < 2) throw std::invalid_argument("--dims needs at least two sizes, got '" + text + "'");
  return out;
}

long minor_faults() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

// The tensor `name` of `state`; std::runtime_error naming the file when it is absent.
const torch::Tensor& entry(const booster::checkpoint::StateDict& state, const std::string& name,
                           const std::string& file) {
  for (const auto& [k, t] : state)
    if (k == name) return t;
  throw std::runtime_error(file + " has no tensor '" + name + "'");
}

std::string ms_list(const std::vector<double>& seconds) {
  std::vector<double> ms;
  for (double s : seconds) ms.push_back(1000 * s);
  return booster::bench::json_list(ms);
}

int run(const Args& a) {
  booster::dist::LaunchOptions lo;
  lo.threads_per_rank = a.threads;
  lo.timeout_s = 300;
  auto world = booster::dist::launch(a.rank, a.world_size, a.host, a.port, "gloo", lo);
  at::set_num_threads(a.threads);
  const int rank = world->rank(), ws = world->size();

  const std::vector<int64_t> dims = parse_dims(a.dims);
  torch::nn::Sequential net;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    net->push_back(booster::nn::Unit<torch::nn::Linear>(dims[i], dims[i + 1]));
    if (i + 2 < dims.size()) net->push_back(torch::nn::ReLU());
  }
  int64_t numel = 0;
  {
    torch::NoGradGuard ng;
    const auto init = booster::checkpoint::load_state_dict(a.init);
    const auto params = net->named_parameters(true);
    if (init.size() != params.size())
      throw std::runtime_error(a.init + " holds " + std::to_string(init.size()) + " tensors, the model has " +
                               std::to_string(params.size()) + " parameters");
    for (const auto& item : params) {
      const torch::Tensor& src = entry(init, item.key(), a.init);
      if (src.sizes() != item.value().sizes() || src.scalar_type() != torch::kFloat)
        throw std::runtime_error(a.init + ": '" + item.key() + "' is not float32 of the parameter's shape");
      item.value().copy_(src);
      numel += item.value().numel();
    }
  }
  const auto data = booster::checkpoint::load_state_dict(a.data);
  const torch::Tensor x = entry(data, "x", a.data), y = entry(data, "y", a.data);
  if (x.dim() != 3 || x.size(2) != dims.front() || y.dim() != 2 || y.size(0) != x.size(0) ||
      y.size(1) != x.size(1) || x.size(1) % ws != 0 || y.scalar_type() != torch::kLong)
    throw std::runtime_error(a.data + ": expected x float32 [nbatches, W * batch, dims[0]], y int64 [nbatches, W * batch]");
  const int64_t nbatches = x.size(0), batch = x.size(1) / ws;

  std::string toml = "[booster]\nplugin = \"torch_fsdp\"\n" + (a.booster_toml.empty() ? "" : a.booster_toml + "\n") +
                     "[plugin]\nsharding_strategy = \"" + a.strategy + "\"\n";
  if (!a.plugin_toml.empty()) toml += a.plugin_toml + "\n";
  booster::Booster booster(booster::Config::from_string(toml));
  auto adamw = std::make_shared<torch::optim::AdamW>(
      net->parameters(), torch::optim::AdamWOptions(a.lr).weight_decay(a.weight_decay));
  booster::Criterion ce = [](const torch::Tensor& out, const torch::Tensor& t) {
    return torch::nn::functional::cross_entropy(out, t);
  };
  auto boosted = booster.boost(net.ptr(), adamw, ce);
  auto& model = boosted.model;
  auto& opt = *boosted.optimizer;

  std::vector<double> losses, d_step, d_fwd, d_bwd, d_opt;
  long faults0 = 0;
  std::map<std::string, int64_t> stats0;
  for (int64_t s = 0; s < a.warmup + a.steps; ++s) {
    if (s == a.warmup) {
      world->barrier();
      faults0 = minor_faults();
      stats0 = model.hooks().stats();
    }
    const int64_t b = s % nbatches;
    const torch::Tensor xb = x[b].narrow(0, rank * batch, batch), yb = y[b].narrow(0, rank * batch, batch);
    const double t0 = booster::bench::now_s();
    torch::Tensor loss = boosted.criterion(model.forward(xb), yb);
    const double t1 = booster::bench::now_s();
    booster.backward(loss, opt);
    const double t2 = booster::bench::now_s();
    opt.step();
    opt.zero_grad();
    const double t3 = booster::bench::now_s();
    losses.push_back(loss.item<double>());
    if (s >= a.warmup) {
      d_step.push_back(t3 - t0);
      d_fwd.push_back(t1 - t0);
      d_bwd.push_back(t2 - t1);
      d_opt.push_back(t3 - t2);
    }
  }
  const double timed = static_cast<double>(std::max<int64_t>(a.steps, 1));
  const double faults_per_step = static_cast<double>(minor_faults() - faults0) / timed;
  std::map<std::string, int64_t> stats = model.hooks().stats();
  if (!a.save_dir.empty()) {
    booster::checkpoint::ModelSaveOptions so;
    so.use_safetensors = false;
    booster.save_model(model, a.save_dir, so);
  }
  world->barrier();

  using namespace booster::bench;
  const std::string line =
      json_obj({{"impl", json_str("booster")},
                {"rank", json_int(rank)},
                {"world_size", json_int(ws)},
                {"batch", json_int(batch)},
                {"params", json_int(numel)},
                {"warmup", json_int(a.warmup)},
                {"steps", json_int(a.steps)},
                {"losses", json_list(losses)},
                {"step_ms", ms_list(d_step)},
                {"fwd_ms", ms_list(d_fwd)},
                {"bwd_ms", ms_list(d_bwd)},
                {"opt_ms", ms_list(d_opt)},
                {"all_gathers", json_num(static_cast<double>(stats["all_gathers"] - stats0["all_gathers"]) / timed)},
                {"reduce_scatters",
                 json_num(static_cast<double>(stats["reduce_scatters"] - stats0["reduce_scatters"]) / timed)},
                {"max_gathered_bytes", json_int(stats["max_gathered_bytes"])},
                {"minor_faults_per_step", json_num(faults_per_step)},
                {"threads", json_int(at::get_num_threads())}});
  std::printf("FSDP_PEER %s\n", line.c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app{"bench_fsdp_peer: one rank of the FSDP vs FSDP2 benchmark"};
  app.add_option("--rank", a.rank);
  app.add_option("--world_size", a.world_size);
  app.add_option("--host", a.host);
  app.add_option("--port", a.port);
  app.add_option("--threads", a.threads, "intra-op threads per rank");
  app.add_option("--dims", a.dims, "layer sizes: input, hidden..., output");
  app.add_option("--init", a.init, "initial weights (state dict file)")->required();
  app.add_option("--data", a.data, "batches (state dict file with x and y)")->required();
  app.add_option("--warmup", a.warmup);
  app.add_option("--steps", a.steps, "timed steps after the warmup");
  app.add_option("--lr", a.lr);
  app.add_option("--weight_decay", a.weight_decay);
  app.add_option("--strategy", a.strategy, "torch_fsdp sharding_strategy")
      ->check(CLI::IsMember({"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"}));
  app.add_option("--plugin_toml", a.plugin_toml, "extra lines for the [plugin] table");
  app.add_option("--booster_toml", a.booster_toml, "extra lines for the [booster] table");
  app.add_option("--save_dir", a.save_dir, "save the trained model here (pytorch_model.bin)");
  CLI11_PARSE(app, argc, argv);
  return booster::bench::guarded_main("bench_fsdp_peer", [&] { return run(a); });
}
