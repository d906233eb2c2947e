// health.cpp — rank heartbeats in the store and the diagnosis of a failed collective (health.h).
#include "health.h"

#include "booster/logging.h"

#include <algorithm>
#include <chrono>
#include <future>
#include <sstream>
#include <thread>
#include <vector>

namespace booster::dist::detail {

namespace {

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string key_of(int rank) { return "booster_health/" + std::to_string(rank); }

}  // namespace

// State shared with the heartbeat thread, which may outlive the Health object (detached when the
// store does not answer).
struct Health::Shared {
  c10::intrusive_ptr<c10d::Store> store;
  int rank = 0, size = 1;
  std::atomic<int64_t> issued{0};
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::promise<void> stopped;
};

double Health::watch_after_s(double timeout_s) { return std::max(timeout_s / 2, timeout_s - 30.0); }

Health::Health(c10::intrusive_ptr<c10d::Store> store, int rank, int size, double timeout_s)
    : shared_(std::make_shared<Shared>()), issued_(shared_->issued), rank_(rank), size_(size) {
  shared_->store = std::move(store);
  shared_->rank = rank;
  shared_->size = size;
  const auto watch_after = std::chrono::duration<double>(watch_after_s(timeout_s));
  std::thread([s = shared_, rank, watch_after]() {
    try {
      // The watch: this rank's count of world collectives, when it last moved, and the count the
      // diagnosis already ran for.
      int64_t count = 0, diagnosed = -1;
      auto moved = std::chrono::steady_clock::now();
      std::unique_lock<std::mutex> lock(s->mutex);
      while (!s->stop) {
        const int64_t issued = s->issued.load();
        const std::string value = std::to_string(unix_ms()) + " " + std::to_string(issued);
        lock.unlock();
        s->store->set(key_of(rank), std::vector<uint8_t>(value.begin(), value.end()));
        const auto now = std::chrono::steady_clock::now();
        if (issued != count) {
          count = issued;
          moved = now;
        } else if (count > 0 && diagnosed != count && now - moved >= watch_after) {
          diagnosed = count;
          const std::string found = diagnose_shared(s, /*compare_counts=*/true);
          if (!found.empty())
            booster::log::error_all(
                "booster: no new world collective for " +
                std::to_string(static_cast<int>(std::chrono::duration<double>(now - moved).count())) +
                " s: the last one this rank issued (#" + std::to_string(count) +
                ") may be waiting for ranks that did not join it; it fails at the timeout" + found);
        }
        lock.lock();
        s->wake.wait_for(lock, std::chrono::duration<double>(kIntervalS), [&] { return s->stop; });
      }
    } catch (...) {
      // The store went away (the job is ending, or rank 0 died): no more heartbeats.
    }
    s->stopped.set_value();
  }).detach();
}

Health::~Health() {
  auto done = shared_->stopped.get_future();
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->stop = true;
  }
  shared_->wake.notify_all();
  // A thread blocked on a store that does not answer stays detached (it holds what it uses).
  done.wait_for(std::chrono::duration<double>(kStoreS));
}

std::string Health::diagnose(bool compare_counts) const { return diagnose_shared(shared_, compare_counts); }

std::string Health::diagnose_shared(const std::shared_ptr<Shared>& shared, bool compare_counts) {
  struct Entry {
    bool present = false;
    int64_t ms = 0, issued = 0;
  };
  const int size = shared->size, rank = shared->rank;
  auto read = std::make_shared<std::promise<std::vector<Entry>>>();
  auto result = read->get_future();
  std::thread([s = shared, read, size]() {
    try {
      std::vector<Entry> entries(static_cast<size_t>(size));
      for (int r = 0; r < size; ++r) {
        if (!s->store->check({key_of(r)})) continue;
        const std::vector<uint8_t> raw = s->store->get(key_of(r));
        std::istringstream in(std::string(raw.begin(), raw.end()));
        Entry& e = entries[static_cast<size_t>(r)];
        e.present = static_cast<bool>(in >> e.ms >> e.issued);
      }
      read->set_value(std::move(entries));
    } catch (...) {
      read->set_exception(std::current_exception());
    }
  }).detach();
  if (result.wait_for(std::chrono::duration<double>(kStoreS)) != std::future_status::ready)
    return "\nhealth check: the store (served by rank 0, or the torchrun agent) did not answer within " +
           std::to_string(static_cast<int>(kStoreS)) + " s: rank 0 is stopped, hung or gone";
  std::vector<Entry> entries;
  try {
    entries = result.get();
  } catch (const std::exception& e) {
    return std::string("\nhealth check: the store could not be read (") + e.what() + "): rank 0 may be gone";
  }
  const int64_t now = unix_ms(), mine = shared->issued.load();
  std::ostringstream out;
  for (int r = 0; r < size; ++r) {
    if (r == rank) continue;
    const Entry& e = entries[static_cast<size_t>(r)];
    if (!e.present) {
      out << "\nhealth check: rank " << r << " never wrote a heartbeat (it did not get this far, or is gone)";
    } else if (now - e.ms > static_cast<int64_t>(kStaleS * 1000)) {
      out << "\nhealth check: rank " << r << " did not answer: its last heartbeat is " << (now - e.ms) / 1000.0
          << " s old (stopped, e.g. SIGSTOP, hung in the kernel, or dead)";
    } else if (compare_counts && e.issued < mine) {
      out << "\nhealth check: rank " << r << " is alive but has issued " << e.issued
          << " collectives on the world group against this rank's " << mine
          << ": it is stuck outside collectives or took another code path";
    }
  }
  return out.str();
}

}  // namespace booster::dist::detail
