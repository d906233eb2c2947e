// pipeline_schedule_test.cpp — the hybrid_parallel plugin's pipeline schedules and layer
// partitioning (plugins/hybrid_parallel/pipeline_schedule.cpp and partition_layers, compiled in):
// exact orders for small cases, every schedule runs to completion for many (pp, microbatches,
// chunks) in the simulation (no deadlock, every action once), and the simulated makespans equal the
// bubble formulas.
#include <gtest/gtest.h>

#include <string>

#include "pipeline_schedule.h"
#include "pipeline_stage.h"

using booster::hybrid::make_schedule;
using booster::hybrid::partition_layers;
using booster::hybrid::PipelineAction;
using booster::hybrid::ScheduleKind;
using booster::hybrid::simulate;

namespace {

std::string text(const std::vector<PipelineAction>& s) {
  std::string out;
  for (const auto& a : s)
    out += (out.empty() ? "" : " ") + std::string(a.kind == PipelineAction::Kind::kForward ? "F" : "B") +
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
