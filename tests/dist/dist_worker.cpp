// dist_worker — one rank of a multi-process test. Started N times by booster_dist_tests with the
// torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...). Arguments are key=value:
//   scenario=train|unused|buffers|mismatch  out=DIR  steps=K  batch=B (per rank, per micro-batch)
//   accum=A (micro-batches per step; the first A-1 inside no_sync)  optimizer=sgd|adamw
//   timeout=S  set=plugin.key=value (repeatable, config overrides)
// Results: DIR/rank<r>.pt (torch::save of the named tensors), DIR/rank<r>.txt (stats, key value).
#include <torch/torch.h>

#include <fstream>
#include <limits>
#include <iostream>
#include <map>

#include "booster/booster.h"
#include "booster/core/replica.h"
#include "booster/mixed_precision/grad_scaler.h"
#include "dist/dist_common.h"

using namespace booster::testing;

namespace {

std::map<std::string, std::string> args;
std::vector<std::string> overrides;

std::string arg(const std::string& k, const std::string& def) {
  auto it = args.find(k);
  return it == args.end() ? def : it->second;
}
int64_t iarg(const std::string& k, int64_t def) { return std::stoll(arg(k, std::to_string(def))); }

void save_named(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  std::vector<torch::Tensor> tensors;
  for (auto& [n, t] : named) tensors.push_back(t.detach().clone());
  torch::save(tensors, path);
}

booster::Config make_config() {
  auto c = booster::Config::from_string("[booster]\nplugin = \"torch_ddp\"\n[distributed]\ntimeout_s = " +
                                        arg("timeout", "60") + "\nthreads_per_rank = 1\n");
  c.apply_overrides(overrides);
  return c;
}

void write_stats(const std::string& path, const std::map<std::string, int64_t>& stats) {
  std::ofstream out(path);
  for (auto& [k, v] : stats) out << k << " " << v << "\n";
}

int run() {
  booster::Config config = make_config();
  std::vector<std::string> no_args;
  auto world = booster::launch_from_config(config, no_args);
  int rank = world->rank(), ws = world->size();
  std::string out = arg("out", ".");
  std::string prefix = out + "/rank" + std::to_string(rank);
  std::string scenario = arg("scenario", "train");
  int64_t steps = iarg("steps", 3), b = iarg("batch", 4), accum = iarg("accum", 1);
  booster::Booster booster(config);

  if (scenario == "train") {
    torch::manual_seed(7);
    MLP net;
    if (rank != 0) {  // a different init on other ranks: boost() must broadcast rank 0's
      torch::NoGradGuard g;
      for (auto& p : net->parameters()) p.uniform_(-1, 1);
    }
    auto opt = make_optimizer(arg("optimizer", "sgd"), net->parameters());
    auto boosted = booster.boost(net, opt);
    auto batches = make_batches(steps, b * ws * accum, 11);
    std::vector<torch::Tensor> norms;  // last_grad_norm after each step (clipping via booster.max_norm)
    for (int64_t s = 0; s < steps; ++s) {
      for (int64_t m = 0; m < accum; ++m) {
        int64_t row = (m * ws + rank) * b;
        auto x = batches.inputs[s].narrow(0, row, b), y = batches.targets[s].narrow(0, row, b);
        auto step_loss = [&] {
          auto loss = torch::mse_loss(boosted.model.forward(x), y) / static_cast<double>(accum);
          booster.backward(loss, *boosted.optimizer);
        };
        if (m + 1 < accum) {
          auto guard = booster.no_sync(boosted.model);
          step_loss();
        } else {
          step_loss();
        }
      }
      boosted.optimizer->step();
      norms.push_back(torch::full({1}, boosted.optimizer->last_grad_norm(), torch::kDouble));
      boosted.optimizer->zero_grad();
    }
    save_named(prefix + ".pt", booster::named_parameters_of(*net, false));
    save_named(prefix + "_norms.pt", {{"norms", torch::cat(norms)}});
    write_stats(prefix + ".txt", boosted.model.hooks().stats());
  } else if (scenario == "overflow") {
    // Loss scaling with an inf injected into rank `bad_rank`'s gradients at step `bad_step` (after the
    // DDP allreduce, so only this rank sees it): every rank must skip that step.
    torch::manual_seed(7);
    MLP net;
    auto opt = make_optimizer("sgd", net->parameters());
    auto boosted = booster.boost(net, opt);
    booster::mixed_precision::DynamicGradScalerOptions so;
    so.initial_scale = 1024;
    so.hysteresis = 1;
    so.growth_interval = 2;
    booster::OptimizerWrapperOptions wo;
    wo.scaler = std::make_shared<booster::mixed_precision::DynamicGradScaler>(so);
    wo.group = world;
    booster::OptimizerWrapper wrapper(opt, boosted.model.hooks_ptr(), wo);
    auto batches = make_batches(steps, b * ws, 11);
    int64_t bad_step = iarg("bad_step", 1), bad_rank = iarg("bad_rank", 1);
    std::vector<torch::Tensor> taken, scales;
    for (int64_t s = 0; s < steps; ++s) {
      auto x = batches.inputs[s].narrow(0, rank * b, b), y = batches.targets[s].narrow(0, rank * b, b);
      booster.backward(torch::mse_loss(boosted.model.forward(x), y), wrapper);
      if (s == bad_step && rank == bad_rank) net->l2->weight.grad()[0][0] = std::numeric_limits<float>::infinity();
      taken.push_back(torch::full({1}, wrapper.step() ? 1.0 : 0.0, torch::kDouble));
      scales.push_back(torch::full({1}, wrapper.loss_scale(), torch::kDouble));
      wrapper.zero_grad();
      save_named(prefix + "_step" + std::to_string(s) + ".pt", booster::named_parameters_of(*net, false));
    }
    save_named(prefix + "_steps.pt", {{"taken", torch::cat(taken)}, {"scales", torch::cat(scales)}});
    write_stats(prefix + ".txt", {{"skipped_steps", wrapper.skipped_steps()}});
  } else if (scenario == "unused") {
    torch::manual_seed(7);
    BranchNet net;
    auto opt = make_optimizer("sgd", net->parameters());
    auto boosted = booster.boost(net, opt);
    auto batches = make_batches(steps, b * ws, 13);
    for (int64_t s = 0; s < steps; ++s) {
      auto x = batches.inputs[s].narrow(0, rank * b, b), y = batches.targets[s].narrow(0, rank * b, b);
      auto loss = torch::mse_loss(boosted.model.forward(x, rank == 0), y);
      booster.backward(loss, *boosted.optimizer);
      if (s + 1 == steps) {  // grads of the last step, before the update
        save_named(prefix + "_grads.pt", {{"trunk.weight", net->trunk->weight.grad()},
                                          {"head_b.weight", net->head_b->weight.grad()}});
        write_stats(prefix + ".txt", {{"never_grad_defined", net->never->weight.grad().defined() ? 1 : 0}});
      }
      boosted.optimizer->step();
      boosted.optimizer->zero_grad();
    }
    save_named(prefix + ".pt", booster::named_parameters_of(*net, false));
  } else if (scenario == "buffers") {
    torch::manual_seed(7);
    BNNet net;
    auto boosted = booster.boost(net);
    {
      torch::NoGradGuard g;
      net->bn->running_mean.fill_(static_cast<double>(rank + 1));  // drift after boost
    }
    auto x = make_batches(1, 8, 17).inputs[0];  // same input on every rank
    boosted.model.forward(x);
    save_named(prefix + ".pt", booster::named_buffers_of(*net));
  } else if (scenario == "mismatch") {
    torch::manual_seed(7);
    std::shared_ptr<torch::nn::Module> net;
    if (rank == 1) net = std::make_shared<BNNetImpl>(); else net = std::make_shared<MLPImpl>();
    booster.boost(net);
  } else {
    std::cerr << "dist_worker: unknown scenario " << scenario << "\n";
    return 2;
  }
  std::cout << "dist_worker: rank " << rank << " done" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (eq == std::string::npos) { std::cerr << "dist_worker: expected key=value, got " << a << "\n"; return 2; }
    if (a.substr(0, eq) == "set") overrides.push_back(a.substr(eq + 1));
    else args[a.substr(0, eq)] = a.substr(eq + 1);
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::cerr << "dist_worker: error: " << e.what() << std::endl;
    return 3;
  }
}
