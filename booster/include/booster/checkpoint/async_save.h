// async_save.h — asynchronous checkpoint saves: the training loop is blocked only while the state
// is copied into host memory; a background thread writes the files and commits them with the same
// single atomic rename a synchronous save uses. The idea is PyTorch DCP's async_save (stage the
// state dict to CPU, write in the background) and ColossalAI's `use_async=True` of
// Booster.save_model / save_optimizer.
//
// How (one mechanism for every CheckpointIO; nothing in a CheckpointIO knows about it):
//  1. Foreground, on the caller's thread (collective, like a synchronous save): the save runs as
//     usual (gathers, broadcasts and error agreements included) with a staging interceptor
//     installed for this thread (io::WriteInterceptor, booster/io/atomic_write.h). Every file the
//     save would write under the save's directory is copied into a host buffer instead (the bytes
//     of the file, as the sync save would have written them: a later training step cannot change
//     them); atomic_write_directory creates its directory at once and lets `fill` write into it
//     directly (the set's commit below provides the atomicity). Files outside the save's directory
//     are written normally (blocking). Directories are created in the foreground; no file data is.
//  2. Background, one thread per process: writes the staged files in the order the save produced
//     them, each fsynced, fsyncs their directories, then drops a marker next to the save's
//     temporary directory: `<tmp>.rank<r>.done`, or `<tmp>.rank<r>.error` holding its error.
//     The background thread issues no collective (it never touches a ProcessGroup).
//  3. Rank 0's thread then waits (AsyncSavePolicy::commit_timeout_s) for every rank's marker. All
//     done: it commits (a standalone save: the temporary replaces the target, io::install_replacement;
//     a CheckpointManager set: rename to step_<S>, `latest`, pruning); else it removes the
//     temporary, so the previous checkpoint stays the newest loadable one. Markers are removed.
//     A rank killed during the write never drops its marker: nothing is committed.
//  4. Errors of a background save are reported at the next foreground sync point, on every rank
//     alike (agreed by one allreduce): the next async save (before anything of it is staged),
//     wait_async_save(), CheckpointManager::wait() / the next manager save. They are reported once.
//     Destructors (CheckpointManager, Booster) wait without throwing and log the error.
//
// At most one save is in flight per process (precisely: per training thread, so that ranks run as
// threads of one test process each have their own writer). A new async save while one is being written waits
// for it (default), or, with AsyncSavePolicy::skip_if_busy, is skipped on every rank (the ranks
// agree by one allreduce) with a warning naming both saves; the one in flight is never disturbed.
//
// Host memory: the staged bytes of one save (about the size of the files it writes on this rank)
// are logged (rank 0) and bounded by AsyncSavePolicy::max_host_mib. A save whose files exceed it
// is not refused: the files staged so far and the rest of this save are written in the foreground
// (blocking, as a sync save), with a warning naming the sizes; the commit stays in the background.
// The check is made per file once the file is complete, so the peak is the bound plus one file (at
// most one shard: size_per_shard_mb).
//
// Test hook: the environment variable BOOSTER_ASYNC_SAVE_DELAY_MS makes the background writer
// sleep that long before writing (a slow disk; the tests use it to keep a save in flight).
//
// Threads: the foreground functions are called from the training thread (the one that calls the
// collectives). The staging interceptor is per thread. The writers take their tensors' bytes
// through host_copy_for_write (below): a GPU tensor is copied into page-locked (pinned) host memory,
// then its bytes into the save's buffer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "booster/export.h"

namespace at {
class Tensor;
}

namespace booster {
namespace dist {
class ProcessGroup;
}

namespace checkpoint {

struct AsyncSavePolicy {
  // A save requested while the previous one is still being written: false waits for it (the save
  // call blocks until the previous save is committed), true skips this save on every rank with a
  // warning (the save call returns false / "" and writes nothing).
  bool skip_if_busy = false;
  // Host memory (MiB, 2^20 bytes) the staged files of one save may take on this rank (>= 1).
  // Beyond it the save finishes blocking, with a warning (see above).
  int64_t max_host_mib = 4096;
  // Seconds rank 0's background writer waits for every rank's part before it gives up, removes the
  // temporary and reports the save as failed (> 0).
  double commit_timeout_s = 600;
};

// Throws std::invalid_argument naming the field and the fix for max_host_mib < 1 or
// commit_timeout_s <= 0.
BOOSTER_API void check_async_policy(const AsyncSavePolicy& policy);

// Runs `save` (the collective foreground part of a save whose files all go under `target`, e.g.
// CheckpointIO::save_model(model, target, ...)) with its files staged, then hands them to the
// background writer; returns true, or false when skipped (skip_if_busy). On rank 0 `target` is
// replaced when every rank's part is durable: a directory (or file) `target.async-<pid>` is written
// and then put in place of `target` by one rename (the old directory removed afterwards), so
// readers see the old or the new checkpoint, never a mix. Collective over `world` (nullptr: this
// process alone). Throws on every rank alike: CheckpointError for the previous async save's
// failure (nothing of this one is staged then: call again); what `save` throws (nothing is
// submitted; the temporary is removed); std::invalid_argument for a bad policy. Inside another
// async save's staging (e.g. Booster::save_model(use_async) inside CheckpointManager's async fill)
// it just runs `save`, staged as part of the outer save. A crash can leave `target.async-<pid>` and
// its markers `target.async-<pid>.rank<r>.done|error` beside the target (never under its name); the
// next async save of that target by a process with the same pid removes the directory.
BOOSTER_API bool async_save(dist::ProcessGroup* world, const std::string& target, const AsyncSavePolicy& policy,
                            const std::function<void()>& save);

// The sync point: waits for this process's background save and agrees with every rank on its
// outcome. Collective over `world` (nullptr: local). Throws CheckpointError on every rank, naming
// the failing ranks and their errors, when the save failed on any rank (then nothing of it was
// committed: the previous checkpoint is intact). A no-op (one allreduce) when nothing was in flight.
BOOSTER_API void wait_async_save(dist::ProcessGroup* world);
// Local and never throws (for destructors and exit paths): waits for this process's background
// save and returns its error ("" when none), also logged on every rank.
BOOSTER_API std::string wait_async_save_noexcept() noexcept;
// Whether this process's background writer is still writing or committing.
BOOSTER_API bool async_save_in_flight();

// For a CheckpointIO that reads back or renames files it wrote during the save (hybrid_parallel's
// per-stage files): when the calling thread is staging an asynchronous save, writes what was staged
// so far and makes the rest of that save blocking, with a warning naming `why`; else a no-op.
BOOSTER_API void write_staged_now(const std::string& why);

// The host copy a checkpoint writer takes a tensor's bytes from (safetensors and torch.save files;
// every CheckpointIO, blocking or asynchronous): `t` (any dtype and shape, dense) as a contiguous
// CPU tensor of the same dtype and shape. A CPU tensor is returned as it is when contiguous, else
// as a contiguous copy. A tensor on a CUDA device is copied (on the current stream, synchronously)
// into page-locked host memory from LibTorch's caching host allocator (cudaHostAlloc blocks, kept
// and reused by later saves: after the first save no pinned memory is allocated, and the cache
// holds at most about twice the largest tensor written, since writers copy one tensor at a time),
// so the device-to-host copy runs at the link's pinned bandwidth instead of through a pageable
// bounce buffer (DCP's async_save stages into pinned memory for the same reason). When pinned
// memory cannot be allocated (host limits), the copy is pageable, logged once per process. While
// this thread stages an asynchronous save, the bytes copied through pinned memory are counted in
// its StagedSave::pinned_bytes(). Throws c10::Error when the device-to-host copy fails.
BOOSTER_API at::Tensor host_copy_for_write(const at::Tensor& t);

// ---- Building blocks (CheckpointManager uses these; async_save is made of them) ----------------

// The sync point at the start of a save: collective. Returns false when a save is in flight on any
// rank and policy.skip_if_busy (a warning, on every rank); else waits for it, reports its error as
// wait_async_save does, and returns true.
BOOSTER_API bool begin_async_save(dist::ProcessGroup* world, const AsyncSavePolicy& policy, const std::string& what);

// The staged files of one save on this rank. run() installs the staging interceptor on the calling
// thread for the duration of `save`: files under `set_dir` are staged as they are; files under
// `target` (when not empty) are staged under `set_dir` in its place. submit() hands them to the
// background writer.
class BOOSTER_API StagedSave {
 public:
  StagedSave(std::string set_dir, std::string target, const AsyncSavePolicy& policy, std::string what);
  ~StagedSave();
  StagedSave(const StagedSave&) = delete;
  StagedSave& operator=(const StagedSave&) = delete;

  // Exceptions of `save` propagate (the staged files are then dropped by the destructor).
  void run(const std::function<void()>& save);
  // Starts the background write (after begin_async_save returned true on every rank). `commit` runs
  // on rank 0's writer once every rank's marker says done; `abandon` (rank 0) when a rank failed or
  // the timeout passed. Both may throw (the save is then reported as failed). Local: no collective.
  void submit(dist::ProcessGroup* world, std::function<void()> commit, std::function<void()> abandon);

  int64_t staged_bytes() const;
  int64_t staged_files() const;
  bool fell_back_to_blocking() const;
  // Bytes of GPU tensors copied to the host through pinned memory for this save (host_copy_for_write).
  int64_t pinned_bytes() const;

  class Impl;

 private:
  std::shared_ptr<Impl> impl_;  // shared with the background writer after submit()
};

}  // namespace checkpoint
}  // namespace booster
