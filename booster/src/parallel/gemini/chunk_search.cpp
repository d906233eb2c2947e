// chunk_search.cpp — Gemini's chunk size search and packing (see chunk_search.h).
#include "chunk_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

namespace booster::parallel::gemini {

int64_t wasted_elements(const std::vector<int64_t>& numels, int64_t chunk_size) {
  int64_t acc = 0, left = 0;
  for (int64_t s : numels) {
    if (s > left) {
      acc += left;
      left = chunk_size;
    }
    left -= s;  // an oversized parameter drives `left` negative: its chunk has no tail
  }
  return std::max<int64_t>(left, 0) + acc;
}

std::vector<std::vector<size_t>> pack_chunks(const std::vector<int64_t>& numels, int64_t chunk_size) {
  std::vector<std::vector<size_t>> chunks;
  int64_t left = 0;
  for (size_t i = 0; i < numels.size(); ++i) {
    if (numels[i] > chunk_size) {  // on its own, exactly its size
      chunks.push_back({i});
      left = 0;
      continue;
    }
    if (chunks.empty() || numels[i] > left) {
      chunks.emplace_back();
      left = chunk_size;
    }
    chunks.back().push_back(i);
    left -= numels[i];
  }
  return chunks;
}

ChunkSearchResult search_chunk_size(const std::vector<int64_t>& numels, int64_t search_range, int64_t search_interval,
                                    int64_t min_chunk_size, bool filter_exlarge_params, int dp_size) {
  if (search_interval < 1 || search_range < 0 || min_chunk_size < 0 || dp_size < 1)
    throw std::invalid_argument("gemini: chunk search needs search_interval >= 1, search_range >= 0, "
                                "min_chunk_size >= 0 and dp_size >= 1 (got " + std::to_string(search_interval) + ", " +
                                std::to_string(search_range) + ", " + std::to_string(min_chunk_size) + ", " +
                                std::to_string(dp_size) + ")");
  int64_t total = 0;
  for (int64_t n : numels) {
    if (n < 0) throw std::invalid_argument("gemini: chunk search: negative parameter numel " + std::to_string(n));
    total += n;
  }
  ChunkSearchResult r;
  if (total < min_chunk_size) {
    r.chunk_size = std::max<int64_t>(total, 1);
    r.keep_gathered = true;
    return r;
  }
  std::vector<int64_t> sizes = numels;
  if (filter_exlarge_params && !sizes.empty()) {
    const double mean = static_cast<double>(total) / static_cast<double>(sizes.size());
    double var = 0;
    for (int64_t n : sizes) var += (static_cast<double>(n) - mean) * (static_cast<double>(n) - mean);
    const double upper = mean + 3.0 * std::sqrt(var / static_cast<double>(sizes.size()));
    sizes.erase(std::remove_if(sizes.begin(), sizes.end(), [&](int64_t n) { return static_cast<double>(n) > upper; }),
                sizes.end());
  }
  int64_t max_size = min_chunk_size;
  for (int64_t n : sizes) max_size = std::max(max_size, n);
  const int64_t start = (max_size + search_interval - 1) / search_interval * search_interval;
  r.chunk_size = start;
  r.wasted = std::numeric_limits<int64_t>::max();
  for (int64_t size = std::max<int64_t>(start, 1); size <= start + search_range; size += search_interval) {
    const int64_t waste = wasted_elements(sizes, size);
    if (waste < r.wasted) {
      r.wasted = waste;
      r.chunk_size = size;
    }
  }
  r.chunk_size = std::max<int64_t>(r.chunk_size, 1);
  r.chunk_size += (dp_size - r.chunk_size % dp_size) % dp_size;
  return r;
}

}  // namespace booster::parallel::gemini
