// state_dict_io.h — HuggingFace-compatible checkpoint files for a state dict: unsharded
// (`model.safetensors` / `pytorch_model.bin`) or sharded (`model-00001-of-00003.safetensors` ... +
// `model.safetensors.index.json`, `pytorch_model-00001-of-00003.bin` ... +
// `pytorch_model.bin.index.json`), exactly as transformers / huggingface_hub write them. Writes are
// atomic: a checkpoint directory is written with io::atomic_write_directory (the previous checkpoint
// is replaced only after the new one is complete and fsynced). The per-file formats are
// safetensors.h and torch_pickle.h (.bin).
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "booster/checkpoint/safetensors.h"
#include "booster/checkpoint/torch_pickle.h"
#include "booster/export.h"

namespace booster::checkpoint {

struct SaveOptions {
  bool shard = false;               // split into shards of at most size_per_shard_mb
  int64_t size_per_shard_mb = 1024; // MiB (1 MiB = 2^20 bytes)
  bool use_safetensors = true;      // false: pytorch_model*.bin (torch pickle zip, read by torch.load)
};

// File names for `weights_name` "model" (safetensors) / "pytorch_model" (bin); `base` lets the
// optimizer reuse the layout ("optimizer").
// Shard boundaries as huggingface_hub's split_torch_state_dict_into_shards: tensors in order; a new
// shard starts when adding the next tensor would exceed max_shard_bytes; a tensor larger than the
// limit is alone in its shard. Returns the tensor indices of each shard. Tensors sharing storage
// count once. Throws std::invalid_argument for max_shard_bytes <= 0.
BOOSTER_API std::vector<std::vector<size_t>> split_into_shards(const std::vector<int64_t>& tensor_bytes,
                                                               int64_t max_shard_bytes);

// Writes `state` under directory `dir` (created; replaced atomically if it exists) as
// `<base>.safetensors` (or `pytorch_<base>.bin` when !use_safetensors and base == "model";
// `<base>.bin` otherwise), or, when sharded into more than one file, `<base>-0000i-of-0000N.<ext>`
// plus `<base>.<ext>.index.json` = {"metadata": {"total_size": <bytes>}, "weight_map": {name: file}}.
// `extra_files` (name -> text) are written into the same directory in the same atomic step.
// Tied tensors (same storage, offset, shape) are written once under their first name, as HF does.
// This is save_state_dict_streamed (below) over the remaining tensors, so the errors are its errors,
// except that a duplicate name or an undefined tensor is a CheckpointError here, thrown before
// anything is written. Throws CheckpointError on I/O errors; nothing at `dir` is changed then.
BOOSTER_API void save_state_dict(const std::string& dir, const StateDict& state, const SaveOptions& options,
                                 const std::string& base = "model",
                                 const std::map<std::string, std::string>& extra_files = {});

// What a streamed save will receive, in order: the tensor's name, dtype and shape ({} for a 0-dim
// tensor; a dimension may be 0).
struct TensorSpec {
  std::string name;
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::vector<int64_t> shape;
};

// Writes the same files, byte for byte, as save_state_dict(dir, state, options, base, extra_files)
// would for tensors with these specs and values, but asks for the tensors one at a time, so that
// the caller (e.g. FSDP gathering one unit at a time) never holds them all: the same shard split
// (split_into_shards on the specs' byte sizes, numel * element size), file names, index JSON and
// safetensors headers (names in spec order, consecutive offsets, padding, {"format": "pt"}
// metadata), all planned from the specs before the first fetch.
//
// fetch(i) returns tensor i: specs[i]'s name; its dtype and shape must match specs[i] exactly (any
// device, layout or strides). It is called exactly once per i, in increasing i, on the calling
// thread, inside the atomic write of `dir` (after every argument check below, so an invalid call
// fetches nothing); after an error it is not called again. No tie detection: every spec is
// written, even when two fetched tensors share storage (save_state_dict drops ties before calling
// this); the caller passes distinct tensors.
//
// Memory: the writer keeps no reference to a fetched tensor after writing it.
//  - safetensors: each file's header comes from the specs, so a tensor's bytes are written as soon
//    as it is fetched and the tensor is released (plus, while it is written, one contiguous CPU
//    copy when it is not contiguous on the CPU already): peak one tensor.
//  - .bin (use_safetensors = false, torch pickle zip): LibTorch's pickler writes a file from the
//    whole dict, so the fetched tensors of the shard file being filled are kept until its last
//    tensor arrives; the file is then written and they are released: peak one shard file (about
//    size_per_shard_mb; the whole state dict when not sharded). A tensor over the shard limit has a
//    file of its own (huggingface_hub's rule), written as soon as it arrives, so while it is
//    written the file being filled around it is held too.
//
// Errors (on any of them `dir` is unchanged: the temporary directory is removed):
//  - std::invalid_argument before anything is written or fetched: `base` or an extra file name that
//    is not a plain file name, an extra file named like a checkpoint file of this save,
//    size_per_shard_mb <= 0 with shard, a duplicate name, a spec with dtype Undefined, a negative
//    dimension, or a byte size over int64.
//  - CheckpointError before anything is written or fetched: what the format cannot store
//    (safetensors: an unsupported dtype such as complex or quantized, the name "__metadata__", a
//    name that is not valid UTF-8; sharded: a name that is not valid UTF-8, for the index JSON), or
//    an I/O error creating the temporary directory.
//  - std::invalid_argument from the fetch of tensor i: it returned an undefined tensor, or one whose
//    dtype or shape differ from specs[i] (the message names the tensor and both dtypes and shapes).
//  - CheckpointError while writing: an I/O error (the errno text), or a fetched tensor without
//    data to write (safetensors: sparse, on the meta device).
//  - whatever fetch throws propagates unchanged.
BOOSTER_API void save_state_dict_streamed(const std::string& dir, const std::vector<TensorSpec>& specs,
                                          const SaveOptions& options,
                                          const std::function<at::Tensor(size_t i)>& fetch,
                                          const std::string& base = "model",
                                          const std::map<std::string, std::string>& extra_files = {});

// Loads a state dict from: a directory with `<base>.safetensors.index.json` or
// `pytorch_<base>.bin.index.json`/`<base>.bin.index.json`, a directory with a single
// `<base>.safetensors` / `pytorch_<base>.bin`, or a file path (.safetensors or .bin). Shards are read
// one at a time. Validates the index: weight_map values must be plain file names inside the
// directory (no absolute path, "..", or separators), every shard must exist, and every name in the
// index must be present in its shard. Throws CheckpointError naming the file and the problem.
BOOSTER_API StateDict load_state_dict(const std::string& path, const std::string& base = "model");

// One tensor of a checkpoint as its files describe it: the dtype it loads as (safetensors U16/U32
// load as int32/int64, see safetensors.h), its shape, and the file (full path) that holds it.
struct CheckpointTensorInfo {
  std::string name;
  at::ScalarType dtype = at::ScalarType::Undefined;
  std::vector<int64_t> shape;
  std::string file;
};

// The tensors load_state_dict(path, base) would return, in the same order, without their data.
// Same path resolution and index validation as load_state_dict (same CheckpointErrors). Safetensors
// files: only the headers are read (no tensor data). .bin files have no separate header, so each is
// loaded in full, one at a time, and dropped before the next (peak memory: one file).
BOOSTER_API std::vector<CheckpointTensorInfo> list_checkpoint_tensors(const std::string& path,
                                                                      const std::string& base = "model");

// Loads the checkpoint at `path` one file (shard) at a time and calls fn with each file's tensors,
// restricted to the names the index assigns to that file, in load_state_dict's order (shards in
// file-name order); a checkpoint that is a single file gives one call. The whole index is validated
// before the first file is read, as load_state_dict does; safetensors files are memory-mapped, so
// peak memory is about one shard (the shard passed to fn is released when fn returns, unless fn
// keeps its tensors). load_state_dict is this, concatenated. Exceptions from fn propagate
// (the remaining shards are not read).
BOOSTER_API void for_each_checkpoint_shard(const std::string& path, const std::string& base,
                                           const std::function<void(const StateDict& shard)>& fn);

// Replaces directory `dir` atomically with one holding exactly `files` (name -> bytes), through
// io::atomic_write_directory. Throws std::invalid_argument for a name that is not a plain file
// name, CheckpointError for an I/O error (the io::IoError's message); on failure `dir` is intact.
BOOSTER_API void atomic_write_directory(const std::string& dir, const std::map<std::string, std::string>& files);

}  // namespace booster::checkpoint
