// chunk_search.h — Gemini's chunk size: ColossalAI's search (zero/gemini/chunk/search_utils.py,
// search_chunk_configuration) over the parameters' element counts, and the packing it assumes.
//
// Packing (pack_chunks): parameters in the given order are appended to the open chunk; one that does
// not fit in what is left closes it and opens a new chunk. A parameter larger than the chunk size gets
// a chunk of its own, exactly its size (ColossalAI: "oversized parameters on their own").
//
// Search (search_chunk_size), all sizes in elements:
//  - total < min_chunk_size: one chunk holding everything, kept gathered (keep_gathered: small models
//    stay replicated, as ColossalAI's "let small parameters keep gathered").
//  - otherwise, with the "extra-large" parameters (numel > mean + 3 standard deviations, population)
//    left out of the search when filter_exlarge_params: start = the largest remaining numel (at least
//    min_chunk_size) rounded up to a multiple of search_interval; every candidate start, start +
//    interval, ... <= start + search_range is scored by its wasted tail (the elements left unused at
//    the end of every chunk by pack_chunks, the last chunk's included), and the first candidate with
//    the least waste wins; finally rounded up to a multiple of dp_size (the chunk divides evenly).
// Errors: std::invalid_argument for search_interval < 1, search_range < 0, min_chunk_size < 0,
// dp_size < 1 or a negative numel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace booster::parallel::gemini {

struct ChunkSearchResult {
  int64_t chunk_size = 0;    // elements per chunk (oversized parameters excepted)
  int64_t wasted = 0;        // elements wasted at the chunk tails by the winning size (the search's score)
  bool keep_gathered = false;
};

ChunkSearchResult search_chunk_size(const std::vector<int64_t>& numels, int64_t search_range, int64_t search_interval,
                                    int64_t min_chunk_size, bool filter_exlarge_params, int dp_size);

// Elements left unused by packing `numels` into chunks of chunk_size (ColossalAI's _get_unused_byte):
// the tail of every closed chunk plus the room left in the last one.
int64_t wasted_elements(const std::vector<int64_t>& numels, int64_t chunk_size);

// The chunks of pack_chunks: indices into numels, in order, each chunk non-empty.
std::vector<std::vector<std::size_t>> pack_chunks(const std::vector<int64_t>& numels, int64_t chunk_size);

}  // namespace booster::parallel::gemini
