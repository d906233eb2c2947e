// shm_ring_test.cpp — the pipeline's shared-memory ring (booster/src/parallel/pipeline/shm_ring.cpp,
// compiled in): messages arrive whole and in order across the ring's wrap-around, a full ring makes
// the sender wait for the receiver (and fail after the timeout), a peer that exited and a message of
// the wrong size are clear errors, and a name is gone from /dev/shm once unlinked.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

#include "shm_ring.h"

using booster::parallel::ShmRing;

namespace {

std::string unique_name(const std::string& what) {
  return "/booster-test-" + std::to_string(getpid()) + "-" + what;
}

// A creator and an opener mapping of one ring of `slots` slots of `numel` floats.
struct Pair {
  Pair(const std::string& what, int64_t slots, int64_t numel) : name(unique_name(what)) {
    std::string error;
    producer = ShmRing::create(name, slots, numel * 4, &error);
    EXPECT_TRUE(producer.valid()) << error;
    consumer = ShmRing::open(name, slots, numel * 4, &error);
    EXPECT_TRUE(consumer.valid()) << error;
    ShmRing::unlink(name);
  }
  std::string name;
  ShmRing producer, consumer;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(ShmRing, MessagesArriveWholeAndInOrderAcrossWrapAround) {
  Pair p("order", 2, 1000);
  // Up to 2 messages ahead, in varying patterns, 7 messages: every slot reused several times.
  int sent = 0, received = 0;
  for (int pattern : {2, 1, 2, 1, 1}) {
    for (int i = 0; i < pattern; ++i) p.producer.send(torch::full({1000}, static_cast<float>(sent++)), 1.0, 0, "test");
    for (int i = 0; i < pattern; ++i) {
      auto out = torch::empty({1000});
      p.consumer.recv(out, 1.0, 0, "test");
      EXPECT_TRUE(torch::equal(out, torch::full({1000}, static_cast<float>(received++))));
    }
  }
  EXPECT_EQ(sent, 7);
  EXPECT_EQ(received, 7);
}

TEST(ShmRing, ConcurrentSenderAndReceiverExchange2000Messages) {
  Pair p("threads", 3, 4097);  // odd size: payloads not a multiple of the 64-byte alignment
  const int n = 2000;
  std::thread sender([&] {
    for (int i = 0; i < n; ++i) p.producer.send(torch::arange(4097, torch::kFloat) + i, 10.0, 0, "test");
  });
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    auto out = torch::empty({4097});
    p.consumer.recv(out, 10.0, 0, "test");
    bad += !torch::equal(out, torch::arange(4097, torch::kFloat) + i);
  }
  sender.join();
  EXPECT_EQ(bad, 0);
}

TEST(ShmRing, AFullRingWaitsForTheReceiverThenTimesOut) {
  Pair p("full", 1, 8);
  p.producer.send(torch::ones({8}), 1.0, 0, "activations to pipeline rank 1");
  const auto start = std::chrono::steady_clock::now();
  const std::string message = error_of([&] { p.producer.send(torch::ones({8}), 0.2, 0, "activations to pipeline rank 1"); });
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("activations to pipeline rank 1"), std::string::npos) << message;
  EXPECT_NE(message.find("timeout_s"), std::string::npos) << message;
  EXPECT_GE(waited, 0.2);
  EXPECT_LT(waited, 5.0);
  // Consuming frees the slot: the next send goes through.
  auto out = torch::empty({8});
  p.consumer.recv(out, 1.0, 0, "test");
  p.producer.send(torch::full({8}, 2.0f), 1.0, 0, "test");
  p.consumer.recv(out, 1.0, 0, "test");
  EXPECT_TRUE(torch::equal(out, torch::full({8}, 2.0f)));
}

TEST(ShmRing, APeerThatExitedIsAnErrorBeforeTheTimeout) {
  Pair p("peer", 2, 8);
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  waitpid(child, nullptr, 0);  // reaped: the pid no longer exists
  const auto start = std::chrono::steady_clock::now();
  auto out = torch::empty({8});
  const std::string message = error_of([&] { p.consumer.recv(out, 60.0, child, "gradients from virtual stage 1"); });
  EXPECT_NE(message.find("pid " + std::to_string(child) + ") has exited"), std::string::npos) << message;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

TEST(ShmRing, WrongSizesAndMissingNamesAreClearErrors) {
  Pair p("sizes", 2, 8);
  const std::string message = error_of([&] { p.producer.send(torch::ones({9}), 1.0, 0, "test"); });
  EXPECT_NE(message.find("36 bytes for a stream of 32-byte messages"), std::string::npos) << message;
  EXPECT_NE(message.find("enable_metadata_cache = false"), std::string::npos) << message;
  auto wrong = torch::empty({4});
  EXPECT_NE(error_of([&] { p.consumer.recv(wrong, 1.0, 0, "test"); }).find("receive buffer of 16 bytes"), std::string::npos);

  std::string error;
  EXPECT_FALSE(ShmRing::open(p.name, 2, 32, &error).valid()) << "the name was unlinked";
  EXPECT_NE(error.find("shm_open"), std::string::npos) << error;
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + p.name));

  const std::string name = unique_name("mismatch");
  ShmRing made = ShmRing::create(name, 2, 32, &error);
  ASSERT_TRUE(made.valid()) << error;
  EXPECT_FALSE(ShmRing::open(name, 3, 32, &error).valid());
  EXPECT_NE(error.find("expected"), std::string::npos) << error;
  EXPECT_FALSE(ShmRing::create(name, 2, 32, &error).valid()) << "names are created exclusively";
  ShmRing::unlink(name);
  EXPECT_FALSE(std::filesystem::exists("/dev/shm" + name));
}

TEST(ShmRing, HostIdIsStable) {
  EXPECT_EQ(booster::parallel::shm_host_id(), booster::parallel::shm_host_id());
  EXPECT_GT(booster::parallel::shm_host_id(), 0);
}
