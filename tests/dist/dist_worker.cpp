// dist_worker — one rank of a multi-process test. Started N times by booster_dist_tests with the
// torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...). Arguments are key=value:
//   scenario=train|unused|buffers|mismatch|overflow|zero_groups|resume|memory  out=DIR  steps=K  batch=B (per rank, per micro-batch)
//   accum=A (micro-batches per step; the first A-1 inside no_sync)
//   optimizer=sgd|adam|adamw|rmsprop|adagrad|debiased_momentum (the last is user-registered)
//   timeout=S  set=plugin.key=value (repeatable, config overrides)
//   scenario=hang hang=stop|stuck: after one allreduce the last rank stops itself (SIGSTOP) or sleeps
//   60 s; the others' next allreduce fails (timeout=S): its message goes to DIR/rank<r>.err, the
//   pid of every rank to DIR/rank<r>.pid, and they exit 4
// Results: DIR/rank<r>.pt (torch::save of the named tensors), DIR/rank<r>.txt (stats, key value).
#include <torch/torch.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>
#include <limits>
#include <iostream>
#include <map>

#include "booster/booster.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/device.h"
#include "booster/estimate.h"
#include "booster/core/replica.h"
#include "booster/mixed_precision/grad_scaler.h"
#include "booster/nn/unit.h"
#include "booster/wrappers/zero_optimizer.h"
#include "common/debiased_momentum.h"
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
  for (auto& [n, t] : named) tensors.push_back(t.detach().to(torch::kCPU).clone());
  torch::save(tensors, path);
}

// The model's parameters in named_parameters order, as full tensors. Under torch_fsdp the
// parameters are sharded (their storage is freed between uses), so the full values come from a
// model save (collective; every rank then reads the files): that also exercises the streamed save.
template <class M>
std::vector<std::pair<std::string, torch::Tensor>> full_parameters(const booster::Config& config, booster::Booster& b,
                                                                   booster::ModelWrapper<M>& model) {
  auto named = booster::named_parameters_of(*model.module(), false);
  const std::string plugin = config.section("booster").get_string("plugin", "torch_ddp");
  if (plugin != "torch_fsdp" && plugin != "gemini") return named;  // sharded: the saved full model
  const std::string dir = arg("out", ".") + "/full_model";
  b.save_model(model, dir);
  std::map<std::string, torch::Tensor> saved;
  for (auto& [name, t] : booster::checkpoint::load_state_dict(dir)) saved[name] = t;
  for (auto& [name, t] : named) t = saved.at(name);
  return named;
}

booster::Config make_config() {
  auto c = booster::Config::from_string("[booster]\nplugin = \"torch_ddp\"\n[distributed]\ntimeout_s = " +
                                        arg("timeout", "60") + "\nthreads_per_rank = 1\n");
  c.apply_overrides(overrides);
  return c;
}

// A ZeroOptimizer that puts an inf into this rank's gradient slice (after the reduction, so only
// this rank sees it) while `inject` is set.
struct InjectingZero : booster::ZeroOptimizer {
  using booster::ZeroOptimizer::ZeroOptimizer;
  bool inject = false;
  std::vector<torch::Tensor> local_gradients() const override {
    auto grads = booster::ZeroOptimizer::local_gradients();
    if (inject && !grads.empty()) grads[0].view({-1})[0] = std::numeric_limits<float>::infinity();
    return grads;
  }
};

// dist_common.h's optimizers, and DebiasedMomentum (registered in main(), as a user would).
std::shared_ptr<torch::optim::Optimizer> make_any_optimizer(const std::string& kind, std::vector<torch::Tensor> params) {
  if (kind == "debiased_momentum") return make_debiased_momentum(std::move(params));
  return make_optimizer(kind, std::move(params));
}

void write_stats(const std::string& path, const std::map<std::string, int64_t>& stats) {
  std::ofstream out(path);
  for (auto& [k, v] : stats) out << k << " " << v << "\n";
}

// cuBLAS and cuBLASLt allocate their workspaces from the caching allocator at the first matmul of
// a thread and stream (32 MiB each on Hopper; backward runs on autograd's device thread, a second
// handle): a biased Linear's forward and backward makes all of them before the model's memory is
// measured (the memory scenario) or Gemini's auto placement takes its non-model baseline at boost().
// No random numbers are drawn (the scenarios' initial weights come from the global generator).
void warm_up_cuda(const c10::Device& device) {
  if (!device.is_cuda()) return;
  const auto o = torch::TensorOptions().device(device);
  auto w = torch::ones({64, 64}, o).requires_grad_();
  auto bias = torch::zeros({64}, o).requires_grad_();
  torch::nn::functional::linear(torch::ones({8, 64}, o), w, bias).sum().backward();
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
    warm_up_cuda(booster.device());
    // model=mlp (default) | reordered (dist_common.h's ReorderedMLP)
    auto train = [&](auto net) {
      if (rank != 0) {  // a different init on other ranks: boost() must broadcast rank 0's
        torch::NoGradGuard g;
        for (auto& p : net->parameters()) p.uniform_(-1, 1);
      }
      auto opt = make_any_optimizer(arg("optimizer", "sgd"), net->parameters());
      auto boosted = booster.boost(net, opt);
      auto batches = make_batches(steps, b * ws * accum, 11);
      std::vector<torch::Tensor> norms;  // last_grad_norm after each step (clipping via booster.max_norm)
      std::vector<double> losses;        // this rank's loss of each step (its micro-batches summed)
      for (int64_t s = 0; s < steps; ++s) {
        losses.push_back(0.0);
        for (int64_t m = 0; m < accum; ++m) {
          int64_t row = (m * ws + rank) * b;
          auto x = batches.inputs[s].narrow(0, row, b).to(booster.device());
          auto y = batches.targets[s].narrow(0, row, b).to(booster.device());
          auto step_loss = [&] {
            // The loss in fp32 (a bf16 autocast output is cast up, as the precision's criterion does).
            auto loss = torch::mse_loss(boosted.model.forward(x).to(torch::kFloat), y) / static_cast<double>(accum);
            booster.backward(loss, *boosted.optimizer);
            losses.back() += loss.template item<double>();
          };
          if (m + 1 < accum && arg("accum_sync", "false") != "true") {  // accum_sync: every pass synchronises
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
      const auto stats = boosted.model.hooks().stats();  // as the last step left them (a save moves state)
      save_named(prefix + ".pt", full_parameters(config, booster, boosted.model));
      save_named(prefix + "_norms.pt", {{"norms", torch::cat(norms)}});
      save_named(prefix + "_losses.pt", {{"losses", torch::tensor(losses, torch::kDouble)}});
      write_stats(prefix + ".txt", stats);
    };
    torch::manual_seed(7);
    if (arg("model", "mlp") == "reordered") train(ReorderedMLP());
    else train(MLP());
  } else if (scenario == "overflow") {
    // Loss scaling with an inf injected into rank `bad_rank`'s gradients at step `bad_step` (after the
    // DDP allreduce, so only this rank sees it): every rank must skip that step.
    // zero_stage > 0: the ZeroOptimizer (run with set=booster.plugin="low_level_zero"; the plugin
    // then only installs its hooks, the test builds the optimizer wrapper with a loss scaler).
    int64_t zero_stage = iarg("zero_stage", 0);
    torch::manual_seed(7);
    MLP net;
    auto opt = make_optimizer("sgd", net->parameters());
    auto boosted = zero_stage > 0 ? booster.boost(net) : booster.boost(net, opt);
    booster::mixed_precision::DynamicGradScalerOptions so;
    so.initial_scale = 1024;
    so.hysteresis = 1;
    so.growth_interval = 2;
    booster::OptimizerWrapperOptions wo;
    wo.scaler = std::make_shared<booster::mixed_precision::DynamicGradScaler>(so);
    wo.group = world;
    std::shared_ptr<booster::OptimizerWrapper> wrapper_ptr;
    InjectingZero* zero = nullptr;
    if (zero_stage > 0) {
      booster::ZeroOptions zo;
      zo.stage = static_cast<int>(zero_stage);
      zo.reduce_bucket_elements = 300;
      auto z = std::make_shared<InjectingZero>(opt, boosted.model.hooks_ptr(), wo, zo,
                                               booster::named_parameters_of(*net, false));
      zero = z.get();
      wrapper_ptr = z;
    } else {
      wrapper_ptr = std::make_shared<booster::OptimizerWrapper>(opt, boosted.model.hooks_ptr(), wo);
    }
    booster::OptimizerWrapper& wrapper = *wrapper_ptr;
    auto batches = make_batches(steps, b * ws, 11);
    int64_t bad_step = iarg("bad_step", 1), bad_rank = iarg("bad_rank", 1);
    std::vector<torch::Tensor> taken, scales;
    for (int64_t s = 0; s < steps; ++s) {
      auto x = batches.inputs[s].narrow(0, rank * b, b), y = batches.targets[s].narrow(0, rank * b, b);
      booster.backward(torch::mse_loss(boosted.model.forward(x), y), wrapper);
      if (s == bad_step && rank == bad_rank) {
        if (zero) zero->inject = true;
        else net->l2->weight.grad()[0][0] = std::numeric_limits<float>::infinity();
      }
      taken.push_back(torch::full({1}, wrapper.step() ? 1.0 : 0.0, torch::kDouble));
      scales.push_back(torch::full({1}, wrapper.loss_scale(), torch::kDouble));
      if (zero) zero->inject = false;
      wrapper.zero_grad();
      save_named(prefix + "_step" + std::to_string(s) + ".pt", booster::named_parameters_of(*net, false));
    }
    save_named(prefix + "_steps.pt", {{"taken", torch::cat(taken)}, {"scales", torch::cat(scales)}});
    write_stats(prefix + ".txt", {{"skipped_steps", wrapper.skipped_steps()}});
  } else if (scenario == "zero_groups") {
    // Two optimizer groups, padding, a 1-element parameter, frozen parameters (run with
    // set=booster.plugin="low_level_zero").
    torch::manual_seed(7);
    OddNet net;
    auto opt = make_odd_optimizer(net);
    auto boosted = booster.boost(net, opt);
    auto batches = make_batches(steps, b * ws, 19);
    for (int64_t s = 0; s < steps; ++s) {
      auto x = batches.inputs[s].narrow(0, rank * b, b), y = batches.targets[s].narrow(0, rank * b, b);
      booster.backward(torch::mse_loss(boosted.model.forward(x), y), *boosted.optimizer);
      boosted.optimizer->step();
      boosted.optimizer->zero_grad();
    }
    save_named(prefix + ".pt", full_parameters(config, booster, boosted.model));
  } else if (scenario == "resume") {
    // Steps [start, stop) of a run of the MLP on global batches of `global` rows (each rank takes
    // global / world_size rows), after loading model + optimizer from load=DIR when given; saves
    // them into save=DIR when given (the optimizer in optimizer_format=auto|gathered|sharded), and
    // writes the parameters right after loading into DIR/rank<r>_loaded.pt. Any plugin / world size: the trajectory is the same. Any precision:
    // the loss is computed in fp32 (a bf16 model's output is cast).
    int64_t start = iarg("start", 0), stop = iarg("stop", steps), global = iarg("global", 8);
    torch::manual_seed(7);
    MLP net;
    auto opt = make_any_optimizer(arg("optimizer", "adamw"), net->parameters());
    auto boosted = booster.boost(net, opt);
    if (!arg("load", "").empty()) {
      booster.load_model(boosted.model, arg("load", "") + "/model");
      booster.load_optimizer(*boosted.optimizer, arg("load", "") + "/optimizer");
      save_named(prefix + "_loaded.pt", full_parameters(config, booster, boosted.model));
    }
    auto batches = make_batches(stop, global, 23);
    int64_t rows = global / ws;
    for (int64_t s = start; s < stop; ++s) {
      auto x = batches.inputs[s].narrow(0, rank * rows, rows).to(booster.device());
      auto y = batches.targets[s].narrow(0, rank * rows, rows).to(booster.device());
      booster.backward(torch::mse_loss(boosted.model.forward(x).to(torch::kFloat), y), *boosted.optimizer);
      boosted.optimizer->step();
      boosted.optimizer->zero_grad();
    }
    write_stats(prefix + ".txt", boosted.model.hooks().stats());  // as the last step left them
    if (!arg("save", "").empty()) {
      booster.save_model(boosted.model, arg("save", "") + "/model");
      booster::checkpoint::OptimizerSaveOptions so;  // optimizer_format=auto|gathered|sharded
      const std::string format = arg("optimizer_format", "auto");
      if (format == "gathered") so.format = booster::checkpoint::OptimizerFormat::kGathered;
      else if (format == "sharded") so.format = booster::checkpoint::OptimizerFormat::kSharded;
      booster.save_optimizer(*boosted.optimizer, arg("save", "") + "/optimizer", so);
    }
    save_named(prefix + ".pt", full_parameters(config, booster, boosted.model));
  } else if (scenario == "memory") {
    // The booster's memory report for a wide MLP (width=W) with AdamW, after boost() (planned) and
    // after `steps` steps (actual tensors). On a CUDA device also the allocator's peak over boost()
    // and the steps above what was allocated before the model was built (device_peak_bytes), and
    // the estimate's device bytes of this plugin's row number estimate_row=K (its rows in order;
    // activations counted as 0: the batch's are under 0.1% of the model states). save_params=1: the
    // full parameters after the steps to out/rankR.pt (as the train scenario).
    int64_t width = iarg("width", 512);
    const c10::Device device = booster.device();
    int64_t device_start = 0;
    if (device.is_cuda()) {
      warm_up_cuda(device);
      booster::reset_device_peak(device);
      device_start = booster::device_memory(device).allocated;
    }
    torch::manual_seed(7);
    // The layers are shard units (booster::nn::Unit): pass-through under DDP and ZeRO, same sizes.
    using booster::nn::Unit;
    auto net = torch::nn::Sequential(Unit<torch::nn::Linear>(kIn, width), torch::nn::Tanh(),
                                     Unit<torch::nn::Linear>(width, width), torch::nn::Tanh(),
                                     Unit<torch::nn::Linear>(width, kOut));
    auto opt = make_optimizer("adamw", net->parameters());
    booster::EstimateRequest request = booster::describe_model(*net, opt.get());
    request.world_size = ws;
    request.device = device.is_cuda() ? "cuda" : "cpu";
    auto boosted = booster.boost(net, opt);
    auto planned = booster.memory_report(boosted.model, boosted.optimizer.get());
    const int64_t memory_steps = iarg("steps", 1);
    auto batches = make_batches(memory_steps, b * ws, 29);
    for (int64_t s = 0; s < memory_steps; ++s) {
      auto x = batches.inputs[s].narrow(0, rank * b, b).to(device), y = batches.targets[s].narrow(0, rank * b, b).to(device);
      booster.backward(torch::mse_loss(boosted.model.forward(x).to(torch::kFloat), y), *boosted.optimizer);
      boosted.optimizer->step();
      if (s + 1 < memory_steps) boosted.optimizer->zero_grad();
    }
    auto actual = booster.memory_report(boosted.model, boosted.optimizer.get());
    int64_t numel = 0;
    for (auto& p : net->parameters()) numel += p.numel();
    if (device.is_cuda()) {
      const std::string plugin = config.section("booster").get_string("plugin", "torch_ddp");
      const auto table = booster::estimate_installed_plugins(request, world);
      int64_t row = iarg("estimate_row", 0), estimate = -1;
      for (const auto& e : table.rows)
        if (e.plugin == plugin && row-- == 0) estimate = e.device_bytes;
      write_stats(prefix + "_device.txt", {{"device_peak_bytes", booster::device_memory(device).peak_allocated - device_start},
                                           {"estimate_device_bytes", estimate}});
    }
    if (iarg("save_params", 0)) save_named(prefix + ".pt", full_parameters(config, booster, boosted.model));
    write_stats(prefix + ".txt", {{"numel", numel},
                                  {"planned_parameters", planned.parameters},
                                  {"planned_gradients", planned.gradients},
                                  {"planned_master_weights", planned.master_weights},
                                  {"planned_optimizer_states", planned.optimizer_states},
                                  {"planned_communication", planned.communication_buffers},
                                  {"actual_parameters", actual.parameters},
                                  {"actual_gradients", actual.gradients},
                                  {"actual_master_weights", actual.master_weights},
                                  {"actual_optimizer_states", actual.optimizer_states}});
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
        auto grad_or_empty = [](const torch::Tensor& p) { return p.grad().defined() ? p.grad() : torch::empty({0}); };
        save_named(prefix + "_grads.pt", {{"trunk.weight", grad_or_empty(net->trunk->weight)},
                                          {"head_b.weight", grad_or_empty(net->head_b->weight)}});
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
  } else if (scenario == "hang") {
    std::ofstream(prefix + ".pid") << ::getpid() << "\n";
    torch::Tensor t = torch::ones({1024});
    world->allreduce(t).wait();
    if (rank == ws - 1) {
      if (arg("hang", "stop") == "stop") ::raise(SIGSTOP);
      else std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    try {
      world->allreduce(t).wait();
      std::ofstream(prefix + ".err") << "no error\n";
    } catch (const booster::dist::DistError& e) {
      std::ofstream(prefix + ".err") << e.what() << "\n";
    }
    return 4;
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
    ensure_debiased_momentum_registered();
    return run();
  } catch (const std::exception& e) {
    std::cerr << "dist_worker: error: " << e.what() << std::endl;
    return 3;
  }
}
