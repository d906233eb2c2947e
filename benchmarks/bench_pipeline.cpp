// bench_pipeline — one rank of the pipeline-bubble benchmark (benchmarks/drivers/pipeline_bubble.py
// starts pp ranks with --rank/--world_size/--port). A stack of `layers` equal MLP blocks
// (Linear(dim, 4 dim) -> GELU -> Linear(4 dim, dim), residual), offered as pipeline layers, trained
// with booster.execute_pipeline under the hybrid_parallel plugin (pp_size = world size, fp32, one
// intra-op thread per rank). Per timed iteration the rank records the wall time of
// execute_pipeline and its compute time inside it (the plugin's pipeline_compute_us stat: forward,
// loss and backward of its chunks); 1 - compute / wall is its measured bubble (idle + communication).
//   --microbatches M --chunks V --style 1f1b|interleaved|gpipe --dim D --layers L --batch B
//   --iters N --warmup W --out PREFIX (writes PREFIX.rank<r>.json)
#include <torch/torch.h>

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
    booster::Booster booster(config);
    torch::manual_seed(1);
    Stack net(layers, dim);
    auto opt = std::make_shared<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(1e-3));
    auto [model, optimizer, criterion, loader, scheduler] =
        booster.boost(net, opt, [](const torch::Tensor& y, const torch::Tensor& t) { return torch::mse_loss(y, t); });
    auto x = torch::randn({batch, dim}), y = torch::randn({batch, dim});
    std::vector<double> wall, compute;
    for (int64_t i = 0; i < warmup + iters; ++i) {
      booster.execute_pipeline(x, y, model, criterion, optimizer.get());
      optimizer->step();
      optimizer->zero_grad();
      if (i < warmup) continue;
      auto stats = model.hooks().stats();
      wall.push_back(stats.at("pipeline_wall_us") * 1e-6);
      compute.push_back(stats.at("pipeline_compute_us") * 1e-6);
    }
    const int64_t shm_messages = model.hooks().stats().at("pipeline_shm_messages");
    using namespace booster::bench;
    write_file(a.str("out", "bench_pipeline") + ".rank" + std::to_string(world->rank()) + ".json",
               json_obj({{"rank", json_int(world->rank())}, {"pp", json_int(world->size())},
                         {"microbatches", json_int(m)}, {"chunks", json_int(chunks)}, {"style", json_str(style)},
                         {"wall_s", json_list(wall)}, {"compute_s", json_list(compute)},
                         {"shm_messages", json_int(shm_messages)}}));
    return 0;
  });
}
