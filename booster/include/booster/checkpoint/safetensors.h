// safetensors.h — reader and writer of the safetensors format (huggingface/safetensors, docs/
// "Format"): 8-byte little-endian header length N, N bytes of UTF-8 JSON header (may be padded
// with spaces), then the data buffer. Each header entry: {"dtype", "shape", "data_offsets":
// [begin, end)} relative to the buffer start; optional "__metadata__" string -> string map.
//
// The reader validates everything before returning and never allocates from an unchecked header
// value; a bad file throws CheckpointError naming the file and the problem (see the parser).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "booster/export.h"

namespace booster::checkpoint {

// Every checkpoint problem: bad file, missing shard, mismatch with the model. The message names
// the file (and tensor) and what is wrong.
class BOOSTER_API CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// (name, tensor) in order: a state dict.
using StateDict = std::vector<std::pair<std::string, at::Tensor>>;

constexpr uint64_t SAFETENSORS_MAX_HEADER_BYTES = 100'000'000;  // the reference implementation's limit

struct SafetensorsEntry {
  std::string name;
  std::string dtype;            // "F64" "F32" "F16" "BF16" "I64" "I32" "I16" "I8" "U8" "BOOL" "U16" "U32"
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets into the data buffer, [begin, end)
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;                 // N
  uint64_t data_start = 0;                   // 8 + N: file offset of the data buffer
  std::vector<SafetensorsEntry> tensors;     // sorted by begin offset
  std::map<std::string, std::string> metadata;
};

// Parses and validates a header from the first `size` bytes of a file of `file_size` bytes
// (`size` may be less than file_size; it must cover 8 + N bytes or the header is "truncated").
// Pure (no I/O): the fuzz target. `source` names the file in errors. Rejects: file shorter than 8
// bytes; N > SAFETENSORS_MAX_HEADER_BYTES; 8 + N > file_size; invalid UTF-8 or JSON; a header that
// is not an object; an entry without dtype/shape/data_offsets or with wrong JSON types; unknown
// dtype; negative dims; numel * dtype size overflow or != end - begin; offsets that do not start
// at 0, overlap or leave gaps; trailing bytes after the last tensor (data_start + last end !=
// file_size); "__metadata__" that is not a string -> string map; duplicate names.
BOOSTER_API SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, uint64_t file_size,
                                                       const std::string& source);

// Reads and validates the header of a file (throws CheckpointError; a missing file names the path).
BOOSTER_API SafetensorsHeader read_safetensors_header(const std::string& path);

// Loads the tensors of a file (all, or only those named in `only`, in header order) as owning CPU
// tensors; the file is memory-mapped, so peak memory is the returned tensors. U16/U32 are read into
// int32/int64 (LibTorch 1.13 has no uint16/uint32). Throws CheckpointError for any invalid file or
// a name in `only` that the file lacks.
BOOSTER_API StateDict load_safetensors(const std::string& path, const std::vector<std::string>* only = nullptr);

// Reads elements [begin, begin + count) of the flattened tensor `entry` (an entry of `header`, which
// read_safetensors_header(path) returned) with pread: only those bytes are read, never the whole
// file. Returns a 1-D tensor of `count` elements in the entry's load dtype (U16/U32 widened as
// load_safetensors does; BOOL bytes checked); when `out` is defined the elements are read into it
// instead (a contiguous CPU tensor of that dtype and `count` elements, e.g. a narrow() of a larger
// buffer) and it is returned. Throws CheckpointError naming the file (and tensor) for a range outside
// the entry, an `out` that does not fit, an I/O error, or a file whose size no longer matches the
// header (it was replaced since the header was read).
BOOSTER_API at::Tensor read_safetensors_range(const std::string& path, const SafetensorsHeader& header,
                                              const SafetensorsEntry& entry, int64_t begin, int64_t count,
                                              at::Tensor out = {});

// Writes tensors (any device, contiguous or not: written as C-order little-endian) with
// metadata (default {"format": "pt"}) to `path`, the header padded with spaces to a multiple of 8,
// offsets in the given order, then fsyncs the file. Not atomic by itself (the checkpoint writer
// writes into a temporary directory). Throws CheckpointError for an unsupported dtype (complex,
// quantized), duplicate names, or an I/O error (with errno text).
BOOSTER_API void write_safetensors(const std::string& path, const StateDict& tensors,
                                   const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// dtype name <-> LibTorch scalar type. Throws CheckpointError for unsupported ones.
BOOSTER_API std::string safetensors_dtype(at::ScalarType type);
BOOSTER_API at::ScalarType scalar_type_from_safetensors(const std::string& dtype);
// Bytes per element of a safetensors dtype name (0 if unknown).
BOOSTER_API size_t safetensors_dtype_size(const std::string& dtype);

}  // namespace booster::checkpoint
