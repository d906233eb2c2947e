// torch_unpickler.h — a restricted unpickler for torch.save's zip archives (internal to libbooster;
// torch_pickle.h's read_bin is its interface). It runs the pickle opcodes protocol 2-4 emit
// (Python's pickletools lists them) on a small value tree, accepts exactly the globals a state dict
// needs and refuses every other one before anything is called:
//   collections.OrderedDict                        -> a dict (BUILD state such as _metadata ignored)
//   torch.jit._pickle.restore_type_tag             -> its value (LibTorch's pickler tags Dict[str, Tensor])
//   torch._utils._rebuild_tensor_v2 / _rebuild_parameter -> a tensor viewing its storage
//   torch.<Float|Double|Half|BFloat16|Long|Int|Short|Char|Byte|Bool|ComplexFloat|ComplexDouble>Storage
// Storages are persistent ids ('storage', type, key, location, numel) read from the archive's
// data/<key> record once (shared by every tensor viewing them), size-checked against numel, and
// views are bounds-checked against their storage.
#pragma once

#include <string>

#include "booster/checkpoint/safetensors.h"  // StateDict, CheckpointError

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace booster::checkpoint::detail {

// Reads the torch.save zip archive `path` and returns its tensors: a dict (or OrderedDict) of
// str -> Tensor in file order; nested dicts are flattened with '.' between the keys ("model.fc.weight";
// int keys as decimals); values that are not tensors or dicts (a step counter, a string, None) are
// left out. Throws CheckpointError naming the file for: a file that is not a zip archive (the legacy
// pre-1.6 format named), a big-endian archive, a global outside the list above (named, nothing run),
// an unknown or truncated opcode (named with its offset), a stack, mark or memo error, nesting
// deeper than 1000, a top level that is not a dict, a missing or wrongly sized storage record, a view
// outside its storage, a key that is not str or int, and two tensors flattening to one name.
StateDict unpickle_state_dict(const std::string& path);
// The same for an archive already open (`path` names it in messages; tests/fuzz/pickle_fuzz.cpp
// feeds in-memory archives this way).
StateDict unpickle_state_dict(caffe2::serialize::PyTorchStreamReader& archive, const std::string& path);

}  // namespace booster::checkpoint::detail
