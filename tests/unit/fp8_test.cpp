// fp8_test.cpp — float8 e4m3 quantization and the compressed collectives (booster/dist/fp8.h):
// the round trip against the documented bound 2^-4 |x| + 2^-10 scale (e4m3's 3 mantissa bits, the
// subnormal step below 2^-6 scale), zeros, saturation, the non-finite policy, the wire layout; then
// fp8_allreduce, fp8_reduce_scatter_in_place and fp8_all_gather_into_tensor on 2 and 3 ranks (threads
// with Gloo process groups on 127.0.0.1) against the exact float32 result, within the error bound
// each function's contract states, and all_to_all_single exactly.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "booster/dist/fp8.h"
#include "booster/dist/process_group.h"
#include "common/thread_ranks.h"

namespace fp8_test {

namespace bd = booster::dist;

// Rank r's data: smooth values of varying magnitude (six binades), deterministic.
at::Tensor data_of(int r, int64_t n) {
  at::Tensor i = at::arange(n, at::kDouble);
  return (at::sin(i * 0.37 + r) * at::pow(2.0, at::remainder(i, 6.0) - 3.0) * (r + 1)).to(at::kFloat);
}

double scale_of(const at::Tensor& x) { return bd::fp8_scale(x).item<double>(); }

// The documented bound of one quantization of x with scale s.
at::Tensor bound_of(const at::Tensor& x, double s) { return x.abs() * std::pow(2.0, -4) + s * std::pow(2.0, -10) + 1e-7; }

TEST(Fp8Quantize, RoundTripWithinE4M3Precision) {
  const at::Tensor x = data_of(0, 4096);
  const at::Tensor s = bd::fp8_scale(x);
  EXPECT_NEAR(s.item<double>(), x.abs().max().item<double>() / 448.0, 1e-9);
  const at::Tensor q = bd::quantize_fp8(x, s);
  EXPECT_EQ(q.scalar_type(), at::kFloat8_e4m3fn);
  // The CPU loop gives the bits of ATen's own cast (the path CUDA tensors take), and dequantizes
  // as ATen does.
  EXPECT_TRUE(at::equal(q.view(at::kByte), (x / s).clamp(-448, 448).to(at::kFloat8_e4m3fn).view(at::kByte)));
  EXPECT_TRUE(at::equal(bd::dequantize_fp8(q, s, at::kFloat), q.to(at::kFloat) * s));
  const at::Tensor y = bd::dequantize_fp8(q, s, at::kFloat);
  const at::Tensor err = (y - x).abs();
  EXPECT_TRUE(err.le(bound_of(x, s.item<double>())).all().item<bool>()) << "max |d| " << err.max().item<double>();
  // The largest value lands exactly on 448 * scale; the relative error is not far below the bound
  // (the test would notice a silently wider format).
  EXPECT_FLOAT_EQ(y.abs().max().item<float>(), x.abs().max().item<float>());
  const at::Tensor big = x.abs() > 0.1 * x.abs().max();
  const double rel = ((y - x).abs() / x.abs()).masked_select(big).max().item<double>();
  EXPECT_GT(rel, std::pow(2.0, -6));
  EXPECT_LE(rel, std::pow(2.0, -4) + 1e-6);
  // bf16 input and output
  const at::Tensor yb = bd::dequantize_fp8(bd::quantize_fp8(x.to(at::kBFloat16), s), s, at::kBFloat16);
  EXPECT_EQ(yb.scalar_type(), at::kBFloat16);
  EXPECT_TRUE((yb.to(at::kFloat) - x).abs().le(bound_of(x, s.item<double>()) * 1.2).all().item<bool>());
}

TEST(Fp8Quantize, ZerosSaturationAndNonFinite) {
  const at::Tensor zeros = at::zeros({17});
  EXPECT_EQ(scale_of(zeros), 1.0);
  EXPECT_TRUE(at::equal(bd::dequantize_fp8(bd::quantize_fp8(zeros, bd::fp8_scale(zeros)), bd::fp8_scale(zeros), at::kFloat), zeros));
  EXPECT_EQ(scale_of(at::empty({0})), 1.0);
  // A scale smaller than amax / 448 saturates to +-448 instead of producing NaN.
  const at::Tensor x = at::tensor({1.0f, -3.0f, 0.0f});
  const at::Tensor q = bd::quantize_fp8(x, at::full({1}, 1.0f / 448.0f));
  EXPECT_FLOAT_EQ(q.to(at::kFloat)[1].item<float>(), -448.0f);
  // Non-finite: the scale comes from the finite values; inf and NaN become NaN, the rest is exact.
  const float inf = std::numeric_limits<float>::infinity();
  const at::Tensor nf = at::tensor({2.0f, inf, -inf, std::nanf(""), -1.0f, 0.0f});
  const at::Tensor s = bd::fp8_scale(nf);
  EXPECT_FLOAT_EQ(s.item<float>(), 2.0f / 448.0f);
  const at::Tensor y = bd::dequantize_fp8(bd::quantize_fp8(nf, s), s, at::kFloat);
  EXPECT_FLOAT_EQ(y[0].item<float>(), 2.0f);
  EXPECT_TRUE(std::isnan(y[1].item<float>()));
  EXPECT_TRUE(std::isnan(y[2].item<float>()));
  EXPECT_TRUE(std::isnan(y[3].item<float>()));
  EXPECT_FLOAT_EQ(y[4].item<float>(), -1.0f);
  EXPECT_EQ(y[5].item<float>(), 0.0f);
  EXPECT_THROW(bd::quantize_fp8(at::ones({3}, at::kLong), s), std::invalid_argument);
}

TEST(Fp8Quantize, WireLayoutIsPayloadThenScale) {
  const at::Tensor x = data_of(1, 10);
  at::Tensor wire = at::empty({bd::fp8_wire_bytes(10)}, at::kByte);
  bd::pack_fp8(x, wire);
  const at::Tensor s = bd::fp8_scale(x);
  EXPECT_TRUE(at::equal(wire.narrow(0, 0, 10), bd::quantize_fp8(x, s).view(at::kByte)));
  EXPECT_EQ(wire.narrow(0, 10, 4).clone().view(at::kFloat).item<float>(), s.item<float>());
  EXPECT_TRUE(at::equal(bd::unpack_fp8(wire, at::kFloat), bd::dequantize_fp8(bd::quantize_fp8(x, s), s, at::kFloat)));
  EXPECT_THROW(bd::pack_fp8(x, at::empty({10}, at::kByte)), std::invalid_argument);
}

// ---- Collectives on thread ranks

// The exact float32 sum of every rank's data and the bound of fp8_allreduce's contract.
void check_allreduce(int world, int64_t n) {
  at::Tensor exact = at::zeros({n}), abs_sum = at::zeros({n});
  double scales = 0;
  for (int r = 0; r < world; ++r) {
    exact += data_of(r, n);
    abs_sum += data_of(r, n).abs();
    scales += scale_of(data_of(r, n));
  }
  const std::vector<int64_t> counts = bd::ProcessGroup::even_counts(n, world);
  at::Tensor result_scale = at::zeros({n});  // the scale each range of the sum was quantized with
  int64_t off = 0;
  for (int64_t c : counts) {
    if (c > 0) result_scale.narrow(0, off, c).fill_(scale_of(exact.narrow(0, off, c)) * 1.02);
    off += c;
  }
  const at::Tensor bound = (abs_sum + exact.abs()) * std::pow(2.0, -4) + (result_scale + scales) * std::pow(2.0, -10) + 1e-6;
  std::vector<at::Tensor> results(static_cast<size_t>(world));
  auto errors = booster::testing::run_thread_ranks(world, [&](const std::shared_ptr<bd::ProcessGroup>& g) {
    at::Tensor t = data_of(g->rank(), n);
    bd::fp8_allreduce(*g, t).wait();
    results[static_cast<size_t>(g->rank())] = t;
  });
  for (const auto& e : errors) ASSERT_EQ(e, "");
  const at::Tensor err = (results[0] - exact).abs();
  EXPECT_TRUE(err.le(bound).all().item<bool>()) << "world " << world << " n " << n << " max |d| " << err.max().item<double>();
  EXPECT_GT(err.max().item<double>(), 0.0);  // it did go through fp8
  for (int r = 1; r < world; ++r) EXPECT_TRUE(at::equal(results[static_cast<size_t>(r)], results[0])) << "rank " << r;
  // bf16 tensor: the same sum within the bound plus bf16's rounding of the result.
  std::vector<at::Tensor> bf(static_cast<size_t>(world));
  errors = booster::testing::run_thread_ranks(world, [&](const std::shared_ptr<bd::ProcessGroup>& g) {
    at::Tensor t = data_of(g->rank(), n).to(at::kBFloat16);
    bd::fp8_allreduce(*g, t).wait();
    bf[static_cast<size_t>(g->rank())] = t.to(at::kFloat);
  });
  for (const auto& e : errors) ASSERT_EQ(e, "");
  EXPECT_TRUE((bf[0] - exact).abs().le(bound * 1.25 + exact.abs() * std::pow(2.0, -8)).all().item<bool>());
}

TEST(Fp8Collectives, AllreduceMatchesFloat32SumWithinBound) {
  check_allreduce(2, 1000);
  check_allreduce(3, 1001);  // uneven ranges
  check_allreduce(3, 2);     // a rank with an empty range
}

TEST(Fp8Collectives, ReduceScatterInPlaceWithCounts) {
  const int world = 3;
  const int64_t n = 600;
  const std::vector<int64_t> counts{250, 0, 350};
  at::Tensor exact = at::zeros({n});
  for (int r = 0; r < world; ++r) exact += data_of(r, n);
  std::vector<at::Tensor> results(world);
  auto errors = booster::testing::run_thread_ranks(world, [&](const std::shared_ptr<bd::ProcessGroup>& g) {
    at::Tensor t = data_of(g->rank(), n);
    bd::fp8_reduce_scatter_in_place(*g, t, counts).wait();
    results[static_cast<size_t>(g->rank())] = t;
  });
  for (const auto& e : errors) ASSERT_EQ(e, "");
  int64_t off = 0;
  for (int me = 0; me < world; ++me) {
    const int64_t c = counts[static_cast<size_t>(me)];
    at::Tensor bound = at::full({c}, 1e-6);
    for (int r = 0; r < world; ++r)
      if (r != me)
        bound += bound_of(data_of(r, n).narrow(0, off, c), scale_of(data_of(r, n)));
    const at::Tensor got = results[static_cast<size_t>(me)];
    EXPECT_TRUE((got.narrow(0, off, c) - exact.narrow(0, off, c)).abs().le(bound).all().item<bool>()) << "rank " << me;
    // The other ranges are untouched.
    const at::Tensor mask = at::ones({n}, at::kBool).index_fill_(0, at::arange(off, off + c), false);
    EXPECT_TRUE(at::equal(got.masked_select(mask), data_of(me, n).masked_select(mask))) << "rank " << me;
    off += c;
  }
  const auto one = booster::testing::run_thread_ranks(1, [&](const std::shared_ptr<bd::ProcessGroup>& g) {
    at::Tensor t = at::ones({4}, at::kLong);
    bd::fp8_reduce_scatter_in_place(*g, t, {4});
  });
  EXPECT_NE(one[0].find("needs a floating tensor"), std::string::npos) << one[0];
}

TEST(Fp8Collectives, AllGatherIntoTensorInPlaceAndMixedDtype) {
  const int world = 2;
  const int64_t n = 513;
  std::vector<at::Tensor> results(world), results_bf(world);
  auto errors = booster::testing::run_thread_ranks(world, [&](const std::shared_ptr<bd::ProcessGroup>& g) {
    at::Tensor full = at::zeros({world * n});
    at::Tensor mine = full.narrow(0, g->rank() * n, n);
    mine.copy_(data_of(g->rank(), n));
    bd::fp8_all_gather_into_tensor(*g, full, mine).wait();  // in place
    results[static_cast<size_t>(g->rank())] = full;
    at::Tensor out_bf = at::zeros({world * n}, at::kBFloat16);
    bd::fp8_all_gather_into_tensor(*g, out_bf, data_of(g->rank(), n)).wait();  // float32 in, bf16 out
    results_bf[static_cast<size_t>(g->rank())] = out_bf;
  });
  for (const auto& e : errors) ASSERT_EQ(e, "");
  EXPECT_TRUE(at::equal(results[0], results[1]));
  for (int r = 0; r < world; ++r) {
    const at::Tensor x = data_of(r, n), got = results[0].narrow(0, r * n, n);
    EXPECT_TRUE((got - x).abs().le(bound_of(x, scale_of(x))).all().item<bool>()) << "piece " << r;
    EXPECT_TRUE(at::equal(got.to(at::kBFloat16), results_bf[0].narrow(0, r * n, n)));
  }
}

TEST(Fp8Collectives, AllToAllSingleIsExact) {
  const int world = 3;
  // Rank r sends (r + p + 1) bytes-worth of int values to rank p, valued 100 r + p.
  auto errors = booster::testing::run_thread_ranks(world, [&](const std::shared_ptr<bd::ProcessGroup>& g) {
    const int me = g->rank();
    std::vector<int64_t> in_counts, out_counts;
    std::vector<at::Tensor> parts;
    for (int p = 0; p < world; ++p) {
      in_counts.push_back(me + p + 1);
      out_counts.push_back(p + me + 1);
      parts.push_back(at::full({me + p + 1}, 100 * me + p, at::kInt));
    }
    at::Tensor in = at::cat(parts), out = at::full({in.numel()}, -1, at::kInt);
    g->all_to_all_single(out, in, out_counts, in_counts).wait();
    int64_t off = 0;
    for (int p = 0; p < world; ++p) {
      const at::Tensor want = at::full({p + me + 1}, 100 * p + me, at::kInt);
      if (!at::equal(out.narrow(0, off, p + me + 1), want)) throw std::runtime_error("wrong range from rank " + std::to_string(p));
      off += p + me + 1;
    }
    EXPECT_THROW(g->all_to_all_single(out, in, {1, 2}, in_counts), bd::DistError);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

}  // namespace fp8_test
