// index_json.h — the weight_map of a HuggingFace checkpoint index (`model.safetensors.index.json`,
// `pytorch_model.bin.index.json`: {"metadata": {...}, "weight_map": {tensor name: shard file}}), as
// load_state_dict reads it. No LibTorch code (fuzzed alone: tests/fuzz/index_fuzz.cpp).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace booster::checkpoint::detail {

// The shard files of the index text `text` (sorted by file name, the order shards are loaded in),
// each with the tensor names the index assigns to it in the index's order. Throws CheckpointError
// naming `index_path` when the text is not JSON, not an object, has a "metadata" that is not an
// object, has no "weight_map" object, maps a name to something other than a string, or names a
// file that is not a plain file name inside the checkpoint directory (is_plain_file_name).
std::map<std::string, std::vector<std::string>> parse_weight_map(const std::string& text,
                                                                 const std::string& index_path);

// A plain file name: not empty, not "." or "..", no '/', '\\' or NUL.
bool is_plain_file_name(const std::string& name);

}  // namespace booster::checkpoint::detail
