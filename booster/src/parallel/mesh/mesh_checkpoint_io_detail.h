// mesh_checkpoint_io_detail.h — what the model and optimizer parts of MeshCheckpointIO share:
// how a tensor-parallel shard sits in its full dense tensor, and a string all-gather.
// Private to libbooster.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "booster/checkpoint/safetensors.h"
#include "booster/dist/process_group.h"
#include "booster/nn/tensor_parallel.h"
#include "booster/parallel/mesh_model.h"

namespace booster::parallel::mesh_detail {

// A tensor of the model as this rank holds it (local: its tp shard, before any pipeline release)
// and as checkpoints hold it (full: the dense tensor, padding dropped).
struct Geometry {
  std::vector<int64_t> local, full;
  std::optional<nn::TensorParallelSpec> spec;  // nullopt: replicated over tp (local == full)
  int64_t inner = 1;        // elements per row along spec->dim (product of the later dims)
  int64_t local_block = 0;  // local[dim] * inner: one contiguous block of the local tensor
  int64_t full_block = 0;   // full[dim] * inner
  int64_t first_row = 0;    // the full row of local row 0 (tp_rank * padded / tp_size)
  int64_t valid_rows = 0;   // local rows that are real (not vocabulary padding)
  int64_t local_numel() const;
  int64_t full_numel() const;
};

// The geometry of `tensor` named `name` in `state` (its local shape from state.local_shape, its spec
// from nn::tensor_parallel_spec, which survives the pipeline release). Throws CheckpointError when
// the spec does not fit the local shape.
Geometry geometry_of(const MeshModel& state, const std::string& name, const at::Tensor& tensor);

// A run of a local flat range: `length` elements at local flat `local` that are full flat elements
// [full, full + length), or padding (full == -1, not part of the dense tensor).
struct Run {
  int64_t local = 0, full = -1, length = 0;
};
// The runs of local flat elements [offset, offset + length), in order (adjacent runs merged when
// contiguous in both). A shard split along dim 0 gives one run (plus padding), along dim d > 0 one
// per block of the leading dims.
std::vector<Run> runs(const Geometry& g, int64_t offset, int64_t length);

// Every rank's string, by rank (collective over `group`).
std::vector<std::string> all_gather_strings(dist::ProcessGroup& group, const std::string& value);

std::string shape_str(at::IntArrayRef shape);

}  // namespace booster::parallel::mesh_detail
