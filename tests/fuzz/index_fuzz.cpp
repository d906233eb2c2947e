// index_fuzz.cpp — libFuzzer target for the HuggingFace index reader
// (booster/src/checkpoint/index_json.cpp): any input must either give a weight_map or throw
// CheckpointError; an accepted map names only plain files (nothing outside the checkpoint
// directory) and every name once. Anything else — another exception, a crash, a sanitizer report,
// a leak — is a bug. Built by tests/fuzz/run_fuzz.sh index (no LibTorch code).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "booster/checkpoint/safetensors.h"
#include "checkpoint/index_json.h"

using booster::checkpoint::CheckpointError;
namespace detail = booster::checkpoint::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto by_file = detail::parse_weight_map(text, "fuzz.index.json");
    std::set<std::string> names;
    for (const auto& [file, list] : by_file) {
      if (!detail::is_plain_file_name(file) || file.find('/') != std::string::npos || file == "..") std::abort();
      for (const auto& n : list)
        if (!names.insert(n).second) std::abort();
    }
  } catch (const CheckpointError&) {
  }
  return 0;
}
