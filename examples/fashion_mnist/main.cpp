// Fashion-MNIST with Booster: a small CNN (2 conv + BN + pooling) trained data-parallel with the
// plugin named in the TOML config. The main job of the project:
//   build/bin/booster run --nproc_per_node 2 build/bin/fashion_mnist --config examples/configs/ddp.toml
// Also runs standalone (1 rank), with explicit --rank/--world_size/--host/--port flags, or under
// torchrun --no_python. Prints per-epoch train loss, test accuracy and samples/s; writes
// metrics.csv and the effective config.toml into [train] output_dir.
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "booster/booster.h"
#include "booster/checkpoint/checkpoint_manager.h"
#include "booster/data/dataset.h"
#include "booster/io/atomic_write.h"
#include "booster/logging.h"
#include "booster/optim/cpu_adam.h"
#include "common/metrics_csv.h"
#include "common/plot_at_end.h"
#include "common/step_profiler.h"
#include "net.h"

namespace {


struct TrainOptions {
  int64_t epochs, batch_size, seed, max_steps_per_epoch, train_subset, gradient_accumulation_steps;
  int64_t stop_after_epoch, stop_after_step, test_subset, checkpoint_every_steps, keep_last_n;
  bool auto_resume, checkpoint_use_async, checkpoint_async_skip_if_busy;
  int64_t checkpoint_async_max_mib;
  std::string optimizer, data_dir, output_dir, checkpoint_dir, resume_from;
  double lr, weight_decay, momentum;
};

// Reads [train] except its [train.lr_scheduler] table (read by make_lr_scheduler; the caller then
// calls check_unknown() on the section).
TrainOptions read_train_options(const booster::Options& t, const std::string& data_dir_flag,
                                const std::string& output_flag) {
  TrainOptions o;
  o.epochs = t.get_int("epochs", 5, 1, 1000);
  o.batch_size = t.get_int("batch_size", 64, 1, 1 << 20);
  // "hybrid_adam": booster::optim::HybridAdam, AdamW's arithmetic in one multi-tensor launch on CUDA
  o.optimizer = t.get_choice("optimizer", "adamw", {"adamw", "hybrid_adam", "sgd"});
  o.lr = t.get_double("lr", 1e-3, 0.0, 10.0);
  o.weight_decay = t.get_double("weight_decay", 0.01, 0.0, 1.0);
  o.momentum = t.get_double("momentum", 0.9, 0.0, 1.0);
  o.seed = t.get_int("seed", 42, 0);
  // Micro-batches per optimizer step; all but the last run inside booster.no_sync (no communication).
  o.gradient_accumulation_steps = t.get_int("gradient_accumulation_steps", 1, 1, 1 << 20);
  o.max_steps_per_epoch = t.get_int("max_steps_per_epoch", 0, 0);  // 0 = whole epoch (smoke tests use a few)
  o.train_subset = t.get_int("train_subset", 0, 0);                // 0 = all 60000 samples
  o.test_subset = t.get_int("test_subset", 0, 0);                  // 0 = all 10000 samples
  o.data_dir = t.get_string("data_dir", booster::data::FASHION_MNIST_DEFAULT_DIR);
  // Checkpointing (booster/checkpoint/checkpoint_manager.h): model, optimizer, scheduler and trainer
  // state (epoch, position in it, generators) in one directory per step under checkpoint_dir,
  // after every epoch and every checkpoint_every_steps optimizer steps (0 = at epoch ends only),
  // keeping the newest keep_last_n (0 = all). auto_resume (default on with a checkpoint_dir)
  // continues from the newest one there, mid-epoch included; resume_from names a checkpoint
  // directory or a checkpoint_dir to continue from instead. stop_after_epoch / stop_after_step
  // simulate an interruption (0 = run to the end).
  o.checkpoint_dir = t.get_string("checkpoint_dir", "");
  o.checkpoint_every_steps = t.get_int("checkpoint_every_steps", 0, 0);
  o.keep_last_n = t.get_int("keep_last_n", 0, 0, 1 << 20);
  // checkpoint_use_async: the checkpoints are written in the background (booster/checkpoint/
  // async_save.h): training continues once the state is copied to host buffers (at most
  // checkpoint_async_max_mib MiB per rank, else that save is written blocking with a warning); a
  // save while the previous one is still being written waits, or is skipped with a warning when
  // checkpoint_async_skip_if_busy.
  o.checkpoint_use_async = t.get_bool("checkpoint_use_async", false);
  o.checkpoint_async_max_mib = t.get_int("checkpoint_async_max_mib", 4096, 1);
  o.checkpoint_async_skip_if_busy = t.get_bool("checkpoint_async_skip_if_busy", false);
  o.auto_resume = t.get_bool("auto_resume", !o.checkpoint_dir.empty());
  o.resume_from = t.get_string("resume_from", "");
  o.stop_after_epoch = t.get_int("stop_after_epoch", 0, 0);
  o.stop_after_step = t.get_int("stop_after_step", 0, 0);
  if (o.auto_resume && o.checkpoint_dir.empty())
    throw booster::ConfigError("[train] auto_resume = true needs a checkpoint_dir to resume from; set "
                               "train.checkpoint_dir or drop auto_resume");
  o.output_dir = t.get_string("output_dir", "runs/fashion_mnist");
  if (!data_dir_flag.empty()) o.data_dir = data_dir_flag;
  if (!output_flag.empty()) o.output_dir = output_flag;
  return o;
}

// Accuracy on this rank's contiguous slice of the test set; summed over ranks. Through the boosted
// model, so the forward runs in the plugin's precision (e.g. bf16 weights under low_level_zero).
double evaluate(booster::ModelWrapper<NetImpl>& model, const booster::data::TensorDataset& test,
                booster::dist::ProcessGroup& world, const c10::Device& device) {
  torch::NoGradGuard no_grad;
  auto net = model.module();
  net->eval();
  int64_t n = test.size(), r = world.rank(), w = world.size();
  int64_t begin = n * r / w, end = n * (r + 1) / w;
  double correct = 0;
  for (int64_t i = begin; i < end; i += 1000) {
    int64_t len = std::min<int64_t>(1000, end - i);
    auto logits = model.forward(test.data().narrow(0, i, len).to(device));
    correct += logits.argmax(1).eq(test.target().narrow(0, i, len).to(device)).sum().item<double>();
  }
  net->train();
  return world.allreduce_scalar(correct, booster::dist::ReduceOp::SUM) / static_cast<double>(n);
}

std::string fmt_double(double v, int precision) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", precision, v);
  return buf;
}

// The checkpoint to continue from for resume_from = `path`: a checkpoint directory itself (it has
// trainer_state.json, or epoch.txt from earlier versions), or a checkpoint_dir holding step
// directories (its newest). Throws std::runtime_error naming the path otherwise.
std::string checkpoint_to_resume(const std::string& path, const std::shared_ptr<booster::dist::ProcessGroup>& world) {
  namespace fs = std::filesystem;
  if (fs::exists(path + "/trainer_state.json") || fs::exists(path + "/model")) return path;
  if (auto latest = booster::checkpoint::CheckpointManager(path, world).latest()) return *latest;
  throw std::runtime_error("fashion_mnist: resume_from = \"" + path + "\" is neither a checkpoint (model/, "
                           "trainer_state.json) nor a checkpoint_dir holding step_* checkpoints");
}

int run(int argc, char** argv) {
  CLI::App app{"Fashion-MNIST CNN trained with Booster (plugin chosen in the TOML config)"};
  std::string config_path = "examples/configs/ddp.toml", data_dir, output_dir;
  std::vector<std::string> overrides;
  app.add_option("--config", config_path, "TOML config file")->check(CLI::ExistingFile);
  app.add_option("--set", overrides, "Dotted override, e.g. --set plugin.bucket_cap_mb=4 (repeatable)");
  app.add_option("--data_dir", data_dir, "Fashion-MNIST IDX directory (overrides [train] data_dir)");
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
  if (!extras.empty()) throw std::invalid_argument("fashion_mnist: unknown argument '" + extras.front() + "' (see --help)");
  booster::Options train_section = config.section("train");
  TrainOptions opt = read_train_options(train_section, data_dir, output_dir);
  booster::Booster booster(config);

  torch::manual_seed(opt.seed);  // same initial model everywhere (DDP broadcasts rank 0's anyway)
  Net net;
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  if (opt.optimizer == "adamw")
    optimizer = std::make_shared<torch::optim::AdamW>(net->parameters(),
                                                      torch::optim::AdamWOptions(opt.lr).weight_decay(opt.weight_decay));
  else if (opt.optimizer == "hybrid_adam")
    optimizer = std::make_shared<booster::optim::HybridAdam>(
        net->parameters(), booster::optim::CPUAdamOptions(opt.lr).weight_decay(opt.weight_decay));
  else
    optimizer = std::make_shared<torch::optim::SGD>(
        net->parameters(), torch::optim::SGDOptions(opt.lr).momentum(opt.momentum).weight_decay(opt.weight_decay));

  auto train_set = booster::data::load_fashion_mnist(opt.data_dir, true);
  auto test_set = booster::data::load_fashion_mnist(opt.data_dir, false);
  if (opt.test_subset > 0 && opt.test_subset < test_set->size())
    test_set = std::make_shared<booster::data::TensorDataset>(test_set->data().narrow(0, 0, opt.test_subset),
                                                             test_set->target().narrow(0, 0, opt.test_subset));
  std::shared_ptr<booster::data::Dataset> train_data = train_set;
  if (opt.train_subset > 0 && opt.train_subset < train_set->size())
    train_data = std::make_shared<booster::data::TensorDataset>(train_set->data().narrow(0, 0, opt.train_subset),
                                                               train_set->target().narrow(0, 0, opt.train_subset));
  auto loader = booster.prepare_dataloader(train_data, opt.batch_size, /*shuffle=*/true, opt.seed, /*drop_last=*/true);
  // The LR schedule steps once per optimizer step: [train.lr_scheduler] (name = "none" for constant).
  int64_t batches = loader->num_batches();
  if (opt.max_steps_per_epoch > 0) batches = std::min(batches, opt.max_steps_per_epoch);
  int64_t total_steps = opt.epochs * std::max<int64_t>(1, batches / opt.gradient_accumulation_steps);
  auto scheduler = booster::make_lr_scheduler(train_section.table("lr_scheduler"), *optimizer, total_steps);
  train_section.check_unknown();
  booster::Criterion cross_entropy = [](const torch::Tensor& logits, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(logits, target);
  };

  if (booster.estimate_requested()) {  // --estimate N: the memory table instead of training
    std::cout << booster.estimate(net.ptr(), optimizer, cross_entropy, loader).text << std::flush;
    return 0;
  }
  auto [model, boosted_opt, criterion, train_loader, lr_scheduler] =
      booster.boost(net, optimizer, cross_entropy, loader, scheduler);

  int64_t steps_per_epoch = train_loader->num_batches();
  if (opt.max_steps_per_epoch > 0) steps_per_epoch = std::min(steps_per_epoch, opt.max_steps_per_epoch);

  // Resume: from resume_from (a checkpoint or a checkpoint_dir), else the newest checkpoint in
  // checkpoint_dir (auto_resume).
  std::unique_ptr<booster::checkpoint::CheckpointManager> checkpoints;
  if (!opt.checkpoint_dir.empty())
    checkpoints = std::make_unique<booster::checkpoint::CheckpointManager>(opt.checkpoint_dir, world,
                                                                         static_cast<int>(opt.keep_last_n));
  if (checkpoints && opt.checkpoint_use_async) {
    booster::checkpoint::AsyncSavePolicy policy;
    policy.max_host_mib = opt.checkpoint_async_max_mib;
    policy.skip_if_busy = opt.checkpoint_async_skip_if_busy;
    checkpoints->set_async(true, policy);
  }
  std::string resume_dir;
  if (!opt.resume_from.empty()) {
    resume_dir = checkpoint_to_resume(opt.resume_from, world);
  } else if (checkpoints && opt.auto_resume) {
    resume_dir = checkpoints->latest().value_or("");
  }
  int64_t first_epoch = 1, skip_batches = 0, global_step = 0;
  std::vector<std::pair<std::string, double>> resumed_sums;
  if (!resume_dir.empty()) {
    booster.load_model(model, resume_dir + "/model");
    booster.load_optimizer(*boosted_opt, resume_dir + "/optimizer");
    if (lr_scheduler) booster.load_lr_scheduler(*lr_scheduler, resume_dir + "/lr_scheduler.json");
    if (std::filesystem::exists(resume_dir + "/trainer_state.json")) {
      booster::checkpoint::TrainerState state = booster::checkpoint::load_trainer_state(resume_dir, world);
      global_step = state.global_step;
      first_epoch = state.epoch;
      if (state.step_in_epoch > 0) {
        if (state.world_size != world->size() || !state.generator_restored)
          throw std::runtime_error("fashion_mnist: " + resume_dir + " was saved mid-epoch by " +
                                   std::to_string(state.world_size) + " ranks; continuing inside an epoch needs the "
                                   "same world size (each rank's data position and generator), or resume from a "
                                   "checkpoint saved at an epoch end");
        skip_batches = state.step_in_epoch;
        resumed_sums = state.sums;
      }
    } else {  // a per-epoch checkpoint of earlier versions: epoch.txt names the finished epoch
      std::ifstream in(resume_dir + "/epoch.txt");
      int64_t done = 0;
      if (!(in >> done) || done < 1)
        throw std::runtime_error("fashion_mnist: " + resume_dir + " has neither trainer_state.json nor a valid epoch.txt");
      first_epoch = done + 1;
    }
    booster::log::info("fashion_mnist: resumed from " + resume_dir +
                       (skip_batches > 0 ? " in epoch " + std::to_string(first_epoch) + " after batch " +
                                               std::to_string(skip_batches)
                                         : " after epoch " + std::to_string(first_epoch - 1)));
  }
  auto save_checkpoint = [&](int64_t epoch, int64_t step_in_epoch,
                             std::vector<std::pair<std::string, double>> sums) {
    checkpoints->save(global_step, [&](const std::string& dir) {
      booster.save_model(model, dir + "/model");
      booster.save_optimizer(*boosted_opt, dir + "/optimizer");
      if (lr_scheduler) booster.save_lr_scheduler(*lr_scheduler, dir + "/lr_scheduler.json");
      booster::checkpoint::TrainerState state;
      state.epoch = epoch;
      state.step_in_epoch = step_in_epoch;
      state.global_step = global_step;
      state.sums = std::move(sums);
      state.config = config.to_toml();
      booster::checkpoint::save_trainer_state(dir, state, world);
    });
  };

  std::filesystem::create_directories(opt.output_dir);
  std::ofstream csv;
  if (world->rank() == 0) {
    config.save(opt.output_dir + "/config.toml");
    // A resumed run keeps the rows of the epochs before the one it continues.
    const std::string kept = resume_dir.empty() ? "" : examples::metrics_rows_below(opt.output_dir + "/metrics.csv", first_epoch);
    csv.open(opt.output_dir + "/metrics.csv");
    csv << "epoch,train_loss,test_accuracy,samples_per_s,epoch_seconds,lr\n" << kept;
  }
  booster::log::info("fashion_mnist: " + std::to_string(train_data->size()) + " training samples, batch " +
                     std::to_string(opt.batch_size) + " per rank x " + std::to_string(world->size()) + " ranks, " +
                     std::to_string(opt.epochs) + " epochs, " + std::to_string(at::get_num_threads()) +
                     " threads per rank");

  double accuracy = 0;
  bool stopped = false;
  examples::StepProfiler profiler;  // BOOSTER_EXAMPLE_PROFILE (common/step_profiler.h): optimizer steps
  for (int64_t epoch = first_epoch; epoch <= opt.epochs && !stopped; ++epoch) {
    if (opt.stop_after_epoch > 0 && epoch > opt.stop_after_epoch) break;
    const bool mid_epoch = epoch == first_epoch && skip_batches > 0;
    // Per-epoch seed (dropout): a run resumed at an epoch start draws the same numbers as an
    // uninterrupted one; mid-epoch, the generator state saved with the checkpoint was restored.
    if (!mid_epoch) torch::manual_seed(static_cast<uint64_t>(opt.seed) * 1000003ULL + epoch * 101 + world->rank());
    train_loader->set_epoch(epoch);
    const int64_t steps = steps_per_epoch;
    booster::log::ProgressBar bar("epoch " + std::to_string(epoch) + "/" + std::to_string(opt.epochs), steps);
    auto start = std::chrono::steady_clock::now();
    const int64_t faults_at_start = booster::process_memory().minor_faults;
    double loss_sum = 0, seconds_before = 0;
    int64_t step = 0, samples = 0;
    if (mid_epoch) {
      for (const auto& [key, value] : resumed_sums) {
        if (key == "loss_sum") loss_sum = value;
        if (key == "samples") samples = static_cast<int64_t>(value);
        if (key == "seconds") seconds_before = value;
      }
    }
    const int64_t gas = opt.gradient_accumulation_steps;
    auto it = train_loader->begin();
    const auto end_it = train_loader->end();
    for (; step < (mid_epoch ? skip_batches : 0) && it != end_it; ++step) ++it;  // batches already trained on
    for (; it != end_it && step < steps; ++it) {
      profiler.begin_step(global_step + 1);
      auto batch = *it;
      // Gradient accumulation: average over `gas` micro-batches, synchronise only on the last one.
      const bool last_micro = (step + 1) % gas == 0;
      auto loss = criterion(model.forward(batch.data), batch.target);
      if (last_micro) {
        booster.backward(loss / static_cast<double>(gas), *boosted_opt);
        boosted_opt->step();
        boosted_opt->zero_grad();
        if (lr_scheduler) lr_scheduler->step();
      } else {
        auto no_sync = booster.no_sync(model, boosted_opt.get());
        booster.backward(loss / static_cast<double>(gas), *boosted_opt);
      }
      loss_sum += loss.item<double>();
      if (last_micro) profiler.end_step(global_step + 1);
      samples += batch.data.size(0);
      ++step;
      bar.update(step, "loss " + fmt_double(loss_sum / step, 4));
      if (!last_micro) continue;
      ++global_step;
      if (checkpoints && opt.checkpoint_every_steps > 0 && global_step % opt.checkpoint_every_steps == 0 && step < steps) {
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        save_checkpoint(epoch, step,
                        {{"loss_sum", loss_sum}, {"samples", static_cast<double>(samples)},
                         {"seconds", seconds_before + seconds}});
      }
      if (opt.stop_after_step > 0 && global_step >= opt.stop_after_step) {
        stopped = true;
        break;
      }
    }
    bar.finish();
    if (stopped) {
      booster::log::info("fashion_mnist: stopped after optimizer step " + std::to_string(global_step) +
                         " (stop_after_step)");
      break;
    }
    double seconds = seconds_before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // Host memory after the epoch's last step (steady state), the peak so far and the fresh pages
    // touched per step: the highest rank's.
    const booster::ProcessMemory mem = booster::process_memory();
    const double faults_per_step = static_cast<double>(mem.minor_faults - faults_at_start) / std::max<int64_t>(step, 1);
    const double rss_mib = world->allreduce_scalar(static_cast<double>(mem.rss_bytes) / (1 << 20), booster::dist::ReduceOp::MAX);
    const double peak_mib = world->allreduce_scalar(static_cast<double>(mem.peak_rss_bytes) / (1 << 20), booster::dist::ReduceOp::MAX);
    const double max_faults = world->allreduce_scalar(faults_per_step, booster::dist::ReduceOp::MAX);
    double mean_loss = world->allreduce_scalar(loss_sum / std::max<int64_t>(step, 1), booster::dist::ReduceOp::SUM) /
                       world->size();
    double total_samples = world->allreduce_scalar(static_cast<double>(samples), booster::dist::ReduceOp::SUM);
    accuracy = evaluate(model, *test_set, *world, booster.device());
    double throughput = total_samples / seconds;
    booster::log::info("epoch " + std::to_string(epoch) + "/" + std::to_string(opt.epochs) + "  train_loss " +
                       fmt_double(mean_loss, 4) + "  test_accuracy " + fmt_double(accuracy, 4) + "  samples/s " +
                       fmt_double(throughput, 0) + "  time " + fmt_double(seconds, 1) + " s  rss " +
                       fmt_double(rss_mib, 0) + " MiB  peak_rss " + fmt_double(peak_mib, 0) + " MiB  faults/step " +
                       fmt_double(max_faults, 0));
    if (checkpoints) save_checkpoint(epoch + 1, 0, {});  // the next epoch, from its start
    if (csv.is_open()) {
      csv << epoch << "," << fmt_double(mean_loss, 6) << "," << fmt_double(accuracy, 6) << ","
          << fmt_double(throughput, 1) << "," << fmt_double(seconds, 2) << ","
          << optimizer->param_groups()[0].options().get_lr() << "\n";
      csv.flush();
    }
  }
  if (checkpoints) checkpoints->wait();  // the last asynchronous save is committed (or its error thrown)
  booster::log::info("fashion_mnist: final test accuracy " + fmt_double(accuracy, 4) + "; metrics in " +
                     opt.output_dir + "/metrics.csv");
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
    std::cerr << "fashion_mnist: error: " << e.what() << std::endl;
    return 1;
  }
}
