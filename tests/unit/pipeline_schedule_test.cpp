// pipeline_schedule_test.cpp — the pipeline schedules and layer
// partitioning (booster/parallel/pipeline_schedule.h; the executor, booster/src/parallel/pipeline, compiled in):
// exact orders for small cases, every schedule runs to completion for many (pp, microbatches,
// chunks) in the simulation (no deadlock, every action once), and the simulated makespans equal the
// bubble formulas. ZB-V: the V placement, PyTorch's ScheduleZBVZeroBubble order (rank lists below
// written out from torch 2.11's _calculate_single_rank_operations), and its bubble against ZB-H1's.
#include <gtest/gtest.h>

#include <string>

#include "booster/parallel/pipeline_schedule.h"
#include "pipeline_stage.h"

using booster::parallel::make_schedule;
using booster::parallel::partition_layers;
using booster::parallel::PipelineAction;
using booster::parallel::ScheduleKind;
using booster::parallel::simulate;
using booster::parallel::stage_rank;
using booster::parallel::chunk_stage;

namespace {

std::string text(const std::vector<PipelineAction>& s) {
  std::string out;
  for (const auto& a : s)
    out += (out.empty() ? "" : " ") +
           std::string(a.kind == PipelineAction::Kind::kForward         ? "F"
                       : a.kind == PipelineAction::Kind::kBackward      ? "B"
                       : a.kind == PipelineAction::Kind::kBackwardInput ? "I"
                                                                        : "W") +
           std::to_string(a.microbatch) + (a.chunk ? "c" + std::to_string(a.chunk) : "");
  return out;
}

std::vector<std::vector<PipelineAction>> all_ranks(ScheduleKind kind, int pp, int m, int chunks, bool fwd_only = false) {
  std::vector<std::vector<PipelineAction>> s;
  for (int r = 0; r < pp; ++r) s.push_back(make_schedule(kind, pp, r, m, chunks, fwd_only));
  return s;
}

TEST(PipelineSchedule, OneFOneBOrderOnFourStages) {
  // PipeDream-Flush: pp - rank - 1 warm-up forwards, then alternate, then drain.
  EXPECT_EQ(text(make_schedule(ScheduleKind::k1F1B, 4, 0, 6, 1)), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(text(make_schedule(ScheduleKind::k1F1B, 4, 2, 6, 1)), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(text(make_schedule(ScheduleKind::k1F1B, 4, 3, 6, 1)), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  EXPECT_EQ(text(make_schedule(ScheduleKind::kGPipe, 2, 1, 3, 1)), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(text(make_schedule(ScheduleKind::k1F1B, 2, 0, 3, 1, true)), "F0 F1 F2");
}

TEST(PipelineSchedule, InterleavedOrderOnTwoStagesTwoChunks) {
  // Micro-batches in groups of pp through chunk 0 then chunk 1; backward from the last chunk.
  EXPECT_EQ(text(make_schedule(ScheduleKind::kInterleaved, 2, 1, 4, 2)),
            "F0 F1 F0c1 B0c1 F1c1 B1c1 F2 B0 F3 B1 F2c1 B2c1 F3c1 B3c1 B2 B3");
  EXPECT_EQ(text(make_schedule(ScheduleKind::kInterleaved, 2, 0, 2, 2)),
            "F0 F1 F0c1 F1c1 B0c1 B1c1 B0 B1");  // m == pp: all forwards first
}

TEST(PipelineSchedule, EveryScheduleCompletesWithoutDeadlock) {
  for (int pp = 1; pp <= 6; ++pp)
    for (int m = pp; m <= 3 * pp + 1; ++m) {
      SCOPED_TRACE("pp " + std::to_string(pp) + " m " + std::to_string(m));
      EXPECT_NO_THROW(simulate(all_ranks(ScheduleKind::k1F1B, pp, m, 1), pp, m, 1));
      EXPECT_NO_THROW(simulate(all_ranks(ScheduleKind::kGPipe, pp, m, 1), pp, m, 1));
      EXPECT_NO_THROW(simulate(all_ranks(ScheduleKind::k1F1B, pp, m, 1, true), pp, m, 1));
      for (int v = 2; v <= 3 && m % pp == 0; ++v) {
        SCOPED_TRACE("chunks " + std::to_string(v));
        EXPECT_NO_THROW(simulate(all_ranks(ScheduleKind::kInterleaved, pp, m, v), pp, m, v));
      }
    }
}

TEST(PipelineSchedule, SimulatedMakespanMatchesBubbleFormulas) {
  // Forward 1, backward 2 time units per whole-model micro-batch stage: 1F1B and GPipe take
  // (m + pp - 1) * 3; interleaved (each chunk 1/v of the work) m * 3 + (pp - 1) * 3 / v.
  for (int pp : {2, 4})
    for (int m : {4, 8}) {
      EXPECT_DOUBLE_EQ(simulate(all_ranks(ScheduleKind::k1F1B, pp, m, 1), pp, m, 1), (m + pp - 1) * 3.0);
      EXPECT_DOUBLE_EQ(simulate(all_ranks(ScheduleKind::kGPipe, pp, m, 1), pp, m, 1), (m + pp - 1) * 3.0);
      const int v = 2;
      EXPECT_DOUBLE_EQ(simulate(all_ranks(ScheduleKind::kInterleaved, pp, m, v), pp, m, v, 1.0 / v, 2.0 / v),
                       m * 3.0 + (pp - 1) * 3.0 / v);
    }
}

TEST(PipelineSchedule, SimulationDetectsDeadlockAndMissingActions) {
  // Rank 1 wants the backward before its forward's gradient can exist on rank 0's side: a cycle.
  std::vector<std::vector<PipelineAction>> bad{
      {{PipelineAction::Kind::kBackward, 0, 0}, {PipelineAction::Kind::kForward, 0, 0}},
      {{PipelineAction::Kind::kForward, 0, 0}, {PipelineAction::Kind::kBackward, 0, 0}}};
  EXPECT_THROW(simulate(bad, 2, 1, 1), std::logic_error);
  std::vector<std::vector<PipelineAction>> missing{{{PipelineAction::Kind::kForward, 0, 0}}, {}};
  EXPECT_THROW(simulate(missing, 2, 1, 1), std::logic_error);
}

TEST(PipelineSchedule, BadArgumentsAreClearErrors) {
  try {
    make_schedule(ScheduleKind::k1F1B, 4, 0, 2, 1);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("num_microbatches >= pp_size"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_schedule(ScheduleKind::kInterleaved, 2, 0, 3, 2), std::invalid_argument);  // 3 % 2
  EXPECT_THROW(make_schedule(ScheduleKind::k1F1B, 2, 0, 4, 2), std::invalid_argument);          // chunks need interleaved
  EXPECT_THROW(make_schedule(ScheduleKind::k1F1B, 2, 2, 4, 1), std::invalid_argument);          // rank
  EXPECT_NO_THROW(make_schedule(ScheduleKind::kGPipe, 4, 0, 2, 1));                             // GPipe: any m
}

// ---------------------------------------------------------------------------------------------
// ZB-V

constexpr auto kZbv = ScheduleKind::kZeroBubbleV;

TEST(PipelineSchedule, ZbvPlacementIsAV) {
  // pp = 4: stages 0..7 on ranks 0 1 2 3 3 2 1 0; the last stage (the loss) on rank 0.
  const std::vector<int> want{0, 1, 2, 3, 3, 2, 1, 0};
  for (int v = 0; v < 8; ++v) EXPECT_EQ(stage_rank(kZbv, 4, v), want[v]) << v;
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(chunk_stage(kZbv, 4, r, 0), r);
    EXPECT_EQ(chunk_stage(kZbv, 4, r, 1), 7 - r);
    for (int c = 0; c < 2; ++c) EXPECT_EQ(stage_rank(kZbv, 4, chunk_stage(kZbv, 4, r, c)), r);
  }
  // The other kinds: v % pp, chunk v / pp.
  EXPECT_EQ(stage_rank(ScheduleKind::kInterleaved, 4, 6), 2);
  EXPECT_EQ(chunk_stage(ScheduleKind::kInterleaved, 4, 2, 1), 6);
}

TEST(PipelineSchedule, ZbvOrderIsPyTorchsOnTwoStages) {
  // I = B (input gradient), W = weight gradient; chunk 1 (c1) is stage 3 on rank 0, stage 2 on rank 1.
  EXPECT_EQ(text(make_schedule(kZbv, 2, 0, 3, 2)),
            "F0 F1 F2 F0c1 I0c1 W0c1 F1c1 I1c1 W1c1 I0 W0 F2c1 I2c1 W2c1 I1 W1 I2 W2");
  EXPECT_EQ(text(make_schedule(kZbv, 2, 1, 3, 2)),
            "F0 F0c1 F1 F1c1 I0c1 W0c1 F2 I0 W0 F2c1 I1c1 W1c1 I1 I2c1 I2 W1 W2c1 W2");
  EXPECT_EQ(text(make_schedule(kZbv, 2, 1, 3, 2, true)), "F0 F0c1 F1 F1c1 F2 F2c1");
  // Fewer micro-batches than 2 * pp - 1: the full schedule's actions of micro-batches >= m dropped.
  EXPECT_EQ(text(make_schedule(kZbv, 2, 0, 1, 2)), "F0 F0c1 I0c1 W0c1 I0 W0");
}

TEST(PipelineSchedule, ZbvCompletesForEveryMicrobatchCount) {
  for (int pp = 2; pp <= 6; ++pp)
    for (int m = 1; m <= 3 * pp; ++m) {
      SCOPED_TRACE("zbv pp " + std::to_string(pp) + " m " + std::to_string(m));
      for (bool fwd_only : {false, true}) {
        auto s = all_ranks(kZbv, pp, m, 2, fwd_only);
        size_t actions = 0;
        for (const auto& r : s) actions += r.size();
        EXPECT_EQ(actions, static_cast<size_t>(m) * 2 * pp * (fwd_only ? 1 : 3));  // F, B, W per stage
        EXPECT_NO_THROW(simulate(s, pp, m, 2, 1, 1, 1, kZbv));
      }
    }
}

TEST(PipelineSchedule, ZbvBubbleIsHalfOfZbH1) {
  // t_f = t_b = t_w; each chunk is half a stage: 0.5 units each, 3 units per micro-batch and stage.
  // From m >= 2 * pp - 1 on, the makespan is 3m + (pp - 1) / 2: a bubble of (pp-1)/(6m), half ZB-H1's
  // (pp-1)/(3m); from m >= pp on it is at most ZB-H1's; 1F1B with the same times has (pp-1)/m.
  for (int pp = 2; pp <= 8; ++pp)
    for (int m = pp; m <= 4 * pp; ++m) {
      SCOPED_TRACE("pp " + std::to_string(pp) + " m " + std::to_string(m));
      const double t = simulate(all_ranks(kZbv, pp, m, 2), pp, m, 2, 0.5, 0.5, 0.5, kZbv);
      const double bubble = (t - 3.0 * m) / (3.0 * m);
      EXPECT_LE(bubble, (pp - 1) / (3.0 * m) + 1e-12);
      if (m >= 2 * pp - 1) EXPECT_DOUBLE_EQ(t, 3.0 * m + (pp - 1) * 0.5);
      const double one_f_one_b = simulate(all_ranks(ScheduleKind::k1F1B, pp, m, 1), pp, m, 1, 1.0, 2.0);
      EXPECT_LT(t, one_f_one_b);
    }
}

TEST(PipelineSchedule, SimulationChecksBackwardSplit) {
  using K = PipelineAction::Kind;
  // W before its B on the same rank; a B without its W; a whole backward after B (a repeat).
  std::vector<std::vector<PipelineAction>> w_first{{{K::kForward, 0, 0}, {K::kBackwardWeight, 0, 0}, {K::kBackwardInput, 0, 0}}};
  EXPECT_THROW(simulate(w_first, 1, 1, 1), std::logic_error);
  std::vector<std::vector<PipelineAction>> no_w{{{K::kForward, 0, 0}, {K::kBackwardInput, 0, 0}}};
  EXPECT_THROW(simulate(no_w, 1, 1, 1), std::logic_error);
  std::vector<std::vector<PipelineAction>> twice{{{K::kForward, 0, 0}, {K::kBackwardInput, 0, 0}, {K::kBackward, 0, 0}}};
  EXPECT_THROW(simulate(twice, 1, 1, 1), std::logic_error);
  std::vector<std::vector<PipelineAction>> good{{{K::kForward, 0, 0}, {K::kBackwardInput, 0, 0}, {K::kBackwardWeight, 0, 0}}};
  EXPECT_DOUBLE_EQ(simulate(good, 1, 1, 1, 1.0, 2.0, 3.0), 6.0);
}

TEST(PipelineSchedule, ZbvBadArgumentsNameTheOption) {
  for (int chunks : {1, 3}) {
    try {
      make_schedule(kZbv, 2, 0, 4, chunks);
      FAIL() << chunks;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("needs num_model_chunks = 2"), std::string::npos) << e.what();
    }
  }
  try {
    make_schedule(kZbv, 1, 0, 4, 2);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("needs pp_size > 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(booster::parallel::schedule_kind_from_name("zbv", 2), kZbv);
  try {
    booster::parallel::schedule_kind_from_name("zb-v", 2);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("\"zbv\""), std::string::npos) << e.what();
  }
}

TEST(PipelinePartition, UniformAndBalanced) {
  using P = std::vector<std::pair<int, int>>;
  EXPECT_EQ(partition_layers(6, 4, false, {}), (P{{0, 2}, {2, 4}, {4, 5}, {5, 6}}));
  EXPECT_EQ(partition_layers(4, 4, false, {}), (P{{0, 1}, {1, 2}, {2, 3}, {3, 4}}));
  // Balanced by parameter count: a heavy embedding alone, the light blocks together.
  EXPECT_EQ(partition_layers(5, 2, true, {100, 10, 10, 10, 10}), (P{{0, 1}, {1, 5}}));
  EXPECT_EQ(partition_layers(6, 3, true, {1, 1, 1, 1, 1, 1}), (P{{0, 2}, {2, 4}, {4, 6}}));
  // Every stage non-empty even when one layer dominates.
  EXPECT_EQ(partition_layers(3, 3, true, {1, 100, 1}), (P{{0, 1}, {1, 2}, {2, 3}}));
  try {
    partition_layers(3, 4, false, {});
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("3 pipeline layers"), std::string::npos) << e.what();
  }
}

}  // namespace
