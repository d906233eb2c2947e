// safetensors_fuzz.cpp — libFuzzer target for the safetensors header parser.
// Any input must either parse or throw CheckpointError; any other exception, a crash, a sanitizer
// report, a leak or a huge allocation is a bug. Built by tests/fuzz/run_fuzz.sh (parser only, no
// LibTorch code: safetensors_header.cpp alone).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "booster/checkpoint/safetensors.h"

using booster::checkpoint::CheckpointError;
using booster::checkpoint::parse_safetensors_header;
using booster::checkpoint::SafetensorsHeader;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    SafetensorsHeader h = parse_safetensors_header(data, size, size, "fuzz");
    // Invariants of an accepted header.
    uint64_t expected = 0;
    for (const auto& t : h.tensors) {
      if (t.begin != expected || t.end < t.begin) std::abort();
      expected = t.end;
      for (int64_t d : t.shape) {
        if (d < 0) std::abort();
      }
    }
    if (h.data_start != 8 + h.header_bytes || h.data_start + expected != size) std::abort();
    // A prefix shorter than the header must be refused, never read past.
    if (h.data_start > 8) {
      try {
        parse_safetensors_header(data, static_cast<size_t>(h.data_start - 1), size, "fuzz");
        std::abort();
      } catch (const CheckpointError&) {
      }
    }
  } catch (const CheckpointError& e) {
    if (e.what()[0] == '\0') std::abort();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    std::abort();
  }
  return 0;
}
