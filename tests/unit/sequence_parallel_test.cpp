// sequence_parallel_test.cpp — booster/nn/sequence_parallel.h on 2 and 4 ranks as threads (real Gloo
// groups): the gather / reduce-scatter along the sequence and Ulysses' all-to-all against the same
// tensors cut and summed here (forward exactly; backward the conjugate operation, exactly), and a
// Megatron-SP block (ColumnParallelLinear -> GELU -> RowParallelLinear in split_gather mode) against
// the dense block: outputs, input gradients, and weight gradients within float32 rounding (rtol 1e-5,
// atol 1e-6); the replicated bias's per-shard gradients sum to the dense one. Also sequence_shard's
// error naming T and sp_size, and the sp-averaged loss.
#include "booster/nn/sequence_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>
#include <string>
#include <vector>

#include "booster/dist/process_group.h"
#include "common/thread_ranks.h"

namespace sequence_parallel_test {

using namespace booster::nn;
using booster::testing::run_thread_ranks;
using SpTestGroup = std::shared_ptr<booster::dist::ProcessGroup>;

at::Tensor data(at::IntArrayRef shape, uint64_t seed) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed));
}

void expect_close(const at::Tensor& a, const at::Tensor& e, const std::string& what, double rtol = 1e-5,
                  double atol = 1e-6) {
  ASSERT_EQ(a.sizes(), e.sizes()) << what;
  EXPECT_TRUE(at::allclose(a.detach(), e.detach(), rtol, atol))
      << what << ": max |diff| " << (a.detach() - e.detach()).abs().max().item<double>();
}

std::mutex& build_mutex() {
  static std::mutex m;
  return m;
}

TEST(SequenceParallel, GatherAndReduceScatterAlongTheSequenceAreConjugateOn2And4Ranks) {
  for (int world : {2, 4}) {
    auto errors = run_thread_ranks(world, [world](const SpTestGroup& g) {
      const int r = g->rank();
      // Every rank's full tensor [2, 4 * world, 3]; rank r's shard is chunk r along dim 1.
      std::vector<at::Tensor> full;
      for (int p = 0; p < world; ++p) full.push_back(data({2, 4 * world, 3}, 100 + p));
      at::Tensor shard = full[r].chunk(world, 1)[r].clone().requires_grad_(true);
      at::Tensor gathered = gather_sequence(shard, g, 1);
      std::vector<at::Tensor> shards;
      for (int p = 0; p < world; ++p) shards.push_back(full[p].chunk(world, 1)[p]);
      EXPECT_TRUE(at::equal(gathered, at::cat(shards, 1))) << "gather forward";
      // backward of the gather: the sum over ranks of their upstream gradients, chunk r.
      std::vector<at::Tensor> ups;
      for (int p = 0; p < world; ++p) ups.push_back(data({2, 4 * world, 3}, 200 + p));
      gathered.backward(ups[r]);
      at::Tensor sum = ups[0].clone();
      for (int p = 1; p < world; ++p) sum += ups[p];
      expect_close(shard.grad(), sum.chunk(world, 1)[r], "gather backward");

      at::Tensor x = full[r].clone().requires_grad_(true);
      at::Tensor scattered = reduce_scatter_sequence(x, g, 1);
      at::Tensor total = full[0].clone();
      for (int p = 1; p < world; ++p) total += full[p];
      expect_close(scattered, total.chunk(world, 1)[r], "reduce-scatter forward");
      std::vector<at::Tensor> small;
      for (int p = 0; p < world; ++p) small.push_back(data({2, 4, 3}, 300 + p));
      scattered.backward(small[r]);
      EXPECT_TRUE(at::equal(x.grad(), at::cat(small, 1))) << "reduce-scatter backward";
    });
    EXPECT_EQ(errors, std::vector<std::string>(world, "")) << world << " ranks";
  }
}

TEST(SequenceParallel, AllToAllTradesSequenceShardsForHeadShardsAndBack) {
  const int world = 4;
  auto errors = run_thread_ranks(world, [](const SpTestGroup& g) {
    const int r = g->rank();
    // The full activation [B=2, T=8, H=4, D=3]; rank r holds positions [2r, 2r + 2).
    at::Tensor full = data({2, 8, 4, 3}, 7);
    at::Tensor shard = full.narrow(1, 2 * r, 2).clone().requires_grad_(true);
    at::Tensor heads = sequence_all_to_all(shard, g, 2, 1);  // [2, 8, 1, 3]: every position, head r
    EXPECT_TRUE(at::equal(heads, full.narrow(2, r, 1))) << "sequence -> heads";
    at::Tensor back = sequence_all_to_all(heads, g, 1, 2);
    EXPECT_TRUE(at::equal(back, shard.detach())) << "heads -> sequence";
    // Backward of the first exchange: the upstream gradient exchanged back.
    at::Tensor up_full = data({2, 8, 4, 3}, 9);
    heads.backward(up_full.narrow(2, r, 1).contiguous());
    EXPECT_TRUE(at::equal(shard.grad(), up_full.narrow(1, 2 * r, 2))) << "backward";
    // bf16 travels through the same exchange.
    at::Tensor h16 = sequence_all_to_all(full.narrow(1, 2 * r, 2).to(at::kBFloat16), g, 2, 1);
    EXPECT_TRUE(at::equal(h16, full.narrow(2, r, 1).to(at::kBFloat16))) << "bf16";
  });
  EXPECT_EQ(errors, booster::testing::kNoErrors);
}

// Megatron-SP's block: y = x + Row(gelu(Column(x))) on [B, T/tp, C] shards equals the dense block on
// [B, T, C] (outputs and input gradients per shard, weight gradients per slice); the replicated
// RowParallelLinear bias gets its shard's part (the parts sum to the dense gradient).
TEST(SequenceParallel, SplitGatherBlockMatchesTheDenseBlockOn2And4Ranks) {
  const int64_t B = 2, T = 8, C = 8;
  at::Tensor x_full = data({B, T, C}, 21), up = data({B, T, C}, 22);
  torch::Tensor dense_y, dense_gx, dense_w1, dense_w2, dense_b2;
  {
    torch::manual_seed(3);
    ColumnParallelLinear fc(C, 4 * C);
    RowParallelLinear proj(4 * C, C);
    at::Tensor x = x_full.clone().requires_grad_(true);
    dense_y = x + proj(torch::gelu(fc(x)));
    dense_y.backward(up);
    dense_gx = x.grad();
    dense_w1 = fc->weight.grad();
    dense_w2 = proj->weight.grad();
    dense_b2 = proj->bias.grad();
  }
  for (int world : {2, 4}) {
    std::vector<at::Tensor> bias_parts(world);
    auto errors = run_thread_ranks(world, [&, world](const SpTestGroup& g) {
      const int r = g->rank();
      ColumnParallelLinear fc{nullptr};
      RowParallelLinear proj{nullptr};
      {
        std::lock_guard<std::mutex> lock(build_mutex());
        torch::manual_seed(3);
        TensorParallelContext split_gather;  // the mode from the context (fc) or from the option (proj)
        split_gather.group = g;
        split_gather.sequence_parallel = SequenceParallelMode::kSplitGather;
        fc = ColumnParallelLinear(LinearParallelOptions(C, 4 * C).context(split_gather));
        proj = RowParallelLinear(LinearParallelOptions(4 * C, C).group(g).sequence_parallel(true));
      }
      EXPECT_TRUE(fc->sequence_parallel && proj->sequence_parallel);
      const int64_t t = T / world;
      at::Tensor x = x_full.narrow(1, r * t, t).clone().requires_grad_(true);
      at::Tensor y = x + proj(torch::gelu(fc(x)));
      expect_close(y, dense_y.narrow(1, r * t, t), "output");
      y.backward(up.narrow(1, r * t, t).contiguous());
      expect_close(x.grad(), dense_gx.narrow(1, r * t, t), "input gradient");
      expect_close(fc->weight.grad(), dense_w1.chunk(world, 0)[r], "column weight gradient");
      expect_close(proj->weight.grad(), dense_w2.chunk(world, 1)[r], "row weight gradient");
      bias_parts[r] = proj->bias.grad().clone();
      // A sequence the group does not divide: the error names T and sp_size before any communication.
      at::Tensor odd = at::zeros({B, 2 * world + 1, 4 * C / world});
      EXPECT_THROW(
          {
            try {
              proj(odd);
            } catch (const std::invalid_argument& e) {
              EXPECT_THAT(e.what(), ::testing::HasSubstr("is not divisible by sp_size = " + std::to_string(world)));
              throw;
            }
          },
          std::invalid_argument);
    });
    EXPECT_EQ(errors, std::vector<std::string>(world, "")) << world << " ranks";
    at::Tensor sum = bias_parts[0].clone();
    for (int p = 1; p < world; ++p) sum += bias_parts[p];
    expect_close(sum, dense_b2, "bias gradient summed over the shards");
  }
}

TEST(SequenceParallel, ShardAndLossFollowTheContext) {
  EXPECT_EQ(sequence_shard(7, TensorParallelContext{}).length, 7);  // default context: the whole sequence
  auto errors = run_thread_ranks(2, [](const SpTestGroup& g) {
    TensorParallelContext c;
    c.sequence_parallel = SequenceParallelMode::kAllToAll;
    c.sp_group = g;
    const SequenceShard s = sequence_shard(6, c);
    EXPECT_EQ(s.offset, 3 * g->rank());
    EXPECT_EQ(s.length, 3);
    at::Tensor ids = at::arange(12).view({2, 6});
    EXPECT_TRUE(at::equal(shard_sequence_input(ids, c), ids.narrow(1, 3 * g->rank(), 3)));
    try {
      sequence_shard(7, c);
      ADD_FAILURE() << "no error for T = 7";
    } catch (const std::invalid_argument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("sequence length T = 7 is not divisible by sp_size = 2"));
      EXPECT_THAT(e.what(), ::testing::HasSubstr("all_to_all"));
    }
    // The loss is the mean over sp ranks; its gradient reaches the local loss unchanged.
    at::Tensor local = at::full({}, 1.0 + g->rank(), at::kFloat).requires_grad_(true);
    at::Tensor loss = sequence_parallel_loss(local * 2, c);
    EXPECT_FLOAT_EQ(loss.item<float>(), 3.0f);  // mean of 2 and 4
    loss.backward();
    EXPECT_FLOAT_EQ(local.grad().item<float>(), 2.0f);
  });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

}  // namespace sequence_parallel_test
