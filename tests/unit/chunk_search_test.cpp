// chunk_search_test.cpp — Gemini's chunk size search and packing (booster/src/parallel/gemini/chunk_search.h)
// against hand-worked cases of ColossalAI's rules.
#include <gtest/gtest.h>

#include "chunk_search.h"

using namespace booster::parallel::gemini;

TEST(ChunkSearch, WastedElementsCountEveryTailAndTheLastChunksRoom) {
  // chunk 10: [4, 4] (tail 2), [7] (tail 3), [5] (room 5)
  EXPECT_EQ(wasted_elements({4, 4, 7, 5}, 10), 2 + 3 + 5);
  EXPECT_EQ(wasted_elements({10, 10}, 10), 0);
  EXPECT_EQ(wasted_elements({}, 10), 0);
}

TEST(ChunkSearch, PackingOpensANewChunkWhenAParameterDoesNotFitAndIsolatesOversizedOnes) {
  auto chunks = pack_chunks({4, 4, 7, 5, 25, 3}, 10);
  ASSERT_EQ(chunks.size(), 5u);
  EXPECT_EQ(chunks[0], (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(chunks[1], (std::vector<std::size_t>{2}));
  EXPECT_EQ(chunks[2], (std::vector<std::size_t>{3}));
  EXPECT_EQ(chunks[3], (std::vector<std::size_t>{4}));  // 25 > 10: on its own
  EXPECT_EQ(chunks[4], (std::vector<std::size_t>{5}));
}

TEST(ChunkSearch, SmallModelsAreOneChunkKeptGathered) {
  auto r = search_chunk_size({100, 200}, 1000, 16, 1000, true, 2);
  EXPECT_TRUE(r.keep_gathered);
  EXPECT_EQ(r.chunk_size, 300);
}

TEST(ChunkSearch, PicksTheLeastWastefulSizeInTheRangeRoundedToTheDataParallelSize) {
  // Sizes 600 x 3, interval 16: start = 608 wastes 3 x 8 = 24; 1200 (two per chunk) wastes the last
  // chunk's 600 of room; 1808 (all three) wastes 8, the least in [608, 608 + 1200].
  auto r = search_chunk_size({600, 600, 600}, 1200, 16, 100, true, 1);
  EXPECT_FALSE(r.keep_gathered);
  EXPECT_EQ(r.chunk_size, 1808);
  EXPECT_EQ(r.wasted, 8);
  // The same on 3 ranks: rounded up to a multiple of 3.
  EXPECT_EQ(search_chunk_size({600, 600, 600}, 1200, 16, 100, true, 3).chunk_size, 1809);
  // A search range of 0 gives the start itself.
  EXPECT_EQ(search_chunk_size({600, 600, 600}, 0, 16, 100, true, 1).chunk_size, 608);
}

TEST(ChunkSearch, ExtraLargeParametersAreLeftOutOfTheSearch) {
  std::vector<int64_t> sizes(30, 100);
  sizes.push_back(100000);  // > mean + 3 std: ignored by the search (packed on its own later)
  auto filtered = search_chunk_size(sizes, 0, 10, 50, true, 1);
  EXPECT_EQ(filtered.chunk_size, 100);
  auto unfiltered = search_chunk_size(sizes, 0, 10, 50, false, 1);
  EXPECT_EQ(unfiltered.chunk_size, 100000);
}

TEST(ChunkSearch, BadArgumentsAreRefused) {
  EXPECT_THROW(search_chunk_size({1}, 0, 0, 1, true, 1), std::invalid_argument);
  EXPECT_THROW(search_chunk_size({1}, -1, 1, 1, true, 1), std::invalid_argument);
  EXPECT_THROW(search_chunk_size({-5}, 0, 1, 0, true, 1), std::invalid_argument);
  EXPECT_THROW(search_chunk_size({1}, 0, 1, 1, true, 0), std::invalid_argument);
}
