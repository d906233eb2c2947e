// bench_tp_peer — one rank of the tensor-parallel benchmark (benchmarks/drivers/tp_peer.py starts 2
// ranks with --rank/--world_size/--port; its peer is benchmarks/peers/dtensor_tp_peer.py).
//
// Model: a stack of `layers` GPT-2 pre-LayerNorm blocks (examples/gpt's Block: causal self-attention
// with c_attn a ColumnParallelLinear C -> 3C whose output is ordered [head, q|k|v, head_dim] and
// c_proj a RowParallelLinear C -> C; MLP c_fc ColumnParallelLinear C -> 4C, exact GELU, c_proj
// RowParallelLinear 4C -> C), no embedding and no head: x float32 [B, T, C] -> [B, T, C]. Loss: mean
// squared error against a target [B, T, C]. Trained under the hybrid_parallel plugin with tp_size =
// world size (dp = pp = 1), precision fp32, one intra-op thread, torch::optim::AdamW.
//
// Arguments ("--key value"):
//   --rank R --world_size W --port P        the job (127.0.0.1, Gloo)
//   --layers L --embd C --heads H            the model (H divisible by W)
//   --init DIR                               DIR/model.safetensors: the full (dense) weights, loaded
//                                            with booster.load_model (the plugin keeps each rank's slice)
//   --data FILE                              safetensors with x.<s>, y.<s> ([B, T, C] float32), s < steps
//   --steps S                                training steps on x.<s>, y.<s> (the equivalence steps)
//   --lr LR --weight_decay WD                AdamW (betas 0.9, 0.95; eps 1e-8)
//   --save DIR                               after the S steps: booster.save_model (gathered weights)
//   --first_out FILE                         the output of the first forward (rank 0; "out", [B, T, C])
//   --warmup N --iters N                     then timed iterations on x.0, y.0 (warm-up ones not recorded)
//   --out PREFIX                             writes PREFIX.rank<r>.json: losses of the S steps and the
//                                            timed iterations' forward (incl. loss), backward, step +
//                                            zero_grad and whole-iteration seconds
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "bench_common.h"
#include "booster/booster.h"
#include "booster/checkpoint/safetensors.h"
#include "booster/nn/tensor_parallel.h"

namespace {

using booster::nn::ColumnParallelLinear;
using booster::nn::LinearParallelOptions;
using booster::nn::RowParallelLinear;
using booster::nn::TensorParallelContext;

// Causal self-attention exactly as examples/gpt/model.cpp (dropout 0): x [B, T, C] -> [B, T, C].
struct AttentionImpl : torch::nn::Module {
  AttentionImpl(int64_t embd, int64_t heads, const TensorParallelContext& tp) : head_dim(embd / heads) {
    c_attn = register_module("c_attn", ColumnParallelLinear(LinearParallelOptions(embd, 3 * embd).context(tp)));
    c_proj = register_module("c_proj", RowParallelLinear(LinearParallelOptions(embd, embd).context(tp)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t B = x.size(0), T = x.size(1);
    auto qkv = c_attn(x).view({B, T, -1, 3, head_dim}).permute({3, 0, 2, 1, 4});  // [3, B, H/tp, T, D]
    auto q = qkv[0], k = qkv[1], v = qkv[2];
    const int64_t H = q.size(1);
    auto mask = torch::full({T, T}, -std::numeric_limits<float>::infinity(), q.options()).triu(1).expand({B * H, T, T});
    auto att = torch::baddbmm(mask, q.reshape({B * H, T, head_dim}), k.reshape({B * H, T, head_dim}).transpose(1, 2),
                              /*beta=*/1.0, /*alpha=*/1.0 / std::sqrt(static_cast<double>(head_dim)))
                   .softmax(-1);
    auto y = torch::bmm(att, v.reshape({B * H, T, head_dim}));
    return c_proj(y.view({B, H, T, head_dim}).transpose(1, 2).reshape({B, T, -1}));
  }
  ColumnParallelLinear c_attn{nullptr};
  RowParallelLinear c_proj{nullptr};
  int64_t head_dim;
};
TORCH_MODULE(Attention);

struct MLPImpl : torch::nn::Module {
  MLPImpl(int64_t embd, const TensorParallelContext& tp) {
    c_fc = register_module("c_fc", ColumnParallelLinear(LinearParallelOptions(embd, 4 * embd).context(tp)));
    c_proj = register_module("c_proj", RowParallelLinear(LinearParallelOptions(4 * embd, embd).context(tp)));
  }
  torch::Tensor forward(const torch::Tensor& x) { return c_proj(torch::gelu(c_fc(x))); }
  ColumnParallelLinear c_fc{nullptr};
  RowParallelLinear c_proj{nullptr};
};
TORCH_MODULE(MLP);

struct BlockImpl : torch::nn::Module {
  BlockImpl(int64_t embd, int64_t heads, const TensorParallelContext& tp) {
    ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embd})));
    attn = register_module("attn", Attention(embd, heads, tp));
    ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({embd})));
    mlp = register_module("mlp", MLP(embd, tp));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = x + attn(ln_1(x));
    return h + mlp(ln_2(h));
  }
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Attention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

// Parameter names h.<i>.ln_1.weight, h.<i>.attn.c_attn.weight, ... (the peer's names).
struct StackImpl : torch::nn::Module {
  StackImpl(int64_t layers, int64_t embd, int64_t heads, const TensorParallelContext& tp) {
    h = register_module("h", torch::nn::ModuleList());
    for (int64_t i = 0; i < layers; ++i) h->push_back(Block(embd, heads, tp));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (const auto& block : *h) x = block->as<Block>()->forward(x);
    return x;
  }
  torch::nn::ModuleList h{nullptr};
};
TORCH_MODULE(Stack);

torch::Tensor named(const booster::checkpoint::StateDict& tensors, const std::string& name) {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  throw std::runtime_error("the data file has no tensor '" + name + "'");
}

}  // namespace

int main(int argc, char** argv) {
  return booster::bench::guarded_main("bench_tp_peer", [&] {
    using namespace booster::bench;
    Args a(argc, argv);
    const int64_t layers = a.integer("layers", 2), embd = a.integer("embd", 64), heads = a.integer("heads", 4);
    const int64_t steps = a.integer("steps", 3), warmup = a.integer("warmup", 1), iters = a.integer("iters", 5);
    const std::string world_size = a.str("world_size", "2");
    auto config = booster::Config::from_string(
        "[booster]\nplugin = \"hybrid_parallel\"\n[distributed]\nthreads_per_rank = 1\ntimeout_s = 300\nport = " +
        a.str("port", "29500") + "\n[plugin]\nprecision = \"fp32\"\ntp_size = " + world_size + "\n");
    std::vector<std::string> launch{"--rank", a.str("rank", "0"), "--world_size", world_size};
    auto world = booster::launch_from_config(config, launch);
    booster::Booster booster(config);
    torch::manual_seed(0);  // the initial values are replaced by --init below
    Stack net(layers, embd, heads, booster.tensor_parallel_context());
    auto adamw = std::make_shared<torch::optim::AdamW>(
        net->parameters(), torch::optim::AdamWOptions(a.real("lr", 1e-3))
                               .betas(std::make_tuple(0.9, 0.95))
                               .eps(1e-8)
                               .weight_decay(a.real("weight_decay", 0.01)));
    auto [model, optimizer, criterion, loader, scheduler] = booster.boost(net, adamw);
    booster.load_model(model, a.str("init", "init"));
    const auto data = booster::checkpoint::load_safetensors(a.str("data", "data.safetensors"));

    std::vector<double> losses, fwd, bwd, step, iter;
    for (int64_t i = 0; i < steps + warmup + iters; ++i) {
      const int64_t s = i < steps ? i : 0;
      const auto x = named(data, "x." + std::to_string(s)), y = named(data, "y." + std::to_string(s));
      const double t0 = now_s();
      auto out = model.forward(x);
      auto loss = torch::mse_loss(out, y);
      const double t1 = now_s();
      booster.backward(loss, *optimizer);
      const double t2 = now_s();
      optimizer->step();
      optimizer->zero_grad();
      const double t3 = now_s();
      if (i == 0 && a.has("first_out") && world->rank() == 0)
        booster::checkpoint::write_safetensors(a.str("first_out", ""), {{"out", out.detach()}});
      if (i < steps) losses.push_back(loss.item<double>());
      if (i + 1 == steps && a.has("save")) booster.save_model(model, a.str("save", ""));
      if (i >= steps + warmup) {
        fwd.push_back(t1 - t0);
        bwd.push_back(t2 - t1);
        step.push_back(t3 - t2);
        iter.push_back(t3 - t0);
      }
    }
    write_file(a.str("out", "bench_tp_peer") + ".rank" + std::to_string(world->rank()) + ".json",
               json_obj({{"rank", json_int(world->rank())}, {"threads", json_int(at::get_num_threads())},
                         {"losses", json_list(losses)}, {"forward_s", json_list(fwd)}, {"backward_s", json_list(bwd)},
                         {"step_s", json_list(step)}, {"iter_s", json_list(iter)}}));
    return 0;
  });
}
