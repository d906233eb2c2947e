// torch_pickle.h — the torch pickle zip format of `torch.save(dict)`, the `.bin` files of the
// HuggingFace layout (pytorch_model.bin). Written with LibTorch's own Pickler and
// PyTorchStreamWriter (the pair torch::pickle_save uses), streamed to the file, so Python's
// torch.load reads it; read with LibTorch's unpickler, so Python's torch.save of a plain dict of
// tensors reads back.
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

// Reads a torch.save zip archive of a dict of str -> Tensor (in the file's order, detached).
// Throws CheckpointError naming the file when it is missing, not a regular file, not a readable
// archive, not a dict of str -> Tensor, or holds a collections.OrderedDict (LibTorch 1.13's
// unpickler cannot rebuild one; the message gives the Python one-liner that re-saves it as a dict).
BOOSTER_API StateDict read_bin(const std::string& path);

}  // namespace booster::checkpoint
