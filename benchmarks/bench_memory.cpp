// bench_memory — per-rank memory of data-parallel training with AdamW: peak RSS (VmHWM) and the
// booster's own MemoryReport, for DDP (torch_ddp), ZeRO stage 1 / 2 (low_level_zero, fp32 or
// bf16 with fp32 master slices) and FSDP (torch_fsdp: FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD,
// fp32); and, with --save, rank 0's RSS rise during Booster::save_model. Run by
// benchmarks/drivers/memory.py (benchmark 4 of the suite):
//
//   booster run --nproc_per_node N bench_memory [options]      (or --rank R --world_size N --port P)
//     --plugin torch_ddp|low_level_zero|torch_fsdp|gemini   --stage 1|2   --precision fp32|bf16
//     --strategy FULL_SHARD|SHARD_GRAD_OP|HYBRID_SHARD|NO_SHARD   (torch_fsdp; default FULL_SHARD)
//     --shard_group_size S      (torch_fsdp HYBRID_SHARD: ranks per shard group)
//     --hidden H --layers L     an MLP of L booster::nn::Unit<Linear(H, H)> layers (Tanh between):
//                               L * (H*H + H) parameters; every Linear is one FSDP shard unit (the
//                               Unit is a pass-through under DDP and ZeRO: names and math unchanged)
//     --steps K                 optimizer steps (default 2)
//     --global_batch B          rows per step over all ranks (default 8); rank r trains rows
//                               [r * B/N, (r+1) * B/N), so every configuration and every N computes
//                               the same full-batch gradient
//     --lr X                    AdamW learning rate (default 1e-4; weight decay 0.01)
//     --set a.b=v[,c.d=w]       extra config overrides (e.g. plugin.gradient_as_bucket_view=true)
//     --save_dir DIR            where model saves go (a directory every rank sees; required by
//                               torch_fsdp and gemini, whose checksum is read back from a save)
//     --save M1[,M2...]         after the training figures, Booster::save_model once per mode into
//                               DIR/<mode>: safetensors | safetensors_sharded | bin | bin_sharded
//                               (sharded: size_per_shard_mb = --save_shard_mb, default 16). Per mode,
//                               rank 0 reports VmRSS before the save and VmHWM during it (reset with
//                               clear_refs right before), and the sizes of the files written.
//
// Every rank prints one line
//   BENCH_MEMORY {"rank", "world_size", "numel", "parameters", "gradients", "master_weights",
//                 "optimizer_states", "communication_buffers", "model_states",
//                 "baseline_rss_bytes", "rss_after_boost_bytes", "setup_hwm_bytes", "train_hwm_bytes",
//                 "vm_hwm_bytes", "final_rss_bytes", "loss", "eval_loss", "checksum", "checksum_sq", ...}
// baseline_rss: VmRSS after launch (LibTorch loaded, rendezvous done), before the model exists.
// setup_hwm: VmHWM after boost() (model built, flattened/cast, optimizer wrapped). The peak is then
// reset (echo 5 > /proc/self/clear_refs) so train_hwm is the peak of the training steps alone;
// vm_hwm = max of the two = the process's peak. The MemoryReport is taken after the steps (every
// lazily created tensor exists). step_start_rss / forward_hwm / backward_hwm / backward_end_rss /
// step_hwm: per step, VmRSS at its start, the peaks of the forward (+ loss), of the backward, VmRSS
// right after the backward (gradients reduced, every FSDP unit freed again: the model states with
// their gradients) and the peak of step() + zero_grad() (VmHWM reset before each phase).
// plugin_stats / plugin_stats_before: the plugin's ModelHooks::stats() right after / right before the
// training steps (so their difference excludes the evaluation forwards; FSDP: all_gathers,
// prefetches, reduce_scatters, max_gathered_units, max_gathered_bytes, ...); largest_unit_bytes:
// parameter bytes of the largest Unit (fp32).
// loss: the last step's training loss; initial_eval_loss / eval_loss: the loss on a fixed batch
// before / after the steps (all averaged over ranks); checksum / checksum_sq: sum of all parameters and
// of their squares in float64 after the steps, computed after the peaks were read, so their
// temporaries do not count. DDP / ZeRO: from the model's parameters (identical on every rank).
// torch_fsdp: the model's parameters are views of freed storage between iterations (reading them
// would read freed memory), so the checksum comes from the model as saved by Booster::save_model
// (the first --save mode, or a safetensors save into DIR/checksum when --save is not given), read
// back with booster::checkpoint::load_state_dict: what a user would get, through the public API.
// checksum_source says which ("parameters" or "saved_model").
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "bench_common.h"
#include "booster/booster.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/core/host_cache.h"
#include "booster/estimate.h"
#include "booster/nn/unit.h"

namespace {

// A field of /proc/self/status in bytes (the kernel reports kB); -1 when absent.
int64_t status_bytes(const std::string& field) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(field + ":", 0) == 0) {
      std::istringstream ss(line.substr(field.size() + 1));
      int64_t kb = -1;
      ss >> kb;
      return kb < 0 ? -1 : kb * 1024;
    }
  }
  return -1;
}

// "a, b, c" (json_arr would break the one-line record the driver parses).
std::string join_items(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
  return out;
}

// Resets VmHWM to the current RSS (Linux >= 4.0); false when not permitted.
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

int run(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::vector<std::string> launch_args = args;
  auto config_text = [](const booster::bench::Args& a) {
    std::string plugin = a.str("plugin", "torch_ddp");
    std::string text = "[booster]\nplugin = \"" + plugin + "\"\n";
    if (plugin == "low_level_zero") {
      text += "[plugin]\nstage = " + a.str("stage", "1") + "\nprecision = \"" + a.str("precision", "fp32") + "\"\n";
    } else if (plugin == "torch_fsdp") {
      if (a.str("precision", "fp32") != "fp32")
        throw std::invalid_argument("bench_memory: torch_fsdp runs fp32 here (its bf16 is [plugin.mixed_precision])");
      text += "[plugin]\nsharding_strategy = \"" + a.str("strategy", "FULL_SHARD") + "\"\n";
      if (a.has("shard_group_size")) text += "shard_group_size = " + a.str("shard_group_size", "0") + "\n";
    } else if (plugin == "gemini") {  // chunk and placement options through --set
      text += "[plugin]\nprecision = \"" + a.str("precision", "fp32") + "\"\n";
    } else if (a.str("precision", "fp32") != "fp32") {
      throw std::invalid_argument("bench_memory: --precision other than fp32 needs --plugin low_level_zero or gemini");
    }
    text += "[distributed]\nthreads_per_rank = 1\ntimeout_s = 300\n";
    return text;
  };

  // Our options: the arguments without the launch flags (--rank --world_size --port --host
  // --backend), which launch_from_config takes out of launch_args below.
  std::vector<std::string> own = args;
  booster::dist::parse_launch_flags(own);
  std::vector<char*> cargv{argv[0]};
  for (auto& s : own) cargv.push_back(s.data());
  booster::bench::Args a(static_cast<int>(cargv.size()), cargv.data());

  auto config = booster::Config::from_string(config_text(a));
  if (a.has("set")) {
    std::vector<std::string> overrides;
    std::stringstream ss(a.str("set", ""));
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) overrides.push_back(item);
    config.apply_overrides(overrides);
  }
  auto world = booster::launch_from_config(config, launch_args);
  const int rank = world->rank(), ws = world->size();
  const int64_t baseline_rss = status_bytes("VmRSS");

  const int64_t hidden = a.integer("hidden", 3584), layers = a.integer("layers", 4);
  const int64_t steps = a.integer("steps", 2), global = a.integer("global_batch", 8);
  const double lr = a.real("lr", 1e-4);
  if (global % ws != 0)
    throw std::invalid_argument("bench_memory: --global_batch " + std::to_string(global) +
                                " is not a multiple of the world size " + std::to_string(ws));
  const int64_t rows = global / ws;

  booster::Booster booster(config);
  torch::manual_seed(1234);
  torch::nn::Sequential net;
  for (int64_t l = 0; l < layers; ++l) {
    net->push_back(booster::nn::Unit<torch::nn::Linear>(hidden, hidden));
    if (l + 1 < layers) net->push_back(torch::nn::Tanh());
  }
  int64_t numel = 0;
  for (auto& p : net->parameters()) numel += p.numel();
  int64_t largest_unit_bytes = 0;
  for (auto& unit : booster::nn::collect_units(*net)) {
    int64_t bytes = 0;
    for (auto& p : unit->unit_module().parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
    largest_unit_bytes = std::max(largest_unit_bytes, bytes);
  }
  const std::string plugin = a.str("plugin", "torch_ddp");
  const bool fsdp = plugin == "torch_fsdp" || plugin == "gemini";  // sharded parameters: checksums from a save
  const std::string save_dir = a.str("save_dir", "");
  std::vector<std::string> save_modes;
  {
    std::stringstream ss(a.str("save", ""));
    std::string item;
    while (std::getline(ss, item, ','))
      if (!item.empty()) save_modes.push_back(item);
  }
  for (const auto& m : save_modes)
    if (m != "safetensors" && m != "safetensors_sharded" && m != "bin" && m != "bin_sharded")
      throw std::invalid_argument("bench_memory: --save " + m + ": expected safetensors, safetensors_sharded, bin or bin_sharded");
  if ((fsdp || !save_modes.empty()) && save_dir.empty())
    throw std::invalid_argument("bench_memory: --save_dir is required with --save and with torch_fsdp");
  auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(),
                                                     torch::optim::AdamWOptions(lr).weight_decay(0.01));
  // The plugin's own estimate for this model (booster/estimate.h), before anything is configured:
  // every row it offers, with the per-rank total without the runtime (the driver adds the baseline
  // and picks the row of this configuration). Activations are not measured (8 rows: under 1 MiB).
  std::vector<std::string> estimate_rows;
  int64_t estimate_runtime = 0;  // what the estimate mode calls runtime: RSS now minus the model's bytes
  {
    int64_t model_bytes = 0;
    for (const auto& p : net->parameters()) model_bytes += static_cast<int64_t>(p.nbytes());
    for (const auto& b : net->buffers()) model_bytes += static_cast<int64_t>(b.nbytes());
    estimate_runtime = status_bytes("VmRSS") - model_bytes;
    booster::EstimateRequest request = booster::describe_model(*net, adamw.get());
    request.world_size = ws;
    request.precision = a.str("precision", "fp32");
    for (const auto& e : booster.plugin().estimate_memory(request)) {
      std::vector<std::string> opts;
      for (const auto& o : e.options) opts.push_back(booster::bench::json_str(o));
      estimate_rows.push_back(booster::bench::json_obj({{"configuration", booster::bench::json_str(e.configuration)},
                                                        {"options", "[" + join_items(opts) + "]"},
                                                        {"model_states", std::to_string(e.states.model_states())},
                                                        {"transient", std::to_string(e.transient)},
                                                        {"total", std::to_string(e.total())}}));
    }
  }
  auto boosted = booster.boost(net.ptr(), adamw);
  const int64_t rss_after_boost = status_bytes("VmRSS");
  const int64_t setup_hwm = status_bytes("VmHWM");

  // Fixed data, the same on every rank and in every configuration: each step's global batch.
  torch::manual_seed(99);
  std::vector<torch::Tensor> xs, ys;
  // A learnable target (a fixed linear map of the input) so the evaluation batch, unseen in
  // training, shows the steps' effect: y = 0.1 x + noise.
  for (int64_t s = 0; s <= steps; ++s) {  // the last one is the evaluation batch
    xs.push_back(torch::randn({global, hidden}));
    ys.push_back(xs.back() * 0.1 + torch::randn({global, hidden}) * 0.01);
  }
  auto dtype = net->parameters().front().scalar_type();
  auto local_loss = [&](int64_t s) {
    auto x = xs[s].narrow(0, rank * rows, rows).to(dtype);
    auto y = ys[s].narrow(0, rank * rows, rows);
    return torch::mse_loss(boosted.model.forward(x).to(torch::kFloat), y);
  };

  // The evaluation loss before training: the steps must move it by more than the tolerance the
  // driver compares configurations with, or the comparison would not test the training.
  double initial_eval_loss = 0;
  {
    torch::NoGradGuard no_grad;
    initial_eval_loss = local_loss(steps).item<double>();
  }
  const std::map<std::string, int64_t> plugin_stats_before = boosted.model.hooks().stats();
  const bool reset_ok = reset_peak_rss();

  double t0 = booster::bench::now_s();
  double last_loss = 0;
  // Peaks of each phase of each step (VmHWM reset at the start of the phase), when resetting works.
  std::vector<double> forward_hwm, backward_hwm, backward_end_rss, step_hwm, step_start_rss;
  int64_t train_hwm = 0;
  auto phase_peak = [&](std::vector<double>& out) {
    if (!reset_ok) return;
    int64_t h = status_bytes("VmHWM");
    out.push_back(static_cast<double>(h));
    train_hwm = std::max(train_hwm, h);
    reset_peak_rss();
  };
  for (int64_t s = 0; s < steps; ++s) {
    step_start_rss.push_back(static_cast<double>(status_bytes("VmRSS")));
    auto loss = local_loss(s);
    phase_peak(forward_hwm);
    booster.backward(loss, *boosted.optimizer);
    backward_end_rss.push_back(static_cast<double>(status_bytes("VmRSS")));
    last_loss = loss.item<double>();
    loss = torch::Tensor();
    phase_peak(backward_hwm);
    boosted.optimizer->step();
    boosted.optimizer->zero_grad();
    phase_peak(step_hwm);
  }
  double train_s = booster::bench::now_s() - t0;
  const std::map<std::string, int64_t> plugin_stats = boosted.model.hooks().stats();
  double eval_loss = 0;
  {
    torch::NoGradGuard no_grad;
    eval_loss = local_loss(steps).item<double>();
  }
  if (reset_ok) train_hwm = std::max(train_hwm, status_bytes("VmHWM"));
  else train_hwm = -1;
  const int64_t final_rss = status_bytes("VmRSS");
  const int64_t vm_hwm = std::max(setup_hwm, train_hwm);
  auto report = booster.memory_report(boosted.model, boosted.optimizer.get());

  // Model saves (collective): rank 0 writes; its RSS before and its peak during each save.
  std::vector<std::string> save_records;
  std::string checksum_dir;
  auto save_once = [&](const std::string& mode, const std::string& path) {
    booster::checkpoint::ModelSaveOptions so;
    so.use_safetensors = mode.rfind("safetensors", 0) == 0;
    so.shard = mode.find("_sharded") != std::string::npos;
    so.size_per_shard_mb = a.integer("save_shard_mb", 16);
    world->barrier();
    const int64_t before = status_bytes("VmRSS");
    const bool reset = reset_peak_rss();
    double ts = booster::bench::now_s();
    booster.save_model(boosted.model, path, so);
    ts = booster::bench::now_s() - ts;
    const int64_t hwm = reset ? status_bytes("VmHWM") : -1;
    const int64_t after = status_bytes("VmRSS");
    int64_t files = 0, largest = 0, total = 0;
    if (rank == 0) {
      for (const auto& e : std::filesystem::directory_iterator(path)) {
        const std::string ext = e.path().extension().string();
        if (!e.is_regular_file() || (ext != ".safetensors" && ext != ".bin")) continue;
        const auto size = static_cast<int64_t>(e.file_size());
        ++files;
        total += size;
        largest = std::max(largest, size);
      }
    }
    using namespace booster::bench;
    save_records.push_back(json_obj({{"mode", json_str(mode)},
                                     {"shard_mb", json_int(so.shard ? so.size_per_shard_mb : 0)},
                                     {"rss_before_bytes", json_int(before)},
                                     {"hwm_bytes", json_int(hwm)},
                                     {"rss_after_bytes", json_int(after)},
                                     {"files", json_int(files)},
                                     {"largest_file_bytes", json_int(largest)},
                                     {"total_file_bytes", json_int(total)},
                                     {"save_s", json_num(ts)}}));
    if (checksum_dir.empty()) checksum_dir = path;
  };
  for (const auto& mode : save_modes) save_once(mode, save_dir + "/" + mode);
  if (fsdp && checksum_dir.empty()) {
    save_once("safetensors", save_dir + "/checksum");
    save_records.pop_back();  // only for the checksum: not a measurement that was asked for
  }

  last_loss = world->allreduce_scalar(last_loss, booster::dist::ReduceOp::SUM) / ws;
  eval_loss = world->allreduce_scalar(eval_loss, booster::dist::ReduceOp::SUM) / ws;
  initial_eval_loss = world->allreduce_scalar(initial_eval_loss, booster::dist::ReduceOp::SUM) / ws;
  double checksum = 0, checksum_sq = 0;
  {
    torch::NoGradGuard no_grad;
    auto add = [&](const torch::Tensor& t) {
      auto d = t.detach().to(torch::kDouble);
      checksum += d.sum().item<double>();
      checksum_sq += d.square().sum().item<double>();
    };
    if (fsdp) {
      // Under FSDP the parameters are views of freed storage here: read the saved model instead.
      auto saved = booster::checkpoint::load_state_dict(checksum_dir, "model");
      if (saved.size() != net->named_parameters().size())
        throw std::runtime_error("bench_memory: the saved model has " + std::to_string(saved.size()) +
                                 " tensors, the model " + std::to_string(net->named_parameters().size()) + " parameters");
      for (auto& [name, t] : saved) add(t);
    } else {
      for (auto& p : net->parameters()) add(p);
    }
  }
  auto stats_json = [](const std::map<std::string, int64_t>& stats) {
    std::vector<std::string> kv;
    for (const auto& [k, v] : stats) kv.push_back(booster::bench::json_str(k) + ": " + std::to_string(v));
    return "{" + join_items(kv) + "}";
  };

  using namespace booster::bench;
  std::cout << "BENCH_MEMORY "
            << json_obj({{"rank", json_int(rank)},
                         {"world_size", json_int(ws)},
                         {"plugin", json_str(plugin)},
                         {"stage", json_int(plugin == "low_level_zero" ? a.integer("stage", 1) : 0)},
                         {"strategy", json_str(fsdp ? a.str("strategy", "FULL_SHARD") : "")},
                         {"shard_group_size", json_int(a.integer("shard_group_size", 0))},
                         {"precision", json_str(a.str("precision", "fp32"))},
                         {"estimate_rows", "[" + join_items(estimate_rows) + "]"},
                         {"estimate_runtime_bytes", json_int(estimate_runtime)},
                         {"numel", json_int(numel)},
                         {"largest_unit_bytes", json_int(largest_unit_bytes)},
                         {"plugin_stats", stats_json(plugin_stats)},
                         {"plugin_stats_before", stats_json(plugin_stats_before)},
                         {"saves", "[" + join_items(save_records) + "]"},
                         {"parameters", json_int(report.parameters)},
                         {"gradients", json_int(report.gradients)},
                         {"master_weights", json_int(report.master_weights)},
                         {"optimizer_states", json_int(report.optimizer_states)},
                         {"communication_buffers", json_int(report.communication_buffers)},
                         {"model_states", json_int(report.model_states())},
                         {"host_cache_held_bytes", json_int(report.host_cache_held)},
                         {"host_cache_limit_bytes", json_int(booster::host_cache_stats().limit_bytes)},
                         {"baseline_rss_bytes", json_int(baseline_rss)},
                         {"rss_after_boost_bytes", json_int(rss_after_boost)},
                         {"setup_hwm_bytes", json_int(setup_hwm)},
                         {"train_hwm_bytes", json_int(train_hwm)},
                         {"vm_hwm_bytes", json_int(vm_hwm)},
                         {"final_rss_bytes", json_int(final_rss)},
                         {"step_start_rss_bytes", json_list(step_start_rss)},
                         {"forward_hwm_bytes", json_list(forward_hwm)},
                         {"backward_hwm_bytes", json_list(backward_hwm)},
                         {"backward_end_rss_bytes", json_list(backward_end_rss)},
                         {"step_hwm_bytes", json_list(step_hwm)},
                         {"train_s", json_num(train_s)},
                         {"loss", json_num(last_loss)},
                         {"initial_eval_loss", json_num(initial_eval_loss)},
                         {"eval_loss", json_num(eval_loss)},
                         {"checksum", json_num(checksum)},
                         {"checksum_source", json_str(fsdp ? "saved_model" : "parameters")},
                         {"checksum_sq", json_num(checksum_sq)}})
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return booster::bench::guarded_main("bench_memory", [&] { return run(argc, argv); });
}
