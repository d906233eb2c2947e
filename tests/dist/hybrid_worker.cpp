// hybrid_worker — one rank of a hybrid_parallel test (started N times by booster_dist_tests with the
// torchrun environment). Trains hybrid_common.h's TinyLM (tensor-parallel layers, pipeline layers)
// on make_token_batches' global batches: each data-parallel rank takes its contiguous share of the
// rows; pp > 1 runs booster.execute_pipeline, else model.forward + booster.backward.
// Arguments are key=value:
//   out=DIR steps=K batch=B (global) optimizer=sgd|adamw first_step=F (skip the first F batches)
//   blocks=N (TinyLM's MLP blocks, default kLayers)
//   tp_plan=1: TinyLM built dense (the default context) and sharded by the plugin's [plugin.tp_plan]
//   (h.*.fc colwise, h.*.proj rowwise, wte vocab_parallel) at boost()
//   short_step=S (step S's sequences cut to their first kSeq / 2 tokens)
//   load=DIR (load model_dir/ and optimizer/ from DIR before training) save=DIR (save them after)
//   bad_load=DIR (booster.load_model from DIR/model expecting a CheckpointError: its message, or
//   "no error", goes to out/rank<r>.err; then training goes on)
//   plugin=NAME set=key=value (repeatable; config overrides)
//   scenario=errors: 2 ranks; each bad input below is tried on every rank and "<case>: <message>"
//   (or "<case>: no error") appended to out/rank<r>.err
//   scenario=rows precision=P: the estimate's zero_stage 2 and 3 rows for the dense TinyLM on this
//   world against what the plugin accepts (see run_rows)
//   estimate_row=CONFIGURATION: also write out/rank<r>.memory, the memory report after boost()
//   (planned_*) and after the steps (actual_*) beside that hybrid_parallel estimate row's figures
//   (estimate_*; the dense TinyLM described as `booster estimate` does, AdamW)
// Results: DIR/model (the trained model, booster.save_model), DIR/rank<r>.txt ("loss <step> <v>" on
// the last stage, "norm <step> <v>" with max_norm).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>

#include "booster/booster.h"
#include "booster/data/dataset.h"
#include "booster/estimate.h"
#include "dist/hybrid_common.h"

using namespace booster::testing;

namespace {

std::map<std::string, std::string> args;
std::vector<std::string> overrides;

std::string arg(const std::string& k, const std::string& def) {
  auto it = args.find(k);
  return it == args.end() ? def : it->second;
}
int64_t iarg(const std::string& k, int64_t def) { return std::stoll(arg(k, std::to_string(def))); }

// Each case's message (every rank must fail the same way, before any rank waits for another).
int run_errors() {
  std::vector<std::pair<std::string, std::string>> results;
  auto config_with = [](const std::string& plugin_table) {
    return booster::Config::from_string("[booster]\nplugin = \"hybrid_parallel\"\n[distributed]\ntimeout_s = 60\n"
                                        "threads_per_rank = 1\n[plugin]\nprecision = \"fp32\"\n" + plugin_table);
  };
  auto attempt = [&](const std::string& name, const std::function<void()>& body) {
    try {
      body();
      results.emplace_back(name, "no error");
    } catch (const std::exception& e) {
      results.emplace_back(name, e.what());
    }
  };
  std::vector<std::string> no_args;
  auto world = booster::launch_from_config(config_with(""), no_args);
  attempt("indivisible_mesh", [&] { booster::Booster b(config_with("tp_size = 3\n")); });
  attempt("too_few_microbatches", [&] { booster::Booster b(config_with("pp_size = 2\nnum_microbatches = 1\n")); });
  attempt("no_microbatches", [&] { booster::Booster b(config_with("pp_size = 2\n")); });
  attempt("zbv_one_chunk", [&] { booster::Booster b(config_with("pp_size = 2\nnum_microbatches = 4\npp_style = \"zbv\"\n")); });
  attempt("zbv_three_chunks", [&] {
    booster::Booster b(config_with("pp_size = 2\nnum_microbatches = 4\npp_style = \"zbv\"\nnum_model_chunks = 3\n"));
  });
  attempt("zbv_without_pipeline", [&] { booster::Booster b(config_with("pp_style = \"zbv\"\nnum_model_chunks = 2\n")); });
  attempt("tp_plan_bad_style", [&] {
    booster::Booster b(config_with("tp_size = 2\n[plugin.tp_plan]\n\"h.*.fc\" = \"columnwise\"\n"));
  });
  attempt("tp_plan_empty", [&] { booster::Booster b(config_with("tp_size = 2\n[plugin.tp_plan]\n")); });
  attempt("tp_plan_optimizer_with_state", [&] {
    booster::Booster b(config_with("tp_size = 2\n[plugin.tp_plan]\n\"h.*.fc\" = \"colwise\"\n"));
    torch::manual_seed(7);
    TinyLM dense;
    auto sgd = make_lm_optimizer("sgd", dense->parameters());  // momentum: a step leaves state
    tiny_lm_loss(dense->forward(make_token_batches(1, 2, 3).tokens[0]), make_token_batches(1, 2, 3).targets[0], {})
        .backward();
    sgd->step();
    const auto before = dense->h[0]->as<TinyBlock>()->fc->weight.clone();
    try {
      b.boost(dense, sgd);
    } catch (...) {
      if (!torch::equal(before, dense->h[0]->as<TinyBlock>()->fc->weight)) throw std::runtime_error("weights changed");
      throw;
    }
  });
  attempt("tp_plan_no_match", [&] {
    booster::Booster b(config_with("tp_size = 2\n[plugin.tp_plan]\n\"h.*.fc\" = \"colwise\"\n\"h.*.mlp\" = \"rowwise\"\n"));
    torch::manual_seed(7);
    TinyLM dense;
    b.boost(dense, make_lm_optimizer("sgd", dense->parameters()));
  });
  attempt("not_a_pipeline_module", [&] {
    booster::Booster b(config_with("pp_size = 2\nnum_microbatches = 2\n"));
    torch::manual_seed(7);
    auto plain = std::make_shared<TinyBlockImpl>(b.tensor_parallel_context());
    b.boost(plain);
  });
  attempt("too_few_layers", [&] {
    booster::Booster b(config_with("pp_size = 2\nnum_microbatches = 4\npp_style = \"interleaved\"\nnum_model_chunks = 4\n"));
    torch::manual_seed(7);
    TinyLM net(b.tensor_parallel_context());  // 6 layers < 2 * 4 stages
    b.boost(net);
  });
  // Sequence parallelism's options (ColossalAI's rules; a setting is never ignored).
  attempt("sp_mode_without_enable", [&] { booster::Booster b(config_with("tp_size = 2\nsequence_parallelism_mode = \"split_gather\"\n")); });
  attempt("sp_size_without_enable", [&] { booster::Booster b(config_with("sp_size = 2\n")); });
  attempt("split_gather_without_tp",
          [&] { booster::Booster b(config_with("enable_sequence_parallelism = true\nsequence_parallelism_mode = \"split_gather\"\n")); });
  attempt("split_gather_sp_size", [&] {
    booster::Booster b(config_with("tp_size = 2\nsp_size = 1\nenable_sequence_parallelism = true\n"
                                   "sequence_parallelism_mode = \"split_gather\"\n"));
  });
  attempt("zero2_with_pipeline",
          [&] { booster::Booster b(config_with("pp_size = 2\nnum_microbatches = 2\nzero_stage = 2\n")); });
  attempt("sp_size_not_dividing_world",
          [&] { booster::Booster b(config_with("enable_sequence_parallelism = true\nsp_size = 4\n")); });
  for (const std::string mode : {"split_gather", "all_to_all"}) {
    attempt("sequence_not_divisible_" + mode, [&] {
      booster::Booster b(config_with(std::string(mode == "split_gather" ? "tp_size = 2\n" : "sp_size = 2\n") +
                                     "enable_sequence_parallelism = true\nsequence_parallelism_mode = \"" + mode + "\"\n"));
      torch::manual_seed(7);
      TinyLM net(b.tensor_parallel_context());
      auto [model, opt, criterion, loader, scheduler] =
          b.boost(net, make_lm_optimizer("sgd", net->parameters()), tiny_lm_criterion(b.tensor_parallel_context()));
      const auto data = make_token_batches(1, 2, 11);
      model.forward(data.tokens[0].narrow(1, 0, kSeq - 1));
    });
  }
  {
    booster::Booster b(config_with("pp_size = 2\nnum_microbatches = 2\n"));
    torch::manual_seed(7);
    TinyLM net(b.tensor_parallel_context());
    auto [model, opt, criterion, loader, scheduler] =
        b.boost(net, make_lm_optimizer("sgd", net->parameters()), tiny_lm_criterion(b.tensor_parallel_context()));
    const auto data = make_token_batches(1, 4, 11);
    attempt("forward_on_pipelined_model", [&] { model.forward(data.tokens[0]); });
    attempt("backward_on_pipelined_model", [&] {
      auto loss = (net->wpe->weight * 2).sum();  // any loss: booster.backward must refuse a pipelined model
      b.backward(loss, *opt);
    });
    attempt("batch_not_divisible", [&] {
      b.execute_pipeline(data.tokens[0].narrow(0, 0, 3), data.targets[0].narrow(0, 0, 3), model, criterion, opt.get());
    });
    // The plugin still works after the refused calls.
    attempt("valid_pipeline_after_errors", [&] {
      b.execute_pipeline(data.tokens[0], data.targets[0], model, criterion, opt.get());
    });
    // The data-iterator form (ColossalAI's execute_pipeline(data_iter, ...)) over a loader from
    // prepare_dataloader: the loader shards by the data-parallel group (here of size 1: pp peers
    // read the same batches); the iterator advances by one batch per call.
    attempt("data_iter_form", [&] {
      auto dataset = std::make_shared<booster::data::TensorDataset>(data.tokens[0], data.targets[0]);
      auto loader = b.prepare_dataloader(dataset, 2);
      if (loader->num_batches() != 2) throw std::runtime_error("expected 2 batches of 2, got " + std::to_string(loader->num_batches()));
      auto it = loader->begin();
      auto out = b.execute_pipeline(it, model, criterion, opt.get());
      if (it != ++loader->begin()) throw std::runtime_error("the iterator did not advance by one batch");
      if (out.is_last_stage != (b.plugin().data_parallel_group()->size() == 1 && world->rank() == 1))
        throw std::runtime_error("is_last_stage is wrong on rank " + std::to_string(world->rank()));
      if (out.is_last_stage && !(out.loss.defined() && std::isfinite(out.loss.item<double>())))
        throw std::runtime_error("no loss on the last stage");
    });
  }
  std::ofstream out(arg("out", ".") + "/rank" + std::to_string(world->rank()) + ".err");
  for (const auto& [name, message] : results) out << name << ": " << message << "\n";
  return 0;
}

// One training step of a boosted TinyLM on rows [dp rank's share] of the batch; returns the loss
// (undefined off the last pipeline stage).
template <typename Model, typename Optimizer, typename Criterion>
torch::Tensor train_step(booster::Booster& booster, Model& model, Optimizer& opt, const Criterion& criterion,
                         const torch::Tensor& tokens, const torch::Tensor& targets) {
  const auto dp = booster.plugin().data_parallel_group();
  const int64_t share = tokens.size(0) / dp->size();
  auto x = tokens.narrow(0, dp->rank() * share, share).to(booster.device());
  auto y = targets.narrow(0, dp->rank() * share, share).to(booster.device());
  const auto stats = model.hooks().stats();
  torch::Tensor loss;
  if (stats.count("pp_size") && stats.at("pp_size") > 1) {
    loss = booster.execute_pipeline(x, y, model, criterion, opt.get()).loss;
  } else {
    loss = criterion(model.forward(x), y);
    booster.backward(loss, *opt);
  }
  opt->step();
  return loss;
}

// Candidates: every zero_stage 2 and 3 configuration (with the settings the estimate's rows use:
// num_microbatches = pp, zbv's 2 chunks and 2 * pp) on the meshes the estimate covers (tp * pp > 1
// or all_to_all) with more than one data-parallel replica, including the ones the plugin refuses.
// Each is boosted and trained one step; "accepted" when that worked. Writes out/rank<r>.rows.
int run_rows() {
  const std::string precision = "precision=\"" + arg("precision", "fp32") + "\"";
  auto config_with = [](const std::vector<std::string>& options) {
    std::string table;
    for (const auto& o : options) table += o + "\n";
    return booster::Config::from_string("[booster]\nplugin = \"hybrid_parallel\"\n[distributed]\ntimeout_s = 60\n"
                                        "threads_per_rank = 1\n[plugin]\n" + table);
  };
  auto canonical = [](std::vector<std::string> options) {
    std::sort(options.begin(), options.end());
    std::string s;
    for (const auto& o : options) s += (s.empty() ? "" : " ") + o;
    return s;
  };
  std::vector<std::string> no_args;
  auto world = booster::launch_from_config(config_with({precision}), no_args);
  const int ws = world->size();
  std::ofstream out(arg("out", ".") + "/rank" + std::to_string(world->rank()) + ".rows");
  {
    booster::Booster b(config_with({precision}));
    TinyLM dense;  // tp = 1: the model as `booster estimate` describes it
    auto adamw = make_lm_optimizer("adamw", dense->parameters());
    booster::EstimateRequest request = booster::describe_model(*dense, adamw.get());
    request.world_size = ws;
    request.precision = arg("precision", "fp32");
    for (const auto& e : b.plugin().estimate_memory(request))
      for (const char* zero : {"zero_stage=2", "zero_stage=3"})
        if (std::find(e.options.begin(), e.options.end(), zero) != e.options.end())
          out << "row " << canonical(e.options) << "\n";
  }
  const auto data = make_token_batches(1, 8, 11);
  for (int tp : {1, 2, 4})
    for (int pp : {1, 2, 4}) {
      if (ws % (tp * pp) != 0 || ws / (tp * pp) < 2) continue;
      for (const std::string mode : {"", "split_gather", "all_to_all"})
        for (int sp : {1, 2, 4}) {
          if ((mode == "all_to_all") != (sp > 1) || (tp * pp == 1 && mode != "all_to_all")) continue;
          for (bool zbv : {false, true})
            for (int zero : {2, 3}) {
              std::vector<std::string> o{"tp_size=" + std::to_string(tp), "pp_size=" + std::to_string(pp),
                                         "zero_stage=" + std::to_string(zero), precision};
              if (zbv) o.insert(o.end(), {"pp_style=\"zbv\"", "num_model_chunks=2"});
              if (pp > 1) o.push_back("num_microbatches=" + std::to_string(zbv ? 2 * pp : pp));
              if (!mode.empty())
                o.insert(o.end(), {"enable_sequence_parallelism=true", "sequence_parallelism_mode=\"" + mode + "\""});
              if (sp > 1) o.push_back("sp_size=" + std::to_string(sp));
              std::string verdict = "accepted";
              try {
                booster::Booster b(config_with(o));
                torch::manual_seed(7);
                TinyLM net(b.tensor_parallel_context());
                auto [model, opt, criterion, loader, scheduler] = b.boost(
                    net, make_lm_optimizer("adamw", net->parameters()), tiny_lm_criterion(b.tensor_parallel_context()));
                train_step(b, model, opt, criterion, data.tokens[0], data.targets[0]);
              } catch (const std::exception&) {
                verdict = "refused";
              }
              out << verdict << " " << canonical(o) << "\n";
            }
        }
    }
  return 0;
}

int run() {
  if (arg("scenario", "train") == "errors") return run_errors();
  if (arg("scenario", "train") == "rows") return run_rows();
  const bool planned = arg("tp_plan", "0") == "1";
  auto config = booster::Config::from_string(
      "[booster]\nplugin = \"" + arg("plugin", "hybrid_parallel") + "\"\n[distributed]\ntimeout_s = 60\n"
      "threads_per_rank = 1\n" +
      (planned ? "[plugin.tp_plan]\n\"h.*.fc\" = \"colwise\"\n\"h.*.proj\" = \"rowwise\"\n\"wte\" = \"vocab_parallel\"\n" : ""));
  config.apply_overrides(overrides);
  std::vector<std::string> no_args;
  auto world = booster::launch_from_config(config, no_args);
  booster::Booster booster(config);
  torch::manual_seed(7);
  // The TP layers shard over its tp group: built with the context, or built dense and sharded by tp_plan.
  TinyLM net(planned ? booster::nn::TensorParallelContext{} : booster.tensor_parallel_context(), iarg("blocks", kLayers));
  auto optimizer = make_lm_optimizer(arg("optimizer", "sgd"), net->parameters());
  auto [model, opt, criterion, loader, scheduler] =
      booster.boost(net, optimizer, tiny_lm_criterion(booster.tensor_parallel_context()));
  if (arg("bad_load", "") != "") {
    std::string message = "no error";
    try {
      booster.load_model(model, arg("bad_load", "") + "/model");
    } catch (const booster::checkpoint::CheckpointError& e) {
      message = e.what();
    }
    std::ofstream(arg("out", ".") + "/rank" + std::to_string(world->rank()) + ".err") << message << "\n";
  }
  if (arg("load", "") != "") {
    booster.load_model(model, arg("load", "") + "/model");
    booster.load_optimizer(*opt, arg("load", "") + "/optimizer");
  }
  std::map<std::string, int64_t> memory;  // estimate_row: the reports and the row's figures
  auto note_report = [&](const std::string& when) {
    const booster::MemoryReport m = booster.memory_report(model, opt.get());
    memory[when + "_parameters"] = m.parameters;
    memory[when + "_gradients"] = m.gradients;
    memory[when + "_master_weights"] = m.master_weights;
    memory[when + "_optimizer_states"] = m.optimizer_states;
  };
  if (!arg("estimate_row", "").empty()) note_report("planned");
  const auto dp = booster.plugin().data_parallel_group();
  const int64_t steps = iarg("steps", 3), batch = iarg("batch", 8), first = iarg("first_step", 0);
  const int64_t short_step = iarg("short_step", -1);
  const auto data = make_token_batches(first + steps, batch, 11);
  const bool pipelined = model.hooks().stats().count("pp_size") && model.hooks().stats().at("pp_size") > 1;
  std::ofstream log(arg("out", ".") + "/rank" + std::to_string(world->rank()) + ".txt");
  log << std::setprecision(17);
  for (int64_t s = first; s < first + steps; ++s) {
    const int64_t seq = s == short_step ? kSeq / 2 : kSeq;
    torch::Tensor loss =
        train_step(booster, model, opt, criterion, data.tokens[s].narrow(1, 0, seq), data.targets[s].narrow(1, 0, seq));
    // The mean over the data-parallel ranks' shares: the loss of the whole global batch.
    if (loss.defined())
      log << "loss " << s << " " << dp->allreduce_scalar(loss.item<double>(), booster::dist::ReduceOp::SUM) / dp->size()
          << "\n";
    if (opt->options().max_norm > 0) log << "norm " << s << " " << opt->last_grad_norm() << "\n";
    if (pipelined) log << "shm_messages " << s << " " << model.hooks().stats().at("pipeline_shm_messages") << "\n";
    if (pipelined) log << "w_fallbacks " << s << " " << model.hooks().stats().at("pipeline_w_fallbacks") << "\n";
    const auto hook_stats = model.hooks().stats();
    if (hook_stats.count("buckets_launched_during_backward"))  // the dp reducer (zero_stage 0 and 1)
      log << "overlapped " << s << " " << hook_stats.at("buckets_launched_during_backward") << "\n"
          << "buckets " << s << " " << hook_stats.at("buckets") << "\n";
    if (s + 1 == first + steps && !arg("estimate_row", "").empty()) note_report("actual");  // gradients still held
    opt->zero_grad();
  }
  if (!arg("estimate_row", "").empty()) {
    TinyLM dense;  // tp = 1: the model as `booster estimate` describes it
    auto adamw = make_lm_optimizer("adamw", dense->parameters());
    booster::EstimateRequest request = booster::describe_model(*dense, adamw.get());
    request.world_size = world->size();
    request.precision = config.section("plugin").get_string("precision", "fp16");
    for (const auto& e : booster.plugin().estimate_memory(request))
      if (e.configuration == arg("estimate_row", "")) {
        memory["estimate_parameters"] = e.states.parameters;
        memory["estimate_gradients"] = e.states.gradients;
        memory["estimate_master_weights"] = e.states.master_weights;
        memory["estimate_optimizer_states"] = e.states.optimizer_states;
      }
    std::ofstream m(arg("out", ".") + "/rank" + std::to_string(world->rank()) + ".memory");
    for (const auto& [k, v] : memory) m << k << " " << v << "\n";
  }
  booster.save_model(model, arg("out", ".") + "/model");
  if (arg("save", "") != "") {
    booster.save_model(model, arg("save", "") + "/model");
    booster.save_optimizer(*opt, arg("save", "") + "/optimizer");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (eq == std::string::npos) continue;
    if (a.substr(0, eq) == "set") overrides.push_back(a.substr(eq + 1));
    else args[a.substr(0, eq)] = a.substr(eq + 1);
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::cerr << "hybrid_worker: " << e.what() << std::endl;
    return 1;
  }
}
