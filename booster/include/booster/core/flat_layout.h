// flat_layout.h — flattening a list of tensors into one padded 1-D buffer split into equal
// contiguous shards, one per rank: the layout of ZeRO stage 1/2 (Rajbhandari et al., "ZeRO:
// Memory Optimizations Toward Training Trillion Parameter Models", SC20; DeepSpeed's
// stage_1_and_2.py flattens each parameter group, pads it to a multiple of the world size and gives
// rank r the r-th contiguous partition). Gemini, FSDP and the hybrid plugin reuse it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "booster/export.h"

namespace booster {

struct BOOSTER_API FlatLayout {
  std::vector<int64_t> offsets;  // element offset of tensor i in the flat buffer
  std::vector<int64_t> numels;   // numel of tensor i
  int64_t numel = 0;             // sum of numels (unpadded)
  int64_t padded_numel = 0;      // numel rounded up to a multiple of world_size (>= world_size)
  int64_t shard_numel = 0;       // padded_numel / world_size
  int world_size = 1;

  // The part of tensor i that lies in rank r's shard [r * shard_numel, (r + 1) * shard_numel):
  // elements [tensor_offset, tensor_offset + length) of the flattened tensor sit at
  // [shard_offset, shard_offset + length) of the shard. length 0 when they do not intersect.
  struct Piece {
    int64_t tensor_offset = 0;
    int64_t shard_offset = 0;
    int64_t length = 0;
  };
  Piece piece(size_t i, int rank) const;
  // [begin, end) of rank r's shard in the flat buffer.
  int64_t shard_begin(int rank) const { return static_cast<int64_t>(rank) * shard_numel; }
};

// Lays out tensors of these numels back to back (no alignment), padded so every rank gets
// padded_numel / world_size elements (at least 1, so even an empty list gives every rank a shard).
// Throws std::invalid_argument for world_size < 1 or a negative numel.
BOOSTER_API FlatLayout make_flat_layout(const std::vector<int64_t>& numels, int world_size);

// Copies `tensors` (numels as in layout, any shapes, one dtype) into a new zero-padded flat buffer
// of layout.padded_numel elements with the tensors' dtype and device, then makes each tensor a view
// of its slice (Tensor::set_data: the tensor keeps its identity, autograd metadata and optimizer
// bindings). Returns the flat buffer. Throws std::invalid_argument when dtypes or devices differ.
BOOSTER_API at::Tensor flatten_into_views(std::vector<at::Tensor>& tensors, const FlatLayout& layout);

}  // namespace booster
