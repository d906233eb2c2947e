// sharded_index.h — the index of a sharded checkpoint, <base>.sharded.json (docs/checkpoint-format.md,
// "Sharded state"): its parser, which checks everything the json alone can say, and the helpers the
// writer and the reader of sharded_state.cpp share. Internal to libbooster, free of LibTorch (the
// fuzz target tests/fuzz/sharded_index_fuzz.cpp links it alone).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace booster::checkpoint::detail {

inline constexpr const char* kShardedFormat = "booster-sharded-v1";

// "[begin, end)".
std::string range_text(int64_t begin, int64_t end);
// Elements of a shape; -1 for a negative dimension or an overflow of int64.
int64_t checked_numel(const std::vector<int64_t>& shape);

struct ShardedIndexPiece {
  size_t file = 0;  // index in ShardedIndex::files (the rank that saved it)
  std::string entry;
  int64_t offset = 0, length = 0;  // elements of the flattened tensor
};

struct ShardedIndexTensor {
  std::string name, dtype;  // dtype as the json names it (not checked here: the reader converts it)
  std::vector<int64_t> shape;
  int64_t numel = 0, covered = 0;         // covered: elements some piece holds
  std::vector<ShardedIndexPiece> pieces;  // sorted by offset, disjoint, each inside [0, numel)
};

struct ShardedIndex {
  int world_size = 0;
  std::string save_id;
  std::vector<std::string> files;        // world_size distinct plain file names, by rank
  std::vector<std::string> extra_files;  // plain file names
  std::vector<ShardedIndexTensor> tensors;  // in the json's order, names distinct
};

// Parses `text`, the content of the index file index_path (used in messages): a JSON object with
// "format" == kShardedFormat, "world_size" in [1, 2^24], "save_id", "files" (world_size distinct
// plain file names, detail::is_plain_file_name), "extra_files" (plain file names) and "tensors", each
// {name (distinct), dtype, shape (integers whose product fits int64), pieces: [{file (one of files),
// entry, offset, length}]} whose pieces are non-empty ranges inside the tensor that do not overlap.
// Throws CheckpointError("<index_path>: <what>") for the first problem; nothing else (any input).
ShardedIndex parse_sharded_index(const std::string& text, const std::string& index_path);

}  // namespace booster::checkpoint::detail
