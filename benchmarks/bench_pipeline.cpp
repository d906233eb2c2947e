// bench_pipeline — one rank of the pipeline-bubble benchmark (benchmarks/drivers/pipeline_bubble.py
// starts pp ranks with --rank/--world_size/--port). A stack of `layers` equal MLP blocks
// (Linear(dim, 4 dim) -> GELU -> Linear(4 dim, dim), residual), offered as pipeline layers, trained
// with booster.execute_pipeline under the hybrid_parallel plugin (pp_size = world size, fp32, one
// intra-op thread per rank). Per timed iteration the rank records the wall time of
// execute_pipeline and its compute time inside it (the plugin's pipeline_compute_us stat: forward,
// loss and backward of its chunks); 1 - compute / wall is its measured bubble (idle + communication).
//   --microbatches M --chunks V --style 1f1b|interleaved|gpipe --dim D --layers L --batch B
//   --iters N --warmup W --out PREFIX (writes PREFIX.rank<r>.json)
// Options for the comparison with torch.distributed.pipelining (benchmarks/drivers/pipelining_peer.py):
//   --init_file F  raw float32: every parameter in registration order, then inputs and targets
//                  ([batch, dim] each), replacing the random ones (read before boost()).
//   --dump_file P  writes P.rank<r>.bin: the gradients of the parameters this rank holds after the
//                  first iteration (before the optimizer step), raw float32 in registration order;
//                  their names go to the JSON as dump_names.
//   --set K=V      one config override, e.g. plugin.enable_metadata_cache=false.
// The JSON also carries call_s (wall time of each timed execute_pipeline call, measured around it)
// and losses (each iteration's loss on the last stage; empty elsewhere).
#include <torch/torch.h>

#include <fstream>

#include "bench_common.h"
#include "booster/booster.h"
#include "booster/nn/pipeline.h"

namespace {

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim) {
    fc = register_module("fc", torch::nn::Linear(dim, 4 * dim));
    proj = register_module("proj", torch::nn::Linear(4 * dim, dim));
  }
  torch::Tensor forward(const torch::Tensor& x) { return x + proj(torch::gelu(fc(x))); }
  torch::nn::Linear fc{nullptr}, proj{nullptr};
};
TORCH_MODULE(Block);

struct StackImpl : torch::nn::Module, booster::nn::PipelineModule {
  StackImpl(int64_t layers, int64_t dim) {
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) h->push_back(Block(dim));
  }
  std::vector<booster::nn::PipelineLayer> pipeline_layers() override {
    std::vector<booster::nn::PipelineLayer> out;
    for (size_t i = 0; i < h->size(); ++i)
      out.push_back({"h." + std::to_string(i), {h[i]}, [this, i](const torch::Tensor& x) { return h[i]->as<Block>()->forward(x); }});
    return out;
  }
  torch::nn::ModuleList h{nullptr};
};
TORCH_MODULE(Stack);

// Reads --init_file (see the header) into net's parameters and returns {inputs, targets}; throws
// std::runtime_error when the file's size is not that of the parameters plus 2 * batch * dim floats.
std::pair<torch::Tensor, torch::Tensor> load_init(const std::string& path, Stack& net, int64_t batch, int64_t dim) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) throw std::runtime_error("cannot read " + path);
  const auto bytes = static_cast<int64_t>(f.tellg());
  int64_t want = 2 * batch * dim;
  for (const auto& p : net->parameters()) want += p.numel();
  if (bytes != want * 4)
    throw std::runtime_error(path + ": " + std::to_string(bytes) + " bytes, expected " + std::to_string(want * 4));
  auto flat = torch::empty({want}, torch::kFloat);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(flat.data_ptr<float>()), bytes);
  if (!f) throw std::runtime_error("cannot read " + path);
  torch::NoGradGuard no_grad;
  int64_t at = 0;
  for (auto& p : net->parameters()) {
    p.copy_(flat.narrow(0, at, p.numel()).view(p.sizes()));
    at += p.numel();
  }
  auto x = flat.narrow(0, at, batch * dim).view({batch, dim}).clone();
  auto y = flat.narrow(0, at + batch * dim, batch * dim).view({batch, dim}).clone();
  return {x, y};
}

// Writes the gradients of the parameters net holds on this rank (numel > 0; another stage's are
// released by boost()) to `path`, raw float32 in registration order; returns their names.
std::vector<std::string> dump_grads(const std::string& path, Stack& net) {
  std::ofstream f(path, std::ios::binary);
  std::vector<std::string> names;
  for (const auto& item : net->named_parameters()) {
    const auto& p = item.value();
    if (p.numel() == 0) continue;
    if (!p.grad().defined()) throw std::runtime_error("no gradient for " + item.key());
    auto g = p.grad().to(torch::kFloat).contiguous();
    f.write(reinterpret_cast<const char*>(g.data_ptr<float>()), static_cast<std::streamsize>(g.numel() * 4));
    names.push_back(item.key());
  }
  if (!f) throw std::runtime_error("cannot write " + path);
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  return booster::bench::guarded_main("bench_pipeline", [&] {
    booster::bench::Args a(argc, argv);
    const int64_t m = a.integer("microbatches", 4), chunks = a.integer("chunks", 1), dim = a.integer("dim", 512);
    const int64_t layers = a.integer("layers", 8), batch = a.integer("batch", 64);
    const int64_t iters = a.integer("iters", 10), warmup = a.integer("warmup", 2);
    const std::string style = a.str("style", chunks > 1 ? "interleaved" : "1f1b");
    auto config = booster::Config::from_string(
        "[booster]\nplugin = \"hybrid_parallel\"\n[distributed]\nthreads_per_rank = 1\ntimeout_s = 300\n"
        "port = " + a.str("port", "29500") + "\n[plugin]\nprecision = \"fp32\"\npp_style = \"" + style + "\"\n" +
        "num_model_chunks = " + std::to_string(chunks) + "\nnum_microbatches = " + std::to_string(m) + "\n");
    std::vector<std::string> launch{"--rank", a.str("rank", "0"), "--world_size", a.str("world_size", "1")};
    auto world = booster::launch_from_config(config, launch);
    config.apply_overrides({"plugin.pp_size=" + std::to_string(world->size())});
    if (a.has("set")) config.apply_overrides({a.str("set", "")});
    booster::Booster booster(config);
    torch::manual_seed(1);
    Stack net(layers, dim);
    std::pair<torch::Tensor, torch::Tensor> init;
    if (a.has("init_file")) init = load_init(a.str("init_file", ""), net, batch, dim);
    auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(1e-3));
    auto [model, optimizer, criterion, loader, scheduler] =
        booster.boost(net, opt, [](const torch::Tensor& y, const torch::Tensor& t) { return torch::mse_loss(y, t); });
    auto x = init.first.defined() ? init.first : torch::randn({batch, dim});
    auto y = init.second.defined() ? init.second : torch::randn({batch, dim});
    std::vector<double> wall, compute, call, losses;
    std::vector<std::string> dump_names;
    const int rank = world->rank();
    for (int64_t i = 0; i < warmup + iters; ++i) {
      const double t0 = booster::bench::now_s();
      auto out = booster.execute_pipeline(x, y, model, criterion, optimizer.get());
      const double t1 = booster::bench::now_s();
      if (out.loss.defined()) losses.push_back(out.loss.item<double>());
      if (i == 0 && a.has("dump_file"))
        dump_names = dump_grads(a.str("dump_file", "") + ".rank" + std::to_string(rank) + ".bin", net);
      optimizer->step();
      optimizer->zero_grad();
      if (i < warmup) continue;
      call.push_back(t1 - t0);
      auto stats = model.hooks().stats();
      wall.push_back(stats.at("pipeline_wall_us") * 1e-6);
      compute.push_back(stats.at("pipeline_compute_us") * 1e-6);
    }
    const int64_t shm_messages = model.hooks().stats().at("pipeline_shm_messages");
    using namespace booster::bench;
    std::vector<std::string> quoted;
    for (const auto& n : dump_names) quoted.push_back(json_str(n));
    write_file(a.str("out", "bench_pipeline") + ".rank" + std::to_string(world->rank()) + ".json",
               json_obj({{"rank", json_int(world->rank())}, {"pp", json_int(world->size())},
                         {"microbatches", json_int(m)}, {"chunks", json_int(chunks)}, {"style", json_str(style)},
                         {"wall_s", json_list(wall)}, {"compute_s", json_list(compute)},
                         {"shm_messages", json_int(shm_messages)}, {"call_s", json_list(call)},
                         {"losses", json_list(losses)}, {"dump_names", json_arr(quoted)}}));
    return 0;
  });
}
