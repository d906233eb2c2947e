// checkpoint_manager.h — one-commit training checkpoints: everything a run needs to resume (model,
// optimizer, LR scheduler, trainer state) in one directory per step, committed by one atomic rename,
// so a reader never sees a mix of two steps and a crash at any moment leaves the newest complete
// checkpoint loadable.
//
// Layout under `root` (HuggingFace Trainer's checkpoint-<step> directories, DeepSpeed's `latest`):
//   root/step_000000120/      a committed checkpoint: complete, whatever the ranks wrote into it
//   root/latest               "step_000000120\n": the newest committed checkpoint (atomic_write_file)
//   root/.tmp-step_<S>-<pid>  a save in progress, or one a crash cut off (removed by the next save)
//   root/.trash-step_<S>-<pid> a pruned checkpoint being removed (likewise)
//
// save() is collective over `world` (every rank calls it with the same step):
//   1. rank 0 removes leftovers of earlier crashes and creates the temporary directory; its name is
//      broadcast; 2. every rank's `fill(tmp)` writes into it (typically the Booster's collective
//      save_model / save_optimizer / save_lr_scheduler and this header's save_trainer_state); 3. the
//      ranks agree that every fill succeeded (one allreduce), else all throw and the temporary is
//      removed; 4. rank 0 fsyncs it, renames it to step_<S> (an existing step_<S> is first moved to
//      the trash), fsyncs root, replaces `latest`, and prunes: every committed checkpoint beyond the
//      newest keep_last_n is renamed into the trash, then removed, so no partly deleted directory
//      ever carries a step name. 5. rank 0's outcome is broadcast (no rank continues alone).
// A directory name step_<S> therefore always means a complete checkpoint; `latest` is a
// convenience: latest() falls back to the highest step_ directory when `latest` is missing, names
// no directory, or is malformed.
//
// The root must be on a file system every rank sees (one machine, or a shared mount).
//
// Asynchronous saves (set_async(true), async_save.h; PyTorch DCP async_save, ColossalAI use_async):
// steps 1-3 run in the foreground as above, with `fill`'s files staged in host memory instead of
// written (the collectives inside fill run as usual); save() then returns at once and this
// process's background writer writes the files into the temporary directory, each rank dropping a
// marker `<tmp>.rank<r>.done` (or `.error`) beside it; rank 0's writer performs step 4 only when
// every rank's marker says done (within AsyncSavePolicy::commit_timeout_s), else it removes the
// temporary. The background issues no collective. So latest() / auto-resume only ever see committed
// sets: a rank killed during the write leaves the previous set the newest loadable one.
// Errors of the background part are thrown (CheckpointError, on every rank) by the next save()
// before it stages anything, or by wait(); the destructor waits and logs them. At most one save is
// in flight: the next save() waits for it, or with AsyncSavePolicy::skip_if_busy skips (returns ""
// on every rank, with a warning). A synchronous save() (the default) waits for any asynchronous save
// that `fill` itself started (e.g. Booster::save_model with use_async) before it commits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "booster/checkpoint/async_save.h"
#include "booster/export.h"

namespace booster {
namespace dist {
class ProcessGroup;
}

namespace checkpoint {

class BOOSTER_API CheckpointManager {
 public:
  // keep_last_n: committed checkpoints kept after a save (>= 1; 0 keeps all). Throws
  // std::invalid_argument for an empty root or keep_last_n < 0. Creates nothing until save().
  CheckpointManager(std::string root, std::shared_ptr<dist::ProcessGroup> world, int keep_last_n = 0);
  // When asynchronous: waits for this process's save in flight, if any (local; an error is logged,
  // not thrown).
  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = default;
  CheckpointManager& operator=(const CheckpointManager&) = default;

  // Makes the following save() calls asynchronous (see above) or blocking again. Throws
  // std::invalid_argument for a bad policy (check_async_policy). Local; every rank must use the same.
  void set_async(bool use_async, const AsyncSavePolicy& policy = {});
  bool use_async() const { return use_async_; }
  // The sync point (collective): waits until the asynchronous save in flight is committed; throws
  // CheckpointError on every rank when it failed (wait_async_save). A no-op without one in flight.
  void wait();

  // Collective: writes checkpoint `step` (>= 0) as described above and returns its directory
  // (root/step_<S>; when asynchronous: where it will be once committed, or "" when skipped). Throws std::invalid_argument for a negative step, io::IoError when a directory
  // operation fails, and CheckpointError (checkpoint_io.h) when `fill` threw on any rank (the message
  // names the rank and its error); on every rank alike. Nothing committed earlier is touched then.
  std::string save(int64_t step, const std::function<void(const std::string& dir)>& fill);

  // The newest committed checkpoint's directory, or nullopt when there is none (or root does not
  // exist). Local (reads the file system only); every rank gets the same answer once save()
  // returned.
  std::optional<std::string> latest() const;
  // Steps of every committed checkpoint, ascending.
  std::vector<int64_t> steps() const;
  const std::string& root() const { return root_; }

  // "step_000000120": the directory name of a step (9 digits, more when needed).
  static std::string step_name(int64_t step);

 private:
  std::string root_;
  std::shared_ptr<dist::ProcessGroup> world_;
  int keep_last_n_;
  bool use_async_ = false;
  AsyncSavePolicy async_policy_;
};

// What a training loop needs besides model, optimizer and scheduler to continue exactly where it
// stopped: its position and the random number generators.
struct TrainerState {
  int64_t epoch = 0;          // the epoch to continue (1-based in the examples)
  int64_t step_in_epoch = 0;  // batches of it already done (0: at its start, e.g. saved at the end
                              // of the previous epoch, which any world size can continue)
  int64_t global_step = 0;    // optimizer steps done in the whole run
  // This rank's running sums of the epoch in progress that the loop reports at its end (e.g.
  // "loss_sum"); saved for every rank, loaded for the loading rank (empty when the checkpoint was
  // written by fewer ranks).
  std::vector<std::pair<std::string, double>> sums;
  std::string config;  // the effective config (TOML text), for the record
  int world_size = 1;  // set by save_trainer_state / load_trainer_state: the ranks that wrote it
  bool generator_restored = false;  // load_trainer_state: this rank's generator file was there and loaded
};

// Writes dir/trainer_state.json (rank 0: the fields above, with every rank's sums, gathered) and
// dir/rng_state_rank<r>.bin (every rank:
// the state of LibTorch's default CPU generator, which dropout and randperm draw from). Collective
// over `world` (errors agreed as in save()). Throws io::IoError / CheckpointError.
BOOSTER_API void save_trainer_state(const std::string& dir, const TrainerState& state,
                                    const std::shared_ptr<dist::ProcessGroup>& world);
// Reads dir/trainer_state.json and restores this rank's generator from dir/rng_state_rank<r>.bin
// when that file exists (generator_restored; it does not when the checkpoint was written by fewer
// ranks: a loop that continues inside an epoch needs the same world size anyway, one that starts
// an epoch reseeds). Throws CheckpointError naming the file for a missing or malformed
// trainer_state.json and for a generator file that is not one.
BOOSTER_API TrainerState load_trainer_state(const std::string& dir, const std::shared_ptr<dist::ProcessGroup>& world);

}  // namespace checkpoint
}  // namespace booster
