// lm_checkpoint.cpp — the language-model trainer's training checkpoints (lm_trainer.h): one
// committed directory per step through booster/checkpoint/checkpoint_manager.h.
#include <filesystem>
#include <stdexcept>

#include "booster/checkpoint/checkpoint_manager.h"
#include "common/lm_trainer.h"

namespace examples::lm {

uint64_t step_seed(int64_t seed, int64_t dp_rank, int64_t step) {
  // SplitMix64 (Steele, Lea and Flood, "Fast Splittable Pseudorandom Number Generators", 2014),
  // folded over the three inputs.
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  uint64_t h = mix(static_cast<uint64_t>(seed));
  h = mix(h ^ static_cast<uint64_t>(dp_rank));
  h = mix(h ^ static_cast<uint64_t>(step));
  return h >> 1;  // torch::manual_seed takes any uint64_t; keep it below 2^63 for int64 readers
}

std::unique_ptr<booster::checkpoint::CheckpointManager> make_checkpoints(
    const TrainOptions& o, const std::shared_ptr<booster::dist::ProcessGroup>& world) {
  if (o.checkpoint_dir.empty()) return nullptr;
  auto manager = std::make_unique<booster::checkpoint::CheckpointManager>(o.checkpoint_dir, world,
                                                                          static_cast<int>(o.keep_last_n));
  if (o.checkpoint_use_async) {
    booster::checkpoint::AsyncSavePolicy policy;
    policy.max_host_mib = o.checkpoint_async_max_mib;
    policy.skip_if_busy = o.checkpoint_async_skip_if_busy;
    manager->set_async(true, policy);
  }
  return manager;
}

namespace {

// resume_from = `path`: a checkpoint itself (trainer_state.json), or a checkpoint_dir (its newest).
std::string checkpoint_at(const std::string& name, const std::string& path,
                          const std::shared_ptr<booster::dist::ProcessGroup>& world) {
  if (std::filesystem::exists(path + "/trainer_state.json")) return path;
  if (auto latest = booster::checkpoint::CheckpointManager(path, world).latest()) return *latest;
  throw std::runtime_error(name + ": [train] resume_from = \"" + path + "\" is neither a checkpoint (trainer_state.json) "
                           "nor a checkpoint_dir holding step_* checkpoints");
}

}  // namespace

std::string resume(Run& run, const TrainOptions& o, booster::checkpoint::CheckpointManager* checkpoints,
                   LoopState& state) {
  std::string dir;
  if (!o.resume_from.empty())
    dir = checkpoint_at(run.name, o.resume_from, run.world);
  else if (checkpoints && o.auto_resume)
    dir = checkpoints->latest().value_or("");
  if (dir.empty()) return dir;
  if (!std::filesystem::exists(dir + "/" + run.saved_as))
    throw std::runtime_error(run.name + ": checkpoint " + dir + " has no " + run.saved_as + "/ (" +
                             (run.saved_as == "lora" ? "it was written without LoRA: resume it without lora_r / --lora_from"
                                                     : "it holds LoRA adapters: resume it with the same lora_r") +
                             ")");
  run.load_model(dir + "/" + run.saved_as);
  run.booster->load_optimizer(*run.optimizer, dir + "/optimizer");
  run.booster->load_lr_scheduler(*run.scheduler, dir + "/lr_scheduler.json");
  const booster::checkpoint::TrainerState saved = booster::checkpoint::load_trainer_state(dir, run.world);
  state = LoopState{};
  state.step = saved.global_step;
  double elapsed = 0;
  for (const auto& [key, value] : saved.sums) {
    if (key == "elapsed_s") elapsed = value;
    if (saved.world_size != run.world->size()) continue;  // the window's sums are per rank
    if (key == "window_loss") state.window_loss = value;
    if (key == "window_steps") state.window_steps = static_cast<int64_t>(value);
    if (key == "window_train_s") state.window_train_s = value;
    if (key == "train_seconds") state.train_seconds = value;
  }
  state.elapsed_s = elapsed;
  booster::log::info(run.name + ": resumed from " + dir + " after step " + std::to_string(state.step) + " (" +
                     fmt(elapsed, 1) + " s of earlier runs" +
                     (saved.world_size != run.world->size()
                          ? ", written by " + std::to_string(saved.world_size) + " ranks: the evaluation window restarts"
                          : std::string()) +
                     ")");
  return dir;
}

void save_checkpoint(Run& run, booster::checkpoint::CheckpointManager& checkpoints, const LoopState& state,
                     const booster::Config& config) {
  const std::string dir = checkpoints.save(state.step, [&](const std::string& tmp) {
    run.save_model(tmp + "/" + run.saved_as);
    run.booster->save_optimizer(*run.optimizer, tmp + "/optimizer");
    run.booster->save_lr_scheduler(*run.scheduler, tmp + "/lr_scheduler.json");
    booster::checkpoint::TrainerState t;
    t.global_step = state.step;
    t.sums = {{"window_loss", state.window_loss},
              {"window_steps", static_cast<double>(state.window_steps)},
              {"window_train_s", state.window_train_s},
              {"train_seconds", state.train_seconds},
              {"elapsed_s", state.elapsed_s}};
    t.config = config.to_toml();
    booster::checkpoint::save_trainer_state(tmp, t, run.world);
  });
  if (!dir.empty())
    booster::log::info(run.name + ": checkpoint of step " + std::to_string(state.step) +
                       (checkpoints.use_async() ? " being written to " : " saved to ") + dir);
}

}  // namespace examples::lm
