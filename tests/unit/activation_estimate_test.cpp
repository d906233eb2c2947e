// activation_estimate_test.cpp — the transformer activation formula (core/activation_estimate.h)
// against Korthikanti et al.'s Table 2 written out by hand: no parallelism, tensor parallelism,
// Megatron sequence parallelism, full and selective recomputation, Ulysses, fp32, the logits, and
// the refusals.
#include "booster/core/activation_estimate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <stdexcept>

namespace activation_estimate_test {

using booster::ActivationOptions;
using booster::TransformerShape;
using booster::transformer_activation_bytes;

// s = 2048, b = 1, h = 1024, a = 16: sbh = 2^21, 5as/h = 160.
TransformerShape shape(int64_t layers) {
  TransformerShape t;
  t.layers = layers;
  t.hidden = 1024;
  t.heads = 16;
  t.seq_length = 2048;
  t.micro_batch = 1;
  return t;
}
constexpr int64_t kSbh = int64_t{1} << 21;

ActivationOptions opts(const std::string& checkpointing = "none", int tp = 1, const std::string& sp_mode = "", int sp = 1) {
  ActivationOptions o;
  o.checkpointing = checkpointing;
  o.tp = tp;
  o.sequence_parallelism = sp_mode;
  o.sp = sp;
  return o;
}

TEST(ActivationEstimate, MatchesTheTableOfKorthikantiEtAl) {
  const int64_t layer = kSbh * (34 + 160);  // sbh(34 + 5as/h), 16-bit
  EXPECT_EQ(transformer_activation_bytes(shape(1), opts()), layer);
  EXPECT_EQ(transformer_activation_bytes(shape(24), opts()), 24 * layer);
  // Tensor parallel t = 8: sbh(10 + 24/t + 5as/(ht)).
  EXPECT_EQ(transformer_activation_bytes(shape(1), opts("none", 8)), kSbh * (10 + 3 + 20));
  // Tensor + sequence parallel: sbh(34/t + 5as/(ht)).
  EXPECT_EQ(transformer_activation_bytes(shape(1), opts("none", 8, "split_gather")), kSbh * 34 / 8 + kSbh * 20);
  // Full recomputation: 2sbh per layer (its input) + one layer recomputed in backward.
  EXPECT_EQ(transformer_activation_bytes(shape(24), opts("full")), 24 * 2 * kSbh + layer);
  EXPECT_EQ(transformer_activation_bytes(shape(24), opts("full", 8, "split_gather")),
            24 * 2 * kSbh / 8 + kSbh * 34 / 8 + kSbh * 20);
  // Selective, every 2nd layer from the first: ceil(5 / 2) = 3 checkpointed, 2 full, + one recomputed.
  ActivationOptions sel = opts("selective");
  sel.selective_every = 2;
  EXPECT_EQ(transformer_activation_bytes(shape(5), sel), 2 * layer + 3 * 2 * kSbh + layer);
  // Ulysses over 4 ranks: everything / 4.
  EXPECT_EQ(transformer_activation_bytes(shape(3), opts("none", 1, "all_to_all", 4)), 3 * layer / 4);
  // fp32: attention 21sbh + 9as²b, MLP 37sbh, LayerNorms 8sbh.
  ActivationOptions fp32 = opts();
  fp32.precision = "fp32";
  EXPECT_EQ(transformer_activation_bytes(shape(1), fp32), kSbh * 66 + kSbh * 9 * 16 * 2048 / 1024);
  // The head's logits: [b, s, V] in 2 bytes + their fp32 log-softmax, vocab-split over tp.
  TransformerShape with_vocab = shape(1);
  with_vocab.vocab = 50304;
  EXPECT_EQ(transformer_activation_bytes(with_vocab, opts()), layer + 2048 * 50304 * 6);
  EXPECT_EQ(transformer_activation_bytes(with_vocab, opts("none", 2, "split_gather")),
            (kSbh * 34 + kSbh * 160) / 2 + 2048 * 50304 * 6 / 2);
  // What recomputation buys grows with depth: 24 layers, full, at most 1/10 of none here.
  EXPECT_LT(transformer_activation_bytes(shape(24), opts("full")) * 10, transformer_activation_bytes(shape(24), opts()));
}

TEST(ActivationEstimate, RefusesWhatItCannotModel) {
  auto error = [](const TransformerShape& s, const ActivationOptions& o) {
    try {
      transformer_activation_bytes(s, o);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  using ::testing::HasSubstr;
  EXPECT_THAT(error(shape(0), opts()), HasSubstr("layers must be >= 1"));
  EXPECT_THAT(error(shape(1), opts("none", 1, "split_gather")), HasSubstr("needs tp > 1"));
  EXPECT_THAT(error(shape(1), opts("none", 1, "", 2)), HasSubstr("set sequence_parallelism = \"all_to_all\""));
  EXPECT_THAT(error(shape(1), opts("none", 1, "all_to_all", 3)), HasSubstr("seq_length 2048 is not divisible by the "
                                                                          "sequence-parallel degree 3"));
  EXPECT_THAT(error(shape(1), opts("some")), HasSubstr("checkpointing must be"));
  ActivationOptions p = opts();
  p.precision = "int8";
  EXPECT_THAT(error(shape(1), p), HasSubstr("precision must be"));
  p = opts("selective");
  p.selective_every = 0;
  EXPECT_THAT(error(shape(1), p), HasSubstr("selective_every must be >= 1"));
}

}  // namespace activation_estimate_test
