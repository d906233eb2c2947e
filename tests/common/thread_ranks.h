// thread_ranks.h — N ranks as threads of the test process, each with its own Gloo process group on
// 127.0.0.1: for unit tests of collective building blocks (the reducer, replica sync) that need real
// collectives but not separate processes. Whole-plugin tests run ranks as processes (tests/dist).
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "booster/dist/process_group.h"
#include "common/test_util.h"

namespace booster::testing {

// What run_thread_ranks returns when all 4 ranks returned normally.
inline const std::vector<std::string> kNoErrors(4, "");

// Runs fn(group) on `world_size` threads, rank r on thread r; returns what each rank threw ("" when
// it returned normally), indexed by rank. `backend`: RendezvousOptions::backend.
inline std::vector<std::string> run_thread_ranks(int world_size,
                                                 const std::function<void(const std::shared_ptr<dist::ProcessGroup>&)>& fn,
                                                 double timeout_s = 60, const std::string& backend = "gloo") {
  const int port = free_port();
  std::vector<std::string> errors(world_size);
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        dist::RendezvousOptions o;
        o.port = port;
        o.rank = r;
        o.world_size = world_size;
        o.timeout_s = timeout_s;
        o.backend = backend;
        auto group = dist::ProcessGroup::rendezvous(o);
        fn(group);
        group->barrier();  // nobody tears down the store while others still use it
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "exception without message";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace booster::testing
