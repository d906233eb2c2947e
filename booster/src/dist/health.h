// health.h — private to libbooster: which rank did not answer, for the error of a failed collective.
//
// Every rank of a world group (world_size > 1) runs one thread that writes, every kIntervalS
// seconds, "<unix time in ms> <collectives issued>" under "booster_health/<rank>" in the world's
// store. When a collective fails (Gloo's timeout_s, or a peer's error), diagnose() reads every rank's
// entry and names:
//   - ranks whose entry is older than kStaleS: stopped (SIGSTOP), hung in the kernel, or gone;
//   - ranks that are alive but issued fewer world collectives than this rank: stuck outside
//     collectives (a loop, a deadlock in user code) or on another code path.
// The store itself lives on rank 0 (or the torchrun agent): when it does not answer within
// kStoreS, that is the diagnosis. Nothing here can block a caller for longer than kStoreS.
//
// The same diagnosis before a timeout ends the job: a device backend's collectives (NCCL) do not
// block the host, and c10d's watchdog ends the process when one times out without naming the ranks
// that never joined it. So the heartbeat thread also watches this rank's own count of world
// collectives: when it has not moved for watch_after_s(timeout_s) (the last collective is waiting,
// or the rank is between collectives), it runs the diagnosis once for that count and logs what it
// found (nothing when every rank is alive and in step: a long phase without collectives is not a
// hang). On Gloo the collective's own error follows at timeout_s with the same lines.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

namespace booster::dist::detail {

class Health {
 public:
  static constexpr double kIntervalS = 1.0;  // heartbeat period
  static constexpr double kStaleS = 3.5;     // an entry older than this is stale
  static constexpr double kStoreS = 5.0;     // longest wait for the store in diagnose()

  // timeout_s: the world's collective timeout (> 0), for the watch above.
  Health(c10::intrusive_ptr<c10d::Store> store, int rank, int size, double timeout_s);
  ~Health();  // stops the heartbeat (a thread stuck on a dead store is left behind, detached)
  Health(const Health&) = delete;
  Health& operator=(const Health&) = delete;

  void note_collective() { issued_.fetch_add(1, std::memory_order_relaxed); }
  // Lines for an error message ("" when every rank looks alive and in step). compare_counts: the
  // failed collective was on the world group (sub-groups' collectives are not counted).
  std::string diagnose(bool compare_counts) const;
  // When the watch runs the diagnosis: max(timeout_s / 2, timeout_s - 30) seconds without a new world
  // collective (150 s of 300, 2.5 s of 5), ahead of the timeout itself.
  static double watch_after_s(double timeout_s);

 private:
  struct Shared;
  // diagnose() over the state the heartbeat thread shares (it may outlive this object).
  static std::string diagnose_shared(const std::shared_ptr<Shared>& shared, bool compare_counts);
  std::shared_ptr<Shared> shared_;
  std::atomic<int64_t>& issued_;
  int rank_, size_;
};

}  // namespace booster::dist::detail
