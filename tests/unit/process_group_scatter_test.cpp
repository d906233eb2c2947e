// process_group_scatter_test.cpp — the pairwise reduce-scatter and all-gather of dist::ProcessGroup
// (booster/src/dist/process_group_scatter.cpp) on 1-4 ranks as threads, the world and a sub-group:
// every result is compared with the same reduction computed here in the documented order (the
// chunks summed in rank order, float32 for bf16), so the comparisons are exact (bitwise); odd sizes,
// empty chunks (inputs smaller than the world), SUM, AVG, MAX, MIN, float32 and bf16; per-rank
// counts (in place), ranges of several pieces, and the bf16 allreduce built from the two.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "booster/dist/process_group.h"
#include "common/thread_ranks.h"

namespace {

using booster::dist::ReduceOp;

// The full input of rank r: numel world * n, deterministic.
at::Tensor input_of(int r, int world, int64_t n, at::ScalarType dtype) {
  return (at::sin(at::arange(world * n, at::kDouble) * 0.37 + r) * (r + 1)).to(dtype);
}

// Chunk `me` of the reduction of every rank's input, in rank order, accumulated as documented.
at::Tensor expected_chunk(int me, int world, int64_t n, at::ScalarType dtype, ReduceOp op) {
  const at::ScalarType acc_dtype = dtype == at::kBFloat16 ? at::kFloat : dtype;
  at::Tensor acc;
  for (int r = 0; r < world; ++r) {
    at::Tensor part = input_of(r, world, n, dtype).narrow(0, me * n, n).to(acc_dtype);
    if (!acc.defined()) acc = part.clone();
    else if (op == ReduceOp::MAX) acc = at::maximum(acc, part);
    else if (op == ReduceOp::MIN) acc = at::minimum(acc, part);
    else acc.add_(part);
  }
  if (op == ReduceOp::AVG) acc.div_(world);
  return acc.to(dtype);
}

void check_group(booster::dist::ProcessGroup& g, int64_t n, at::ScalarType dtype, const std::string& what) {
  const int world = g.size(), me = g.rank();
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX, ReduceOp::MIN}) {
    at::Tensor in = input_of(me, world, n, dtype), before = in.clone();
    at::Tensor out = at::full({n}, -7.0, at::TensorOptions().dtype(dtype));
    g.reduce_scatter_tensor(out, in, op).wait();
    EXPECT_TRUE(at::equal(out, expected_chunk(me, world, n, dtype, op)))
        << what << " reduce_scatter op " << static_cast<int>(op) << " rank " << me;
    EXPECT_TRUE(at::equal(in, before)) << what << ": reduce_scatter_tensor changed its input";
    at::Tensor scratch = input_of(me, world, n, dtype), out2 = at::zeros({n}, dtype);
    g.reduce_scatter_tensor_consuming(out2, scratch, op).wait();
    EXPECT_TRUE(at::equal(out2, out)) << what << " consuming variant";
  }
  // all-gather: out of place and in place (the input is this rank's chunk of the output).
  at::Tensor mine = input_of(me, world, n, dtype).narrow(0, 0, n).contiguous();
  at::Tensor want = at::empty({world * n}, dtype);
  for (int r = 0; r < world; ++r) want.narrow(0, r * n, n).copy_(input_of(r, world, n, dtype).narrow(0, 0, n));
  at::Tensor gathered = at::zeros({world * n}, dtype);
  g.all_gather_into_tensor(gathered, mine).wait();
  EXPECT_TRUE(at::equal(gathered, want)) << what << " all_gather rank " << me;
  at::Tensor in_place = at::zeros({world * n}, dtype);
  in_place.narrow(0, me * n, n).copy_(mine);
  at::Tensor chunk = in_place.narrow(0, me * n, n);
  g.all_gather_into_tensor(in_place, chunk).wait();
  EXPECT_TRUE(at::equal(in_place, want)) << what << " in-place all_gather rank " << me;
}

}  // namespace

TEST(ProcessGroupScatter, PairwiseCollectivesEqualTheDocumentedReductionOn1To4Ranks) {
  for (int world : {1, 2, 3, 4}) {
    auto errors = booster::testing::run_thread_ranks(world, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
      for (int64_t n : {0, 1, 7, 100003, 300001})  // 300001 float32: two pieces of a range
        for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
          check_group(*g, n, dtype, std::to_string(world) + " ranks, n " + std::to_string(n) + ", " +
                                        c10::toString(dtype));
    });
    EXPECT_EQ(errors, std::vector<std::string>(static_cast<size_t>(world), "")) << world << " ranks";
  }
}

TEST(ProcessGroupScatter, SubGroupsAndOutstandingCollectivesMatchInOrder) {
  auto errors = booster::testing::run_thread_ranks(4, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
    auto odd = g->new_group({1, 3});
    auto even = g->new_group({0, 2});
    auto& mine = g->rank() % 2 ? *odd : *even;
    check_group(mine, 5, at::kFloat, "sub-group");
    // Several collectives in flight at once on the world (ZeRO-2 keeps two): matched in issue order.
    const int64_t n = 33;
    std::vector<at::Tensor> outs, ins;
    std::vector<booster::dist::Work> works;
    for (int k = 0; k < 3; ++k) {
      ins.push_back(input_of(g->rank() + 10 * k, 4, n, at::kFloat));
      outs.push_back(at::zeros({n}));
      works.push_back(g->reduce_scatter_tensor(outs.back(), ins.back()));
    }
    for (int k = 0; k < 3; ++k) {
      works[k].wait();
      at::Tensor want;
      for (int r = 0; r < 4; ++r) {
        at::Tensor part = input_of(r + 10 * k, 4, n, at::kFloat).narrow(0, g->rank() * n, n);
        want = want.defined() ? want + part : part.clone();
      }
      EXPECT_TRUE(at::equal(outs[k], want)) << "collective " << k << " rank " << g->rank();
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
}

namespace {

// Per-rank counts over a buffer of rank r's values, reduce-scattered in place: this rank's range is
// the documented reduction, every other range is unchanged; then all-gathered in place: every range
// holds its owner's reduction.
void check_counts(booster::dist::ProcessGroup& g, const std::vector<int64_t>& counts, at::ScalarType dtype,
                  const std::string& what) {
  const int world = g.size(), me = g.rank();
  int64_t total = 0, offset = 0;
  for (int r = 0; r < world; ++r) {
    if (r < me) offset += counts[static_cast<size_t>(r)];
    total += counts[static_cast<size_t>(r)];
  }
  auto values_of = [&](int r) { return (at::cos(at::arange(total, at::kDouble) * 0.11 + r) * (r + 2)).to(dtype); };
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MAX}) {
    // The expected reduction of every element, summed in rank order (float32 for bf16).
    const at::ScalarType acc_dtype = dtype == at::kBFloat16 ? at::kFloat : dtype;
    at::Tensor acc;
    for (int r = 0; r < world; ++r) {
      at::Tensor v = values_of(r).to(acc_dtype);
      if (!acc.defined()) acc = v.clone();
      else if (op == ReduceOp::MAX) acc = at::maximum(acc, v);
      else acc.add_(v);
    }
    if (op == ReduceOp::AVG) {
      if (at::isFloatingType(acc_dtype)) acc.div_(world);
      else acc.div_(world, "trunc");
    }
    const at::Tensor want = acc.to(dtype);
    at::Tensor buffer = values_of(me), before = buffer.clone();
    g.reduce_scatter_in_place(buffer, counts, op).wait();
    const int64_t n = counts[static_cast<size_t>(me)];
    EXPECT_TRUE(at::equal(buffer.narrow(0, offset, n), want.narrow(0, offset, n)))
        << what << " reduce_scatter_in_place op " << static_cast<int>(op) << " rank " << me;
    EXPECT_TRUE(at::equal(buffer.narrow(0, 0, offset), before.narrow(0, 0, offset)) &&
                at::equal(buffer.narrow(0, offset + n, total - offset - n), before.narrow(0, offset + n, total - offset - n)))
        << what << ": reduce_scatter_in_place changed another rank's range";
    g.all_gather_in_place(buffer, counts).wait();
    EXPECT_TRUE(at::equal(buffer, want)) << what << " all_gather_in_place op " << static_cast<int>(op) << " rank " << me;
  }
}

}  // namespace

TEST(ProcessGroupScatter, InPlaceCollectivesWithPerRankCountsOn1To4Ranks) {
  // Uneven counts, empty ranges (first, middle, last rank), and ranges of several 1 MiB pieces.
  const std::vector<std::vector<std::vector<int64_t>>> cases = {
      {{5}, {0}},
      {{3, 8}, {0, 6}, {7, 0}, {300007, 262144}},
      {{1, 0, 4}, {0, 0, 9}, {2, 5, 1}, {262145, 1, 600000}},
      {{3, 0, 2, 7}, {0, 1, 0, 0}, {11, 13, 0, 5}, {0, 262143, 524289, 3}}};
  for (int world : {1, 2, 3, 4}) {
    auto errors = booster::testing::run_thread_ranks(world, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
      for (const auto& counts : cases[static_cast<size_t>(world - 1)])
        for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kInt}) {
          std::string what = std::to_string(world) + " ranks, " + c10::toString(dtype) + ", counts";
          for (int64_t c : counts) what += " " + std::to_string(c);
          check_counts(*g, counts, dtype, what);
        }
      // Errors name the problem, before any communication.
      at::Tensor t = at::zeros({4});
      std::vector<int64_t> wrong_length(static_cast<size_t>(world) + 1, 0);
      EXPECT_THAT([&] { g->reduce_scatter_in_place(t, wrong_length); },
                  ::testing::ThrowsMessage<booster::dist::DistError>(::testing::HasSubstr("one count per rank")));
      std::vector<int64_t> short_counts(static_cast<size_t>(world), 0);
      EXPECT_THAT([&] { g->all_gather_in_place(t, short_counts); },
                  ::testing::ThrowsMessage<booster::dist::DistError>(::testing::HasSubstr("add up to 0 elements")));
    });
    EXPECT_EQ(errors, std::vector<std::string>(static_cast<size_t>(world), "")) << world << " ranks";
  }
}

TEST(ProcessGroupScatter, EvenCountsSplitTheRemainderOverTheFirstRanks) {
  EXPECT_EQ(booster::dist::ProcessGroup::even_counts(10, 4), (std::vector<int64_t>{3, 3, 2, 2}));
  EXPECT_EQ(booster::dist::ProcessGroup::even_counts(2, 3), (std::vector<int64_t>{1, 1, 0}));
  EXPECT_EQ(booster::dist::ProcessGroup::even_counts(0, 2), (std::vector<int64_t>{0, 0}));
}

TEST(ProcessGroupScatter, Bf16AllreduceIsTheFloat32SumInRankOrderRoundedOnceAndWaitOrderFree) {
  for (int world : {2, 3, 4}) {
    auto errors = booster::testing::run_thread_ranks(world, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
      const int me = g->rank();
      for (int64_t n : {1, 2, 7, 1000003}) {
        auto values_of = [&](int r, int k) {
          return (at::sin(at::arange(n, at::kDouble) * 0.29 + r + 10 * k) * (r + 1)).to(at::kBFloat16);
        };
        for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG, ReduceOp::MIN}) {
          // Two allreduces in flight, waited for in opposite orders on even and odd ranks.
          std::vector<at::Tensor> t = {values_of(me, 0), values_of(me, 1)};
          std::vector<booster::dist::Work> works = {g->allreduce(t[0], op), g->allreduce(t[1], op)};
          if (me % 2) std::swap(works[0], works[1]);
          for (auto& w : works) w.wait();
          for (int k = 0; k < 2; ++k) {
            at::Tensor acc;
            for (int r = 0; r < world; ++r) {
              at::Tensor v = values_of(r, k).to(at::kFloat);
              if (!acc.defined()) acc = v.clone();
              else if (op == ReduceOp::MIN) acc = at::minimum(acc, v);
              else acc.add_(v);
            }
            if (op == ReduceOp::AVG) acc.div_(world);
            EXPECT_TRUE(at::equal(t[static_cast<size_t>(k)], acc.to(at::kBFloat16)))
                << world << " ranks, n " << n << ", op " << static_cast<int>(op) << ", allreduce " << k << ", rank " << me;
          }
        }
      }
    });
    EXPECT_EQ(errors, std::vector<std::string>(static_cast<size_t>(world), "")) << world << " ranks";
  }
}

// is_completed() of a collective made of point-to-point parts: false while a peer has not posted its
// side (rank 1 starts 300 ms late), true after wait(); for reduce-scatter, all-gather and the bf16
// allreduce (both halves).
TEST(ProcessGroupScatter, IsCompletedIsFalseWhileAPeerHasNotPostedItsSide) {
  std::atomic<bool> peer_posted{false};
  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& g) {
    const int64_t n = 3 << 20;  // several 1 MiB pieces per range
    at::Tensor rs = at::ones({n}), ag = at::full({n}, 1.f + g->rank()), ar = at::ones({n}, at::kBFloat16);
    const auto counts = booster::dist::ProcessGroup::even_counts(n, 2);
    if (g->rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::vector<booster::dist::Work> works = {g->reduce_scatter_in_place(rs, counts, ReduceOp::SUM),
                                              g->all_gather_in_place(ag, counts), g->allreduce(ar, ReduceOp::SUM)};
    if (g->rank() == 1) {
      peer_posted = true;
      for (auto& w : works) w.wait();
      return;
    }
    const bool early[3] = {works[0].is_completed(), works[1].is_completed(), works[2].is_completed()};
    if (!peer_posted.load())
      for (int k = 0; k < 3; ++k) EXPECT_FALSE(early[k]) << "work " << k << " completed before the peer posted";
    for (int k = 0; k < 3; ++k) {
      works[static_cast<size_t>(k)].wait();
      EXPECT_TRUE(works[static_cast<size_t>(k)].is_completed()) << "work " << k << " after wait()";
    }
    EXPECT_EQ(rs.narrow(0, 0, counts[0]).sum().item<double>(), 2.0 * static_cast<double>(counts[0]));
    EXPECT_EQ(ag.narrow(0, counts[0], counts[1]).min().item<double>(), 2.0);
    EXPECT_EQ(ar.to(at::kFloat).min().item<double>(), 2.0);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}
