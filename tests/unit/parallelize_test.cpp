// parallelize_test.cpp — booster::parallel::parallelize (booster/parallel/parallelize.h) on 2 ranks as
// threads: hybrid_common.h's TinyLM built dense and parallelized by a plan equals the TinyLM built
// with the tp context from the start — the same shards (bit for bit), specs, loss and gradients —
// and its loss equals the dense model's in one process (1e-5: sums in another order); the plan's
// errors leave the model unchanged.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <string>
#include <vector>

#include "booster/parallel/parallelize.h"
#include "common/thread_ranks.h"
#include "dist/hybrid_common.h"

namespace parallelize_test {

using booster::parallel::colwise;
using booster::parallel::parallelize;
using booster::parallel::rowwise;
using booster::parallel::vocab_parallel;
using booster::testing::kLayers;
using booster::testing::run_thread_ranks;
using booster::testing::TinyLM;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

const booster::parallel::ParallelizePlan kPlan{
    {"h.*.fc", colwise()}, {"h.*.proj", rowwise()}, {"wte", vocab_parallel()}};

// Built with seed 7 (the ranks are threads of one process: one global generator, so one at a time).
TinyLM build(const booster::nn::TensorParallelContext& context) {
  static std::mutex rng;
  std::lock_guard<std::mutex> lock(rng);
  torch::manual_seed(7);
  return TinyLM(context);
}

TEST(Parallelize, ADenseModelParallelizedByAPlanEqualsOneBuiltSharded) {
  const auto data = booster::testing::make_token_batches(1, 4, 11);
  const booster::nn::TensorParallelContext dense;
  TinyLM reference = build(dense);
  const double dense_loss =
      booster::testing::tiny_lm_loss(reference->forward(data.tokens[0]), data.targets[0], dense).item<double>();
  auto errors = run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    booster::nn::TensorParallelContext tp;
    tp.group = group;
    TinyLM planned = build(dense);
    const auto done = parallelize(*planned, tp, kPlan);
    EXPECT_EQ(done.size(), static_cast<size_t>(2 * kLayers + 1));
    EXPECT_EQ(done.front(), "wte");
    TinyLM built = build(tp);
    auto a = planned->named_parameters(), b = built->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].key(), b[i].key());
      EXPECT_TRUE(torch::equal(a[i].value(), b[i].value())) << a[i].key();
      const auto sa = booster::nn::tensor_parallel_spec(a[i].value()), sb = booster::nn::tensor_parallel_spec(b[i].value());
      ASSERT_EQ(sa.has_value(), sb.has_value()) << a[i].key();
      if (sa) {
        EXPECT_EQ(sa->dim, sb->dim);
        EXPECT_EQ(sa->full_size, sb->full_size);
        EXPECT_EQ(sa->padded_size, sb->padded_size);
        EXPECT_EQ(sa->tp_rank, sb->tp_rank);
      }
    }
    auto la = booster::testing::tiny_lm_loss(planned->forward(data.tokens[0]), data.targets[0], tp);
    auto lb = booster::testing::tiny_lm_loss(built->forward(data.tokens[0]), data.targets[0], tp);
    la.backward();
    lb.backward();
    EXPECT_EQ(la.item<double>(), lb.item<double>());
    EXPECT_NEAR(la.item<double>(), dense_loss, 1e-5);
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_TRUE(torch::equal(a[i].value().grad(), b[i].value().grad())) << a[i].key();
    // Applying the plan again: the layers are sharded already.
    EXPECT_THAT([&] { parallelize(*planned, tp, kPlan); },
                ThrowsMessage<std::logic_error>(HasSubstr("' is already sharded over a tp group")));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

TEST(Parallelize, BadPlansAreClearErrorsAndChangeNothing) {
  auto errors = run_thread_ranks(2, [&](const std::shared_ptr<booster::dist::ProcessGroup>& group) {
    booster::nn::TensorParallelContext tp;
    tp.group = group;
    TinyLM net = build({});
    const at::Tensor before = net->h[0]->as<booster::testing::TinyBlock>()->fc->weight.clone();
    auto unchanged = [&] {
      EXPECT_TRUE(torch::equal(net->h[0]->as<booster::testing::TinyBlock>()->fc->weight, before));
      EXPECT_EQ(net->h[0]->as<booster::testing::TinyBlock>()->fc->group, nullptr);
    };
    EXPECT_THAT([&] { parallelize(*net, tp, {{"h.*.fc", colwise()}, {"h.*.mlp", rowwise()}}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("the pattern 'h.*.mlp' matches no sub-module")));
    unchanged();
    EXPECT_THAT([&] { parallelize(*net, tp, {{"h.*.fc", colwise()}, {"h.*.ln", colwise()}}); },
                ThrowsMessage<std::invalid_argument>(AllOf(HasSubstr("module 'h.0.ln'"), HasSubstr("cannot be colwise"))));
    unchanged();
    EXPECT_THAT([&] { parallelize(*net, tp, {{"h.*.fc", colwise()}, {"h.0.fc", colwise()}}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("'h.0.fc' is matched by both 'h.*.fc' and 'h.0.fc'")));
    unchanged();
    EXPECT_THAT([&] { parallelize(*net, tp, {{"h.*.fc", rowwise()}}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("cannot be rowwise")));
    unchanged();
    booster::nn::ColumnParallelLinear odd(booster::nn::LinearParallelOptions(4, 3));
    torch::nn::Sequential seq(odd);
    EXPECT_THAT([&] { parallelize(*seq, tp, {{"0", colwise()}}); },
                ThrowsMessage<std::invalid_argument>(HasSubstr("out_features = 3 is not divisible by the tp size 2")));
    EXPECT_EQ(odd->weight.size(0), 3);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

}  // namespace parallelize_test
