// parallel_pipeline_test.cpp — booster::parallel::pipeline (booster/parallel/pipeline.h) used without a
// plugin, on ranks as threads: the dense TinyLM (tests/dist/hybrid_common.h; tied embedding and head,
// so the embedding is shared by the first and the last stage) split over pp = 2 on a (dp, pp) mesh,
// one training step of 4 micro-batches with SGD, against the same step in one process on the whole
// batch: the loss on the last stage, and every parameter each rank holds after
// sum_shared_gradients() (and, with dp = 2, averaging over dp by hand) and the step, within 1e-5
// absolute + 1e-4 relative (sums in another order). Also the stage maps and the errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "booster/dist/process_mesh.h"
#include "booster/parallel/pipeline.h"
#include "common/thread_ranks.h"
#include "dist/hybrid_common.h"

namespace parallel_pipeline_test {

using booster::testing::kLayers;
using booster::testing::make_token_batches;
using booster::testing::run_thread_ranks;
using booster::testing::TinyLM;
using ::testing::HasSubstr;

constexpr double kLr = 0.1;

// The reference: one SGD step of the dense model on the whole batch; its loss and parameters.
std::pair<double, std::map<std::string, at::Tensor>> reference_step(const at::Tensor& x, const at::Tensor& y) {
  const booster::nn::TensorParallelContext dense;
  torch::manual_seed(7);
  TinyLM net(dense);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(kLr));
  auto loss = booster::testing::tiny_lm_loss(net->forward(x), y, dense);
  loss.backward();
  sgd.step();
  std::map<std::string, at::Tensor> params;
  for (const auto& item : net->named_parameters()) params[item.key()] = item.value().detach().clone();
  return {loss.item<double>(), params};
}

void check_pipeline_step(int dp, const booster::parallel::PipelineOptions& options) {
  const int world = 2 * dp;
  const auto data = make_token_batches(1, 8, 11);
  const auto [want_loss, want] = reference_step(data.tokens[0], data.targets[0]);
  auto errors = run_thread_ranks(world, [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    booster::dist::ProcessMesh mesh(group, {{"dp", dp}, {"pp", 2}});
    const booster::nn::TensorParallelContext dense;
    TinyLM net{nullptr};
    {
      static std::mutex rng;  // the ranks are threads of one process: one global generator
      std::lock_guard<std::mutex> lock(rng);
      torch::manual_seed(7);
      net = TinyLM(dense);
    }
    auto stage = booster::parallel::pipeline(*net, mesh, "pp", options);
    // The maps cover the whole model; this rank holds its stage's tensors only.
    EXPECT_EQ(stage->held().size(), net->named_parameters().size() + net->named_buffers().size());
    int held = 0;
    for (const auto& [name, h] : stage->held()) held += h;
    EXPECT_GT(held, 0);
    EXPECT_LT(held, static_cast<int>(stage->held().size()));
    EXPECT_EQ(stage->shared().size(), options.pp_style == "zbv" ? 0u : 1u);  // zbv: head and embedding on rank 0
    const int64_t rows = 8 / dp, row0 = mesh.coordinate("dp") * rows;
    booster::parallel::PipelineRunOptions run;
    run.microbatches = 4 / dp;
    auto out = stage->run(data.tokens[0].narrow(0, row0, rows), data.targets[0].narrow(0, row0, rows),
                          booster::testing::tiny_lm_criterion(dense), run);
    stage->sum_shared_gradients();
    std::vector<at::Tensor> params;
    for (const auto& item : net->named_parameters())
      if (stage->held().at(item.key())) params.push_back(item.value());
    {
      at::NoGradGuard no_grad;
      for (auto& p : params) {
        ASSERT_TRUE(p.grad().defined());
        mesh.group("dp")->allreduce(p.mutable_grad(), booster::dist::ReduceOp::AVG).wait();
        p.sub_(p.grad() * kLr);
      }
    }
    EXPECT_EQ(out.is_last_stage, stage->is_last_stage());
    if (out.is_last_stage) {
      at::Tensor loss = out.loss.detach().clone();
      mesh.group("dp")->allreduce(loss, booster::dist::ReduceOp::AVG).wait();
      EXPECT_NEAR(loss.item<double>(), want_loss, 1e-5);
    }
    for (const auto& item : net->named_parameters()) {
      if (!stage->held().at(item.key())) {
        EXPECT_EQ(item.value().numel(), 0) << item.key() << " belongs to another stage: released";
        continue;
      }
      EXPECT_TRUE(torch::allclose(item.value(), want.at(item.key()), 1e-4, 1e-5)) << item.key();
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(world, ""));
}

TEST(ParallelPipeline, OneFOneBOnTwoStagesEqualsOneProcess) { check_pipeline_step(1, {}); }

TEST(ParallelPipeline, DataTimesPipelineAndZeroBubbleVEqualOneProcess) {
  check_pipeline_step(2, {});
  booster::parallel::PipelineOptions zbv;
  zbv.pp_style = "zbv";
  zbv.num_model_chunks = 2;
  check_pipeline_step(1, zbv);
}

TEST(ParallelPipeline, ModelsThatCannotBeSplitAreClearErrors) {
  auto errors = run_thread_ranks(2, [](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    booster::dist::ProcessMesh mesh(group, {{"pp", 2}});
    torch::nn::Linear plain(4, 4);
    EXPECT_THAT([&] { booster::parallel::pipeline(*plain, mesh, "pp", {}); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("does not derive from booster::nn::PipelineModule")));
    const booster::nn::TensorParallelContext dense;
    TinyLM net(dense, 1);  // 3 pipeline layers
    booster::parallel::PipelineOptions two_chunks;
    two_chunks.pp_style = "interleaved";
    two_chunks.num_model_chunks = 2;
    EXPECT_THAT([&] { booster::parallel::pipeline(*net, mesh, "pp", two_chunks); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("fewer than")));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

}  // namespace parallel_pipeline_test
