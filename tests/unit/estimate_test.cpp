// estimate_test.cpp — the memory estimate (booster/estimate.h, core/memory_estimate.h): the model
// description, one measured iteration (activations, optimizer state per parameter), each in-tree
// plugin's rows against the ZeRO paper's model-state formulas, the table over every installed plugin
// (third-party ones without an estimate listed, broken ones reported), and the `booster estimate`
// command with its errors. The comparison with measured RSS is the memory benchmark's
// (docs/benchmarks.md, "Estimate against measurement") and EstimateMode.* in the dist tests.
#include "booster/estimate.h"

#include "booster/auto_select.h"
#include "booster/booster.h"
#include "booster/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <map>
#include <string>

#include "booster/dist/process_group.h"
#include "booster/nn/pipeline.h"
#include "booster/nn/unit.h"
#include "booster/plugin_loader.h"
#include "common/test_util.h"
#include "common/tensor_test_util.h"

namespace bt = booster::testing;
using booster::EstimateRequest;
using booster::MemoryEstimate;
using ::testing::HasSubstr;

namespace {

using booster::testing::world_of_one;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", booster::nn::Unit<torch::nn::Linear>(10, 20));
    b = register_module("b", booster::nn::Unit<torch::nn::Linear>(20, 5));
    bn = register_module("bn", torch::nn::BatchNorm1d(5));
    head = register_module("head", torch::nn::Linear(5, 3));
  }
  torch::Tensor forward(torch::Tensor x) { return head(bn(b(torch::relu(a(x))))); }
  booster::nn::Unit<torch::nn::Linear> a{nullptr}, b{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

// Every installed plugin's rows for `r`, by "plugin: configuration".
std::map<std::string, MemoryEstimate> rows_of(const EstimateRequest& r) {
  std::map<std::string, MemoryEstimate> out;
  for (auto& e : booster::estimate_installed_plugins(r, world_of_one()).rows) out[e.plugin + ": " + e.configuration] = e;
  return out;
}

}  // namespace

TEST(Estimate, DescribeModelCountsParametersUnitsBuffersAndOptimizerState) {
  Net net;
  const int64_t a = 10 * 20 + 20, b = 20 * 5 + 5, bn = 5 + 5, head = 5 * 3 + 3;
  auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-3));
  EstimateRequest r = booster::describe_model(*net, adamw.get());
  EXPECT_EQ(r.parameters, a + b + bn + head);
  EXPECT_EQ(r.largest_parameter, 200);
  EXPECT_EQ(r.units, 2);
  EXPECT_EQ(r.largest_unit, a);
  EXPECT_EQ(r.layers, 0);
  EXPECT_EQ(r.buffer_bytes, (5 + 5) * 4 + 8);  // running mean, var (fp32), num_batches_tracked (int64)
  EXPECT_EQ(r.optimizer_state_bytes_per_parameter, 8);

  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_EQ(booster::describe_model(*net, &sgd).optimizer_state_bytes_per_parameter, 4);
  torch::optim::SGD plain(net->parameters(), torch::optim::SGDOptions(0.1));
  EXPECT_EQ(booster::describe_model(*net, &plain).optimizer_state_bytes_per_parameter, 0);
  torch::optim::Adam ams(net->parameters(), torch::optim::AdamOptions(1e-3).amsgrad(true));
  EXPECT_EQ(booster::describe_model(*net, &ams).optimizer_state_bytes_per_parameter, 12);
  torch::nn::Linear dense(4, 4);  // no Unit: the whole model is one unit
  EXPECT_EQ(booster::describe_model(*dense, nullptr).largest_unit, 20);
}

TEST(Estimate, MeasureIterationCountsActivationsAndTheOptimizerStateOfOneStep) {
  torch::manual_seed(0);
  torch::nn::Sequential mlp(torch::nn::Linear(256, 256), torch::nn::ReLU(), torch::nn::Linear(256, 256));
  auto x = torch::randn({64, 256});
  auto y = torch::randn({64, 256});
  torch::optim::AdamW adamw(mlp->parameters(), torch::optim::AdamWOptions(1e-3));
  auto m = booster::measure_iteration(*mlp, &adamw, [&] { return torch::mse_loss(mlp->forward(x), y); });
  const int64_t params = 2 * (256 * 256 + 256);
  EXPECT_EQ(m.gradient_bytes, params * 4);
  // Activations saved for backward: ReLU's output (also the second Linear's input) and the second
  // Linear's output (mse_loss's input), 64 x 256 fp32 = 64 KiB each (measured: exactly these plus the
  // 4-byte loss); at most a few backward temporaries more; never the 514 KiB of gradients.
  const int64_t one = 64 * 256 * 4;
  EXPECT_GE(m.activation_bytes, 2 * one);
  EXPECT_LE(m.activation_bytes, 4 * one);
  EXPECT_DOUBLE_EQ(m.optimizer_state_bytes_per_parameter, 8.0);  // exp_avg + exp_avg_sq, fp32

  torch::optim::SGD sgd(mlp->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  auto s = booster::measure_iteration(*mlp, &sgd, [&] { return torch::mse_loss(mlp->forward(x), y); });
  EXPECT_DOUBLE_EQ(s.optimizer_state_bytes_per_parameter, 4.0);  // momentum_buffer
  EXPECT_THROW(booster::measure_iteration(*mlp, nullptr, [&] { return mlp->forward(x); }), std::invalid_argument);
}

TEST(Estimate, InTreePluginsGiveTheZeroPaperModelStates) {
  EstimateRequest r;
  const int64_t P = 1 << 22, N = 4;
  r.parameters = P;
  r.largest_parameter = P / 4;
  r.largest_unit = P / 4;
  r.units = 4;
  r.world_size = N;
  r.optimizer_state_bytes_per_parameter = 8;
  auto rows = rows_of(r);
  auto states = [&](const std::string& key) {
    EXPECT_TRUE(rows.count(key)) << key;
    return rows[key].states.model_states();
  };
  EXPECT_EQ(states("torch_ddp: gradient_as_bucket_view = false (default)"), 16 * P);
  EXPECT_EQ(rows["torch_ddp: gradient_as_bucket_view = false (default)"].states.communication_buffers, 4 * P);
  EXPECT_EQ(rows["torch_ddp: gradient_as_bucket_view = true"].states.communication_buffers, 0);
  EXPECT_EQ(states("low_level_zero: stage = 1, precision = \"fp32\""), 8 * P + 8 * P / N);
  EXPECT_EQ(states("low_level_zero: stage = 2, precision = \"fp32\""), 4 * P + 12 * P / N);
  // ZeRO's backward: the largest gradient as autograd made it (4 * P/4), stage 2's buckets in flight
  // (capped at the model: 4P), and the in-place reduce-scatter's receive buffers, N - 1 peers' parts
  // of this rank's 4P/N range. The step (fp32 gradient copy + AdamW's two temporaries on the shard,
  // 12P/N = 3P) is below both.
  EXPECT_EQ(rows["low_level_zero: stage = 2, precision = \"fp32\""].transient, 4 * P + 4 * (P / 4) + (N - 1) * 4 * (P / N));
  EXPECT_EQ(rows["low_level_zero: stage = 1, precision = \"fp32\""].transient, 4 * (P / 4) + (N - 1) * 4 * (P / N));
  EXPECT_EQ(states("torch_fsdp: sharding_strategy = \"FULL_SHARD\""), 16 * P / N);
  EXPECT_EQ(states("torch_fsdp: sharding_strategy = \"HYBRID_SHARD\", shard_group_size = 2"), 16 * P / 2);
  // FULL_SHARD's iteration: two units gathered + two full-size gradients of the unit in backward.
  EXPECT_EQ(rows["torch_fsdp: sharding_strategy = \"FULL_SHARD\""].transient, 2 * 4 * (P / 4) + 2 * 4 * (P / 4));
  EXPECT_EQ(rows["torch_fsdp: sharding_strategy = \"FULL_SHARD\""].communication_volume, 3);
  // Gemini below 32 Mi elements: one chunk kept gathered, the fp32 master apart from the parameters.
  EXPECT_EQ(states("gemini: precision = \"fp32\""), 4 * P + 4 * P / N + 4 * P / N + 8 * P / N);
  EXPECT_EQ(rows["gemini: precision = \"fp32\", offload_optim_frac = 1, offload_dir = (a directory)"]
                .states.model_states(),
            4 * P + 4 * P / N);
  // No PipelineModule: tensor-parallel meshes only; neither data parallel nor a pipeline (auto never
  // picks them).
  ASSERT_TRUE(rows.count("hybrid_parallel: tp_size = 2, pp_size = 1, zero_stage = 0, precision = \"fp32\""));
  EXPECT_FALSE(rows.count("hybrid_parallel: tp_size = 1, pp_size = 2, zero_stage = 0, precision = \"fp32\""));
  EXPECT_FALSE(rows["hybrid_parallel: tp_size = 2, pp_size = 1, zero_stage = 0, precision = \"fp32\""].data_parallel);
  EXPECT_FALSE(rows["hybrid_parallel: tp_size = 2, pp_size = 1, zero_stage = 0, precision = \"fp32\""].pipeline);
  // Gemini on a model under its minimum chunk: also rows in chunks of an eighth of it, at least its
  // largest parameter (here P/4 = 1 Mi elements), with the options that select that size; with the
  // optimizer side on disk it needs less than FULL_SHARD.
  const std::string chunked = "gemini: precision = \"fp32\", chunks of " + std::to_string(P / 4) +
                              " elements (min_chunk_size_m=1)";
  ASSERT_TRUE(rows.count(chunked));
  EXPECT_THAT(rows[chunked].options, ::testing::Contains("search_range_m=0"));
  EXPECT_EQ(states(chunked), 4 * P / N + 4 * P / N + 4 * P / N + 8 * P / N);
  EXPECT_LT(rows[chunked + ", offload_optim_frac = 1, offload_dir = (a directory)"].total(),
            rows["torch_fsdp: sharding_strategy = \"FULL_SHARD\""].total());
  EXPECT_EQ(states("hybrid_parallel: tp_size = 2, pp_size = 1, zero_stage = 0, precision = \"fp32\""), 16 * P / 2);

  r.precision = "bf16";
  r.layers = 8;
  auto bf16 = rows_of(r);
  EXPECT_EQ(bf16["low_level_zero: stage = 2, precision = \"bf16\""].states.model_states(), 2 * P + 14 * P / N);
  EXPECT_EQ(bf16["low_level_zero: stage = 1, precision = \"bf16\""].states.model_states(), 4 * P + 12 * P / N);
  const std::string pp4 = "hybrid_parallel: tp_size = 1, pp_size = 4, zero_stage = 0, precision = \"bf16\"";
  ASSERT_TRUE(bf16.count(pp4));
  EXPECT_TRUE(bf16[pp4].pipeline);  // no tensor parallelism: auto may pick it, after the data-parallel rows
  EXPECT_FALSE(bf16[pp4].data_parallel);
  // A stage holds the parameters of its layers: bf16 weights and gradients, fp32 master and Adam.
  EXPECT_EQ(bf16[pp4].states.model_states(), 16 * (P / 4));
  // With the layers' sizes known, the largest stage of the uniform partition counts: 8 layers, the
  // first holding half of Ψ, so stage 0 (layers 0 and 1) holds P/2 + P/14.
  r.layer_parameters = {P / 2, P / 14, P / 14, P / 14, P / 14, P / 14, P / 14, P / 14};
  EXPECT_EQ(rows_of(r)[pp4].states.model_states(), 16 * (P / 2 + P / 14));
  // pp_style = "zbv" beside it: 8 stages of one layer, rank r holding layers r and 7 - r, so rank 0
  // holds P/2 + P/14 as well; activations counted as 1F1B's; its options select the schedule.
  const std::string zbv4 = "hybrid_parallel: tp_size = 1, pp_size = 4, pp_style = \"zbv\", num_model_chunks = 2, "
                           "zero_stage = 0, precision = \"bf16\"";
  r.activation_bytes = 4 << 20;
  auto with_layers = rows_of(r);
  ASSERT_TRUE(with_layers.count(zbv4));
  EXPECT_EQ(with_layers[zbv4].states.model_states(), 16 * (P / 2 + P / 14));
  EXPECT_EQ(with_layers[zbv4].activations, (4 << 20) / 4);
  EXPECT_EQ(with_layers[zbv4].activations, with_layers[pp4].activations);
  EXPECT_TRUE(with_layers[zbv4].pipeline);
  EXPECT_THAT(with_layers[zbv4].options, ::testing::IsSupersetOf({std::string("pp_style=\"zbv\""),
                                                                   std::string("num_model_chunks=2"),
                                                                   std::string("num_microbatches=8")}));
  // Without 2 * pp layers there is no zbv row (8 layers: pp 4 has one, pp 5 cannot).
  r.world_size = 5;
  EXPECT_TRUE(rows_of(r).count("hybrid_parallel: tp_size = 1, pp_size = 5, zero_stage = 0, precision = \"bf16\""));
  EXPECT_FALSE(rows_of(r).count("hybrid_parallel: tp_size = 1, pp_size = 5, pp_style = \"zbv\", num_model_chunks = 2, "
                                "zero_stage = 0, precision = \"bf16\""));
  r.world_size = N;
  EXPECT_EQ(bf16["torch_ddp: gradient_as_bucket_view = true"].states.model_states(), 16 * P);  // autocast: fp32 weights
}

// Sequence parallelism in hybrid_parallel's rows (Korthikanti et al. 2022 without the attention-score
// term): tp alone keeps 10 of the 34 activation units whole, split_gather shards them all over tp,
// all_to_all everything over sp (then as tp alone over tp). Model states are those of the same tp;
// all_to_all's ZeRO-1 shards over dp x sp. None is data parallel (auto never picks them).
TEST(Estimate, SequenceParallelRowsShardTheActivations) {
  EstimateRequest r;
  const int64_t P = 1 << 20, A = 340 << 20;
  r.parameters = P;
  r.largest_parameter = P / 4;
  r.largest_unit = P / 4;
  r.world_size = 4;
  r.activation_bytes = A;
  auto rows = rows_of(r);
  const std::string tp2 = "hybrid_parallel: tp_size = 2, pp_size = 1, zero_stage = 0, precision = \"fp32\"";
  const std::string sg = tp2 + ", sequence_parallelism_mode = \"split_gather\"";
  const std::string a2a = "hybrid_parallel: tp_size = 1, pp_size = 1, zero_stage = 1, precision = \"fp32\", "
                          "sequence_parallelism_mode = \"all_to_all\", sp_size = 4";
  const std::string a2a_tp = "hybrid_parallel: tp_size = 2, pp_size = 1, zero_stage = 0, precision = \"fp32\", "
                             "sequence_parallelism_mode = \"all_to_all\", sp_size = 2";
  for (const auto& key : {tp2, sg, a2a, a2a_tp}) ASSERT_TRUE(rows.count(key)) << key;
  EXPECT_EQ(rows[tp2].activations, A / 34 * 22);  // (10 + 24 / 2) / 34
  EXPECT_EQ(rows[sg].activations, A / 2);
  EXPECT_EQ(rows[a2a].activations, A / 4);
  EXPECT_EQ(rows[a2a_tp].activations, A / 34 * 11);  // (10 + 12) / 34 / 2
  EXPECT_EQ(rows[sg].states.model_states(), rows[tp2].states.model_states());
  EXPECT_EQ(rows[a2a].states.model_states(), 8 * P + 8 * P / 4);  // ZeRO-1 over dp x sp = 4, as low_level_zero
  EXPECT_THAT(rows[sg].options, ::testing::IsSupersetOf({std::string("enable_sequence_parallelism=true"),
                                                         std::string("sequence_parallelism_mode=\"split_gather\"")}));
  EXPECT_THAT(rows[a2a].options, ::testing::Contains("sp_size=4"));
  for (const auto& key : {sg, a2a, a2a_tp}) {
    EXPECT_FALSE(rows[key].data_parallel) << key;
    EXPECT_FALSE(rows[key].pipeline) << key;
  }
}

namespace {
// A PipelineModule of four shard units: Ψ = 544 + 1056 + 1056 + 132 = 2788 elements.
struct FourUnitPipelineImpl : torch::nn::Module, booster::nn::PipelineModule {
  FourUnitPipelineImpl() {
    const int64_t sizes[] = {16, 32, 32, 32, 4};
    for (int i = 0; i < 4; ++i)
      l.push_back(register_module("l" + std::to_string(i), booster::nn::Unit<torch::nn::Linear>(sizes[i], sizes[i + 1])));
  }
  std::vector<booster::nn::PipelineLayer> pipeline_layers() override {
    std::vector<booster::nn::PipelineLayer> out;
    for (size_t i = 0; i < l.size(); ++i)
      out.push_back({"l" + std::to_string(i), {l[i].ptr()}, [m = l[i].ptr()](const torch::Tensor& x) { return m->forward(x); }});
    return out;
  }
  std::vector<booster::nn::Unit<torch::nn::Linear>> l;
};
TORCH_MODULE(FourUnitPipeline);
}  // namespace

// hybrid_parallel's zero_stage 2 and 3 rows: present exactly where the plugin accepts the
// configuration (not with pp > 1 for 2, not at dp = 1; split_gather included), their
// numbers the ZeRO-2 and FSDP FULL_SHARD formulas written out for a real model on 4 ranks with AdamW
// (8 bytes of state per element): tp 2 holds 1394 elements (shard 697 over dp 2), pp 2 the stage
// of layers 0-1 (1600, shard 800), all_to_all sp 2 all 2788 (shard 697 over dp x sp = 4).
TEST(Estimate, HybridZeroStage2And3RowsFollowTheZeroFormulas) {
  FourUnitPipeline net;
  auto adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-3));
  EstimateRequest r = booster::describe_model(*net, adamw.get());
  ASSERT_EQ(r.parameters, 2788);
  ASSERT_EQ(r.largest_unit, 1056);
  ASSERT_EQ(r.layer_parameters, (std::vector<int64_t>{544, 1056, 1056, 132}));
  r.world_size = 4;
  auto rows = rows_of(r);
  const std::string h = "hybrid_parallel: ";
  const std::string tp2 = h + "tp_size = 2, pp_size = 1, zero_stage = ", pp2 = h + "tp_size = 1, pp_size = 2, ";
  const std::string fp32 = ", precision = \"fp32\"", a2a = ", sequence_parallelism_mode = \"all_to_all\", sp_size = 2";
  const std::string sg = ", sequence_parallelism_mode = \"split_gather\"";
  for (const std::string& key : {tp2 + "2" + fp32, tp2 + "3" + fp32, tp2 + "2" + fp32 + a2a, tp2 + "3" + fp32 + a2a,
                                 pp2 + "zero_stage = 3" + fp32, pp2 + "pp_style = \"zbv\", num_model_chunks = 2, zero_stage = 3" + fp32,
                                 h + "tp_size = 1, pp_size = 1, zero_stage = 2" + fp32 + a2a,
                                 h + "tp_size = 1, pp_size = 1, zero_stage = 3" + fp32 + a2a, tp2 + "1" + fp32 + sg,
                                 tp2 + "2" + fp32 + sg, tp2 + "3" + fp32 + sg})
    EXPECT_TRUE(rows.count(key)) << key;
  for (const std::string& key : {pp2 + "zero_stage = 2" + fp32, pp2 + "pp_style = \"zbv\", num_model_chunks = 2, zero_stage = 2" + fp32,
                                 h + "tp_size = 4, pp_size = 1, zero_stage = 2" + fp32,  // dp = 1
                                 h + "tp_size = 1, pp_size = 4, zero_stage = 3" + fp32,
                                 h + "tp_size = 2, pp_size = 2, zero_stage = 3" + fp32})
    EXPECT_FALSE(rows.count(key)) << key;

  // ZeRO-2 over dp 2 at tp 2: weights 4 · 1394, gradient and Adam shards 4 · 697 and 8 · 697; backward:
  // the buckets in flight (capped at the 1394 elements), the largest gradient (512 = 1024 / tp) and
  // one peer's part of this rank's range; the step's fp32 gradient copy + two temporaries on the shard.
  const MemoryEstimate& z2 = rows[tp2 + "2" + fp32];
  EXPECT_EQ(z2.states.parameters, 4 * 1394);
  EXPECT_EQ(z2.states.gradients, 4 * 697);
  EXPECT_EQ(z2.states.master_weights, 0);
  EXPECT_EQ(z2.states.optimizer_states, 8 * 697);
  EXPECT_EQ(z2.transient, std::max<int64_t>(4 * 1394 + 4 * 512 + 4 * 697, 4 * 697 + 2 * 4 * 697));
  EXPECT_DOUBLE_EQ(z2.communication_volume, 2.0 * 1394 / 2788);
  EXPECT_THAT(z2.options, ::testing::IsSupersetOf({std::string("tp_size=2"), std::string("zero_stage=2")}));
  // FULL_SHARD over dp 2 at tp 2: 16 bytes per shard element; two units of 1056 / 2 gathered and
  // two fp32 gradients of one; 3Ψ of the rank's part.
  const MemoryEstimate& z3 = rows[tp2 + "3" + fp32];
  EXPECT_EQ(z3.states.model_states(), 16 * 697);
  EXPECT_EQ(z3.states.parameters, 4 * 697);
  EXPECT_EQ(z3.transient, 2 * 528 * 4 + 2 * 4 * 528);
  EXPECT_DOUBLE_EQ(z3.communication_volume, 3.0 * 1394 / 2788);
  EXPECT_THAT(z3.options, ::testing::Contains("zero_stage=3"));
  // A pipeline stage (pp 2, dp 2): the stage of 1600 stays gathered through the schedule and its
  // gradients accumulate (4 · 1600 each) beside the fp32 flat gradient of the largest unit (1056).
  const MemoryEstimate& z3pp = rows[pp2 + "zero_stage = 3" + fp32];
  EXPECT_EQ(z3pp.states.model_states(), 16 * 800);
  EXPECT_EQ(z3pp.transient, 4 * 1600 + 4 * 1600 + 4 * 1056);
  EXPECT_DOUBLE_EQ(z3pp.communication_volume, (2.0 * 2 + 1) * 1600 / 2788);  // 2 micro-batches, units regathered
  EXPECT_TRUE(z3pp.pipeline);
  EXPECT_THAT(z3pp.options, ::testing::IsSupersetOf({std::string("zero_stage=3"), std::string("num_microbatches=2")}));
  // zbv: rank 1 holds the V's stages 1 and 2 (2112 elements), sharded over dp 2.
  EXPECT_EQ(rows[pp2 + "pp_style = \"zbv\", num_model_chunks = 2, zero_stage = 3" + fp32].states.model_states(), 16 * 1056);
  // all_to_all sp 2 without tp: ZeRO over dp x sp = 4 ranks of the whole model.
  EXPECT_EQ(rows[h + "tp_size = 1, pp_size = 1, zero_stage = 2" + fp32 + a2a].states.model_states(), 4 * 2788 + 12 * 697);
  EXPECT_EQ(rows[h + "tp_size = 1, pp_size = 1, zero_stage = 3" + fp32 + a2a].states.model_states(), 16 * 697);

  // bf16: ZeRO-2 keeps bf16 weights and gradient shards with fp32 master shards; zero_stage 3 keeps
  // fp32 shards and gathers in bf16.
  r.precision = "bf16";
  auto bf16 = rows_of(r);
  const std::string bf = ", precision = \"bf16\"";
  const MemoryEstimate& b2 = bf16[tp2 + "2" + bf];
  EXPECT_EQ(b2.states.parameters, 2 * 1394);
  EXPECT_EQ(b2.states.gradients, 2 * 697);
  EXPECT_EQ(b2.states.master_weights, 4 * 697);
  EXPECT_EQ(bf16[tp2 + "3" + bf].states.model_states(), 16 * 697);
  EXPECT_EQ(bf16[tp2 + "3" + bf].transient, 2 * 528 * 2 + 2 * 4 * 528);
  EXPECT_EQ(bf16[pp2 + "zero_stage = 3" + bf].transient, 2 * 1600 + 2 * 1600 + 4 * 1056);
}

TEST(Estimate, TheTableListsPluginsWithoutAnEstimateAndThoseThatFail) {
  bt::ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_TEST_PLUGIN_DIR);
  EstimateRequest r;
  r.parameters = r.largest_unit = r.largest_parameter = 1000;
  r.world_size = 2;
  auto table = booster::estimate_installed_plugins(r, world_of_one());
  EXPECT_THAT(table.without_estimate, ::testing::Contains("test_minimal"));
  std::string failed;
  for (const auto& f : table.failed) failed += f + "\n";
  EXPECT_THAT(failed, HasSubstr("test_bad_abi: "));
  EXPECT_THAT(failed, HasSubstr("ABI version 999"));
  EXPECT_FALSE(table.rows.empty());  // the in-tree plugins, found next to this executable
  std::string text = booster::format_estimate_table(r, table, 100 << 20, 1 << 30);
  EXPECT_THAT(text, HasSubstr("test_minimal: the plugin reports no estimate"));
  EXPECT_THAT(text, HasSubstr("not estimated: test_bad_abi"));
  EXPECT_THAT(text, HasSubstr("fits in 1024.0"));
}

// Booster::estimate: every installed plugin's rows for a real model at estimate_world_size ranks,
// measured on the data loader's first batch, returned as a report (nothing printed; the process goes
// on, so exiting is the trainer's choice); boost() refuses to train a run that asked for the
// estimate, naming estimate().
TEST(Estimate, BoosterEstimateReturnsTheReportAndBoostRefusesAnEstimateRun) {
  bt::ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  env.unset("RANK");
  env.unset("WORLD_SIZE");
  booster::Booster booster(booster::Config::from_string(
      "[booster]\nplugin = \"torch_ddp\"\nestimate = true\nestimate_world_size = 4\n", "estimate.toml"));
  EXPECT_TRUE(booster.estimate_requested());
  torch::manual_seed(1);
  Net net;
  auto optimizer = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-3));
  auto data = std::make_shared<booster::data::TensorDataset>(torch::randn({16, 10}), torch::randint(0, 3, {16}));
  auto loader = booster.prepare_dataloader(data, 8, /*shuffle=*/false, 0, /*drop_last=*/true);
  booster::Criterion ce = [](const torch::Tensor& out, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(out, target);
  };
  const booster::EstimateReport report = booster.estimate(net.ptr(), optimizer, ce, loader);
  EXPECT_EQ(report.request.world_size, 4);
  EXPECT_GT(report.request.activation_bytes, 0) << "measured on the first batch";
  EXPECT_EQ(report.request.parameters, 10 * 20 + 20 + 20 * 5 + 5 + 5 + 5 + 5 * 3 + 3);
  bool ddp = false;
  for (const auto& row : report.table.rows) ddp = ddp || row.plugin == "torch_ddp";
  EXPECT_TRUE(ddp) << "the in-tree plugins' rows";
  EXPECT_THAT(report.text, HasSubstr("activations measured on the data loader's first batch"));
  EXPECT_THAT(report.text, HasSubstr("torch_ddp"));
  EXPECT_THAT([&] { booster.boost(net.ptr(), optimizer, ce, loader); },
              ::testing::ThrowsMessage<booster::ConfigError>(
                  ::testing::AllOf(HasSubstr("estimate = true"), HasSubstr("booster.estimate("))));
}

TEST(EstimateCommand, PrintsEveryPluginAndRejectsBadInput) {
  auto ok = bt::run_process({BOOSTER_CLI_PATH, "estimate", "--params", "51.4M", "--units", "4", "--world_size", "4",
                             "--memory_mb", "1000"});
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_THAT(ok.output, HasSubstr("for 51400000 parameters, 4 ranks, fp32"));
  for (const char* plugin : {"torch_ddp", "low_level_zero", "torch_fsdp", "gemini", "hybrid_parallel"})
    EXPECT_THAT(ok.output, HasSubstr(std::string("\n") + plugin + " ")) << plugin;
  EXPECT_THAT(ok.output, HasSubstr("fits in 1000.0"));
  EXPECT_THAT(ok.output, HasSubstr("  no  "));   // DDP's 16Ψ = 784 MiB + runtime does not fit in 1000 MiB
  EXPECT_THAT(ok.output, HasSubstr("  yes  "));  // FSDP's 16Ψ/4 does

  auto bad = bt::run_process({BOOSTER_CLI_PATH, "estimate", "--params", "lots"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_THAT(bad.output, HasSubstr("'lots' is not a count"));
  auto big = bt::run_process({BOOSTER_CLI_PATH, "estimate", "--params", "1000", "--largest_unit", "2000"});
  EXPECT_EQ(big.exit_code, 2);
  EXPECT_THAT(big.output, HasSubstr("cannot exceed --params"));
  auto missing = bt::run_process({BOOSTER_CLI_PATH, "estimate"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.output, HasSubstr("--params is required"));
  // Activations from a transformer's shape, with recomputation (core/activation_estimate.h): sbh =
  // 2^21 elements, so full = 24 · 2sbh + sbh(34 + 5as/h) bytes = 96 + 388 MiB, none = 24 · 388 MiB.
  auto shape = bt::run_process({BOOSTER_CLI_PATH, "estimate", "--params", "300M", "--precision", "bf16",
                                "--num_layers", "24", "--hidden_size", "1024", "--num_heads", "16", "--seq_length",
                                "2048", "--micro_batch_size", "1", "--activation_checkpointing", "full"});
  ASSERT_EQ(shape.exit_code, 0) << shape.output;
  EXPECT_THAT(shape.output, HasSubstr("activations: 484.0 MiB from the shape (Korthikanti et al. 2022; 24 layers"));
  EXPECT_THAT(shape.output, HasSubstr("9312.0 MiB without recomputation"));
  EXPECT_THAT(shape.output, HasSubstr(" 484.0 "));  // in the rows' activations column
  auto both = bt::run_process({BOOSTER_CLI_PATH, "estimate", "--params", "1M", "--activation_mb", "3", "--num_layers", "2"});
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_THAT(both.output, HasSubstr("give either --activation_mb or the transformer's shape"));
  auto alone = bt::run_process({BOOSTER_CLI_PATH, "estimate", "--params", "1M", "--activation_checkpointing", "full"});
  EXPECT_EQ(alone.exit_code, 2);
  EXPECT_THAT(alone.output, HasSubstr("give the transformer's shape too"));
}

namespace {
MemoryEstimate row(const std::string& plugin, const std::string& configuration, double volume, int64_t total,
                   std::vector<std::string> options = {}, bool data_parallel = true) {
  MemoryEstimate e;
  e.plugin = plugin;
  e.configuration = configuration;
  e.communication_volume = volume;
  e.states.parameters = total;  // total() = model states here
  e.options = std::move(options);
  e.data_parallel = data_parallel;
  return e;
}

std::string chosen(const std::vector<MemoryEstimate>& rows, int64_t budget, const std::string& dir = "") {
  auto s = booster::select_auto_configuration(rows, 10, budget, dir);  // runtime 10 bytes added to every row
  return s.chosen.plugin + " " + s.chosen.configuration;
}
}  // namespace

// A pipeline mesh (hybrid_parallel, tp_size = 1) comes after every data-parallel row, whatever its
// volume: it is chosen only when no data-parallel configuration fits, and never once the data was
// sharded over the world before boost().
TEST(AutoSelect, PipelineMeshesOnlyWhenNoDataParallelConfigurationFits) {
  MemoryEstimate pp2 = row("hybrid_parallel", "pp 2", 0, 30, {"pp_size=2"}, /*data_parallel=*/false);
  pp2.pipeline = true;
  std::vector<MemoryEstimate> rows{pp2, row("torch_fsdp", "FULL_SHARD", 3, 60), row("torch_ddp", "default", 2, 100),
                                   row("hybrid_parallel", "tp 2", 1, 5, {}, /*data_parallel=*/false)};
  EXPECT_EQ(chosen(rows, 1000), "torch_ddp default");
  EXPECT_EQ(chosen(rows, 70), "torch_fsdp FULL_SHARD");
  EXPECT_EQ(chosen(rows, 69), "hybrid_parallel pp 2");
  auto s = booster::select_auto_configuration(rows, 10, 1000, "");
  std::string reasons;
  for (const auto& r : s.reasons) reasons += r + "\n";
  EXPECT_THAT(reasons, HasSubstr("hybrid_parallel (pp 2): needs 0.0 MiB (40 bytes), 0Ψ per step, fits, not needed"));
  EXPECT_THAT(reasons, HasSubstr("hybrid_parallel (tp 2): not considered (the model must be built for its mesh)"));
  auto sharded = booster::select_auto_configuration(rows, 10, 1000, "", /*allow_pipeline=*/false);
  reasons.clear();
  for (const auto& r : sharded.reasons) reasons += r + "\n";
  EXPECT_THAT(reasons, HasSubstr("hybrid_parallel (pp 2): not considered (data was sharded over the world before boost()"));
  EXPECT_THROW(booster::select_auto_configuration(rows, 10, 69, "", false), booster::ConfigError);
}

TEST(AutoSelect, LeastCommunicationThatFitsThenTheSimplerPlugin) {
  // Listed in no particular order: the selection sorts by volume, then plugin order, then row order.
  std::vector<MemoryEstimate> rows{
      row("torch_fsdp", "FULL_SHARD", 3, 40),
      row("gemini", "offload", 3, 30, {"precision=\"fp32\"", "offload_dir=\"\""}),
      row("hybrid_parallel", "tp 2", 1, 5, {}, /*data_parallel=*/false),
      row("low_level_zero", "stage 1", 2, 60),
      row("torch_ddp", "default", 2, 100),
      row("torch_ddp", "view", 2, 80),
      row("low_level_zero", "stage 2", 2, 50),
  };
  EXPECT_EQ(chosen(rows, 1000), "torch_ddp default");
  EXPECT_EQ(chosen(rows, 110), "torch_ddp default");  // 100 + runtime 10: exactly the budget fits
  EXPECT_EQ(chosen(rows, 109), "torch_ddp view");
  EXPECT_EQ(chosen(rows, 89), "low_level_zero stage 1");
  EXPECT_EQ(chosen(rows, 69), "low_level_zero stage 2");
  EXPECT_EQ(chosen(rows, 59), "torch_fsdp FULL_SHARD");  // 3Ψ only when no 2Ψ configuration fits
  auto offload = booster::select_auto_configuration(rows, 10, 49, "/data/x\"y");
  EXPECT_EQ(offload.chosen.plugin, "gemini");
  EXPECT_THAT(offload.chosen.options, ::testing::Contains("offload_dir=\"/data/x\\\"y\""));
  std::string reasons;
  for (const auto& r : offload.reasons) reasons += r + "\n";
  EXPECT_THAT(reasons, HasSubstr("hybrid_parallel (tp 2): not considered (the model must be built for its mesh)"));
  EXPECT_THAT(reasons, HasSubstr("torch_ddp (default): needs 0.0 MiB (110 bytes), 2Ψ per step, does not fit"));
  EXPECT_THAT(reasons, HasSubstr("gemini (offload): needs 0.0 MiB (40 bytes), 3Ψ per step, fits: chosen"));
  try {
    chosen(rows, 49);  // Gemini's offload row needs a directory
    ADD_FAILURE() << "nothing fits, yet a choice was made";
  } catch (const booster::ConfigError& e) {
    EXPECT_THAT(e.what(), HasSubstr("no configuration fits in 0.0 MiB per rank; the smallest need is 0.0 MiB "
                                    "(torch_fsdp: FULL_SHARD)"));
    EXPECT_THAT(e.what(), HasSubstr("set auto.offload_dir"));
  }
  EXPECT_THROW(chosen({row("hybrid_parallel", "tp 2", 1, 5, {}, false)}, 1000), booster::ConfigError);
}

// [auto] communication_dtype: only the configurations that can send the dtype compete, and the
// chosen one carries the option.
TEST(AutoSelect, CommunicationDtypeKeepsThePluginsThatCanSendIt) {
  MemoryEstimate pp2 = row("hybrid_parallel", "pp 2", 0, 30, {"pp_size=2"}, /*data_parallel=*/false);
  pp2.pipeline = true;
  const std::vector<MemoryEstimate> rows{pp2,
                                         row("torch_fsdp", "FULL_SHARD", 3, 40),
                                         row("gemini", "chunks", 3, 35),
                                         row("low_level_zero", "stage 2", 2, 50),
                                         row("torch_ddp", "default", 2, 100),
                                         row("torch_ddp", "view", 2, 80, {"gradient_as_bucket_view=true"})};
  auto names = [](const std::vector<MemoryEstimate>& rs) {
    std::string s;
    for (const auto& r : rs) s += r.plugin + " (" + r.configuration + ");";
    return s;
  };
  const auto fp8 = booster::rows_for_communication_dtype(rows, "fp8");
  EXPECT_EQ(names(fp8), "torch_fsdp (FULL_SHARD, communication_dtype = \"fp8\");"
                        "gemini (chunks, communication_dtype = \"fp8\");"
                        "low_level_zero (stage 2, communication_dtype = \"fp8\");"
                        "torch_ddp (default, communication_dtype = \"fp8\");"
                        "torch_ddp (view, communication_dtype = \"fp8\");");
  for (const auto& r : fp8) EXPECT_THAT(r.options, ::testing::Contains("communication_dtype=\"fp8\""));
  const auto bf16 = booster::rows_for_communication_dtype(rows, "bf16");
  EXPECT_EQ(names(bf16), "low_level_zero (stage 2, communication_dtype = \"bf16\");"
                         "torch_ddp (default, communication_dtype = \"bf16\");");
  EXPECT_EQ(booster::select_auto_configuration(bf16, 10, 1000, "").chosen.options.back(), "communication_dtype=\"bf16\"");
  EXPECT_EQ(booster::rows_for_communication_dtype(rows, "").size(), rows.size());
  EXPECT_THROW(booster::rows_for_communication_dtype(rows, "fp16"), std::invalid_argument);
}

// resolve_auto: the configuration auto chooses, before a training Booster exists, as a printable
// Config; a Booster built from it (over the same explicitly launched world) runs that plugin, the
// same one boost() under auto attaches; a named plugin refuses resolve_auto.
TEST(AutoSelect, ResolveAutoGivesThePrintableConfigThatBoostChooses) {
  bt::ScopedEnv env;
  env.set("BOOSTER_PLUGIN_PATH", BOOSTER_PLUGIN_DIR);
  env.unset("RANK");
  env.unset("WORLD_SIZE");
  const booster::Config config = booster::Config::from_string(
      "[booster]\nplugin = \"auto\"\n[auto]\nmemory_budget_mb = 4096\nruntime_mb = 0\n", "auto.toml");
  std::vector<std::string> no_args;
  auto world = booster::launch_from_config(config, no_args);
  torch::manual_seed(1);
  Net net;
  auto optimizer = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(1e-3));
  booster::Booster probe(config, world);
  EXPECT_EQ(&probe.world(), world.get()) << "the Booster takes the world it is given";
  const booster::Config chosen = probe.resolve_auto(*net, optimizer.get());
  const std::string plugin = chosen.section("booster").get_string("plugin", "");
  EXPECT_NE(plugin, "auto");
  EXPECT_FALSE(plugin.empty());
  EXPECT_THAT(chosen.to_toml(), HasSubstr("plugin = '" + plugin + "'"));
  EXPECT_THAT(chosen.to_toml(), ::testing::Not(HasSubstr("[auto]")));
  EXPECT_EQ(config.section("booster").get_string("plugin", ""), "auto") << "the Config given stays as it was";

  booster::Booster trained(chosen, world);
  EXPECT_EQ(trained.plugin().name(), plugin);
  booster::Booster automatic(config, world);
  torch::manual_seed(1);
  Net net2;
  auto optimizer2 = std::make_shared<torch::optim::AdamW>(net2->parameters(), torch::optim::AdamWOptions(1e-3));
  automatic.boost(net2.ptr(), optimizer2);
  EXPECT_EQ(automatic.plugin().name(), plugin) << "boost() under auto chooses the same";

  booster::Booster named(booster::Config::from_string("[booster]\nplugin = \"torch_ddp\"\n", "ddp.toml"), world);
  EXPECT_THAT([&] { named.resolve_auto(*net, optimizer.get()); },
              ::testing::ThrowsMessage<booster::ConfigError>(HasSubstr("booster.plugin = \"auto\"")));
}
