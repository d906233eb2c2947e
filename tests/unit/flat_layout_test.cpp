// flat_layout_test.cpp — the ZeRO flat layout: padding, per-rank shards, pieces of tensors that
// cross shard boundaries, and parameters turned into views of the flat buffer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "booster/core/flat_layout.h"

using booster::FlatLayout;
using booster::make_flat_layout;

TEST(FlatLayout, PadsToAMultipleOfTheWorldSizeAndSplitsIntoEqualShards) {
  FlatLayout l = make_flat_layout({5, 1, 3}, 4);
  EXPECT_EQ(l.numel, 9);
  EXPECT_EQ(l.shard_numel, 3);
  EXPECT_EQ(l.padded_numel, 12);
  EXPECT_EQ(l.offsets, (std::vector<int64_t>{0, 5, 6}));
  // Tensor 0 [0, 5) spans rank 0 [0, 3) and rank 1 [3, 6).
  auto p = l.piece(0, 0);
  EXPECT_EQ(p.tensor_offset, 0); EXPECT_EQ(p.shard_offset, 0); EXPECT_EQ(p.length, 3);
  p = l.piece(0, 1);
  EXPECT_EQ(p.tensor_offset, 3); EXPECT_EQ(p.shard_offset, 0); EXPECT_EQ(p.length, 2);
  // The 1-element tensor (smaller than the world size) sits at the end of rank 1's shard.
  p = l.piece(1, 1);
  EXPECT_EQ(p.tensor_offset, 0); EXPECT_EQ(p.shard_offset, 2); EXPECT_EQ(p.length, 1);
  EXPECT_EQ(l.piece(1, 0).length, 0);
  EXPECT_EQ(l.piece(1, 2).length, 0);
  // Tensor 2 [6, 9) is rank 2's whole shard; rank 3 owns only padding.
  p = l.piece(2, 2);
  EXPECT_EQ(p.tensor_offset, 0); EXPECT_EQ(p.shard_offset, 0); EXPECT_EQ(p.length, 3);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(l.piece(i, 3).length, 0);
}

TEST(FlatLayout, EveryRankGetsAShardEvenWhenThereIsLessThanOneElementEach) {
  FlatLayout empty = make_flat_layout({}, 4);
  EXPECT_EQ(empty.shard_numel, 1);
  EXPECT_EQ(empty.padded_numel, 4);
  FlatLayout one = make_flat_layout({1}, 4);
  EXPECT_EQ(one.padded_numel, 4);
  EXPECT_EQ(one.piece(0, 0).length, 1);
  EXPECT_EQ(one.piece(0, 1).length, 0);
  EXPECT_THROW(make_flat_layout({3}, 0), std::invalid_argument);
  EXPECT_THROW(make_flat_layout({-1}, 2), std::invalid_argument);
}

TEST(FlatLayout, FlattenIntoViewsKeepsValuesAndIdentity) {
  torch::manual_seed(1);
  torch::Tensor a = torch::randn({2, 3}).set_requires_grad(true), b = torch::randn({4}).set_requires_grad(true);
  torch::Tensor a0 = a.detach().clone(), b0 = b.detach().clone();
  const void* impl_a = a.unsafeGetTensorImpl();
  std::vector<torch::Tensor> tensors{a, b};
  FlatLayout l = make_flat_layout({6, 4}, 4);
  torch::Tensor flat = booster::flatten_into_views(tensors, l);
  EXPECT_EQ(flat.numel(), 12);
  EXPECT_EQ(a.unsafeGetTensorImpl(), impl_a);  // the same tensor object (optimizers keep working)
  EXPECT_TRUE(a.requires_grad());
  EXPECT_TRUE(a.is_leaf());
  EXPECT_TRUE(torch::equal(a, a0));
  EXPECT_TRUE(torch::equal(b, b0));
  EXPECT_TRUE(torch::equal(flat.narrow(0, 10, 2), torch::zeros({2})));  // padding
  {
    torch::NoGradGuard g;
    flat.fill_(2.0);  // the tensors are views of the flat buffer
  }
  EXPECT_TRUE(torch::equal(a, torch::full({2, 3}, 2.0)));
  EXPECT_TRUE(torch::equal(b, torch::full({4}, 2.0)));

  std::vector<torch::Tensor> mixed{torch::zeros({2}), torch::zeros({2}, torch::kBFloat16)};
  EXPECT_THROW(booster::flatten_into_views(mixed, make_flat_layout({2, 2}, 2)), std::invalid_argument);
}
