// index_json.cpp — a HuggingFace index's weight_map (see index_json.h).
#include "index_json.h"

#include <nlohmann/json.hpp>

#include "booster/checkpoint/safetensors.h"  // CheckpointError

namespace booster::checkpoint::detail {

bool is_plain_file_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  return name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

std::map<std::string, std::vector<std::string>> parse_weight_map(const std::string& text,
                                                                 const std::string& index_path) {
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("index '" + index_path + "' is not valid JSON: " + e.what());
  }
  if (!index.is_object()) throw CheckpointError("index '" + index_path + "' is not a JSON object");
  if (index.contains("metadata") && !index["metadata"].is_object())
    throw CheckpointError("index '" + index_path + "': \"metadata\" is not an object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object())
    throw CheckpointError("index '" + index_path + "' has no \"weight_map\" object");
  std::map<std::string, std::vector<std::string>> by_file;  // sorted by file name = shard order
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string())
      throw CheckpointError("index '" + index_path + "': weight_map entry '" + it.key() + "' is not a string");
    const std::string file = it.value().get<std::string>();
    if (!is_plain_file_name(file))
      throw CheckpointError("index '" + index_path + "': weight_map entry '" + it.key() + "' names '" + file +
                            "', which is not a plain file name inside the checkpoint directory");
    by_file[file].push_back(it.key());
  }
  return by_file;
}

}  // namespace booster::checkpoint::detail
