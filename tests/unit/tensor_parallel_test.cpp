// tensor_parallel_test.cpp — the tensor-parallel layers of booster/nn/tensor_parallel.h against the
// dense LibTorch layers built from the same seed on the same data: bit-identical at T = 1; at T = 2
// and T = 4 (ranks as threads with real Gloo groups) forward outputs and the gradients of the input
// and of the full (gathered) weights agree within float32 rounding (rtol 1e-5, atol 1e-6 unless
// stated). Also the f/g operators, vocabulary padding, the vocab-parallel cross entropy, bf16,
// the tp dropout generator, the spec registry and the errors.
#include "booster/nn/tensor_parallel.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "common/thread_ranks.h"

namespace {

using namespace booster::nn;
using booster::testing::run_thread_ranks;
using ::testing::AllOf;
using ::testing::Each;
using ::testing::Eq;
using ::testing::HasSubstr;
using Group = std::shared_ptr<booster::dist::ProcessGroup>;

constexpr double kRtol = 1e-5, kAtol = 1e-6;

// The global torch RNG is shared by the rank threads: every "seed, then build" runs under this lock.
std::mutex& rng_mutex() {
  static std::mutex m;
  return m;
}

// Data from a private generator (the same on every rank for the same seed).
at::Tensor randn(at::IntArrayRef shape, uint64_t seed) {
  return at::randn(shape, at::make_generator<at::CPUGeneratorImpl>(seed));
}
at::Tensor randint(int64_t high, at::IntArrayRef shape, uint64_t seed) {
  return at::randint(high, shape, at::make_generator<at::CPUGeneratorImpl>(seed));
}

void expect_close(const at::Tensor& actual, const at::Tensor& expected, const std::string& what, double rtol = kRtol,
                  double atol = kAtol) {
  ASSERT_TRUE(actual.defined()) << what;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << what;
  at::Tensor a = actual.detach().to(at::kDouble), e = expected.detach().to(at::kDouble);
  const double diff = a.numel() ? (a - e).abs().max().item<double>() : 0.0;
  EXPECT_TRUE(at::allclose(a, e, rtol, atol)) << what << ": max |diff| " << diff;
}

void expect_equal(const at::Tensor& actual, const at::Tensor& expected, const std::string& what) {
  ASSERT_TRUE(actual.defined()) << what;
  EXPECT_TRUE(at::equal(actual, expected)) << what << ": max |diff| "
                                           << (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
}

// The full dense tensor of a sharded parameter (or of its gradient `shard`): all-gather along the
// spec's dim, drop vocabulary padding. Collective over the spec's group.
at::Tensor gather_full(const at::Tensor& shard, const TensorParallelSpec& spec) {
  at::Tensor s = shard.detach().contiguous();
  if (spec.tp_size == 1) return s.narrow(spec.dim, 0, spec.full_size);
  std::vector<at::Tensor> parts(spec.tp_size);
  for (auto& p : parts) p = at::empty_like(s);
  spec.group->allgather(parts, s).wait();
  return at::cat(parts, spec.dim).narrow(spec.dim, 0, spec.full_size);
}

at::Tensor gather_full(const at::Tensor& param, const at::Tensor& shard_or_grad) {
  auto spec = tensor_parallel_spec(param);
  if (!spec) throw std::runtime_error("no tensor-parallel spec");
  return gather_full(shard_or_grad, *spec);
}

at::Tensor my_chunk(const at::Tensor& full, const Group& g) {
  return full.chunk(g->size(), -1)[g->rank()].contiguous();
}

// Runs body on T = 2 and T = 4 thread ranks, each with g = the world group (the tp group the body
// passes to its layers, in a TensorParallelContext, and to the functions).
void on_tp_ranks(const std::function<void(const Group&)>& body) {
  for (int t : {2, 4}) {
    auto errors = run_thread_ranks(t, [&](const Group& g) { body(g); });
    EXPECT_THAT(errors, Each(Eq(""))) << "T = " << t;
  }
}

// The context of tp group g.
TensorParallelContext tp_context(const Group& g) {
  TensorParallelContext c;
  c.group = g;
  return c;
}

// ---------------------------------------------------------------------------------------------
// T = 1: the dense layers, bit for bit

TEST(TensorParallel, TpOneLinearLayersAreTheDenseLinear) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(11);
  torch::nn::Linear dense(6, 10);
  torch::manual_seed(11);
  ColumnParallelLinear col(6, 10);
  torch::manual_seed(11);
  RowParallelLinear row(6, 10);
  EXPECT_EQ(col->group, nullptr);
  for (auto* layer : {&col->weight, &row->weight}) expect_equal(*layer, dense->weight, "weight");
  expect_equal(col->bias, dense->bias, "column bias");
  expect_equal(row->bias, dense->bias, "row bias");
  EXPECT_EQ(col->named_parameters().keys(), dense->named_parameters().keys());
  EXPECT_FALSE(tensor_parallel_spec(col->weight));
  EXPECT_FALSE(tensor_parallel_spec(row->weight));

  at::Tensor x = randn({4, 3, 6}, 1);
  at::Tensor g = randn({4, 3, 10}, 2);
  auto run = [&](torch::nn::Module& m, const std::function<at::Tensor(const at::Tensor&)>& fwd) {
    at::Tensor xi = x.clone().requires_grad_(true);
    at::Tensor y = fwd(xi);
    y.backward(g);
    return std::vector<at::Tensor>{y.detach(), xi.grad(), m.named_parameters()["weight"].grad(),
                                   m.named_parameters()["bias"].grad()};
  };
  auto d = run(*dense, [&](const at::Tensor& v) { return dense->forward(v); });
  auto c = run(*col, [&](const at::Tensor& v) { return col->forward(v); });
  auto r = run(*row, [&](const at::Tensor& v) { return row->forward(v); });
  const char* names[] = {"output", "input grad", "weight grad", "bias grad"};
  for (int i = 0; i < 4; ++i) {
    expect_equal(c[i], d[i], std::string("column ") + names[i]);
    expect_equal(r[i], d[i], std::string("row ") + names[i]);
  }

  // Without bias, and with an init method (bias then zero).
  torch::manual_seed(3);
  torch::nn::Linear dense_nb(torch::nn::LinearOptions(6, 4).bias(false));
  torch::manual_seed(3);
  ColumnParallelLinear col_nb(LinearParallelOptions(6, 4).bias(false));
  expect_equal(col_nb->weight, dense_nb->weight, "weight without bias");
  EXPECT_FALSE(col_nb->bias.defined());
  ColumnParallelLinear inited(
      LinearParallelOptions(6, 4).init_method([](at::Tensor& w) { w.fill_(0.5); }));
  EXPECT_TRUE(at::equal(inited->weight, at::full({4, 6}, 0.5)));
  EXPECT_TRUE(at::equal(inited->bias, at::zeros({4})));
}

TEST(TensorParallel, TpOneEmbeddingAndCrossEntropyAreTheDenseOnes) {
  std::lock_guard<std::mutex> lock(rng_mutex());
  torch::manual_seed(5);
  torch::nn::Embedding dense(11, 4);
  torch::manual_seed(5);
  VocabParallelEmbedding emb(11, 4);
  EXPECT_EQ(emb->padded_vocab(), 11);
  EXPECT_EQ(emb->vocab_start(), 0);
  expect_equal(emb->weight, dense->weight, "weight");
  EXPECT_FALSE(tensor_parallel_spec(emb->weight));

  at::Tensor ids = randint(11, {3, 5}, 4);
  at::Tensor target = randint(11, {3, 5}, 6);
  at::Tensor hd = dense->forward(ids);
  at::Tensor ht = emb->forward(ids);
  expect_equal(ht, hd, "embedding output");
  at::Tensor ld = torch::nn::functional::cross_entropy(at::linear(hd, dense->weight).reshape({-1, 11}), target.reshape({-1}));
  at::Tensor lt = vocab_parallel_cross_entropy(emb->lm_logits(ht), target, 11, emb->group);
  expect_equal(lt, ld, "loss");
  ld.backward();
  lt.backward();
  expect_equal(emb->weight.grad(), dense->weight.grad(), "tied weight grad");

  // The general (Megatron) path at T = 1, through vocabulary padding: columns >= vocab_size take no
  // probability, so the loss equals the dense loss over the first vocab_size columns.
  at::Tensor logits = randn({6, 9}, 7).requires_grad_(true);
  at::Tensor t = randint(7, {6}, 8);
  at::Tensor dl = logits.detach().narrow(1, 0, 7).clone().requires_grad_(true);
  at::Tensor expect = torch::nn::functional::cross_entropy(dl, t);
  at::Tensor got = vocab_parallel_cross_entropy(logits, t, 7, nullptr);
  expect_close(got, expect, "padded loss");
  expect.backward();
  got.backward();
  expect_close(logits.grad().narrow(1, 0, 7), dl.grad(), "padded logits grad");
  EXPECT_TRUE(at::equal(logits.grad().narrow(1, 7, 2), at::zeros({6, 2}))) << "padding columns get no gradient";
}

// ---------------------------------------------------------------------------------------------
// T = 2, 4: equal to the dense layers up to float32 rounding

TEST(TensorParallel, ColumnParallelLinearMatchesDense) {
  on_tp_ranks([](const Group& g) {
    for (bool gather : {false, true}) {
      ColumnParallelLinear col{nullptr};
      torch::nn::Linear dense{nullptr};
      {
        std::lock_guard<std::mutex> lock(rng_mutex());
        torch::manual_seed(21);
        col = ColumnParallelLinear(LinearParallelOptions(8, 12).gather_output(gather).context(tp_context(g)));
        torch::manual_seed(21);
        dense = torch::nn::Linear(8, 12);
      }
      const int t = g->size();
      EXPECT_EQ(col->weight.sizes(), (std::vector<int64_t>{12 / t, 8}));
      EXPECT_EQ(col->bias.sizes(), (std::vector<int64_t>{12 / t}));
      expect_equal(gather_full(col->weight, col->weight), dense->weight, "initial weight");
      expect_equal(gather_full(col->bias, col->bias), dense->bias, "initial bias");

      at::Tensor x = randn({2, 3, 8}, 30), go = randn({2, 3, 12}, 31);
      at::Tensor xd = x.clone().requires_grad_(true), xt = x.clone().requires_grad_(true);
      at::Tensor yd = dense->forward(xd);
      yd.backward(go);
      at::Tensor yt = col->forward(xt);
      if (gather) {
        expect_close(yt, yd, "gathered output");
        yt.backward(go);
      } else {
        expect_close(yt, my_chunk(yd, g), "output columns");
        yt.backward(my_chunk(go, g));
      }
      expect_close(xt.grad(), xd.grad(), "input grad (all-reduced)");
      expect_close(gather_full(col->weight, col->weight.grad()), dense->weight.grad(), "weight grad");
      expect_close(gather_full(col->bias, col->bias.grad()), dense->bias.grad(), "bias grad");
    }
  });
}

TEST(TensorParallel, RowParallelLinearMatchesDense) {
  on_tp_ranks([](const Group& g) {
    for (bool parallel_input : {true, false}) {
      RowParallelLinear row{nullptr};
      torch::nn::Linear dense{nullptr};
      {
        std::lock_guard<std::mutex> lock(rng_mutex());
        torch::manual_seed(22);
        row = RowParallelLinear(LinearParallelOptions(12, 5).input_is_parallel(parallel_input).context(tp_context(g)));
        torch::manual_seed(22);
        dense = torch::nn::Linear(12, 5);
      }
      const int t = g->size();
      EXPECT_EQ(row->weight.sizes(), (std::vector<int64_t>{5, 12 / t}));
      expect_equal(row->bias, dense->bias, "replicated bias");
      EXPECT_FALSE(tensor_parallel_spec(row->bias));

      at::Tensor x = randn({4, 12}, 40), go = randn({4, 5}, 41);
      at::Tensor xd = x.clone().requires_grad_(true);
      at::Tensor yd = dense->forward(xd);
      yd.backward(go);
      at::Tensor xt = (parallel_input ? my_chunk(x, g) : x.clone()).requires_grad_(true);
      at::Tensor yt = row->forward(xt);
      expect_close(yt, yd, "output");
      yt.backward(go);
      expect_close(xt.grad(), parallel_input ? my_chunk(xd.grad(), g) : xd.grad(), "input grad");
      expect_close(gather_full(row->weight, row->weight.grad()), dense->weight.grad(), "weight grad");
      expect_close(row->bias.grad(), dense->bias.grad(), "bias grad");
    }
  });
}

TEST(TensorParallel, ColumnThenRowMlpMatchesDenseMlp) {
  on_tp_ranks([](const Group& g) {
    ColumnParallelLinear fc1{nullptr};
    RowParallelLinear fc2{nullptr};
    torch::nn::Linear d1{nullptr}, d2{nullptr};
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(23);
      fc1 = ColumnParallelLinear(LinearParallelOptions(8, 16).context(tp_context(g)));
      fc2 = RowParallelLinear(LinearParallelOptions(16, 8).context(tp_context(g)));
      torch::manual_seed(23);
      d1 = torch::nn::Linear(8, 16);
      d2 = torch::nn::Linear(16, 8);
    }
    at::Tensor x = randn({3, 4, 8}, 50);
    at::Tensor xd = x.clone().requires_grad_(true), xt = x.clone().requires_grad_(true);
    at::Tensor ld = d2->forward(torch::gelu(d1->forward(xd))).pow(2).sum();
    at::Tensor lt = fc2->forward(torch::gelu(fc1->forward(xt))).pow(2).sum();
    expect_close(lt, ld, "loss");
    ld.backward();
    lt.backward();
    expect_close(xt.grad(), xd.grad(), "input grad");
    expect_close(gather_full(fc1->weight, fc1->weight.grad()), d1->weight.grad(), "fc1 weight grad");
    expect_close(gather_full(fc1->bias, fc1->bias.grad()), d1->bias.grad(), "fc1 bias grad");
    expect_close(gather_full(fc2->weight, fc2->weight.grad()), d2->weight.grad(), "fc2 weight grad");
    expect_close(fc2->bias.grad(), d2->bias.grad(), "fc2 bias grad");
  });
}

// V = 11 does not divide by 2 or 4: padded to a multiple of 2 * T (make_vocab_size_divisible_by 2).
TEST(TensorParallel, VocabParallelEmbeddingWithPaddingMatchesDense) {
  on_tp_ranks([](const Group& g) {
    const int t = g->size();
    const int64_t v = 11, dim = 6;
    VocabParallelEmbedding emb{nullptr};
    torch::nn::Embedding dense{nullptr};
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(24);
      emb = VocabParallelEmbedding(VocabParallelEmbeddingOptions(v, dim).make_vocab_size_divisible_by(2).context(tp_context(g)));
      torch::manual_seed(24);
      dense = torch::nn::Embedding(v, dim);
    }
    const int64_t vp = t == 2 ? 12 : 16;
    EXPECT_EQ(emb->padded_vocab(), vp);
    EXPECT_EQ(emb->vocab_start(), g->rank() * vp / t);
    EXPECT_EQ(emb->weight.sizes(), (std::vector<int64_t>{vp / t, dim}));
    auto spec = tensor_parallel_spec(emb->weight);
    ASSERT_TRUE(spec);
    EXPECT_EQ(spec->dim, 0);
    EXPECT_EQ(spec->full_size, v);
    EXPECT_EQ(spec->padded_size, vp);
    EXPECT_EQ(spec->tp_size, t);
    EXPECT_EQ(spec->tp_rank, g->rank());
    expect_equal(gather_full(emb->weight, emb->weight), dense->weight, "initial weight");
    at::Tensor padded_rows = gather_full(emb->weight, TensorParallelSpec{0, vp, vp, t, g->rank(), g}).narrow(0, v, vp - v);
    EXPECT_TRUE(at::equal(padded_rows, at::zeros({vp - v, dim}))) << "padding rows start at zero";

    // Embedding forward/backward, tied to the lm head, into the cross entropy: all as the dense model.
    at::Tensor ids = randint(v, {3, 7}, 60), target = randint(v, {3, 7}, 61);
    ids[0][0] = v - 1;  // the last real row and column
    target[0][1] = v - 1;
    at::Tensor hd = dense->forward(ids) * 0.5;
    at::Tensor logits_d = at::linear(hd, dense->weight);
    at::Tensor ht = emb->forward(ids) * 0.5;
    expect_close(ht, hd, "embedding output");
    at::Tensor logits_t = emb->lm_logits(ht);
    EXPECT_EQ(logits_t.sizes(), (std::vector<int64_t>{3, 7, vp / t}));
    expect_close(gather_full(logits_t, TensorParallelSpec{2, v, vp, t, g->rank(), g}), logits_d, "logits");
    hd.retain_grad();
    ht.retain_grad();
    at::Tensor ld = torch::nn::functional::cross_entropy(logits_d.reshape({-1, v}), target.reshape({-1}));
    at::Tensor lt = vocab_parallel_cross_entropy(logits_t, target, v, g);
    EXPECT_EQ(lt.scalar_type(), at::kFloat);
    EXPECT_EQ(lt.dim(), 0);
    expect_close(lt, ld, "loss");
    ld.backward();
    lt.backward();
    expect_close(ht.grad(), hd.grad(), "hidden grad");
    expect_close(gather_full(emb->weight, emb->weight.grad()), dense->weight.grad(), "tied weight grad");
    at::Tensor pad_grad = gather_full(emb->weight.grad(), TensorParallelSpec{0, vp, vp, t, g->rank(), g}).narrow(0, v, vp - v);
    EXPECT_TRUE(at::equal(pad_grad, at::zeros({vp - v, dim}))) << "padding rows get no gradient";
  });
}

TEST(TensorParallel, VocabParallelCrossEntropyWithoutPaddingMatchesDense) {
  on_tp_ranks([](const Group& g) {
    at::Tensor logits = randn({5, 16}, 70) * 3;
    at::Tensor target = randint(16, {5}, 71);
    at::Tensor ld_in = logits.clone().requires_grad_(true);
    at::Tensor ld = torch::nn::functional::cross_entropy(ld_in, target);
    ld.backward();
    at::Tensor lt_in = my_chunk(logits, g).requires_grad_(true);
    at::Tensor lt = vocab_parallel_cross_entropy(lt_in, target, -1, g);  // vocab_size -1: every column real
    expect_close(lt, ld, "loss");
    lt.backward(at::full({}, 2.0));  // the upstream gradient scales it
    expect_close(lt_in.grad(), my_chunk(ld_in.grad() * 2, g), "logits grad");
  });
}

// ---------------------------------------------------------------------------------------------
// The f/g operators

TEST(TensorParallel, ConjugateOperatorsForwardAndBackward) {
  on_tp_ranks([](const Group& g) {
    const int t = g->size(), r = g->rank();
    auto per_rank = [&](int rank, uint64_t salt) { return randn({2, 3}, 100 * salt + rank); };
    at::Tensor sum_of_ranks = at::zeros({2, 3});
    std::vector<at::Tensor> all;
    for (int k = 0; k < t; ++k) {
      sum_of_ranks += per_rank(k, 1);
      all.push_back(per_rank(k, 1));
    }
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      const double tol = dtype == at::kFloat ? 1e-6 : 2e-2;
      const std::string name = dtype == at::kFloat ? " (float32)" : " (bf16)";
      at::Tensor x = per_rank(r, 1).to(dtype).requires_grad_(true);

      at::Tensor y = copy_to_tensor_parallel_region(x, g);  // f: identity, backward all-reduce
      expect_equal(y, x.detach(), "f forward" + name);
      y.backward(per_rank(r, 1).to(dtype));
      EXPECT_EQ(x.grad().scalar_type(), dtype);
      expect_close(x.grad(), sum_of_ranks, "f backward" + name, tol, tol);
      x.mutable_grad() = at::Tensor();

      y = reduce_from_tensor_parallel_region(x, g);  // g: all-reduce, backward identity
      EXPECT_EQ(y.scalar_type(), dtype);
      expect_close(y, sum_of_ranks, "g forward" + name, tol, tol);
      at::Tensor go = per_rank(r, 2).to(dtype);
      y.backward(go);
      expect_equal(x.grad(), go, "g backward" + name);
      x.mutable_grad() = at::Tensor();

      y = gather_from_tensor_parallel_region(x, g);  // all-gather along the last dim
      expect_equal(y, at::cat(all, -1).to(dtype), "gather forward" + name);
      at::Tensor gfull = randn({2, 3 * t}, 9).to(dtype);
      y.backward(gfull);
      expect_equal(x.grad(), gfull.narrow(1, 3 * r, 3), "gather backward" + name);
      x.mutable_grad() = at::Tensor();

      at::Tensor full = randn({2, 2 * t}, 10).to(dtype).requires_grad_(true);  // split own chunk
      y = scatter_to_tensor_parallel_region(full, g);
      expect_equal(y, full.detach().narrow(1, 2 * r, 2), "scatter forward" + name);
      y.backward(per_rank(r, 3).narrow(1, 0, 2).to(dtype));
      std::vector<at::Tensor> chunks;
      for (int k = 0; k < t; ++k) chunks.push_back(per_rank(k, 3).narrow(1, 0, 2).to(dtype));
      expect_equal(full.grad(), at::cat(chunks, 1), "scatter backward" + name);
    }
    EXPECT_THROW(scatter_to_tensor_parallel_region(at::ones({2, 2 * t + 1}), g), std::invalid_argument);
  });
  // T = 1 (no group): every operator is the identity.
  at::Tensor x = at::ones({2, 3});
  for (auto* op : {&copy_to_tensor_parallel_region, &reduce_from_tensor_parallel_region,
                   &gather_from_tensor_parallel_region, &scatter_to_tensor_parallel_region})
    EXPECT_TRUE(at::equal((*op)(x, nullptr), x));
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(TensorParallel, Bf16ModulesRunAndStayCloseToFloat) {
  on_tp_ranks([](const Group& g) {
    ColumnParallelLinear fc1{nullptr};
    RowParallelLinear fc2{nullptr};
    VocabParallelEmbedding emb{nullptr};
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(25);
      fc1 = ColumnParallelLinear(LinearParallelOptions(8, 16).context(tp_context(g)));
      fc2 = RowParallelLinear(LinearParallelOptions(16, 8).context(tp_context(g)));
      emb = VocabParallelEmbedding(VocabParallelEmbeddingOptions(13, 8).make_vocab_size_divisible_by(1).context(tp_context(g)));
    }
    at::Tensor ids = randint(13, {2, 5}, 80), target = randint(13, {2, 5}, 81);
    auto loss_of = [&]() {
      at::Tensor h = emb->forward(ids);
      h = h + fc2->forward(torch::gelu(fc1->forward(h)));
      return vocab_parallel_cross_entropy(emb->lm_logits(h), target, 13, g);
    };
    const at::Tensor loss32 = loss_of().detach();
    for (torch::nn::Module* m : std::vector<torch::nn::Module*>{fc1.get(), fc2.get(), emb.get()}) m->to(at::kBFloat16);
    EXPECT_EQ(fc1->weight.scalar_type(), at::kBFloat16);
    ASSERT_TRUE(tensor_parallel_spec(fc1->weight)) << "the spec survives Module::to(dtype)";
    EXPECT_EQ(tensor_parallel_spec(fc1->weight)->tp_size, g->size());
    ASSERT_TRUE(tensor_parallel_spec(fc2->weight));
    ASSERT_TRUE(tensor_parallel_spec(emb->weight));
    at::Tensor loss16 = loss_of();
    EXPECT_EQ(loss16.scalar_type(), at::kFloat);  // the cross entropy computes in float32
    expect_close(loss16, loss32, "bf16 loss vs float32 loss", 2e-2, 2e-2);
    loss16.backward();
    for (const at::Tensor& w : {fc1->weight, fc2->weight, emb->weight}) {
      ASSERT_TRUE(w.grad().defined());
      EXPECT_EQ(w.grad().scalar_type(), at::kBFloat16);
      EXPECT_TRUE(w.grad().isfinite().all().item<bool>());
    }
  });
}

// ---------------------------------------------------------------------------------------------
// tp dropout

TEST(TensorParallel, DropoutDiffersAcrossTpRanksAndIsReproducible) {
  on_tp_ranks([](const Group& g) {
    const int t = g->size();
    at::Tensor x = at::ones({4000});
    set_tensor_parallel_seed(77);
    at::Tensor a = tensor_parallel_dropout(x, 0.25, true, g);
    at::Tensor b = tensor_parallel_dropout(x, 0.25, true, g);
    EXPECT_FALSE(at::equal(a, b)) << "successive calls draw new masks";
    set_tensor_parallel_seed(77);
    expect_equal(tensor_parallel_dropout(x, 0.25, true, g), a, "same seed, same mask");
    // Kept entries are scaled by 1 / (1 - p), the rest are zero; about 75% are kept.
    EXPECT_TRUE(((a == 0).logical_or(a == 1 / 0.75f)).all().item<bool>());
    const double kept = (a != 0).to(at::kDouble).mean().item<double>();
    EXPECT_NEAR(kept, 0.75, 0.03);
    std::vector<at::Tensor> masks(t);
    for (auto& m : masks) m = at::empty_like(a);
    g->allgather(masks, a).wait();
    for (int i = 0; i < t; ++i)
      for (int j = i + 1; j < t; ++j) EXPECT_FALSE(at::equal(masks[i], masks[j])) << "ranks " << i << ", " << j;
    // Gradient flows through the kept entries, scaled.
    at::Tensor xg = torch::ones({100}, torch::requires_grad());
    set_tensor_parallel_seed(5);
    at::Tensor y = tensor_parallel_dropout(xg, 0.5, true, g);
    y.sum().backward();
    expect_equal(xg.grad(), y.detach(), "gradient = mask / (1 - p)");
  });
  at::Tensor x = at::ones({10});
  EXPECT_TRUE(at::equal(tensor_parallel_dropout(x, 0.5, false, nullptr), x));
  EXPECT_TRUE(at::equal(tensor_parallel_dropout(x, 0.0, true, nullptr), x));
  set_tensor_parallel_seed(1);
  at::Tensor bf = tensor_parallel_dropout(at::ones({64}, at::kBFloat16), 0.5, true, nullptr);
  EXPECT_EQ(bf.scalar_type(), at::kBFloat16);
  for (double p : {-0.1, 1.0, 1.5, std::nan("")})
    EXPECT_THAT([&] { tensor_parallel_dropout(x, p, true, nullptr); },
                ::testing::ThrowsMessage<std::invalid_argument>(HasSubstr("p must be in [0, 1)")));
}

// ---------------------------------------------------------------------------------------------
// Spec registry, clone/reset

TEST(TensorParallel, SpecRegistryCloneAndReset) {
  on_tp_ranks([](const Group& g) {
    const int t = g->size();
    ColumnParallelLinear col{nullptr};
    RowParallelLinear row{nullptr};
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(26);
      col = ColumnParallelLinear(LinearParallelOptions(4, 8).context(tp_context(g)));
      row = RowParallelLinear(LinearParallelOptions(8, 4).context(tp_context(g)));
    }
    auto cw = tensor_parallel_spec(col->weight), cb = tensor_parallel_spec(col->bias);
    auto rw = tensor_parallel_spec(row->weight);
    ASSERT_TRUE(cw && cb && rw);
    EXPECT_EQ(cw->dim, 0);
    EXPECT_EQ(cw->full_size, 8);
    EXPECT_EQ(cw->padded_size, 8);
    EXPECT_EQ(cw->tp_rank, g->rank());
    EXPECT_EQ(cw->group, g);
    EXPECT_EQ(cb->dim, 0);
    EXPECT_EQ(rw->dim, 1);
    EXPECT_EQ(rw->full_size, 8);
    EXPECT_EQ(rw->tp_size, t);
    EXPECT_FALSE(tensor_parallel_spec(row->bias));
    EXPECT_FALSE(tensor_parallel_spec(col->weight.detach().clone()));  // a copy is a new tensor

    // clone() re-creates the parameters (reset) and copies the values; the copies have specs.
    std::shared_ptr<ColumnParallelLinearImpl> copy;
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      copy = std::dynamic_pointer_cast<ColumnParallelLinearImpl>(col->clone());
    }
    ASSERT_TRUE(copy);
    EXPECT_NE(copy->weight.unsafeGetTensorImpl(), col->weight.unsafeGetTensorImpl());
    EXPECT_TRUE(at::equal(copy->weight, col->weight));
    EXPECT_EQ(copy->group, g);
    ASSERT_TRUE(tensor_parallel_spec(copy->weight));
    EXPECT_EQ(tensor_parallel_spec(copy->weight)->full_size, 8);

    // reset() re-initialises the full tensor from the global RNG, as the dense layer's reset does.
    torch::nn::Linear dense{nullptr};
    {
      std::lock_guard<std::mutex> lock(rng_mutex());
      torch::manual_seed(27);
      col->reset();
      torch::manual_seed(27);
      dense = torch::nn::Linear(4, 8);
    }
    expect_equal(gather_full(col->weight, col->weight), dense->weight, "weight after reset");
    ASSERT_TRUE(tensor_parallel_spec(col->weight));
  });

  // Entries of destroyed tensors never reach new tensors.
  for (int i = 0; i < 200; ++i) {
    at::Tensor tmp = at::zeros({4, 2});
    register_tensor_parallel_spec(tmp, TensorParallelSpec{0, 8, 8, 2, 1, nullptr});
    ASSERT_TRUE(tensor_parallel_spec(tmp));
  }
  for (int i = 0; i < 200; ++i) EXPECT_FALSE(tensor_parallel_spec(at::zeros({4, 2})));
  EXPECT_THROW(register_tensor_parallel_spec(at::zeros({4}), TensorParallelSpec{1, 8, 8, 2, 0, nullptr}),
               std::invalid_argument);  // dim out of range
  EXPECT_EQ(padded_vocab_size(50257, 1, 64), 50257);
  EXPECT_EQ(padded_vocab_size(50257, 2, 64), 50304);
  EXPECT_EQ(padded_vocab_size(50258, 2, 64), 50258);
  EXPECT_EQ(padded_vocab_size(11, 4, 2), 16);
}

// ---------------------------------------------------------------------------------------------
// Errors

TEST(TensorParallel, Errors) {
  auto errors = run_thread_ranks(4, [](const Group& g) {
    // The group option in place of the context's.
    ColumnParallelLinear ok(LinearParallelOptions(4, 8).group(g));
    EXPECT_EQ(ok->weight.size(0), 2);
    EXPECT_THAT([&] { ColumnParallelLinear(LinearParallelOptions(4, 10).group(g)); },
                ::testing::ThrowsMessage<std::invalid_argument>(
                    AllOf(HasSubstr("out_features (10)"), HasSubstr("tensor-parallel size 4"), HasSubstr("multiple of 4"))));
    EXPECT_THAT([&] { RowParallelLinear(LinearParallelOptions(6, 4).group(g)); },
                ::testing::ThrowsMessage<std::invalid_argument>(
                    AllOf(HasSubstr("in_features (6)"), HasSubstr("tensor-parallel size 4"))));
    VocabParallelEmbedding emb(VocabParallelEmbeddingOptions(10, 4).group(g));
    EXPECT_EQ(emb->padded_vocab(), 256);  // the default context's make_vocab_size_divisible_by 64
    TensorParallelContext by4 = tp_context(g);
    by4.make_vocab_size_divisible_by = 4;
    EXPECT_EQ(VocabParallelEmbedding(VocabParallelEmbeddingOptions(10, 4).context(by4))->padded_vocab(), 16);
    at::Tensor ids = at::tensor({1, 2, 12, -1}, at::kLong);
    EXPECT_THAT([&] { emb->forward(ids); },
                ::testing::ThrowsMessage<std::out_of_range>(AllOf(HasSubstr("id 12"), HasSubstr("[0, 10)"))));
    EXPECT_THROW(emb->forward(at::zeros({2}, at::kInt)), std::invalid_argument);
    at::Tensor logits = at::zeros({3, 64});
    EXPECT_THAT([&] { vocab_parallel_cross_entropy(logits, at::tensor({0, 10, 1}, at::kLong), 10, g); },
                ::testing::ThrowsMessage<std::out_of_range>(HasSubstr("target 10")));
    EXPECT_THROW(vocab_parallel_cross_entropy(logits, at::zeros({4}, at::kLong), 10, g), std::invalid_argument);
    EXPECT_THROW(copy_to_tensor_parallel_region(at::zeros({2}, at::kLong), g), std::invalid_argument);
  });
  EXPECT_THAT(errors, Each(Eq("")));
}

}  // namespace
