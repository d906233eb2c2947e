// GPT with Booster: a GPT-2-style byte-level decoder (model.h) trained on the King James Bible
// (data.h: whole books held out for validation) with the plugin named in the TOML config.
//   build/bin/booster run --nproc_per_node 2 build/bin/gpt --config examples/configs/gpt_ddp.toml
// (scripts/run_gpt.sh builds and runs exactly that). Also runs standalone (1 rank) or with explicit
// --rank/--world_size/--host/--port flags.
//
// Training: random windows of n_ctx + 1 bytes from the training books, a different stream on each
// data-parallel rank; AdamW (weight decay on matrices only); linear warmup then cosine decay to
// min_lr_ratio * lr over whichever limit ends the run first, max_steps or the wall-clock budget
// max_minutes (counted from process start, so start-up is included; all ranks agree on the time
// every step). Every eval_interval steps: mean next-byte loss on a fixed set of validation windows;
// at the end on every window of the held-out books. bits per byte = loss in nats / ln 2.
// Output (rank 0): log lines, [train] output_dir/metrics.csv (one row per evaluation), the effective
// config.toml, optionally the model (output_dir/model, HuggingFace layout) and a text sample.
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>

#include "booster/booster.h"
#include "booster/logging.h"
#include "common/plot_at_end.h"
#include "data.h"
#include "model.h"

namespace {

using Clock = std::chrono::steady_clock;
using Model = booster::ModelWrapper<gpt::GPTImpl>;

struct TrainOptions {
  gpt::GPTConfig model;
  int64_t batch_size, gradient_accumulation_steps, max_steps, warmup_steps, eval_interval, eval_windows;
  int64_t final_eval_windows, log_interval, seed, sample_length;
  double lr, min_lr_ratio, weight_decay, beta1, beta2, max_minutes, sample_temperature;
  bool save_model;
  std::string corpus, val_books, output_dir, sample_prompt;
};

// Reads [train]; the caller calls check_unknown() afterwards.
TrainOptions read_train_options(const booster::Options& t, const std::string& output_flag) {
  TrainOptions o;
  o.model.n_layer = t.get_int("n_layer", 4, 1, 64);
  o.model.n_head = t.get_int("n_head", 4, 1, 64);
  o.model.n_embd = t.get_int("n_embd", 256, 8, 8192);
  o.model.n_ctx = t.get_int("n_ctx", 256, 2, 8192);  // context length = training window
  o.model.dropout = t.get_double("dropout", 0.0, 0.0, 0.9);
  o.model.gelu_tanh = t.get_choice("gelu", "exact", {"exact", "tanh"}) == "tanh";
  o.batch_size = t.get_int("batch_size", 32, 1, 1 << 16);  // windows per rank per micro-batch
  o.gradient_accumulation_steps = t.get_int("gradient_accumulation_steps", 1, 1, 1024);
  o.lr = t.get_double("lr", 2e-3, 0.0, 10.0);
  o.min_lr_ratio = t.get_double("min_lr_ratio", 0.1, 0.0, 1.0);  // the cosine ends at lr * this
  o.warmup_steps = t.get_int("warmup_steps", 100, 0);
  o.weight_decay = t.get_double("weight_decay", 0.1, 0.0, 10.0);  // matrices and embeddings only
  o.beta1 = t.get_double("beta1", 0.9, 0.0, 1.0);
  o.beta2 = t.get_double("beta2", 0.95, 0.0, 1.0);
  o.max_steps = t.get_int("max_steps", 100000, 1);
  o.max_minutes = t.get_double("max_minutes", 0.0, 0.0);  // wall-clock budget from start; 0 = none
  o.eval_interval = t.get_int("eval_interval", 200, 1);
  o.eval_windows = t.get_int("eval_windows", 128, 0);          // periodic evaluation; 0 = all
  o.final_eval_windows = t.get_int("final_eval_windows", 0, 0);  // final evaluation; 0 = all
  o.log_interval = t.get_int("log_interval", 50, 1);
  o.seed = t.get_int("seed", 42, 0);
  o.corpus = t.get_string("corpus", "build/data/kjv.txt");  // raw `bible` output, made when missing
  o.val_books = t.get_string("val_books", "Ruth,Eccl,Dan,Mark,Rom");
  o.output_dir = t.get_string("output_dir", "runs/gpt");
  o.save_model = t.get_bool("save_model", false);             // into output_dir/model
  o.sample_prompt = t.get_string("sample_prompt", "And God said");
  o.sample_length = t.get_int("sample_length", 300, 0);       // bytes generated at the end (rank 0 prints)
  o.sample_temperature = t.get_double("sample_temperature", 0.8, 0.0, 10.0);  // 0 = greedy
  if (!output_flag.empty()) o.output_dir = output_flag;
  return o;
}

std::string fmt(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

// The plugin's tensor- and pipeline-parallel sizes (1 and 1 except under hybrid_parallel).
struct Parallel {
  int64_t tp = 1, pp = 1;
  int64_t pipeline_batch = 1;  // rows that split into the plugin's micro-batches (generation)
  booster::dist::ProcessGroup* world = nullptr;
  // The last pipeline stage's loss on every rank (each last-stage rank of a dp replica holds the
  // loss of its own batch: their mean).
  double from_last_stage(const booster::PipelineOutput& out) const {
    const double mine = out.is_last_stage && out.loss.defined() ? out.loss.item<double>() : 0.0;
    return world->allreduce_scalar(mine, booster::dist::ReduceOp::SUM) / static_cast<double>(world->size() / pp);
  }
};

// One micro-batch: x = window[:, :-1], y = window[:, 1:], int64 [B, T].
struct Batch {
  torch::Tensor x, y;
};

// B random windows of T + 1 bytes from `data` (uint8 [N]).
Batch sample_batch(const torch::Tensor& data, int64_t B, int64_t T, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> pick(0, data.size(0) - T - 1);
  auto starts = torch::empty({B, 1}, torch::kLong);
  auto* s = starts.data_ptr<int64_t>();
  for (int64_t i = 0; i < B; ++i) s[i] = pick(rng);
  auto windows = data.index({starts + torch::arange(T + 1, torch::kLong)}).to(torch::kLong);  // [B, T + 1]
  return {windows.narrow(1, 0, T).contiguous(), windows.narrow(1, 1, T).contiguous()};
}

// The training step (forward, booster.backward, optimizer step) on `micro` micro-batches: all but
// the last accumulate gradients locally (no_sync), the last one synchronises them. Steps the LR
// scheduler. Returns this rank's mean loss in nats.
// With pipeline parallelism (hybrid_parallel pp_size > 1) the micro-batches go to
// booster.execute_pipeline as one batch (the plugin splits it into its own micro-batches) and the
// loss, known on the last stage, is shared with every rank.
double train_step(booster::Booster& booster, Model& model, booster::OptimizerWrapper& optimizer,
                  booster::LRScheduler& scheduler, const booster::Criterion& criterion,
                  const std::vector<Batch>& micro, const Parallel& par) {
  if (par.pp > 1) {
    std::vector<torch::Tensor> xs, ys;
    for (const auto& b : micro) {
      xs.push_back(b.x);
      ys.push_back(b.y);
    }
    auto out = booster.execute_pipeline(torch::cat(xs), torch::cat(ys), model, criterion, &optimizer);
    optimizer.step();
    optimizer.zero_grad();
    scheduler.step();
    return par.from_last_stage(out);
  }
  double loss_sum = 0;
  const double n = static_cast<double>(micro.size());
  for (size_t i = 0; i < micro.size(); ++i) {
    auto loss = criterion(model.forward(micro[i].x.to(booster.device())), micro[i].y.to(booster.device()));
    if (i + 1 < micro.size()) {
      auto no_sync = booster.no_sync(model, &optimizer);
      booster.backward(loss / n, optimizer);
    } else {
      booster.backward(loss / n, optimizer);
    }
    loss_sum += loss.item<double>();
  }
  optimizer.step();
  optimizer.zero_grad();
  scheduler.step();
  return loss_sum / n;
}

// Mean next-byte loss (nats) over non-overlapping windows of `val` (uint8 [N]): window i holds bytes
// [i T, i T + T]. `limit` > 0 takes that many windows evenly spread over the stream, 0 all of them;
// the count is rounded down to a multiple of the data-parallel size and split into contiguous equal
// parts (so every rank runs the same number of forwards: FSDP's forwards are collective); the sums
// are allreduced over the data-parallel group.
double evaluate(booster::Booster& booster, Model& model, const booster::Criterion& criterion,
                const torch::Tensor& val, int64_t T, int64_t batch_size, int64_t limit, booster::dist::ProcessGroup& dp,
                const Parallel& par) {
  torch::NoGradGuard no_grad;
  model->eval();
  const int64_t total = (val.size(0) - 1) / T;
  int64_t n = (limit > 0 && limit < total) ? limit : total;
  n -= n % dp.size();
  if (n <= 0) throw std::runtime_error("gpt: the validation text has fewer windows than data-parallel ranks");
  int64_t per_rank = n / dp.size();
  // Pipelined: every evaluation batch must split into the plugin's micro-batches (batch_size does).
  if (par.pp > 1) per_rank -= per_rank % par.pipeline_batch;
  if (per_rank <= 0)
    throw std::runtime_error("gpt: fewer validation windows per data-parallel rank than one pipeline batch (" +
                             std::to_string(par.pipeline_batch) + "); raise eval_windows / final_eval_windows");
  n = per_rank * dp.size();
  const int64_t first = per_rank * dp.rank();
  double loss_sum = 0;
  for (int64_t b = 0; b < per_rank; b += batch_size) {
    const int64_t len = std::min(batch_size, per_rank - b);
    auto starts = torch::empty({len, 1}, torch::kLong);
    for (int64_t i = 0; i < len; ++i) starts.data_ptr<int64_t>()[i] = (first + b + i) * total / n * T;
    auto windows = val.index({starts + torch::arange(T + 1, torch::kLong)}).to(torch::kLong);
    auto x = windows.narrow(1, 0, T).to(booster.device()), y = windows.narrow(1, 1, T).contiguous().to(booster.device());
    const double loss = par.pp > 1 ? par.from_last_stage(booster.execute_pipeline(x, y, model, criterion, nullptr)) *
                                         static_cast<double>(dp.size())  // undo the mean over dp: summed below
                                   : criterion(model.forward(x), y).item<double>();
    loss_sum += loss * static_cast<double>(len);
  }
  model->train();
  if (par.pp > 1) return loss_sum / static_cast<double>(n);  // from_last_stage already summed over dp
  return dp.allreduce_scalar(loss_sum, booster::dist::ReduceOp::SUM) / static_cast<double>(n);
}

// Continues `prompt` by `length` bytes (temperature sampling; greedy when temperature <= 0). Every
// rank runs it with the same seed (the boosted forward may be collective); the result is the same.
// Under tensor parallelism the logits are gathered over the tp group; under pipeline parallelism the
// last stage computes them (execute_pipeline forward only, the context repeated to fill the
// plugin's micro-batches) and the chosen byte is broadcast from it.
std::string generate(booster::Booster& booster, Model& model, const booster::Criterion& criterion,
                     const std::string& prompt, int64_t length, double temperature, uint64_t seed, int64_t n_ctx,
                     const Parallel& par) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  for (auto& id : ids) id &= 0xff;
  if (ids.empty()) ids.push_back('\n');
  for (int64_t i = 0; i < length; ++i) {
    const int64_t T = std::min<int64_t>(n_ctx, static_cast<int64_t>(ids.size()));
    auto ctx = torch::from_blob(ids.data() + ids.size() - T, {1, T}, torch::kLong).to(booster.device());
    torch::Tensor local;  // [1, T, V / tp] on the ranks that computed logits
    if (par.pp > 1) {
      auto batch = ctx.repeat({par.pipeline_batch, 1});
      auto out = booster.execute_pipeline(batch, batch, model, criterion, nullptr, false, true);
      if (out.is_last_stage) local = out.outputs.narrow(0, 0, 1);
    } else {
      local = model.forward(ctx);
    }
    int64_t next = 0;
    if (local.defined()) {
      auto logits = booster::nn::gather_from_tensor_parallel_region(local, booster::nn::tensor_parallel_context().group)
                        .select(1, T - 1).squeeze(0).narrow(0, 0, 256).to(torch::kCPU, torch::kFloat64);  // [V]
      if (temperature <= 0) {
        next = logits.argmax().item<int64_t>();
      } else {
        auto p = torch::softmax(logits / temperature, 0).contiguous();
        std::discrete_distribution<int64_t> dist(p.data_ptr<double>(), p.data_ptr<double>() + p.numel());
        next = dist(rng);
      }
    }
    if (par.pp > 1) {  // the first last-stage rank's choice (dp 0, tp 0) for everyone
      auto t = torch::tensor({next}, torch::kLong);
      par.world->broadcast(t, static_cast<int>((par.pp - 1) * par.tp)).wait();
      next = t.item<int64_t>();
    }
    ids.push_back(next);
  }
  model->train();
  // Bytes outside printable ASCII (an undertrained model emits some) print as '?', except '\n'.
  std::string out;
  for (auto id : ids) out += (id == '\n' || (id >= 0x20 && id < 0x7f)) ? static_cast<char>(id) : '?';
  return out;
}

// AdamW with two parameter groups: weight decay on tensors of rank >= 2 (matrices, embeddings),
// none on biases and LayerNorm parameters.
std::shared_ptr<torch::optim::AdamW> make_adamw(gpt::GPTImpl& net, const TrainOptions& o) {
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : net.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(o.lr)
                                                            .betas({o.beta1, o.beta2})
                                                            .eps(1e-8)
                                                            .weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(o.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  return std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(o.lr));
}

int run(int argc, char** argv) {
  const auto t_start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - t_start).count(); };
  CLI::App app{"GPT-2-style byte-level LM on the King James Bible, trained with Booster"};
  std::string config_path = "examples/configs/gpt_ddp.toml", output_dir;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "TOML config file")->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "Dotted override, e.g. --set train.max_steps=20 (repeatable)");
  app.add_option("--output_dir", output_dir, "Run directory (overrides [train] output_dir)");
  int estimate_world_size = 0;
  app.add_option("--estimate", estimate_world_size,
                 "Print the per-rank memory of every installed plugin's configurations for this many ranks, "
                 "measured on one real micro-batch, and exit (run as one process)")
      ->check(CLI::Range(1, 1 << 20));
  app.allow_extras();  // --host --port --rank --world_size --backend go to the launcher
  CLI11_PARSE(app, argc, argv);

  booster::Config config = booster::Config::from_file(config_path);
  config.apply_overrides(overrides);
  if (estimate_world_size > 0)
    config.apply_overrides({"booster.estimate=true", "booster.estimate_world_size=" + std::to_string(estimate_world_size)});
  std::vector<std::string> extras = app.remaining();
  auto world = booster::launch_from_config(config, extras);
  if (!extras.empty()) throw std::invalid_argument("gpt: unknown argument '" + extras.front() + "' (see --help)");
  booster::Options train_section = config.section("train");
  TrainOptions opt = read_train_options(train_section, output_dir);
  train_section.check_unknown();
  booster::Booster booster(config);

  gpt::Corpus corpus =
      gpt::split_kjv(gpt::read_or_make_kjv(opt.corpus, world->rank() == 0), gpt::split_list(opt.val_books));
  const int64_t T = opt.model.n_ctx;

  torch::manual_seed(opt.seed);  // the same initial model on every rank
  gpt::GPT net(opt.model);
  auto adamw = make_adamw(*net, opt);
  // Warmup, then cosine over progress = max(step / max_steps, elapsed / budget), to min_lr_ratio.
  auto progress = std::make_shared<double>(0.0);
  auto schedule = [o = opt, progress](int64_t step) {
    if (step < o.warmup_steps) return static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
    const double p = std::clamp(*progress, 0.0, 1.0);
    return o.min_lr_ratio + (1.0 - o.min_lr_ratio) * 0.5 * (1.0 + std::cos(M_PI * p));
  };
  auto scheduler = std::make_shared<booster::LambdaLR>(*adamw, schedule);
  booster::Criterion criterion_fn = [vocab = opt.model.vocab_size](const torch::Tensor& logits,
                                                                  const torch::Tensor& targets) {
    return gpt::lm_loss(logits, targets, vocab);
  };
  {
    // One training micro-batch (from its own generator: training's randomness is unchanged) for
    // --estimate, which measures its activations: this trainer gives boost() no data loader.
    std::mt19937_64 estimate_rng(static_cast<uint64_t>(opt.seed));
    Batch b = sample_batch(corpus.train, opt.batch_size, T, estimate_rng);
    booster.set_estimate_batch(b.x, b.y);
  }
  auto [model, optimizer, criterion, unused_loader, lr_scheduler] =
      booster.boost(net, adamw, criterion_fn, nullptr, scheduler);

  // After boost(): under plugin = "auto" the mesh (and so the data-parallel group) is chosen there.
  auto dp = booster.data_parallel_group();
  Parallel par;
  par.world = world.get();
  {
    auto stats = model.hooks().stats();
    if (stats.count("tp_size")) par.tp = stats.at("tp_size");
    if (stats.count("pp_size")) par.pp = stats.at("pp_size");
    booster::Options plugin = booster.config().section("plugin");
    if (par.pp > 1)
      par.pipeline_batch = std::max(plugin.get_int("num_microbatches", 0), plugin.get_int("microbatch_size", 0));
  }
  const int64_t tokens_per_step = opt.batch_size * T * opt.gradient_accumulation_steps * dp->size();
  booster::log::info("gpt: " + std::to_string(net->num_parameters()) + " parameters (" +
                     std::to_string(opt.model.n_layer) + " layers, n_embd " + std::to_string(opt.model.n_embd) +
                     ", " + std::to_string(opt.model.n_head) + " heads, n_ctx " + std::to_string(T) + "); train " +
                     std::to_string(corpus.train.size(0)) + " bytes, validation " + std::to_string(corpus.val.size(0)) +
                     " bytes (" + opt.val_books + "); " + std::to_string(tokens_per_step) + " tokens per step on " +
                     std::to_string(dp->size()) + " data-parallel ranks; " + std::to_string(at::get_num_threads()) +
                     " threads per rank; budget " +
                     (opt.max_minutes > 0 ? fmt(opt.max_minutes, 2) + " min" : std::string("none")) + ", max_steps " +
                     std::to_string(opt.max_steps));

  std::ofstream csv;
  if (world->rank() == 0) {
    std::filesystem::create_directories(opt.output_dir);
    config.save(opt.output_dir + "/config.toml");
    csv.open(opt.output_dir + "/metrics.csv");
    csv << "step,elapsed_s,train_loss,val_loss,val_bpb,lr,tokens_per_s,tokens_seen,eval_windows\n";
  }
  auto write_row = [&](int64_t step, double t, double train_loss, double val_loss, double lr, double tok_s,
                       int64_t windows) {
    if (!csv.is_open()) return;
    csv << step << "," << fmt(t, 2) << "," << fmt(train_loss, 5) << "," << fmt(val_loss, 5) << ","
        << fmt(val_loss / std::log(2.0), 5) << "," << lr << "," << fmt(tok_s, 1) << "," << step * tokens_per_step
        << "," << windows << "\n";
    csv.flush();
  };

  std::mt19937_64 rng(static_cast<uint64_t>(opt.seed) * 1000003ULL + static_cast<uint64_t>(dp->rank()) + 1);
  // Dropout: the same stream on the tp and pp peers of a data-parallel rank (Megatron-LM's rule for
  // dropout outside the tensor-parallel region), different across dp ranks.
  torch::manual_seed(static_cast<uint64_t>(opt.seed) * 7919ULL + static_cast<uint64_t>(dp->rank()));
  booster::nn::set_tensor_parallel_seed(static_cast<uint64_t>(opt.seed) * 7919ULL + static_cast<uint64_t>(dp->rank()));
  const double budget_s = opt.max_minutes * 60.0;
  double train_seconds = 0, window_loss = 0, last_train_loss = NAN;
  int64_t window_steps = 0, step = 0;
  double window_train_s = 0;
  while (step < opt.max_steps) {
    // Every rank stops at the same step: the slowest rank's clock decides.
    const double now = world->allreduce_scalar(elapsed(), booster::dist::ReduceOp::MAX);
    if (budget_s > 0 && now >= budget_s) break;
    *progress = std::max(static_cast<double>(step) / static_cast<double>(opt.max_steps),
                         budget_s > 0 ? now / budget_s : 0.0);
    auto t0 = Clock::now();
    const std::clock_t c0 = std::clock();
    std::vector<Batch> micro;
    for (int64_t i = 0; i < opt.gradient_accumulation_steps; ++i)
      micro.push_back(sample_batch(corpus.train, opt.batch_size, T, rng));
    const double lr = optimizer->optimizer().param_groups()[0].options().get_lr();
    const double loss = train_step(booster, model, *optimizer, *lr_scheduler, criterion, micro, par);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    // Process CPU time over wall time: well below 1 (one thread per rank) on a loaded machine.
    const double cpu_share = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC / dt;
    train_seconds += dt;
    window_train_s += dt;
    window_loss += loss;
    ++window_steps;
    ++step;
    if (step % opt.log_interval == 0 || step == 1)
      booster::log::info("step " + std::to_string(step) + "  loss " + fmt(loss, 4) + " (" +
                         fmt(loss / std::log(2.0), 3) + " bpb)  lr " + fmt(lr, 6) + "  " +
                         fmt(static_cast<double>(tokens_per_step) / dt, 0) + " tokens/s  cpu/wall " +
                         fmt(cpu_share, 2) + "  elapsed " +
                         fmt(elapsed(), 1) + " s");
    if (step % opt.eval_interval == 0) {
      const double mean_train = world->allreduce_scalar(window_loss / static_cast<double>(window_steps),
                                                        booster::dist::ReduceOp::SUM) / world->size();
      const double tok_s = static_cast<double>(window_steps * tokens_per_step) / window_train_s;
      auto e0 = Clock::now();
      const double val = evaluate(booster, model, criterion, corpus.val, T, opt.batch_size, opt.eval_windows, *dp, par);
      const double eval_s = std::chrono::duration<double>(Clock::now() - e0).count();
      booster::log::info("eval step " + std::to_string(step) + "  train_loss " + fmt(mean_train, 4) + "  val_loss " +
                         fmt(val, 4) + "  val_bpb " + fmt(val / std::log(2.0), 4) + "  tokens/s " + fmt(tok_s, 0) +
                         "  eval " + fmt(eval_s, 1) + " s  elapsed " + fmt(elapsed(), 1) + " s");
      write_row(step, elapsed(), mean_train, val, lr, tok_s, opt.eval_windows);
      last_train_loss = mean_train;
      window_loss = 0;
      window_steps = 0;
      window_train_s = 0;
    }
  }
  if (window_steps > 0)
    last_train_loss = world->allreduce_scalar(window_loss / static_cast<double>(window_steps),
                                              booster::dist::ReduceOp::SUM) / world->size();
  const double train_tok_s = static_cast<double>(step * tokens_per_step) / std::max(train_seconds, 1e-9);
  booster::log::info("gpt: training stopped after " + std::to_string(step) + " steps at " + fmt(elapsed(), 1) +
                     " s (" + fmt(train_tok_s, 0) + " training tokens/s); final evaluation");
  const double val = evaluate(booster, model, criterion, corpus.val, T, opt.batch_size, opt.final_eval_windows, *dp, par);
  write_row(step, elapsed(), last_train_loss, val, lr_scheduler->get_last_lr()[0], train_tok_s,
            opt.final_eval_windows);
  booster::log::info("gpt: final val_loss " + fmt(val, 4) + " nats/byte = val_bpb " + fmt(val / std::log(2.0), 4) +
                     " (" + (opt.final_eval_windows > 0 ? std::to_string(opt.final_eval_windows) : std::string("all")) +
                     " windows of the held-out books) after " + std::to_string(step) + " steps, " +
                     fmt(elapsed(), 1) + " s");
  if (opt.save_model) {
    booster.save_model(model, opt.output_dir + "/model");
    booster::log::info("gpt: model saved to " + opt.output_dir + "/model");
  }
  if (opt.sample_length > 0) {
    std::string text = generate(booster, model, criterion, opt.sample_prompt, opt.sample_length,
                                opt.sample_temperature, static_cast<uint64_t>(opt.seed), T, par);
    if (world->rank() == 0) std::cout << "----- sample (temperature " << opt.sample_temperature << ") -----\n"
                                      << text << "\n-----" << std::endl;
  }
  booster::log::info("gpt: done in " + fmt(elapsed(), 1) + " s; metrics in " + opt.output_dir + "/metrics.csv");
  if (csv.is_open()) {
    csv.close();
    examples::plot_metrics_at_end(opt.output_dir);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "gpt: error: " << e.what() << std::endl;
    return 1;
  }
}
