// lm_trainer.h — the byte-level language-model trainer shared by examples/gpt and examples/llama:
// the command line, the [train] options, the training loop on the King James Bible
// (examples/gpt/data.h), evaluation, generation, scoring, and HuggingFace-compatible checkpoints
// through a state-dict adapter (booster/checkpoint/state_dict_adapter.h).
//
// An example's main() is run_lm<ModelImpl>(argc, argv, spec): ModelImpl is the model module (the
// public shape of gpt::GPTImpl: a constructor (config, booster::nn::TensorParallelContext), to which
// the trainer passes the Booster's tensor_parallel_context(); a `config` member, forward(idx) ->
// logits [B, T, V / tp], embed / run_blocks / head, pipeline_layers(), num_parameters()), spec says how to read its configuration
// from [train] and from / to a HuggingFace config.json, its loss and its adapter's name.
//
// Training: random windows of n_ctx + 1 bytes from the training books, a different stream on each
// data-parallel rank; AdamW (weight decay on tensors of rank >= 2 only); linear warmup then cosine
// decay to min_lr_ratio * lr over whichever limit ends the run first, max_steps or the wall-clock
// budget max_minutes (counted from process start, so start-up is included; all ranks agree on the
// time every step). Every eval_interval steps: mean next-byte loss on a fixed set of validation
// windows; at the end on every window of the held-out books. bits per byte = loss in nats / ln 2.
// Output (rank 0): log lines, [train] output_dir/metrics.csv (one row per evaluation), the effective
// config.toml, optionally the model (output_dir/model: config.json + model.safetensors as
// transformers' save_pretrained writes them, through the adapter) and a text sample.
// LoRA fine-tuning ([train] lora_r > 0, lora_alpha, lora_dropout, lora_target_modules; typically
// with --init_from): booster.enable_lora before boost(), so only the adapters train; save_model
// then writes them in PEFT's layout to output_dir/lora (adapter_config.json names --init_from as
// the base model).
//
// Training checkpoints ([train] checkpoint_dir; booster/checkpoint/checkpoint_manager.h, one
// committed directory per step as fashion_mnist's): every checkpoint_every_steps optimizer steps
// (0: only when training ends) and when training ends, keeping the newest keep_last_n (0: all).
// Each holds the model as save_model writes it (<dir>/model, HuggingFace's layout; with LoRA the
// adapters only, <dir>/lora in PEFT's, the base coming from --init_from again), the optimizer, the
// scheduler and the loop state (step, elapsed time, the evaluation window's sums). auto_resume
// (default on with a checkpoint_dir) continues from the newest one there, resume_from from the
// checkpoint (or checkpoint_dir) it names; the resumed run then trains exactly as the
// uninterrupted one (every step's batches and dropout derive from the seed, the data-parallel rank
// and the step), and its metrics.csv keeps the rows up to the checkpoint. The time budget
// max_minutes counts the seconds of the runs before. checkpoint_use_async writes them in the
// background (booster/checkpoint/async_save.h: at most checkpoint_async_max_mib MiB of host memory
// per rank, else that save is written blocking with a warning; a save while one is in flight waits,
// or with checkpoint_async_skip_if_busy is skipped with a warning). stop_after_step (0: off) ends the
// run after that step with no final evaluation, save or sample, as if it were killed there (tests).
//
// Command line (besides --config, --set, --output_dir, --estimate and the launcher's flags):
//   --init_from DIR   DIR holds a HuggingFace checkpoint (config.json + model.safetensors or shards
//                     with their index; transformers' save_pretrained or this trainer's save_model).
//                     The model's sizes come from DIR/config.json (spec.from_hf; logged, they
//                     override [train]'s); after boost() the weights are loaded strictly through the
//                     adapter; then training (fine-tuning) runs as usual under any plugin.
//   --lora_from DIR   DIR holds PEFT LoRA adapters (adapter_config.json + adapter_model.safetensors,
//                     as PeftModel.save_pretrained or this trainer with [train] lora_r > 0 writes them):
//                     enable_lora with DIR's config before boost(), then its adapters are loaded
//                     (after --init_from's base weights); --score / --sample apply them, training
//                     fine-tunes them further.
//   --score TEXT      prints "bits per byte: X" (X with %.9f): the mean cross entropy of each byte of
//                     TEXT given the bytes before it (bytes 1..n-1 predicted; transformers' loss with
//                     labels = input_ids) divided by ln 2, in float32 (one process, torch_ddp, on the
//                     config's [booster] device: the configured plugin and precision are training's);
//                     then exits 0.
//                     TEXT needs 2 to n_ctx bytes. No corpus, no training, one process.
//   --sample PROMPT   generates [train] sample_length bytes after PROMPT ([train] sample_temperature,
//                     seed) and prints them as the end-of-training sample is printed; then exits 0.
//                     No corpus, no training, one process.
// --score and --sample use --init_from's weights when given, else the seeded initial model; under
// a launcher with more than one rank they are refused.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "booster/booster.h"
#include "booster/checkpoint/checkpoint_manager.h"
#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/logging.h"

namespace examples::lm {

using Clock = std::chrono::steady_clock;

// ---- Non-template parts (lm_trainer.cpp).

// The command line.
struct Cli {
  std::string config_path, output_dir, init_from, lora_from, score_text, sample_prompt;
  std::vector<std::string> overrides;
  int estimate_world_size = 0;
  bool config_given = false;           // --config given (else config_path is the default)
  bool score = false, sample = false;  // --score / --sample given
};
// Parses argv (unknown flags are left for the launcher: `extras`). Returns the exit status when the
// program should stop now (--help, a parse error), nullopt to go on.
std::optional<int> parse_cli(int argc, char** argv, const std::string& description, const std::string& default_config,
                             Cli& cli, std::vector<std::string>& extras);

// [train]'s options other than the model's.
struct TrainOptions {
  int64_t batch_size, gradient_accumulation_steps, max_steps, warmup_steps, eval_interval, eval_windows;
  int64_t final_eval_windows, log_interval, seed, sample_length;
  double lr, min_lr_ratio, weight_decay, beta1, beta2, max_minutes, sample_temperature;
  bool save_model;
  std::string corpus, val_books, output_dir, sample_prompt;
  std::string optimizer;  // "adamw" | "hybrid_adam"
  int64_t lora_r;  // 0: no LoRA
  double lora_alpha, lora_dropout;
  std::string lora_target_modules;  // comma-separated
  // Training checkpoints (lm_checkpoint.cpp): see the top of this file.
  std::string checkpoint_dir, resume_from;
  int64_t checkpoint_every_steps, keep_last_n, stop_after_step, checkpoint_async_max_mib;
  bool auto_resume, checkpoint_use_async, checkpoint_async_skip_if_busy;
};
// Reads them from [train] (output_flag: --output_dir, wins when not empty); the caller reads the
// model's keys and calls check_unknown() afterwards.
TrainOptions read_train_options(const booster::Options& train, const std::string& output_flag,
                                const std::string& default_output_dir);

// The configuration, the launch and the [train] section of a run: reads --config, applies --set and
// --estimate, launches (consuming the launcher's flags from `extras`), refuses a flag left over.
// --score / --sample without --config read the default config when it exists, else none ([train]'s
// defaults).
struct Setup {
  booster::Config config;
  std::shared_ptr<booster::dist::ProcessGroup> world;
  booster::Options train;
};
Setup setup(const std::string& name, const Cli& cli, std::vector<std::string> extras);
// The Booster's configuration for --score / --sample: one process on the config's [booster] device,
// plugin torch_ddp, float32 (the configured plugin and precision are training's; the score is the
// model's float32 value, as transformers computes it).
booster::Config inference_config(const std::string& name, const booster::Config& config);

// DIR/config.json (refused when missing or not an object, naming DIR).
nlohmann::json read_hf_config(const std::string& name, const std::string& dir);

// The run's LoRA configuration: --lora_from's adapter_config.json (refused together with [train]
// lora_r), else [train] lora_r > 0 with lora_alpha, lora_dropout and lora_target_modules (default:
// default_targets, comma-separated), else none.
std::optional<booster::nn::LoraConfig> lora_config(const std::string& name, const Cli& cli, const TrainOptions& o,
                                                   const std::string& default_targets);

std::string fmt(double v, int precision);

// [train] optimizer ("adamw": LibTorch's torch::optim::AdamW; "hybrid_adam": booster::optim::HybridAdam,
// the same AdamW arithmetic as one multi-tensor kernel launch per group on CUDA and the fused CPU
// kernel on the CPU) with two parameter groups: weight decay on tensors of rank >= 2 (matrices,
// embeddings), none on biases and norm parameters.
std::shared_ptr<torch::optim::Optimizer> make_optimizer(torch::nn::Module& net, const TrainOptions& o);
// Warmup, then cosine over progress = max(step / max_steps, elapsed / budget) (*progress, set by
// the loop), down to min_lr_ratio.
std::shared_ptr<booster::LambdaLR> make_scheduler(torch::optim::Optimizer& optimizer, const TrainOptions& o,
                                                  std::shared_ptr<double> progress);

// One micro-batch: x = window[:, :-1], y = window[:, 1:], int64 [B, T].
struct Batch {
  torch::Tensor x, y;
};
// B random windows of T + 1 bytes from `data` (uint8 [N]).
Batch sample_batch(const torch::Tensor& data, int64_t B, int64_t T, std::mt19937_64& rng);

// The plugin's tensor- and pipeline-parallel sizes (1 and 1 except under hybrid_parallel).
struct Parallel {
  int64_t tp = 1, pp = 1;
  int64_t pipeline_batch = 1;  // rows that split into the plugin's micro-batches (generation)
  booster::dist::ProcessGroup* world = nullptr;
  // The last pipeline stage's loss on every rank (each last-stage rank of a dp replica holds the
  // loss of its own batch: their mean).
  double from_last_stage(const booster::PipelineOutput& out) const;
};
Parallel parallel_of(booster::Booster& booster, booster::ModelHooks& hooks, booster::dist::ProcessGroup* world);

// The boosted model and what goes with it, independent of the model type (run_lm fills it).
struct Run {
  std::string name;  // "gpt": log prefix
  booster::Booster* booster = nullptr;
  std::shared_ptr<booster::dist::ProcessGroup> world;
  std::shared_ptr<booster::dist::ProcessGroup> dp;
  booster::OptimizerWrapper* optimizer = nullptr;
  booster::LRScheduler* scheduler = nullptr;
  booster::Criterion criterion;
  Parallel par;
  int64_t n_ctx = 0;
  std::function<torch::Tensor(const torch::Tensor&)> forward;  // the boosted forward
  // booster.execute_pipeline(x, y, model, criterion, optimizer): the loss (training, evaluation) or,
  // with return_outputs, the last stage's logits only (generation)
  std::function<booster::PipelineOutput(const torch::Tensor&, const torch::Tensor&, booster::OptimizerWrapper*, bool)>
      pipeline;
  std::function<booster::ScopeGuard()> no_sync;  // booster.no_sync(model, optimizer)
  std::function<void(bool)> set_training;        // model->train(on)
  std::function<void(const std::string&)> save_model;  // through the adapter
  std::function<void(const std::string&)> load_model;  // save_model's inverse (strict)
  std::string saved_as = "model";  // save_model's directory under output_dir ("lora": PEFT's adapters)
};

// ---- Training checkpoints (lm_checkpoint.cpp).

// Where the loop stands: what a checkpoint stores besides model, optimizer and scheduler. Every
// step's randomness (its batches, dropout) is a function of (seed, data-parallel rank, step), so
// the step is all a resumed run needs to draw what an uninterrupted one draws.
struct LoopState {
  int64_t step = 0;             // optimizer steps done
  double elapsed_s = 0;         // wall-clock seconds of the run so far (the budget counts them)
  double train_seconds = 0;     // of which in training steps
  double window_loss = 0;       // this rank's loss sum since the last evaluation
  int64_t window_steps = 0;     // steps in that sum
  double window_train_s = 0;    // their seconds
};

// The seed of step `step` on data-parallel rank `dp_rank` (SplitMix64 of the three), for the
// batches' std::mt19937_64, torch's default generator (dropout) and the tensor-parallel one.
uint64_t step_seed(int64_t seed, int64_t dp_rank, int64_t step);

// The run's checkpoints: [train] checkpoint_dir's manager (asynchronous with checkpoint_use_async),
// or nullptr without a checkpoint_dir. Throws std::invalid_argument for a bad policy.
std::unique_ptr<booster::checkpoint::CheckpointManager> make_checkpoints(const TrainOptions& o,
                                                                         const std::shared_ptr<booster::dist::ProcessGroup>& world);
// Collective. The checkpoint to continue from: resume_from (a checkpoint directory, or a
// checkpoint_dir whose newest it takes; std::runtime_error naming it when it is neither), else with
// auto_resume the newest in checkpoint_dir, else none (""). When there is one, loads the model
// (run.load_model from DIR/<run.saved_as>), the optimizer (DIR/optimizer), the scheduler
// (DIR/lr_scheduler.json) and the loop state (DIR/trainer_state.json; the per-rank window sums only
// when it was written by as many ranks) into `state`, and logs it. Throws what the loads throw.
std::string resume(Run& run, const TrainOptions& o, booster::checkpoint::CheckpointManager* checkpoints,
                   LoopState& state);
// Collective. Writes checkpoint `state.step` (model through run.save_model into DIR/<run.saved_as>,
// optimizer, scheduler, loop state, the effective config) through `checkpoints` (blocking or
// asynchronous as it is set).
void save_checkpoint(Run& run, booster::checkpoint::CheckpointManager& checkpoints, const LoopState& state,
                     const booster::Config& config);


// Refuses a --score text shorter than 2 bytes or longer than n_ctx (naming both lengths).
void check_score_text(const std::string& name, const std::string& text, int64_t n_ctx);
// --score's value: mean cross entropy in nats of bytes 1..n-1 of `text` given their prefixes.
double score_text(Run& run, const std::string& text);
// Continues `prompt` by `length` bytes (temperature sampling; greedy when temperature <= 0); see
// lm_trainer.cpp.
std::string generate(Run& run, const std::string& prompt, int64_t length, double temperature, uint64_t seed);
// Prints a sample block ("----- sample (temperature T) -----", the text, "-----") on rank 0.
void print_sample(Run& run, const std::string& text, double temperature);
// The training loop, the final evaluation, save_model and the sample (see the top of this file).
// describe: the model line's parenthesis; progress: make_scheduler's.
int train(Run& run, const TrainOptions& opt, const booster::Config& config, const torch::Tensor& train_bytes,
          const torch::Tensor& val_bytes, const std::string& describe, int64_t num_parameters, Clock::time_point t_start, const std::shared_ptr<double>& progress);
// Reads (or makes) the corpus and splits it: {train, val}; logs nothing.
std::pair<torch::Tensor, torch::Tensor> load_corpus(const TrainOptions& opt, bool rank0);

// Mean next-byte cross entropy in nats, float32 scalar, of the GPT and Llama examples. logits
// [B, T, Vp / tp] (this rank's vocabulary columns, any floating dtype), targets int64 [B, T];
// vocab_size: the real vocabulary (padding columns excluded); tp: the context the model was built
// with. Collective over tp's group. Under sequence_parallelism_mode = "all_to_all" the logits are this
// rank's shard [B, T/sp, Vp / tp]: the loss is taken on the same shard of the targets and averaged
// over the sp group (sequence_parallel_loss).
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets, int64_t vocab_size,
                      const booster::nn::TensorParallelContext& tp);

// ---- The model-specific part of an example.
template <class Config>
struct ModelSpec {
  std::string name;            // "gpt": the log and error prefix
  std::string adapter;         // the state-dict adapter's name ("gpt2")
  std::string lora_targets;    // [train] lora_target_modules' default (PEFT's for the architecture)
  std::string description;     // --help's first line
  std::string default_config;  // --config's default
  std::string default_output_dir;
  // The model's [train] keys.
  std::function<Config(const booster::Options& train)> read_config;
  // A HuggingFace config.json -> the model's sizes; training-only choices (dropout) from `train`.
  // Throws std::invalid_argument for a configuration the model cannot represent.
  std::function<Config(const nlohmann::json& hf, const Config& train)> from_hf;
  std::function<nlohmann::json(const Config&)> to_hf;
  std::function<std::string(const Config&)> describe;  // "4 layers, n_embd 256, 4 heads, n_ctx 128"
  // Mean next-byte cross entropy: logits [B, T, V / tp], targets [B, T], the real vocabulary size,
  // the tensor-parallel context the model was built with.
  std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, int64_t,
                              const booster::nn::TensorParallelContext&)>
      loss;
  std::function<int64_t(const Config&)> vocab_size;
  std::function<int64_t(const Config&)> n_ctx;
};

namespace detail {
template <class ModelImpl, class Config>
int run_lm(int argc, char** argv, const ModelSpec<Config>& spec) {
  const auto t_start = Clock::now();
  Cli cli;
  std::vector<std::string> extras;
  if (auto rc = parse_cli(argc, argv, spec.description, spec.default_config, cli, extras)) return *rc;
  Setup s = setup(spec.name, cli, std::move(extras));
  Config cfg = spec.read_config(s.train);
  TrainOptions opt = read_train_options(s.train, cli.output_dir, spec.default_output_dir);
  s.train.check_unknown();
  const bool training = !cli.score && !cli.sample;
  if (!training && s.world->size() > 1)
    throw std::invalid_argument(std::string(cli.score ? "--score" : "--sample") + " runs as one process, not " +
                                std::to_string(s.world->size()) +
                                " ranks: run the example directly (no launcher, no --world_size)");
  if (!cli.init_from.empty()) {
    cfg = spec.from_hf(read_hf_config(spec.name, cli.init_from), cfg);
    booster::log::info(spec.name + ": --init_from " + cli.init_from + ": the model's sizes come from its config.json (" +
                       spec.describe(cfg) + "), overriding [train]'s");
  }
  if (cli.score) check_score_text(spec.name, cli.score_text, spec.n_ctx(cfg));  // before any work
  booster::Booster booster(training ? s.config : inference_config(spec.name, s.config));

  torch::Tensor train_bytes, val_bytes;
  if (training) std::tie(train_bytes, val_bytes) = load_corpus(opt, s.world->rank() == 0);
  const int64_t T = spec.n_ctx(cfg);

  torch::manual_seed(opt.seed);  // the same initial model on every rank
  auto net = std::make_shared<ModelImpl>(cfg, booster.tensor_parallel_context());
  const std::optional<booster::nn::LoraConfig> lora = lora_config(spec.name, cli, opt, spec.lora_targets);
  if (lora) booster.enable_lora(*net, *lora);  // before the optimizer: boost() keeps the adapters only
  auto adamw = make_optimizer(*net, opt);
  auto progress = std::make_shared<double>(0.0);
  auto scheduler = make_scheduler(*adamw, opt, progress);
  booster::Criterion criterion_fn = [loss = spec.loss, vocab = spec.vocab_size(cfg), tp = booster.tensor_parallel_context()](
                                        const torch::Tensor& logits, const torch::Tensor& targets) {
    return loss(logits, targets, vocab, tp);
  };
  if (training && booster.estimate_requested()) {
    // --estimate N: the memory table instead of training. One training micro-batch (from its own
    // generator) measures the activations: this trainer has no data loader to give estimate().
    std::mt19937_64 estimate_rng(static_cast<uint64_t>(opt.seed));
    Batch b = sample_batch(train_bytes, opt.batch_size, T, estimate_rng);
    booster.set_estimate_batch(b.x, b.y);
    std::cout << booster.estimate(net, adamw, criterion_fn).text << std::flush;
    return 0;
  }
  // Named members, not a structured binding: the lambdas below capture them (C++17).
  auto boosted = booster.boost(net, adamw, criterion_fn, nullptr, scheduler);
  auto& model = boosted.model;
  auto& optimizer = boosted.optimizer;
  auto& criterion = boosted.criterion;

  // The adapter of this model size, registered for the model (its rules are checked against the
  // model's tensors here): save_model writes its config.json and layout, load_model checks and
  // converts through it.
  std::shared_ptr<const booster::checkpoint::StateDictAdapter> adapter =
      booster::checkpoint::make_state_dict_adapter(spec.adapter, spec.to_hf(cfg));
  booster.set_state_dict_adapter(model, adapter);
  if (!cli.init_from.empty()) {
    booster.load_model(model, cli.init_from, /*strict=*/true);
    booster::log::info(spec.name + ": loaded the weights of " + cli.init_from + " (" + adapter->architecture() + ")");
  }
  if (!cli.lora_from.empty()) {
    booster.load_lora(model, cli.lora_from);
    booster::log::info(spec.name + ": loaded the LoRA adapters of " + cli.lora_from);
  }

  Run run;
  run.name = spec.name;
  run.booster = &booster;
  run.world = s.world;
  // After boost(): under plugin = "auto" the mesh (and so the data-parallel group) is chosen there.
  run.dp = booster.data_parallel_group();
  run.optimizer = optimizer.get();
  run.scheduler = boosted.lr_scheduler.get();
  run.criterion = criterion;
  run.par = parallel_of(booster, model.hooks(), s.world.get());
  run.n_ctx = T;
  run.forward = [&model](const torch::Tensor& x) -> torch::Tensor { return model.forward(x); };
  run.pipeline = [&booster, &model, &criterion](const torch::Tensor& x, const torch::Tensor& y,
                                                booster::OptimizerWrapper* o, bool return_outputs) {
    return booster.execute_pipeline(x, y, model, criterion, o, /*return_loss=*/!return_outputs, return_outputs);
  };
  run.no_sync = [&booster, &model, &optimizer] { return booster.no_sync(model, optimizer.get()); };
  run.set_training = [&model](bool on) { model->train(on); };
  if (lora) {
    run.saved_as = "lora";
    run.save_model = [&booster, &model, base = cli.init_from](const std::string& dir) {
      booster.save_lora_as_pretrained(model, dir, base);
    };
    run.load_model = [&booster, &model](const std::string& dir) { booster.load_lora(model, dir); };
  } else {
    run.save_model = [&booster, &model](const std::string& dir) { booster.save_model(model, dir); };
    run.load_model = [&booster, &model](const std::string& dir) { booster.load_model(model, dir, /*strict=*/true); };
  }

  if (!training) {
    if (cli.score) {
      const double nats = score_text(run, cli.score_text);
      std::printf("bits per byte: %.9f\n", nats / std::log(2.0));
      std::fflush(stdout);
    }
    if (cli.sample)
      print_sample(run, generate(run, cli.sample_prompt, opt.sample_length, opt.sample_temperature,
                                 static_cast<uint64_t>(opt.seed)),
                   opt.sample_temperature);
    return 0;
  }
  return train(run, opt, s.config, train_bytes, val_bytes, spec.describe(cfg), net->num_parameters(),
               t_start, progress);
}
}  // namespace detail

// The example's whole main(): errors are printed as "<name>: error: <message>" with exit status 1.
template <class ModelImpl, class Config>
int run_lm(int argc, char** argv, const ModelSpec<Config>& spec) {
  try {
    return detail::run_lm<ModelImpl>(argc, argv, spec);
  } catch (const std::exception& e) {
    // Messages that already start with "<name>: " get it once.
    std::string message = e.what();
    if (message.rfind(spec.name + ": ", 0) == 0) message.erase(0, spec.name.size() + 2);
    std::cerr << spec.name << ": error: " << message << std::endl;
    return 1;
  }
}

}  // namespace examples::lm
