// flat_param_test.cpp — FlatParameter (booster/core/flat_param.h) on 2 and 4 ranks as threads:
// the shard layout with padding, the storage really freed when sharded and restored by the
// all-gather, gradients unchanged when storage is freed after forward and refilled before backward,
// and reduce_gradients giving each rank its shard of the averaged gradient (also split in two
// halves with the reduce-scatter in flight).
#include "booster/core/flat_param.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "common/thread_ranks.h"

namespace {

using booster::FlatParameter;
using Group = std::shared_ptr<booster::dist::ProcessGroup>;

// A two-layer block with values from a formula (the global RNG is shared by the rank threads);
// 5*3 + 5 + 2*5 = 30 elements (padded to 32 on 4 ranks).
struct Block {
  at::Tensor w1 = (at::sin(at::arange(15, at::kFloat)) * 0.5).reshape({5, 3}).requires_grad_();
  at::Tensor b1 = (at::cos(at::arange(5, at::kFloat)) * 0.1).requires_grad_();
  at::Tensor w2 = (at::sin(at::arange(10, at::kFloat) * 0.7)).reshape({2, 5}).requires_grad_();
  std::vector<std::pair<std::string, at::Tensor>> named() { return {{"w1", w1}, {"b1", b1}, {"w2", w2}}; }
  at::Tensor loss(int rank) {
    at::Tensor x = at::linspace(-1, 1, 12).reshape({4, 3}) * (rank + 1);
    return at::tanh(at::linear(x, w1, b1)).matmul(w2.t()).pow(2).sum();
  }
};

// The block's flattened values / gradients, padded to `padded` elements.
at::Tensor flat_of(const std::vector<at::Tensor>& ts, int64_t padded) {
  std::vector<at::Tensor> parts;
  for (const auto& t : ts) parts.push_back(t.detach().reshape({-1}));
  at::Tensor flat = at::cat(parts);
  return at::cat({flat, at::zeros({padded - flat.numel()})});
}

TEST(FlatParameter, ShardsWithPaddingAndFreesTheFullStorage) {
  const auto errors = booster::testing::run_thread_ranks(4, [](const Group& g) {
    Block b;
    const at::Tensor want = flat_of({b.w1, b.b1, b.w2}, 32);  // w1, b1, w2, padding
    FlatParameter fp(b.named(), g);
    EXPECT_EQ(fp.layout().numel, 30);
    EXPECT_EQ(fp.layout().padded_numel, 32);
    EXPECT_EQ(fp.layout().shard_numel, 8);
    EXPECT_EQ(fp.state(), FlatParameter::State::kSharded);
    EXPECT_EQ(fp.unsharded_storage_bytes(), 0);
    EXPECT_TRUE(at::equal(fp.local_shard(), want.narrow(0, 8 * g->rank(), 8)));
    fp.unshard();
    EXPECT_EQ(fp.unsharded_storage_bytes(), 32 * 4);
    Block fresh;
    EXPECT_TRUE(at::equal(b.w1, fresh.w1));  // every view sees the gathered values
    EXPECT_TRUE(at::equal(b.b1, fresh.b1));
    EXPECT_TRUE(at::equal(b.w2, fresh.w2));
    EXPECT_TRUE(b.w1.requires_grad());
    fp.reshard();
    EXPECT_EQ(fp.unsharded_storage_bytes(), 0);
    // An update of the shard is what the next unshard gathers.
    fp.local_shard().add_(1.0);
    fp.unshard();
    EXPECT_TRUE(at::equal(b.w1, fresh.w1 + 1));
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
}

TEST(FlatParameter, FreeingAfterForwardAndRefillingBeforeBackwardKeepsGradients) {
  Block ref;
  ref.loss(0).backward();
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) {
    Block b;
    FlatParameter fp(b.named(), g);
    fp.unshard();
    at::Tensor loss = b.loss(0);  // autograd saves views of the flat storage
    fp.reshard();                 // freed between forward and backward, as FSDP does
    EXPECT_EQ(fp.unsharded_storage_bytes(), 0);
    fp.unshard();
    loss.backward();
    EXPECT_TRUE(at::equal(b.w1.grad(), ref.w1.grad()));
    EXPECT_TRUE(at::equal(b.b1.grad(), ref.b1.grad()));
    EXPECT_TRUE(at::equal(b.w2.grad(), ref.w2.grad()));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

// The mean over 4 ranks of the block's flattened gradients ([32], padded), computed without any group.
at::Tensor mean_flat_gradient() {
  std::vector<at::Tensor> per_rank;
  for (int r = 0; r < 4; ++r) {
    Block b;
    b.loss(r).backward();
    per_rank.push_back(flat_of({b.w1.grad(), b.b1.grad(), b.w2.grad()}, 32));
  }
  return at::stack(per_rank).mean(0);
}

TEST(FlatParameter, ReduceGradientsGivesEachRankItsShardOfTheMean) {
  const at::Tensor mean = mean_flat_gradient();
  const auto errors = booster::testing::run_thread_ranks(4, [&](const Group& g) {
    Block b;
    FlatParameter fp(b.named(), g);
    for (int step = 1; step <= 2; ++step) {                   // the shard's gradient accumulates
      fp.unshard();
      b.loss(g->rank()).backward();
      fp.reduce_gradients();
      EXPECT_FALSE(b.w1.grad().defined()) << "parameter gradients are released";
      fp.reshard();
      const at::Tensor want = mean.narrow(0, 8 * g->rank(), 8) * step;
      EXPECT_TRUE(at::allclose(fp.local_grad(), want, 1e-6, 1e-6))
          << "step " << step << " max |diff| " << (fp.local_grad() - want).abs().max().item<double>();
    }
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
}

// The split reduction (FSDP2's reduce-scatter in flight): reduce_gradients_async releases the
// parameters' gradients and leaves local_grad() untouched until finish_reduce(); a second
// reduce_gradients_async finishes the first. The result is reduce_gradients'.
TEST(FlatParameter, AsyncReductionFinishesIntoTheShardOfTheMean) {
  const at::Tensor mean = mean_flat_gradient();
  const auto errors = booster::testing::run_thread_ranks(4, [&](const Group& g) {
    Block b;
    FlatParameter fp(b.named(), g);
    fp.unshard();
    b.loss(g->rank()).backward();
    fp.reduce_gradients_async();
    EXPECT_TRUE(fp.reduce_in_flight());
    EXPECT_FALSE(b.w1.grad().defined()) << "parameter gradients are released when packed";
    EXPECT_FALSE(fp.local_grad().defined()) << "nothing is added before finish_reduce";
    b.loss(g->rank()).backward();
    fp.reduce_gradients_async();  // finishes the first, starts the second
    EXPECT_TRUE(fp.local_grad().defined());
    const at::Tensor shard = mean.narrow(0, 8 * g->rank(), 8);
    EXPECT_TRUE(at::allclose(fp.local_grad(), shard, 1e-6, 1e-6));
    fp.finish_reduce();
    EXPECT_FALSE(fp.reduce_in_flight());
    fp.finish_reduce();  // none in flight: no-op
    EXPECT_TRUE(at::allclose(fp.local_grad(), shard * 2, 1e-6, 1e-6))
        << "max |diff| " << (fp.local_grad() - shard * 2).abs().max().item<double>();
    fp.reshard();
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
}

// Mixed precision (FSDP MixedPrecision): the gathered parameters are bf16, the shard stays fp32 and
// is what gather_full returns; gradients are reduced in fp32 into an fp32 shard gradient.
TEST(FlatParameter, ComputeDtypeGathersBf16FromAnFp32Shard) {
  std::vector<at::Tensor> per_rank;
  for (int r = 0; r < 2; ++r) {
    Block b;
    b.w1.set_data(b.w1.to(at::kBFloat16));
    b.b1.set_data(b.b1.to(at::kBFloat16));
    b.w2.set_data(b.w2.to(at::kBFloat16));
    at::Tensor x = at::linspace(-1, 1, 12).reshape({4, 3}) * (r + 1);
    at::tanh(at::linear(x.to(at::kBFloat16), b.w1, b.b1)).matmul(b.w2.t()).pow(2).sum().backward();
    per_rank.push_back(flat_of({b.w1.grad().to(at::kFloat), b.b1.grad().to(at::kFloat), b.w2.grad().to(at::kFloat)}, 30));
  }
  const at::Tensor mean = at::stack(per_rank).mean(0);
  const auto errors = booster::testing::run_thread_ranks(2, [&](const Group& g) {
    Block b;
    const at::Tensor exact = flat_of({b.w1, b.b1, b.w2}, 30);
    booster::FlatParameterOptions o;
    o.compute_dtype = at::kBFloat16;
    o.reduce_dtype = at::kFloat;
    FlatParameter fp(b.named(), g, o);
    EXPECT_EQ(b.w1.scalar_type(), at::kBFloat16);
    EXPECT_EQ(fp.local_shard().scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(fp.local_shard(), exact.narrow(0, 15 * g->rank(), 15)));  // not rounded
    fp.unshard();
    EXPECT_EQ(fp.unsharded_storage_bytes(), 30 * 2);
    EXPECT_TRUE(at::equal(b.b1, Block().b1.to(at::kBFloat16)));
    at::Tensor x = at::linspace(-1, 1, 12).reshape({4, 3}) * (g->rank() + 1);
    at::tanh(at::linear(x.to(at::kBFloat16), b.w1, b.b1)).matmul(b.w2.t()).pow(2).sum().backward();
    fp.reduce_gradients();
    EXPECT_EQ(fp.local_grad().scalar_type(), at::kFloat);
    EXPECT_TRUE(at::allclose(fp.local_grad(), mean.narrow(0, 15 * g->rank(), 15), 1e-6, 1e-6));
    EXPECT_TRUE(at::equal(fp.gather_full(), exact));
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

// HYBRID_SHARD on 4 ranks: shards inside {0,1} and {2,3}, replicas across them; the shard gradient
// is the mean over all 4 ranks. NO_SHARD: a group of one rank aliases the shard to the flat buffer.
TEST(FlatParameter, ReplicateGroupAveragesAcrossReplicasAndNoShardAliases) {
  std::vector<at::Tensor> per_rank;
  for (int r = 0; r < 4; ++r) {
    Block b;
    b.loss(r).backward();
    per_rank.push_back(flat_of({b.w1.grad(), b.b1.grad(), b.w2.grad()}, 30));
  }
  const at::Tensor mean = at::stack(per_rank).mean(0);
  const auto errors = booster::testing::run_thread_ranks(4, [&](const Group& g) {
    Group shard = g->split(g->rank() / 2, g->rank());
    Group replicate = g->split(g->rank() % 2, g->rank());
    Group self = g->split(g->rank(), 0);
    Block b;
    booster::FlatParameterOptions o;
    o.replicate_group = replicate;
    FlatParameter fp(b.named(), shard, o);
    fp.unshard_async();
    EXPECT_TRUE(fp.unshard_in_flight());
    fp.unshard();
    EXPECT_FALSE(fp.unshard_in_flight());
    EXPECT_TRUE(at::equal(b.w2, Block().w2));
    b.loss(g->rank()).backward();
    fp.reduce_gradients();
    EXPECT_TRUE(at::allclose(fp.local_grad(), mean.narrow(0, 15 * shard->rank(), 15), 1e-6, 1e-6));

    Block c;
    booster::FlatParameterOptions all;
    all.replicate_group = g;
    FlatParameter alone(c.named(), self, all);
    EXPECT_TRUE(alone.is_aliased());
    alone.reshard();
    EXPECT_EQ(alone.state(), FlatParameter::State::kUnsharded);
    EXPECT_EQ(alone.unsharded_storage_bytes(), 30 * 4);
    c.loss(g->rank()).backward();
    alone.reduce_gradients();
    EXPECT_TRUE(at::allclose(alone.local_grad(), mean, 1e-6, 1e-6));
    alone.local_shard().add_(1.0);  // the shard is the parameters' storage
    EXPECT_TRUE(at::equal(c.b1, Block().b1 + 1));
    // load_full replaces the values from a full (unpadded) buffer.
    alone.load_full(at::zeros({30}));
    EXPECT_EQ(c.w1.abs().sum().item<float>(), 0.0f);
  });
  EXPECT_EQ(errors, std::vector<std::string>(4, ""));
}

TEST(FlatParameter, RejectsBadParameterLists) {
  const auto errors = booster::testing::run_thread_ranks(1, [](const Group& g) {
    at::Tensor a = at::ones({2}).requires_grad_();
    EXPECT_THROW(FlatParameter({}, g), std::invalid_argument);
    EXPECT_THROW(FlatParameter({{"a", a}, {"tied", a}}, g), std::invalid_argument);
    EXPECT_THROW(FlatParameter({{"a", a}, {"d", at::ones({2}, at::kDouble)}}, g), std::invalid_argument);
    EXPECT_THROW(FlatParameter({{"a", a}}, nullptr), std::invalid_argument);
  });
  EXPECT_EQ(errors, std::vector<std::string>(1, ""));
}

}  // namespace
