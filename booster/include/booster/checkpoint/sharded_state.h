// sharded_state.h — the sharded (DCP-like) state format: every rank writes only the pieces of the
// logical (full) state dict it holds, and a reader at any world size reads any range of any tensor
// from the overlapping pieces. For sharded plugins (ZeRO-1/2, FSDP), which hold each parameter's
// optimizer state as contiguous ranges of the FLATTENED parameter. The layout is specified in
// docs/checkpoint-format.md ("Sharded state"); in short, directory <dir> holds
//   <base>-rank-0000r-of-0000N.safetensors   one per rank r of N (0-based), the rank's pieces as 1-D
//                                            entries named "<logical name>@<offset>"
//   <base>.sharded.json                      {"format": "booster-sharded-v1", "world_size": N,
//                                             "save_id", "files", "extra_files", "tensors": [{name,
//                                             dtype, shape, pieces: [{file, entry, offset, length}]}]}
//   extra files (e.g. optimizer_groups.json) written by rank 0.
// The file formats are safetensors.h; the directory is replaced with io::atomic_write_directory.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "booster/checkpoint/safetensors.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/export.h"

namespace booster {
namespace dist {
class ProcessGroup;
}

namespace checkpoint {

// One contiguous range of one flattened tensor of the logical (full) state dict, held by this rank.
struct StatePiece {
  std::string name;            // logical tensor name, e.g. "l1.weight.exp_avg"
  std::vector<int64_t> shape;  // the FULL logical tensor's shape, e.g. [32, 16] ([] for a scalar)
  int64_t offset = 0;          // first element of the range in the flattened full tensor
  at::Tensor values;           // 1-D: elements [offset, offset + values.numel()) of the flattened tensor,
                               // any device/strides; every piece of a name has the same dtype and shape
};

// Saves the pieces of every rank of `group` into directory `dir`, replacing it atomically.
// Collective over `group`: every rank calls it, with the same `dir` and `base` (checked), in the
// same order relative to the group's other collectives. `group` nullptr (or a group of one) is a
// single process. Ranks in files and messages are ranks of `group`.
//
// Pieces: validated on every rank, then globally (every rank sees every rank's piece descriptors):
//   - name non-empty and valid UTF-8; values defined and 1-D; shape dims >= 0; dtype one that
//     safetensors stores (float64/32/16, bfloat16, int64/32/16/8, uint8, bool);
//     0 <= offset and offset + length <= numel(shape);
//   - every piece of one name (on any rank) has the same dtype and shape;
//   - no two non-empty pieces of one name overlap, on one rank or across ranks (the error names the
//     tensor, both ranges and both ranks). Replicated state (DDP, HYBRID_SHARD replicas) is saved by
//     passing the pieces of ONE replica only; the other replicas pass no pieces.
//   Zero-length pieces are allowed: they write nothing but make the tensor (name, dtype, shape)
//   known, so a tensor of numel 0, or one that no rank holds any element of, is listed.
// A tensor need not be fully covered: reading an uncovered range throws (ShardedStateReader).
// Data problems (a tensor on the meta device, a device copy failing) and I/O errors surface when
// the rank writes its file.
//
// extra_files (file name -> text, e.g. "optimizer_groups.json") are taken from rank 0 only; other
// ranks' maps are ignored. Names must be plain file names other than the generated ones.
//
// Protocol (all-or-nothing; no rank hangs when another fails, as every rank reaches the same
// collectives): (1) one all-gather of the piece descriptors, then the validation above, identical on
// every rank; (2) rank 0 runs io::atomic_write_directory(dir, fill); in `fill` it broadcasts the
// temporary directory's path, every rank writes and fsyncs its own file there (rank 0 also the json
// and the extra files), and (3) one all-gather of every rank's outcome: only when every rank
// succeeded does rank 0 let the directory be committed (4; one broadcast of the commit's outcome).
// `dir` must be on a file system every rank sees (one node, or a shared file system).
// Any failure, on any rank, at any step makes EVERY rank throw the same CheckpointError naming the
// failing rank(s) and their errors; `dir` is then unchanged (its previous content, or still absent).
// std::invalid_argument-type problems (bad base name) are reported the same way.
BOOSTER_API void save_sharded_state(const std::string& dir, const std::vector<StatePiece>& pieces,
                                    dist::ProcessGroup* group, const std::string& base = "optimizer",
                                    const std::map<std::string, std::string>& extra_files = {});

// One stored piece of a logical tensor, as <base>.sharded.json lists it.
struct ShardedPieceInfo {
  int rank = 0;         // the rank that saved it
  std::string file;     // full path of the rank's file
  std::string entry;    // its tensor name inside that file ("<name>@<offset>")
  int64_t offset = 0;   // first element in the flattened logical tensor
  int64_t length = 0;   // elements
};

// One logical tensor of a sharded checkpoint.
struct ShardedTensorInfo {
  std::string name;
  at::ScalarType dtype = at::ScalarType::Undefined;  // the saved dtype (read_range returns it)
  std::vector<int64_t> shape;                        // the full logical shape
  int64_t numel = 0;
  int64_t covered = 0;                    // elements held by some piece (== numel: fully covered)
  std::vector<ShardedPieceInfo> pieces;   // non-empty pieces, sorted by offset, disjoint
};

// Reads a sharded checkpoint. The constructor validates <dir>/<base>.sharded.json completely (format
// tag, world size, plain file names, tensors, dtypes, shapes, piece ranges inside the tensor and
// disjoint) and reads the header of every rank file it lists (only the headers): each must exist,
// be a valid safetensors file of this save (its __metadata__ format and save_id), and hold every
// entry the json assigns to it with the json's dtype and shape [length]. Any problem throws
// CheckpointError naming the file (the json or the rank file) and what is wrong. Reads are
// thread-safe (const; each opens the files it needs).
class BOOSTER_API ShardedStateReader {
 public:
  explicit ShardedStateReader(const std::string& dir, const std::string& base = "optimizer");
  // Whether `dir` holds a sharded checkpoint of `base` (<dir>/<base>.sharded.json is a regular file).
  static bool exists(const std::string& dir, const std::string& base = "optimizer");

  const std::string& dir() const;
  const std::string& base() const;
  int world_size() const;                                // ranks that saved it
  const std::vector<std::string>& files() const;         // the rank files (full paths), by rank
  const std::vector<ShardedTensorInfo>& tensors() const; // every logical tensor, in save order
  const ShardedTensorInfo* find(const std::string& name) const;  // nullptr when absent
  // The tensors as list_checkpoint_tensors gives them (file: the path of <base>.sharded.json).
  std::vector<CheckpointTensorInfo> list() const;

  // Elements [offset, offset + length) of the flattened logical tensor `name`, in its saved dtype
  // (a new 1-D tensor), assembled from every overlapping piece; only those bytes are read (pread).
  // Throws CheckpointError for an unknown name, a range outside [0, numel), or a range with elements
  // that no piece holds (naming the tensor and the first uncovered range) — checked before any read.
  at::Tensor read_range(const std::string& name, int64_t offset, int64_t length) const;
  // read_range(name, 0, numel) viewed in the logical shape.
  at::Tensor read_full(const std::string& name) const;

  const std::vector<std::string>& extra_files() const;   // names, as saved
  // The text of an extra file; CheckpointError when it is not one of extra_files() or unreadable.
  std::string read_extra_file(const std::string& file_name) const;

  struct Impl;

 private:
  std::shared_ptr<const Impl> impl_;
};

// `booster ckpt consolidate`: rewrites the sharded checkpoint at in_dir (base `base`) in the
// gathered format: every logical tensor read in full and written with save_state_dict(out_dir,
// state, options, base, extra files) — for base "optimizer" the gathered optimizer format
// (optimizer.safetensors or shards + index, optimizer_groups.json copied unchanged). out_dir is
// replaced atomically. Peak memory is the whole state (as the gathered save on rank 0). Every
// tensor must be fully covered (else CheckpointError naming it). Returns the number of tensors.
BOOSTER_API size_t consolidate_sharded_state(const std::string& in_dir, const std::string& out_dir,
                                             const SaveOptions& options = {}, const std::string& base = "optimizer");

}  // namespace checkpoint
}  // namespace booster
