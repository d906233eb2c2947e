// hybrid_test.cpp — the hybrid_parallel plugin on 2 and 4 ranks (hybrid_worker processes) against
// single-process LibTorch: every mesh shape that fits (tp, pp, dp·tp, dp·pp, pp·tp, tp4, pp4), the
// 1F1B, interleaved, ZB-V and GPipe schedules, zero_stage 0 to 3, SGD and AdamW, clipping, bf16; and
// checkpoints moving between mesh shapes and plugins.
// Tolerances: float32 runs within kAtol = 1e-5 + kRtol = 1e-4 * |reference| (sums in another order:
// tp splits the matmuls, dp and micro-batches split the batch); bf16 runs within 3e-2 absolute
// (bf16 weights rounded at every step; the parameters are O(1)).
#include <gtest/gtest.h>

#include <iostream>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "booster/checkpoint/state_dict_io.h"
#include "booster/nn/tensor_parallel.h"
#include "dist/dist_test_util.h"
#include "dist/hybrid_common.h"
#include "dist/hybrid_test_util.h"

namespace booster::testing {
namespace {

// Every bad input is refused on every rank with a message that names the problem and the fix.
TEST(HybridParallel, BadInputIsAClearErrorOnEveryRank) {
  TempDir dir;
  auto results = run_hybrid(2, {"scenario=errors", "out=" + dir.path()});
  expect_all_ok(results);
  const std::map<std::string, std::vector<std::string>> want{
      {"indivisible_mesh", {"tp_size * pp_size = 3 * 1 = 3 does not divide the world size 2"}},
      {"too_few_microbatches", {"num_microbatches = 1 < pp_size = 2", "raise num_microbatches"}},
      {"no_microbatches", {"needs num_microbatches or microbatch_size"}},
      {"zbv_one_chunk", {"pp_style = \"zbv\" needs num_model_chunks = 2", "got num_model_chunks = 1",
                         "set plugin.num_model_chunks = 2"}},
      {"zbv_three_chunks", {"pp_style = \"zbv\" needs num_model_chunks = 2", "got num_model_chunks = 3"}},
      {"zbv_without_pipeline", {"pp_style = \"zbv\" needs pp_size > 1", "got pp_size = 1"}},
      {"not_a_pipeline_module", {"booster::nn::PipelineModule", "pipeline_layers()"}},
      {"too_few_layers", {"6 pipeline layers", "fewer than pp_size * num_model_chunks = 8"}},
      {"forward_on_pipelined_model", {"use booster.execute_pipeline"}},
      {"backward_on_pipelined_model", {"booster.backward does not work on a pipelined model"}},
      {"batch_not_divisible", {"batch size 3", "num_microbatches = 2"}},
      {"valid_pipeline_after_errors", {"no error"}},
      {"sp_mode_without_enable", {"sequence_parallelism_mode = \"split_gather\" is set but enable_sequence_parallelism is false"}},
      {"sp_size_without_enable", {"sp_size = 2 is set but enable_sequence_parallelism is false"}},
      {"split_gather_without_tp", {"needs tp_size > 1", "sequence_parallelism_mode = \"all_to_all\""}},
      {"split_gather_sp_size", {"sp_size = 1 with sequence_parallelism_mode = \"split_gather\"", "remove sp_size"}},
      {"sp_size_not_dividing_world", {"tp_size * pp_size * sp_size = 4 does not divide the world size 2"}},
      {"zero2_with_pipeline", {"zero_stage = 2 needs pp_size = 1", "pp_size = 2", "Use zero_stage = 1"}},
      {"sequence_not_divisible_split_gather", {"sequence length T = 7 is not divisible by sp_size = 2", "tp_size"}},
      {"sequence_not_divisible_all_to_all", {"sequence length T = 7 is not divisible by sp_size = 2", "all_to_all"}},
      {"data_iter_form", {"no error"}},
      {"tp_plan_bad_style", {"plugin.tp_plan.\"h.*.fc\" = \"columnwise\" is not one of", "vocab_parallel"}},
      {"tp_plan_empty", {"[plugin.tp_plan] is empty", "\"h.*.fc\" = \"colwise\""}},
      {"tp_plan_optimizer_with_state", {"the optimizer already has state", "boost before the first step"}},
      {"tp_plan_no_match", {"[plugin.tp_plan]", "the pattern 'h.*.mlp' matches no sub-module"}}};
  for (int r = 0; r < 2; ++r) {
    std::map<std::string, std::string> got;
    std::istringstream in(read_file(dir.file("rank" + std::to_string(r) + ".err")));
    std::string line;
    while (std::getline(in, line)) {
      auto colon = line.find(": ");
      if (colon != std::string::npos) got[line.substr(0, colon)] = line.substr(colon + 2);
    }
    for (const auto& [name, parts] : want) {
      ASSERT_TRUE(got.count(name)) << "rank " << r << " case " << name;
      for (const auto& part : parts) EXPECT_NE(got[name].find(part), std::string::npos) << name << ": " << got[name];
    }
  }
}

TEST(HybridParallel, TensorParallel2MatchesSingleProcess) {
  check_hybrid({2, {"plugin.tp_size=2"}, "adamw"});
}
// [plugin.tp_plan]: the dense TinyLM (built with the default context) sharded by the plugin at
// boost() trains as the one built with the Booster's context: the same reference, the same tolerances.
TEST(HybridParallel, TpPlanOnADenseModelMatchesSingleProcess) {
  HybridCase tp2{2, {"plugin.tp_size=2"}, "adamw"};
  tp2.tp_plan = true;
  check_hybrid(tp2);
  HybridCase pp2tp2{4, {"plugin.pp_size=2", "plugin.tp_size=2", "plugin.num_microbatches=4"}, "sgd", 0.05};
  pp2tp2.tp_plan = true;
  check_hybrid(pp2tp2);
}
TEST(HybridParallel, Pipeline2OneFOneBMatchesSingleProcess) {
  check_hybrid({2, {"plugin.pp_size=2", "plugin.num_microbatches=4"}, "sgd"});
}
// The metadata cache (enable_metadata_cache, on by default): step 0 sends micro-batch 0 with its shape
// header and learns the shapes, step 1's shorter sequences are a new key (headers again), step 2 is
// step 0's key again (every message plain, first receives posted up front). Off: headers every step.
TEST(HybridParallel, PipelineMetadataCacheFollowsChangingShapes) {
  check_hybrid({2, {"plugin.pp_size=2", "plugin.num_microbatches=4"}, "adamw", 0, false, 1});
  check_hybrid({4, {"plugin.pp_size=2", "plugin.pp_style=interleaved", "plugin.num_model_chunks=2",
                    "plugin.num_microbatches=2", "plugin.tp_size=2"}, "sgd", 0, false, 1});
  check_hybrid({2, {"plugin.pp_size=2", "plugin.num_microbatches=2", "plugin.enable_metadata_cache=false"}, "sgd",
                0, false, 1});
}
TEST(HybridParallel, Pipeline2GPipeMatchesSingleProcess) {
  check_hybrid({2, {"plugin.pp_size=2", "plugin.num_microbatches=2", "plugin.pp_style=gpipe"}, "sgd"});
}
TEST(HybridParallel, DataTensor2x2AdamWClippedMatchesSingleProcess) {
  check_hybrid({4, {"plugin.tp_size=2"}, "adamw", 0.05});
}
// The dp average of zero_stage 0 and 1 runs in DDP's buckets during backward: with buckets of
// 0.5 KiB several allreduces start before backward ends, and training still equals single-process
// LibTorch. With pp_size = 2 (1F1B; interleaved with 2 chunks: the last backward reaches one chunk,
// the other chunk's accumulated gradients join at its end; ZB-V: the last W pass) only the last
// backward of the schedule reduces, carrying every micro-batch's gradients.
TEST(HybridParallel, DpAverageOverlapsBackwardInBuckets) {
  const std::vector<std::vector<std::string>> meshes{
      {"plugin.tp_size=2", "plugin.zero_stage=0"},
      {"plugin.tp_size=2", "plugin.zero_stage=1"},
      {"plugin.pp_size=2", "plugin.num_microbatches=4", "plugin.zero_stage=0"},
      {"plugin.pp_size=2", "plugin.pp_style=interleaved", "plugin.num_model_chunks=2", "plugin.num_microbatches=4",
       "plugin.zero_stage=1"},
      {"plugin.pp_size=2", "plugin.pp_style=zbv", "plugin.num_model_chunks=2", "plugin.num_microbatches=2"}};
  for (const auto& mesh : meshes) {
    std::vector<std::string> sets = mesh;
    sets.push_back("plugin.ddp_bucket_cap_mb=0.0005");
    std::string label;
    for (const auto& s : mesh) label += s + " ";
    check_hybrid({4, sets, mesh[0] == "plugin.tp_size=2" ? "adamw" : "sgd", mesh[0] == "plugin.tp_size=2" ? 0.05 : 0.0});
    TempDir dir;
    std::vector<std::string> args{"out=" + dir.path(), "steps=2", "batch=8", "optimizer=adamw", "set=plugin.precision=fp32"};
    for (const auto& s : sets) args.push_back("set=" + s);
    expect_all_ok(run_hybrid(4, args));
    for (int r = 0; r < 4; ++r) {
      auto log = read_log(dir.file("rank" + std::to_string(r) + ".txt"));
      EXPECT_GT(log["buckets"][1], 2) << label << "rank " << r;
      // Launched from gradient hooks, before backward ended (counted over the reducer's life: 2 passes).
      EXPECT_GT(log["overlapped"][1], 0) << label << "rank " << r;
      if (r == 0)
        std::cout << "[ overlap  ] " << label << ": " << log["buckets"][1] << " buckets, "
                  << log["overlapped"][1] << " of " << 2 * log["buckets"][1]
                  << " launched during backward in 2 steps" << std::endl;
    }
  }
}

TEST(HybridParallel, DataPipeline2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.num_microbatches=2"}, "adamw"});
}
TEST(HybridParallel, PipelineTensor2x2ClippedMatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.tp_size=2", "plugin.num_microbatches=4"}, "sgd", 0.05});
}
TEST(HybridParallel, Tensor4MatchesSingleProcess) {
  check_hybrid({4, {"plugin.tp_size=4"}, "adamw"});
}
TEST(HybridParallel, Pipeline4MatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=4", "plugin.num_microbatches=4"}, "adamw", 0.05});
}
TEST(HybridParallel, InterleavedPipeline2x2ChunksMatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.pp_style=interleaved", "plugin.num_model_chunks=2",
                    "plugin.num_microbatches=4"}, "adamw"});
}
// ZB-V (pp_style = "zbv"): 8 virtual stages on 4 ranks in a V (rank 0 holds the embedding and the
// tied head: the stage with the loss), backward split into B and W. 6 blocks = 8 pipeline layers, one
// per stage; m = 4 < 2 * pp - 1 and m = 8 (the full steady state), AdamW with clipping (the norm and
// the update see every W's gradients). Same float32 tolerances as the other meshes.
TEST(HybridParallel, ZeroBubbleV4StagesMatchesSingleProcess) {
  HybridCase c{4, {"plugin.pp_size=4", "plugin.pp_style=zbv", "plugin.num_model_chunks=2", "plugin.num_microbatches=8"},
               "adamw", 0.05};
  c.blocks = 6;
  check_hybrid(c);
  c.sets[3] = "plugin.num_microbatches=4";
  c.optimizer = "sgd";
  c.max_norm = 0;
  check_hybrid(c);
}
// zbv with dp and the metadata cache's shape changes (step 1 shorter): pp2 x dp2, 3 micro-batches.
TEST(HybridParallel, ZeroBubbleVDataPipeline2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.pp_style=zbv", "plugin.num_model_chunks=2", "plugin.num_microbatches=2"},
                "sgd", 0, false, 1});
}
TEST(HybridParallel, ZeroStage1DataTensor2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.tp_size=2", "plugin.zero_stage=1"}, "adamw", 0.05});
}
// zero_stage 2 (pp_size = 1): ZeRO-2 over dp composed with tp (the reducer reduce-scatters the tp
// shards' gradients over dp during backward), with clipping; over dp x sp under all_to_all; and
// bf16 weights with fp32 master slices on dp2.
TEST(HybridParallel, ZeroStage2DataTensor2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.tp_size=2", "plugin.zero_stage=2"}, "adamw", 0.05});
}
TEST(HybridParallel, ZeroStage2DataSequence2x2AllToAllMatchesSingleProcess) {
  check_hybrid({4, {"plugin.sp_size=2", "plugin.enable_sequence_parallelism=true", "plugin.zero_stage=2",
                    "plugin.sequence_parallelism_mode=all_to_all"}, "adamw", 0.05});
}
TEST(HybridParallel, ZeroStage2Bf16Data2TracksSingleProcess) {
  check_hybrid({2, {"plugin.zero_stage=2"}, "sgd", 0, true});
}
// zero_stage 3 (pp_size = 1): fully_shard over dp composed with tp (FSDP x TP: each tp rank's shard
// of the model flattened and sharded over its dp group), with clipping (each element counted once
// over dp x tp); over dp x sp under all_to_all; bf16 gathered parameters with fp32 shards on dp2.
TEST(HybridParallel, ZeroStage3DataTensor2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.tp_size=2", "plugin.zero_stage=3"}, "adamw", 0.05});
  check_hybrid({2, {"plugin.tp_size=2", "plugin.zero_stage=3"}, "adamw", 0.05});  // dp = 1: unsharded FlatParameters
}
TEST(HybridParallel, ZeroStage3DataSequence2x2AllToAllMatchesSingleProcess) {
  check_hybrid({4, {"plugin.sp_size=2", "plugin.enable_sequence_parallelism=true", "plugin.zero_stage=3",
                    "plugin.sequence_parallelism_mode=all_to_all"}, "adamw", 0.05});
}
// zero_stage 3 with pipelines (FSDP x PP; dp2·pp2 and dp2·pp2 under zbv with its tied embedding on one
// rank, and 1F1B with the tied embedding split over the first and last stage): each stage's
// FlatParameters stay gathered through the schedule, the micro-batches' gradients accumulate, the
// tied embedding's are summed over its stages, then reduce-scattered over dp once.
TEST(HybridParallel, ZeroStage3DataPipeline2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.zero_stage=3", "plugin.num_microbatches=2"}, "adamw", 0.05});
  check_hybrid({4, {"plugin.pp_size=2", "plugin.zero_stage=3", "plugin.num_microbatches=4", "plugin.pp_style=zbv",
                    "plugin.num_model_chunks=2"}, "sgd"});
}
TEST(HybridParallel, ZeroStage3PipelineTensor2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.tp_size=2", "plugin.zero_stage=3", "plugin.num_microbatches=4"}, "sgd",
                0.05});
}
// FSDP x TP x PP: 8 ranks, dp2·pp2·tp2.
TEST(HybridParallel, ZeroStage3DataPipelineTensor2x2x2MatchesSingleProcess) {
  check_hybrid({8, {"plugin.pp_size=2", "plugin.tp_size=2", "plugin.zero_stage=3", "plugin.num_microbatches=2"}, "adamw",
                0.05});
}
TEST(HybridParallel, ZeroStage3Bf16Data2TracksSingleProcess) {
  check_hybrid({2, {"plugin.zero_stage=3"}, "sgd", 0, true});
}
// The estimate's zero_stage 2 and 3 rows (hybrid_estimate.h) are exactly the configurations the
// plugin accepts: on 4 ranks every zero_stage 2 / 3 candidate on the meshes the estimate covers with
// dp > 1 (tp, pp, zbv, split_gather, all_to_all sp 2 and 4; hybrid_worker's run_rows) is boosted
// and trained one step, and the accepted ones must be the rows, in fp32 and bf16.
TEST(HybridParallel, EstimateZeroStage2And3RowsAreWhatThePluginAccepts) {
  for (const std::string precision : {"fp32", "bf16"}) {
    TempDir dir;
    expect_all_ok(run_hybrid(4, {"scenario=rows", "out=" + dir.path(), "precision=" + precision}));
    std::set<std::string> rows, accepted, refused;
    std::istringstream in(read_file(dir.file("rank0.rows")));
    std::string verdict, options;
    while (in >> verdict && std::getline(in, options)) {
      options = options.substr(1);
      (verdict == "row" ? rows : verdict == "accepted" ? accepted : refused).insert(options);
    }
    for (int r = 1; r < 4; ++r)
      EXPECT_EQ(read_file(dir.file("rank" + std::to_string(r) + ".rows")), read_file(dir.file("rank0.rows"))) << r;
    EXPECT_EQ(rows, accepted) << precision;
    const std::string p = "precision=\"" + precision + "\"";
    // tp2, tp2 split_gather, tp2 sp2, sp2, sp4 at zero_stage 2 and 3; pp2 and zbv at 3
    EXPECT_EQ(rows.size(), 12u) << precision;
    // The refusal is exercised: zero_stage 2 with a pipeline.
    EXPECT_TRUE(refused.count("num_microbatches=2 pp_size=2 " + p + " tp_size=1 zero_stage=2")) << precision;
    EXPECT_TRUE(rows.count("enable_sequence_parallelism=true pp_size=1 " + p +
                           " sequence_parallelism_mode=\"split_gather\" tp_size=2 zero_stage=3"))
        << precision;
    EXPECT_TRUE(rows.count("num_microbatches=2 pp_size=2 " + p + " tp_size=1 zero_stage=3")) << precision;
  }
}

// The plugin's own memory report of a boosted run (after boost() and after 2 AdamW steps, 4 ranks)
// against the estimate row of the same configuration, within the 5% of the ZeRO formula checks
// (zero_test.cpp): weights (parameters and fp32 masters), gradients and optimizer states per rank.
// ZeRO-2 over dp x sp (all_to_all sp 2) and zero_stage 3 over dp 2 of a pipeline stage (pp 2: the
// estimate counts the larger stage, 5040 elements of the dense TinyLM; the other holds 4944), fp32
// and bf16. tp is left out: TinyLM's vocabulary padding and tp-replicated LayerNorms put a tp rank
// ~19% above the estimate's Ψ/tp.
TEST(HybridParallel, EstimateZeroStage2And3RowsMatchTheMemoryReport) {
  struct Case {
    std::vector<std::string> sets;
    std::string row;
  };
  for (const std::string precision : {"fp32", "bf16"}) {
    const std::string p = ", precision = \"" + precision + "\"";
    const std::vector<Case> cases{
        {{"plugin.zero_stage=2", "plugin.enable_sequence_parallelism=true", "plugin.sp_size=2"},
         "tp_size = 1, pp_size = 1, zero_stage = 2" + p + ", sequence_parallelism_mode = \"all_to_all\", sp_size = 2"},
        {{"plugin.zero_stage=3", "plugin.pp_size=2", "plugin.num_microbatches=2"},
         "tp_size = 1, pp_size = 2, zero_stage = 3" + p}};
    for (const Case& c : cases) {
      TempDir dir;
      std::vector<std::string> args{"out=" + dir.path(), "steps=2", "batch=8", "optimizer=adamw",
                                    "estimate_row=" + c.row, "set=plugin.precision=" + precision};
      for (const auto& s : c.sets) args.push_back("set=" + s);
      expect_all_ok(run_hybrid(4, args));
      for (int r = 0; r < 4; ++r) {
        auto m = load_stats(dir.file("rank" + std::to_string(r) + ".memory"));
        const std::string what = c.row + ", rank " + std::to_string(r);
        ASSERT_TRUE(m.count("estimate_parameters")) << what << ": no such estimate row";
        auto near = [&](double got, double want, const std::string& name) {
          EXPECT_NEAR(got, want, 0.05 * want + 1) << what << ": " << name;
        };
        const double weights = static_cast<double>(m["estimate_parameters"] + m["estimate_master_weights"]);
        for (const char* when : {"planned", "actual"}) {
          const std::string w = when;
          near(static_cast<double>(m[w + "_parameters"] + m[w + "_master_weights"]), weights, w + " weights");
          near(static_cast<double>(m[w + "_gradients"]), static_cast<double>(m["estimate_gradients"]), w + " gradients");
        }
        near(static_cast<double>(m["actual_optimizer_states"]), static_cast<double>(m["estimate_optimizer_states"]),
             "optimizer states");
        if (r == 0)
          std::cout << "[ memory   ] " << what << ": model states " << m["actual_parameters"] + m["actual_master_weights"] +
                           m["actual_gradients"] + m["actual_optimizer_states"] << " bytes, estimate "
                    << m["estimate_parameters"] + m["estimate_master_weights"] + m["estimate_gradients"] +
                           m["estimate_optimizer_states"] << std::endl;
      }
    }
  }
}

TEST(HybridParallel, ZeroStage1DataPipeline2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.zero_stage=1", "plugin.num_microbatches=2"}, "sgd"});
}
// Sequence parallelism on 4 ranks. split_gather (Megatron-SP over tp): the tp-replicated parameters'
// gradients are per-shard parts summed over tp; with a step of shorter sequences (other shard shapes)
// and clipping. all_to_all (Ulysses over sp): every gradient is its shard's, averaged over dp x sp;
// ZeRO-1 then shards over dp x sp.
TEST(HybridParallel, SequenceParallelSplitGatherDataTensor2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.tp_size=2", "plugin.enable_sequence_parallelism=true",
                    "plugin.sequence_parallelism_mode=split_gather"}, "adamw", 0.05, false, 1});
}
// split_gather with zero_stage 2 and 3: the tp-replicated parameters' pieces of the gradient shards
// reduced over dp are summed over tp before clipping and the update (booster/parallel/mesh_optimizer.h).
TEST(HybridParallel, SequenceParallelSplitGatherWithZeroStage2And3MatchesSingleProcess) {
  for (const std::string zero : {"2", "3"})
    check_hybrid({4, {"plugin.tp_size=2", "plugin.enable_sequence_parallelism=true",
                      "plugin.sequence_parallelism_mode=split_gather", "plugin.zero_stage=" + zero}, "adamw", 0.05,
                  false, 1});
}
TEST(HybridParallel, SequenceParallelSplitGatherTensor4MatchesSingleProcess) {
  check_hybrid({4, {"plugin.tp_size=4", "plugin.enable_sequence_parallelism=true",
                    "plugin.sequence_parallelism_mode=split_gather"}, "sgd"});
}
TEST(HybridParallel, SequenceParallelAllToAllDataSequence2x2MatchesSingleProcess) {
  check_hybrid({4, {"plugin.sp_size=2", "plugin.enable_sequence_parallelism=true",
                    "plugin.sequence_parallelism_mode=all_to_all"}, "adamw", 0.05, false, 1});
}
TEST(HybridParallel, SequenceParallelAllToAllSequence4ZeroStage1MatchesSingleProcess) {
  check_hybrid({4, {"plugin.sp_size=4", "plugin.enable_sequence_parallelism=true", "plugin.zero_stage=1",
                    "plugin.sequence_parallelism_mode=all_to_all"}, "adamw", 0.05});
}
TEST(HybridParallel, Bf16PipelineTensor2x2TracksSingleProcess) {
  check_hybrid({4, {"plugin.pp_size=2", "plugin.tp_size=2", "plugin.num_microbatches=2"}, "sgd", 0, true});
}


// ---------------------------------------------------------------------------------------------
// Checkpoints: a mesh shape's model and optimizer continue at another shape or in another plugin
// exactly as the uninterrupted single-process run (AdamW, so the optimizer state matters).

struct Leg {
  int world;
  std::vector<std::string> sets;  // "plugin=torch_ddp" selects the plugin, the rest are set=...
};

std::vector<std::string> leg_args(const Leg& leg) {
  std::vector<std::string> args;
  for (const auto& s : leg.sets) args.push_back(s.rfind("plugin=", 0) == 0 ? s : "set=" + s);
  bool hybrid = true;
  for (const auto& s : leg.sets) hybrid = hybrid && s.rfind("plugin=", 0) != 0;
  if (hybrid) args.push_back("set=plugin.precision=fp32");
  return args;
}

// `first` trains steps [0, 2) and saves; `second` loads and trains steps [2, 4).
// `inspect` (optional) looks at the checkpoint directory.
void check_resume(const Leg& first, const Leg& second, const std::string& what,
                  const std::function<void(const TempDir& ckpt)>& inspect = nullptr) {
  TempDir a, b, ckpt;
  const int64_t batch = 8;
  auto args1 = leg_args(first);
  for (const std::string& s : {"out=" + a.path(), std::string("steps=2"), "batch=" + std::to_string(batch),
                               std::string("optimizer=adamw"), "save=" + ckpt.path()})
    args1.push_back(s);
  expect_all_ok(run_hybrid(first.world, args1));
  if (inspect) inspect(ckpt);
  auto args2 = leg_args(second);
  for (const std::string& s : {"out=" + b.path(), std::string("steps=2"), std::string("first_step=2"),
                               "batch=" + std::to_string(batch), std::string("optimizer=adamw"), "load=" + ckpt.path()})
    args2.push_back(s);
  expect_all_ok(run_hybrid(second.world, args2));
  const Reference ref = reference_lm(4, batch, "adamw");
  expect_model_close(b.file("model"), ref, kAtol, kRtol, what);
  int with_loss = 0;
  double max_diff = 0;
  for (int r = 0; r < second.world; ++r) {
    auto log = read_log(b.file("rank" + std::to_string(r) + ".txt"));
    if (log["loss"].empty()) continue;
    ++with_loss;
    for (int64_t s = 2; s < 4; ++s) {
      EXPECT_NEAR(log["loss"][s], ref.losses[s], 1e-5) << what << " rank " << r << " step " << s;
      max_diff = std::max(max_diff, std::abs(log["loss"][s] - ref.losses[s]));
    }
  }
  EXPECT_GT(with_loss, 0) << what;
  std::cout << "[ compare  ] " << what << ": losses of steps 2, 3 within " << max_diff << " of the reference" << std::endl;
}

const std::vector<std::string> kTp2Pp2{"plugin.tp_size=2", "plugin.pp_size=2", "plugin.num_microbatches=4"};

TEST(HybridParallel, CheckpointPipelineTensor2x2ResumesInTorchDdp) {
  check_resume({4, kTp2Pp2}, {1, {"plugin=torch_ddp"}}, "tp2·pp2 (2 steps) -> torch_ddp 1 rank (2 steps)",
               [](const TempDir& ckpt) {
                 // One file per stage, numbered as one checkpoint, one index; the optimizer sharded.
                 for (const char* f : {"model/model-00001-of-00002.safetensors", "model/model-00002-of-00002.safetensors",
                                       "model/model.safetensors.index.json", "optimizer/optimizer.sharded.json",
                                       "optimizer/optimizer_groups.json"})
                   EXPECT_TRUE(std::filesystem::exists(ckpt.file(f))) << f;
                 const std::string index = read_file(ckpt.file("model/model.safetensors.index.json"));
                 EXPECT_NE(index.find("\"ln_f.weight\": \"model-00002-of-00002.safetensors\""), std::string::npos) << index;
                 EXPECT_NE(index.find("\"wte.weight\": \"model-00001-of-00002.safetensors\""), std::string::npos) << index;
               });
}
// A zbv checkpoint (pp2·tp2: rank 0 holds virtual stages 0 and 3, rank 1 stages 1 and 2) resumes in
// 1F1B pp2 and in one process; a torch_ddp one resumes under zbv.
const std::vector<std::string> kZbvTp2Pp2{"plugin.tp_size=2", "plugin.pp_size=2", "plugin.pp_style=zbv",
                                          "plugin.num_model_chunks=2", "plugin.num_microbatches=4"};
TEST(HybridParallel, CheckpointZeroBubbleVResumesIn1F1BAndTorchDdp) {
  check_resume({4, kZbvTp2Pp2}, {2, {"plugin.pp_size=2", "plugin.num_microbatches=4"}}, "zbv tp2·pp2 -> 1f1b pp2",
               [](const TempDir& ckpt) {
                 // Two stage files; the V puts the embedding and ln_f (the tied head) on pp rank 0.
                 const std::string index = read_file(ckpt.file("model/model.safetensors.index.json"));
                 EXPECT_NE(index.find("\"ln_f.weight\": \"model-00001-of-00002.safetensors\""), std::string::npos) << index;
                 EXPECT_NE(index.find("\"wte.weight\": \"model-00001-of-00002.safetensors\""), std::string::npos) << index;
                 EXPECT_NE(index.find("\"h.1.fc.weight\": \"model-00002-of-00002.safetensors\""), std::string::npos) << index;
               });
  check_resume({4, kZbvTp2Pp2}, {1, {"plugin=torch_ddp"}}, "zbv tp2·pp2 -> torch_ddp 1 rank");
  check_resume({1, {"plugin=torch_ddp"}}, {4, kZbvTp2Pp2}, "torch_ddp 1 rank -> zbv tp2·pp2");
}
TEST(HybridParallel, CheckpointTorchDdpResumesInPipelineTensor2x2) {
  check_resume({1, {"plugin=torch_ddp"}}, {4, kTp2Pp2}, "torch_ddp 1 rank (2 steps) -> tp2·pp2 (2 steps)");
}
TEST(HybridParallel, CheckpointZeroStage1DataTensor2x2ResumesInPipeline2) {
  check_resume({4, {"plugin.tp_size=2", "plugin.zero_stage=1"}},
               {2, {"plugin.pp_size=2", "plugin.num_microbatches=2"}}, "dp2·tp2 zero_stage 1 -> pp2");
}

// zero_stage 2's checkpoint (each dp rank's ZeRO slices) continues at another mesh shape and in
// torch_fsdp and low_level_zero; DDP's and ZeRO-2's continue in it.
TEST(HybridParallel, CheckpointZeroStage2DataTensor2x2MovesToAndFromOtherPlugins) {
  const std::vector<std::string> zero2{"plugin.tp_size=2", "plugin.zero_stage=2"};
  check_resume({4, zero2}, {2, {"plugin.pp_size=2", "plugin.num_microbatches=2"}}, "dp2·tp2 zero_stage 2 -> pp2");
  check_resume({4, zero2}, {2, {"plugin=torch_fsdp"}}, "dp2·tp2 zero_stage 2 -> torch_fsdp 2 ranks");
  check_resume({1, {"plugin=torch_ddp"}}, {4, zero2}, "torch_ddp 1 rank -> dp2·tp2 zero_stage 2");
  check_resume({2, {"plugin=low_level_zero", "plugin.stage=2", "plugin.precision=\"fp32\""}}, {4, zero2},
               "low_level_zero stage 2, 2 ranks -> dp2·tp2 zero_stage 2");
}

// zero_stage 3's checkpoint (model gathered over dp, optimizer state from each dp rank's
// FlatParameter shards) continues at another mesh shape and in torch_fsdp, low_level_zero and
// gemini; DDP's, ZeRO-2's and Gemini's continue in it.
TEST(HybridParallel, CheckpointZeroStage3DataTensor2x2MovesToAndFromOtherPlugins) {
  const std::vector<std::string> zero3{"plugin.tp_size=2", "plugin.zero_stage=3"};
  check_resume({4, zero3}, {2, {"plugin.pp_size=2", "plugin.num_microbatches=2"}}, "dp2·tp2 zero_stage 3 -> pp2");
  check_resume({4, zero3}, {2, {"plugin=torch_fsdp"}}, "dp2·tp2 zero_stage 3 -> torch_fsdp 2 ranks");
  check_resume({4, zero3}, {2, {"plugin=low_level_zero", "plugin.stage=2", "plugin.precision=\"fp32\""}},
               "dp2·tp2 zero_stage 3 -> low_level_zero stage 2, 2 ranks");
  check_resume({1, {"plugin=torch_ddp"}}, {4, zero3}, "torch_ddp 1 rank -> dp2·tp2 zero_stage 3");
  check_resume({4, {"plugin.tp_size=2", "plugin.zero_stage=2"}}, {4, zero3}, "dp2·tp2 zero_stage 2 -> zero_stage 3");
  const std::vector<std::string> gemini{"plugin=gemini", "plugin.precision=\"fp32\""};
  check_resume({4, zero3}, {2, gemini}, "dp2·tp2 zero_stage 3 -> gemini 2 ranks");
  check_resume({2, gemini}, {4, zero3}, "gemini 2 ranks -> dp2·tp2 zero_stage 3");
  const std::vector<std::string> zero3_pp{"plugin.pp_size=2", "plugin.zero_stage=3", "plugin.num_microbatches=2"};
  check_resume({4, zero3_pp}, {4, zero3}, "dp2·pp2 zero_stage 3 -> dp2·tp2 zero_stage 3");
  check_resume({1, {"plugin=torch_ddp"}}, {4, zero3_pp}, "torch_ddp 1 rank -> dp2·pp2 zero_stage 3");
}

// A tp2 model's safetensors file, read by Python's torch (the header parsed by hand: the image has
// no safetensors package), equals the reference's dense tensors (the vocabulary padding dropped).
TEST(HybridParallel, CheckpointTensor2ModelReadByPythonTorch) {
  TempDir dir;
  expect_all_ok(run_hybrid(2, {"out=" + dir.path(), "steps=1", "batch=8", "optimizer=adamw",
                               "set=plugin.tp_size=2", "set=plugin.precision=fp32"}));
  const Reference ref = reference_lm(1, 8, "adamw");
  booster::checkpoint::StateDict want;
  for (const auto& [name, t] : ref.params) want.emplace_back(name, t);
  booster::checkpoint::SaveOptions bin;
  bin.use_safetensors = false;
  booster::checkpoint::save_state_dict(dir.file("reference"), want, bin);  // pytorch_model.bin: torch.load
  if (std::system((std::string(BOOSTER_PYTHON) + " -c 'import torch' 2>/dev/null").c_str()) != 0) {
    expect_model_close(dir.file("model"), ref, kAtol, kRtol, "tp2 model (no Python torch: read in C++)");
    return;
  }
  const std::string script = R"PY(
import json, struct, sys, torch
path, ref_path = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
dtypes = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "I64": torch.int64}
got = {}
for name, info in header.items():
    if name == "__metadata__":
        continue
    begin, end = info["data_offsets"]
    raw = bytearray(data[8 + n + begin:8 + n + end])
    got[name] = torch.frombuffer(raw, dtype=dtypes[info["dtype"]]).reshape(info["shape"])
ref = torch.load(ref_path)
assert sorted(got) == sorted(ref), (sorted(got), sorted(ref))
worst = 0.0
for name, t in ref.items():
    assert got[name].shape == t.shape, (name, got[name].shape, t.shape)
    assert torch.allclose(got[name].float(), t, rtol=1e-4, atol=1e-5), name
    worst = max(worst, (got[name].float() - t).abs().max().item())
print("python torch", torch.__version__, "read", len(got), "tensors; wte.weight", list(got["wte.weight"].shape),
      "; max |diff|", worst)
)PY";
  {
    std::ofstream(dir.file("check.py")) << script;
  }
  const std::string cmd = std::string(BOOSTER_PYTHON) + " " + dir.file("check.py") + " " +
                          dir.file("model/model.safetensors") + " " + dir.file("reference/pytorch_model.bin") +
                          " > " + dir.file("python.txt") + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string out = read_file(dir.file("python.txt"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("wte.weight [37, 16]"), std::string::npos) << out;
  std::cout << "[ python   ] " << out;
}

// pp = 1: the model directory is byte for byte the default CheckpointIO's (torch_ddp) for the same
// weights (the untrained model: tp2 gathers it exactly).
TEST(HybridParallel, CheckpointTensor2ModelFilesEqualTorchDdps) {
  TempDir hybrid, ddp;
  expect_all_ok(run_hybrid(2, {"out=" + hybrid.path(), "steps=0", "set=plugin.tp_size=2", "set=plugin.precision=fp32"}));
  expect_all_ok(run_hybrid(1, {"out=" + ddp.path(), "steps=0", "plugin=torch_ddp"}));
  const std::string a = read_file(hybrid.file("model/model.safetensors")), b = read_file(ddp.file("model/model.safetensors"));
  EXPECT_GT(a.size(), 1000u);
  EXPECT_TRUE(a == b) << a.size() << " vs " << b.size() << " bytes";
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(hybrid.file("model")), {}), 1);
}

// A checkpoint whose tensor has the wrong shape: every rank throws a CheckpointError naming it, and
// the model is unchanged (it then equals the initial model).
TEST(HybridParallel, CheckpointWrongShapeIsRefusedAndModelUnchanged) {
  TempDir dir, bad;
  const Reference initial = reference_lm(0, 8, "adamw");
  booster::checkpoint::StateDict state;
  for (const auto& [name, t] : initial.params)
    state.emplace_back(name, name == "h.1.fc.weight" ? t.narrow(0, 0, 63).contiguous() : t + 1);
  booster::checkpoint::save_state_dict(bad.file("model"), state, {});
  expect_all_ok(run_hybrid(4, {"out=" + dir.path(), "steps=0", "batch=8", "optimizer=adamw", "bad_load=" + bad.path(),
                               "set=plugin.tp_size=2", "set=plugin.pp_size=2", "set=plugin.num_microbatches=4",
                               "set=plugin.precision=fp32"}));
  for (int r = 0; r < 4; ++r) {
    const std::string err = read_file(dir.file("rank" + std::to_string(r) + ".err"));
    EXPECT_NE(err.find("h.1.fc.weight: shape [63, 16] in the checkpoint, [64, 16] in the model"), std::string::npos)
        << "rank " << r << ": " << err;
    if (r == 0) std::cout << "[ error    ] " << err;
  }
  expect_model_close(dir.file("model"), initial, 0, 0, "model after the refused load (must be the initial one)");
}

}  // namespace
}  // namespace booster::testing
