// torch_pickle.h — the torch pickle zip format of `torch.save(dict)`, the `.bin` files of the
// HuggingFace layout (pytorch_model.bin). Written with LibTorch's own Pickler and
// PyTorchStreamWriter (the pair torch::pickle_save uses), streamed to the file, so Python's
// torch.load reads it; read with Booster's restricted unpickler, so what Python's torch.save writes
// for a state dict reads back.
#pragma once

#include <string>

#include "booster/checkpoint/safetensors.h"  // StateDict, CheckpointError
#include "booster/export.h"

namespace booster::checkpoint {

// Writes `state` as a Dict[str, Tensor] to the new file `path` (must not exist) and fsyncs it. Each
// tensor is stored as exactly its own bytes (CPU, contiguous; views are copied, never their whole
// storage). Not atomic by itself: checkpoint writers call it inside io::atomic_write_directory.
// Throws CheckpointError for an undefined tensor, a duplicate name, or an I/O error (errno text).
BOOSTER_API void write_bin(const std::string& path, const StateDict& state);

// Reads a torch.save zip archive of a state dict with Booster's restricted unpickler
// (torch_unpickler.h): what torch.save writes for a dict or an OrderedDict
// (torch.save(model.state_dict())) of str -> Tensor, in file order, detached, every dtype torch
// 1.13 writes, views sharing one storage; nested dicts flattened with '.' ("model.fc.weight";
// non-tensor values such as a step counter left out). Only the globals a state dict needs are
// accepted; any other global is refused by name and nothing is executed. Throws CheckpointError
// naming the file when it is missing, not a regular file, not a torch.save zip archive (the legacy
// pre-1.6 format is named), holds something else than a dict, has a refused global, a malformed or
// truncated pickle, a missing or wrongly sized storage record, or a view outside its storage.
BOOSTER_API StateDict read_bin(const std::string& path);

}  // namespace booster::checkpoint
