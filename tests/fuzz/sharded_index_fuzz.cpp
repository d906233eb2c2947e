// sharded_index_fuzz.cpp — libFuzzer target for the sharded checkpoint index parser
// (booster/src/checkpoint/sharded_index.cpp): any input must either give an index or throw
// CheckpointError; an accepted index has world_size distinct plain file names, plain extra file
// names, distinct tensor names, and per tensor pieces that name a listed file and are non-empty,
// inside the tensor, sorted and disjoint, with covered equal to the sum of their lengths. Anything
// else — another exception, a crash, a sanitizer report, a leak — is a bug. Built by
// tests/fuzz/run_fuzz.sh (FUZZ_TARGET=sharded_index; no LibTorch code).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "booster/checkpoint/safetensors.h"
#include "checkpoint/index_json.h"
#include "checkpoint/sharded_index.h"

using booster::checkpoint::CheckpointError;
namespace detail = booster::checkpoint::detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const detail::ShardedIndex index = detail::parse_sharded_index(text, "fuzz.sharded.json");
    if (index.world_size < 1 || index.files.size() != static_cast<size_t>(index.world_size)) std::abort();
    std::set<std::string> files(index.files.begin(), index.files.end());
    if (files.size() != index.files.size()) std::abort();
    for (const auto& f : index.files)
      if (!detail::is_plain_file_name(f)) std::abort();
    for (const auto& f : index.extra_files)
      if (!detail::is_plain_file_name(f)) std::abort();
    std::set<std::string> names;
    for (const auto& t : index.tensors) {
      if (!names.insert(t.name).second || t.numel < 0 || t.numel != detail::checked_numel(t.shape)) std::abort();
      int64_t end = 0, covered = 0;
      for (const auto& p : t.pieces) {
        if (p.file >= index.files.size() || p.length < 1 || p.offset < end || p.offset > t.numel - p.length)
          std::abort();
        end = p.offset + p.length;
        covered += p.length;
      }
      if (covered != t.covered) std::abort();
    }
  } catch (const CheckpointError&) {
  }
  return 0;
}
