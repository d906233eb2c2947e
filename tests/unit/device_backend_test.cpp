// device_backend_test.cpp — the device-backend seam (booster/dist/device_backend.h) on the CPU: a
// recording backend registered for a device type no tensor here uses (PrivateUse1), so every
// collective stays on Gloo while the factory and the non-member hook see each group the adapter
// makes. Checks what NCCL's communicator split relies on: a sub-group's members get the parent's
// backend and one split color per member set, and every other rank of the parent takes part in the
// same new_group / split call.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "booster/dist/device_backend.h"
#include "booster/dist/process_group.h"
#include "common/thread_ranks.h"

namespace booster::testing::device_backend_test {

// A c10d backend that runs nothing (the tests issue no collective on its device type).
class RecordingBackend : public c10d::Backend {
 public:
  RecordingBackend(int rank, int size) : c10d::Backend(rank, size) {}
  const std::string getBackendName() const override { return "recording"; }
};

struct Call {
  int world_rank;   // the thread's rank in the world
  int step;         // which group-making call of the test (0: the world)
  bool member;      // the factory (true) or the non-member hook (false)
  int rank, size;   // the request's
  bool has_parent;
  int split_color;
};

std::mutex calls_mutex;
std::vector<Call> calls;
thread_local int tl_world_rank = -1;
thread_local int tl_step = 0;

void record(const dist::DeviceBackendRequest& r, bool member) {
  std::lock_guard<std::mutex> lock(calls_mutex);
  calls.push_back({tl_world_rank, tl_step, member, r.rank, r.size, static_cast<bool>(r.parent), r.split_color});
}

std::vector<Call> calls_of(int step) {
  std::vector<Call> out;
  for (const Call& c : calls)
    if (c.step == step) out.push_back(c);
  std::sort(out.begin(), out.end(), [](const Call& a, const Call& b) { return a.world_rank < b.world_rank; });
  return out;
}

TEST(DeviceBackend, SubGroupsGetTheParentAndOneColorPerMemberSetAndTheOtherRanksTakePart) {
  dist::register_device_backend(
      "recording_test", c10::kPrivateUse1, c10d::ProcessGroup::BackendType::CUSTOM,
      [](const dist::DeviceBackendRequest& r) {
        record(r, true);
        return c10::make_intrusive<RecordingBackend>(r.rank, r.size);
      },
      [](const dist::DeviceBackendRequest& r) { record(r, false); });
  calls.clear();
  auto errors = run_thread_ranks(
      4,
      [](const std::shared_ptr<dist::ProcessGroup>& world) {
        tl_world_rank = world->rank();
        tl_step = 1;
        auto g013 = world->new_group({3, 0, 1});  // members 0, 1, 3; rank 2 left out
        tl_step = 2;
        auto halves = world->split(world->rank() / 2, 0);  // {0, 1} and {2, 3}: two groups, one call
        tl_step = 3;
        auto odd = world->split(world->rank() % 2 == 1 ? 0 : -1, 0);  // {1, 3}; 0 and 2 pass no color
        tl_step = 4;
        auto solo = world->new_group({2});  // one rank: no backend, so rank 2 takes part as a non-member
        tl_step = 5;
        if (g013) {  // a sub-group of a sub-group: its parent is g013's backend
          auto inner = g013->new_group({0, 2});  // g013's ranks 0 and 2 = world ranks 0 and 3
        }
        tl_step = 6;
      },
      60, "recording_test");
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));

  // The world: every rank's factory, no parent, no color.
  auto world = calls_of(0);
  ASSERT_EQ(world.size(), 4u);  // tl_step is 0 during the rendezvous
  for (const Call& c : world) {
    EXPECT_TRUE(c.member);
    EXPECT_FALSE(c.has_parent);
    EXPECT_EQ(c.split_color, -1);
    EXPECT_EQ(c.size, 4);
  }
  auto check = [](int step, const std::map<int, int>& member_sizes, const std::vector<int>& others,
                  int parent_size) {
    SCOPED_TRACE("call " + std::to_string(step));
    auto got = calls_of(step);
    EXPECT_EQ(got.size(), member_sizes.size() + others.size()) << "every rank of the parent takes part once";
    std::map<int, int> color_of_size;  // groups are told apart by size here
    for (const Call& c : got) {
      const bool member = member_sizes.count(c.world_rank) > 0;
      EXPECT_EQ(c.member, member) << "world rank " << c.world_rank;
      EXPECT_TRUE(c.has_parent) << "world rank " << c.world_rank;
      if (member) {
        EXPECT_EQ(c.size, member_sizes.at(c.world_rank));
        EXPECT_GE(c.split_color, 0);
      } else {
        EXPECT_EQ(c.size, parent_size) << "a non-member's request is its rank in the parent";
        EXPECT_EQ(c.split_color, -1);
      }
    }
    return got;
  };
  auto one = check(1, {{0, 3}, {1, 3}, {3, 3}}, {2}, 4);
  ASSERT_EQ(one.size(), 4u);
  EXPECT_EQ(one[0].split_color, one[1].split_color);
  EXPECT_EQ(one[0].split_color, one[3].split_color);
  EXPECT_EQ(one[0].rank, 0);
  EXPECT_EQ(one[1].rank, 1);
  EXPECT_EQ(one[3].rank, 2);

  auto two = check(2, {{0, 2}, {1, 2}, {2, 2}, {3, 2}}, {}, 4);
  ASSERT_EQ(two.size(), 4u);
  EXPECT_EQ(two[0].split_color, two[1].split_color);
  EXPECT_EQ(two[2].split_color, two[3].split_color);
  EXPECT_NE(two[0].split_color, two[2].split_color) << "two groups made by one split call need two colors";

  auto three = check(3, {{1, 2}, {3, 2}}, {0, 2}, 4);
  ASSERT_EQ(three.size(), 4u);
  EXPECT_EQ(three[1].split_color, three[3].split_color);
  EXPECT_NE(three[1].split_color, one[0].split_color);

  check(4, {}, {0, 1, 2, 3}, 4);

  auto five = check(5, {{0, 2}, {3, 2}}, {1}, 3);
  ASSERT_EQ(five.size(), 3u);
  for (const Call& c : five)
    if (!c.member) EXPECT_EQ(c.rank, 1) << "the non-member's rank in its parent (g013)";
}

TEST(DeviceBackend, AnUnregisteredNameIsRefusedNamingTheChoices) {
  dist::RendezvousOptions o;
  o.backend = "no_such_backend";
  EXPECT_THAT([&] { dist::ProcessGroup::rendezvous(o); },
              ::testing::ThrowsMessage<std::invalid_argument>(
                  ::testing::AllOf(::testing::HasSubstr("unknown backend 'no_such_backend'"),
                                   ::testing::HasSubstr("register_device_backend"))));
}

}  // namespace booster::testing::device_backend_test
