// process_group_p2p_test.cpp — point-to-point communication of dist::ProcessGroup (isend/irecv,
// send/recv, batch_isend_irecv, isend_tensor/recv_tensor) on ranks as threads with real Gloo
// groups: values of every dtype around a ring, tag matching in any order, sub-group peer numbering,
// and every documented error.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "booster/dist/process_group.h"
#include "common/thread_ranks.h"
#include "common/tensor_test_util.h"

namespace {

using booster::testing::kNoErrors;
using booster::testing::values_of;

using booster::dist::DistError;
using booster::dist::P2POp;
using booster::dist::ProcessGroup;
using booster::dist::Work;
using booster::testing::run_thread_ranks;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;
using Group = std::shared_ptr<ProcessGroup>;
using Kind = P2POp::Kind;

// What rank r sends in the ring tests: distinct per rank and exact in every dtype used.
at::Tensor payload(int r, at::ScalarType dtype) {
  if (dtype == at::kLong) return at::arange(4, at::kLong) + ((int64_t{1} << 40) + r);  // needs all 64 bits
  return (at::arange(6, at::kFloat).view({2, 3}) * 0.5 - r).to(dtype);                 // exact in bf16
}

TEST(ProcessGroupP2P, RingSendRecvOfFloatInt64AndBf16) {
  auto errors = run_thread_ranks(4, [](const Group& g) {
    const int r = g->rank(), next = (r + 1) % 4, prev = (r + 3) % 4;
    for (auto dtype : {at::kFloat, at::kLong, at::kBFloat16}) {
      // Asynchronous: post the send, then receive from the other side.
      at::Tensor sent = payload(r, dtype);
      Work w = g->isend(sent, next);
      at::Tensor got = at::zeros_like(sent);
      g->irecv(got, prev).wait();
      w.wait();
      EXPECT_EQ(got.scalar_type(), dtype);
      EXPECT_TRUE(at::equal(got, payload(prev, dtype))) << c10::toString(dtype) << " on rank " << r;
      EXPECT_TRUE(at::equal(sent, payload(r, dtype))) << "the sent tensor is unchanged";
      // Blocking: even ranks send first, odd ranks receive first (two blocking sends facing each
      // other would deadlock: Gloo transmits only once the receive is posted).
      at::Tensor back = at::zeros_like(sent);
      if (r % 2 == 0) {
        g->send(payload(r, dtype), prev, 7);
        g->recv(back, next, 7);
      } else {
        g->recv(back, next, 7);
        g->send(payload(r, dtype), prev, 7);
      }
      EXPECT_TRUE(at::equal(back, payload(next, dtype))) << c10::toString(dtype) << " on rank " << r;
    }
    // Values spot-checked by hand: rank 3 -> rank 0.
    if (r == 0) {
      at::Tensor f = at::zeros({2, 3}, at::kBFloat16);
      Work w = g->isend(payload(0, at::kBFloat16), 1, 9);
      g->recv(f, 3, 9);
      w.wait();
      EXPECT_THAT(values_of(f), ElementsAre(-3, -2.5, -2, -1.5, -1, -0.5));
    } else {
      at::Tensor f = at::zeros({2, 3}, at::kBFloat16);
      Work w = g->isend(payload(r, at::kBFloat16), (r + 1) % 4, 9);
      g->recv(f, r - 1, 9);
      w.wait();
    }
  });
  EXPECT_EQ(errors, kNoErrors);
}

TEST(ProcessGroupP2P, TagsMatchIndependentlyAndIsendDoesNotBlock) {
  std::atomic<bool> receiver_posted{false};
  auto errors = run_thread_ranks(2, [&](const Group& g) {
    if (g->rank() == 0) {
      // Posted before rank 1 posts anything: isend returns at once and is not complete.
      Work w1 = g->isend(at::full({3}, 1.f), 1, /*tag=*/1);
      Work w0 = g->isend(at::full({2}, 100, at::kLong), 1, /*tag=*/0);
      const bool done1 = w1.is_completed(), done0 = w0.is_completed();
      if (!receiver_posted.load()) {
        EXPECT_FALSE(done1) << "Gloo transmits only once the matching recv is posted";
        EXPECT_FALSE(done0);
      }
      // Same tag: matched in posting order.
      Work a = g->isend(at::full({1}, 20.f), 1, 2), b = g->isend(at::full({1}, 21.f), 1, 2);
      w1.wait();
      w0.wait();
      a.wait();
      b.wait();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      receiver_posted = true;
      at::Tensor t0 = at::zeros({2}, at::kLong), t1 = at::zeros({3});
      g->recv(t0, 0, 0);  // tag 0 first, although rank 0 posted tag 1 first
      g->recv(t1, 0, 1);
      EXPECT_THAT(values_of(t0), ElementsAre(100, 100));
      EXPECT_THAT(values_of(t1), ElementsAre(1, 1, 1));
      at::Tensor first = at::zeros({1}), second = at::zeros({1});
      g->recv(first, 0, 2);
      g->recv(second, 0, 2);
      EXPECT_THAT(values_of(first), ElementsAre(20));
      EXPECT_THAT(values_of(second), ElementsAre(21));
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(ProcessGroupP2P, BatchIsendIrecvRingExchange) {
  auto errors = run_thread_ranks(4, [](const Group& g) {
    const int r = g->rank(), next = (r + 1) % 4, prev = (r + 3) % 4;
    std::vector<P2POp> ops{
        {Kind::kSend, at::full({2}, 10.f * r), next, 3},
        {Kind::kRecv, at::zeros({2}), prev, 3},
        {Kind::kSend, at::full({3}, int64_t{100} * r, at::kLong), prev, 4},
        {Kind::kRecv, at::zeros({3}, at::kLong), next, 4},
    };
    std::vector<Work> works = g->batch_isend_irecv(ops);
    ASSERT_EQ(works.size(), 4u);
    for (auto& w : works) w.wait();
    EXPECT_THAT(values_of(ops[1].tensor), ElementsAre(10 * prev, 10 * prev));
    EXPECT_THAT(values_of(ops[3].tensor), ElementsAre(100 * next, 100 * next, 100 * next));
    std::vector<P2POp> none;
    EXPECT_TRUE(g->batch_isend_irecv(none).empty());
  });
  EXPECT_EQ(errors, kNoErrors);
}

TEST(ProcessGroupP2P, IsendTensorCarriesShapeAndDtype) {
  auto errors = run_thread_ranks(4, [](const Group& g) {
    const int r = g->rank(), next = (r + 1) % 4, prev = (r + 3) % 4;
    auto scalar = [](int k) { return at::scalar_tensor(1.5 + k, at::kFloat); };
    auto vec = [](int k) { return at::tensor({0.25f * k, -1.f, 64.f + k}).to(at::kBFloat16); };
    auto cube = [](int k) { return at::arange(24, at::kLong).view({2, 3, 4}) * ((int64_t{1} << 35) + k); };
    std::vector<Work> works;
    works.push_back(g->isend_tensor(scalar(r), next, 5));
    works.push_back(g->isend_tensor(vec(r), next, 5));
    works.push_back(g->isend_tensor(cube(r).transpose(0, 2), next, 5));  // non-contiguous: sent as a copy
    works.push_back(g->isend_tensor(at::zeros({0, 2}, at::kDouble), next, 5));
    // A plain isend on the same tag never meets the header/data of isend_tensor.
    works.push_back(g->isend(at::full({1}, 7.f * r), next, 5));
    at::Tensor plain = at::zeros({1});
    g->recv(plain, prev, 5);
    EXPECT_THAT(values_of(plain), ElementsAre(7 * prev));

    at::Tensor s = g->recv_tensor(prev, 5);
    EXPECT_EQ(s.dim(), 0);
    EXPECT_EQ(s.scalar_type(), at::kFloat);
    EXPECT_DOUBLE_EQ(s.item<double>(), 1.5 + prev);
    at::Tensor v = g->recv_tensor(prev, 5);
    EXPECT_EQ(v.sizes(), at::IntArrayRef({3}));
    EXPECT_EQ(v.scalar_type(), at::kBFloat16);
    EXPECT_THAT(values_of(v), ElementsAre(0.25 * prev, -1, 64 + prev));
    at::Tensor c = g->recv_tensor(prev, 5);
    EXPECT_EQ(c.sizes(), at::IntArrayRef({4, 3, 2}));
    EXPECT_EQ(c.scalar_type(), at::kLong);
    EXPECT_TRUE(c.is_contiguous());
    EXPECT_TRUE(at::equal(c, cube(prev).transpose(0, 2)));
    at::Tensor e = g->recv_tensor(prev, 5);
    EXPECT_EQ(e.sizes(), at::IntArrayRef({0, 2}));
    EXPECT_EQ(e.scalar_type(), at::kDouble);
    for (auto& w : works) w.wait();
  });
  EXPECT_EQ(errors, kNoErrors);
}

TEST(ProcessGroupP2P, SubGroupPeersAreInGroupRanks) {
  auto errors = run_thread_ranks(4, [](const Group& world) {
    const int wr = world->rank();
    Group g = world->split(wr % 2, -wr);  // {2, 0} and {3, 1}: world 2 / 3 is group rank 0
    ASSERT_NE(g, nullptr);
    const int peer = 1 - g->rank();
    Work w = g->isend(at::full({2}, static_cast<float>(wr)), peer);
    at::Tensor got = at::zeros({2});
    g->recv(got, peer);
    w.wait();
    const double partner = wr < 2 ? wr + 2 : wr - 2;
    EXPECT_THAT(values_of(got), ElementsAre(partner, partner)) << "world rank " << wr;
    Work wt = g->isend_tensor(at::full({1, 2}, wr, at::kLong), peer, 1);
    at::Tensor t = g->recv_tensor(peer, 1);
    wt.wait();
    EXPECT_EQ(t.sizes(), at::IntArrayRef({1, 2}));
    EXPECT_THAT(values_of(t), ElementsAre(partner, partner));
    EXPECT_THAT([&] { g->isend(got, 2); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("isend: peer 2 is outside this group's [0, 2)")));

    // Groups of one rank have no peer: every p2p call is an invalid argument.
    Group self = world->split(wr, 0);
    ASSERT_NE(self, nullptr);
    const std::string none = "this group has one rank (rank 0 of 1), so there is no peer";
    EXPECT_THAT([&] { self->isend(got, 0); }, ThrowsMessage<std::invalid_argument>(HasSubstr(none)));
    EXPECT_THAT([&] { self->recv(got, 1); }, ThrowsMessage<std::invalid_argument>(HasSubstr(none)));
    EXPECT_THAT([&] { self->recv_tensor(0); }, ThrowsMessage<std::invalid_argument>(HasSubstr(none)));
    std::vector<P2POp> ops{{Kind::kSend, got, 0, 0}};
    EXPECT_THAT([&] { self->batch_isend_irecv(ops); }, ThrowsMessage<std::invalid_argument>(HasSubstr(none)));
  });
  EXPECT_EQ(errors, kNoErrors);
}

TEST(ProcessGroupP2P, BadArgumentsAreInvalidArguments) {
  auto errors = run_thread_ranks(2, [](const Group& g) {
    const int r = g->rank(), peer = 1 - r;
    at::Tensor t = at::zeros({2, 3});
    using Invalid = std::invalid_argument;
    const std::string me = std::to_string(r);
    EXPECT_THAT([&] { g->isend(t, r); },
                ThrowsMessage<Invalid>(HasSubstr("isend: peer " + me + " is this rank (rank " + me + " of 2)")));
    EXPECT_THAT([&] { g->irecv(t, 2); },
                ThrowsMessage<Invalid>(HasSubstr("irecv: peer 2 is outside this group's [0, 2) (this is rank " + me)));
    EXPECT_THAT([&] { g->send(t, -1); }, ThrowsMessage<Invalid>(HasSubstr("send: peer -1 is outside")));
    EXPECT_THAT([&] { g->recv(t, peer, -1); }, ThrowsMessage<Invalid>(HasSubstr("recv: tag -1 is outside [0, 536870911]")));
    EXPECT_THAT([&] { g->isend(t, peer, 1 << 29); },
                ThrowsMessage<Invalid>(HasSubstr("isend: tag 536870912 is outside [0, 536870911]")));
    EXPECT_THAT([&] { g->isend_tensor(t, peer, -3); }, ThrowsMessage<Invalid>(HasSubstr("isend_tensor: tag -3")));
    EXPECT_THAT([&] { g->recv_tensor(r); }, ThrowsMessage<Invalid>(HasSubstr("recv_tensor: peer " + me + " is this rank")));
    at::Tensor strided = t.t();
    EXPECT_THAT([&] { g->irecv(strided, peer); }, ThrowsMessage<Invalid>(HasSubstr("irecv: tensor must be contiguous")));
    EXPECT_THAT([&] { g->isend(t.t(), peer); }, ThrowsMessage<Invalid>(HasSubstr("isend: tensor must be contiguous")));
    EXPECT_THAT([&] { g->isend(at::Tensor(), peer); }, ThrowsMessage<Invalid>(HasSubstr("isend: tensor is undefined")));
    EXPECT_THAT([&] { g->isend(t.to_sparse(), peer); }, ThrowsMessage<Invalid>(HasSubstr("isend: tensor must be dense")));
    EXPECT_THAT([&] { g->isend_tensor(at::zeros(std::vector<int64_t>(9, 1)), peer); },
                ThrowsMessage<Invalid>(HasSubstr("isend_tensor: the tensor has 9 dimensions, at most 8")));
    // batch_isend_irecv checks every op before it posts any, and names the bad one.
    std::vector<P2POp> ops{{Kind::kSend, t, peer, 0}, {Kind::kRecv, t.t(), peer, 0}};
    EXPECT_THAT([&] { g->batch_isend_irecv(ops); },
                ThrowsMessage<Invalid>(HasSubstr("batch_isend_irecv op 1 (irecv): tensor must be contiguous")));
    // Nothing was posted by the calls above: a clean exchange on tag 0 still pairs up.
    Work w = g->isend(at::full({2}, 5.f + r), peer);
    at::Tensor got = at::zeros({2});
    g->recv(got, peer);
    w.wait();
    EXPECT_THAT(values_of(got), ElementsAre(5 + peer, 5 + peer));
    // A shorter message than the receive buffer is not detected (documented): it fills the start.
    if (r == 0) {
      g->send(at::full({2}, 8.f), 1, 11);
    } else {
      at::Tensor longer = at::full({4}, -1.f);
      g->recv(longer, 0, 11);
      EXPECT_THAT(values_of(longer), ElementsAre(8, 8, -1, -1));
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(ProcessGroupP2P, TimeoutIsDistErrorNamingTheOp) {
  std::string message;
  auto errors = run_thread_ranks(2, [&](const Group& g) {
    if (g->rank() != 1) {
      // Rank 0 never sends. It enters run_thread_ranks' final barrier (same timeout) only after 2 s,
      // so rank 1's receive times out first; else rank 0's barrier timeout could close the
      // connection under rank 1's receive ("Connection closed by peer"), seen in a loaded CI run.
      std::this_thread::sleep_for(std::chrono::seconds(2));
      return;
    }
    at::Tensor t = at::zeros({3});
    Work w = g->irecv(t, 0, 5);
    try {
      w.wait();
    } catch (const DistError& e) {
      message = e.what();
    }
  }, /*timeout_s=*/5.0);  // also the rendezvous's: shorter ones time out on a loaded machine
  EXPECT_THAT(message, AllOf(HasSubstr("booster: irecv of 3 Float elements from rank 0 (tag 5) failed: "),
                             HasSubstr("Timed out waiting 5000ms for recv")));
  // Gloo closes the group's connections after a timeout, so run_thread_ranks' final barrier fails.
  for (const auto& e : errors)
    if (!e.empty()) EXPECT_THAT(e, HasSubstr("barrier failed"));
}

}  // namespace
