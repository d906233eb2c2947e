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

  Health(c10::intrusive_ptr<c10d::Store> store, int rank, int size);
  ~Health();  // stops the heartbeat (a thread stuck on a dead store is left behind, detached)
  Health(const Health&) = delete;
  Health& operator=(const Health&) = delete;

  void note_collective() { issued_.fetch_add(1, std::memory_order_relaxed); }
  // Lines for an error message ("" when every rank looks alive and in step). compare_counts: the
  // failed collective was on the world group (sub-groups' collectives are not counted).
  std::string diagnose(bool compare_counts) const;

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
  std::atomic<int64_t>& issued_;
  int rank_, size_;
};

}  // namespace booster::dist::detail
