// did_you_mean.h — "did you mean" hints for misspelt names (config keys, plugin names, options).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "booster/export.h"

namespace booster {

// Levenshtein edit distance (insertions, deletions, substitutions; no transpositions), in bytes.
BOOSTER_API size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word` within `max_distance` edits ("" if none); ties go to the first.
// `word` itself is never a hint, nor a candidate that shares nothing with it (distance equal to the
// longer length, e.g. "c" for "a").
BOOSTER_API std::string closest_match(const std::string& word, const std::vector<std::string>& candidates,
                                      size_t max_distance = 3);

}  // namespace booster
