// did_you_mean.cpp — edit distance and closest match (see booster/did_you_mean.h).
#include "booster/did_you_mean.h"

#include <algorithm>

namespace booster {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, substitute});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates, size_t max_distance) {
  std::string best;
  size_t best_distance = max_distance + 1;
  for (const auto& c : candidates) {
    if (c == word) continue;
    const size_t d = edit_distance(word, c);
    if (d < best_distance && d < std::max(word.size(), c.size())) {
      best = c;
      best_distance = d;
    }
  }
  return best;
}

}  // namespace booster
