// did_you_mean_test.cpp — edit distance and the closest-match hint (booster/did_you_mean.h).
#include "booster/did_you_mean.h"

#include <gtest/gtest.h>

namespace {

TEST(DidYouMean, EditDistance) {
  EXPECT_EQ(booster::edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(booster::edit_distance("", "abc"), 3u);
  EXPECT_EQ(booster::edit_distance("abc", ""), 3u);
  EXPECT_EQ(booster::edit_distance("stage", "stage"), 0u);
  EXPECT_EQ(booster::edit_distance("bucket_cap_m", "bucket_cap_mb"), 1u);
  EXPECT_EQ(booster::edit_distance("ab", "ba"), 2u);  // plain Levenshtein: no transpositions
}

TEST(DidYouMean, ClosestMatch) {
  using booster::closest_match;
  const std::vector<std::string> keys{"bucket_cap_mb", "first_bucket_mb", "broadcast_buffers", "stage"};
  EXPECT_EQ(closest_match("bucket_cap_m", keys), "bucket_cap_mb");
  EXPECT_EQ(closest_match("stgae", keys), "stage");          // two substitutions
  EXPECT_EQ(closest_match("bucket_cap_mb", keys), "");       // the word itself is no hint
  EXPECT_EQ(closest_match("completely_else", keys), "");     // too far
  EXPECT_EQ(closest_match("a", {"c"}), "");                  // shares nothing with the word
  EXPECT_EQ(closest_match("stag", {"stage", "stab"}), "stage");  // ties go to the first
  EXPECT_EQ(closest_match("stge", keys, 0), "");             // max_distance 0: exact only, never a hint
  EXPECT_EQ(closest_match("x", {}), "");
}

}  // namespace
