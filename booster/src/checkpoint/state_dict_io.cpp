// state_dict_io.cpp — HuggingFace-layout checkpoint directories (see booster/checkpoint/state_dict_io.h).
//
// Saving: tied tensors are dropped (first name wins) and the rest goes to save_state_dict_streamed
// (state_dict_stream.cpp), the one writer of checkpoint directories: shard split with
// huggingface_hub's rule, every file (shards, index, extra files) written inside one
// io::atomic_write_directory, so `dir` always holds a complete checkpoint. The file formats are
// safetensors.h and torch_pickle.h.
//
// Loading: a file, or a directory probed as transformers does (single safetensors, safetensors index,
// single bin, bin index). An index is validated completely (file names, shard presence, and for
// safetensors shards every listed name in the shard header) before any tensor data is read; then the
// shards are loaded one at a time in file-name order, each in its own order. That resolution is a
// CheckpointPlan; for_each_checkpoint_shard walks it (load_state_dict concatenates its shards) and
// list_checkpoint_tensors reads only the headers it names.

#include "booster/checkpoint/state_dict_io.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "booster/checkpoint/torch_pickle.h"
#include "booster/io/atomic_write.h"
#include "checkpoint_detail.h"
#include "index_json.h"

namespace booster::checkpoint {

namespace {

namespace fs = std::filesystem;
using detail::as_checkpoint_error;
using detail::errno_text;
using detail::Fd;
using detail::is_plain_file_name;
using detail::join;

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int err) {
  throw CheckpointError(what + " '" + path + "': " + errno_text(err));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ---- loading helpers ------------------------------------------------------------------------

bool is_zip_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  Fd guard(fd);
  char magic[4] = {};
  return ::read(fd, magic, 4) == 4 && std::memcmp(magic, "PK\x03\x04", 4) == 0;
}

// A .bin file name, or a zip archive under another name that is not .safetensors.
bool is_bin_file(const std::string& path) {
  return ends_with(path, ".bin") || (!ends_with(path, ".safetensors") && is_zip_file(path));
}

// One file of either format, all of it or only `only` (in file order).
StateDict load_file(const std::string& path, const std::vector<std::string>* only) {
  if (!is_bin_file(path)) return load_safetensors(path, only);
  StateDict all = read_bin(path);
  if (!only) return all;
  std::set<std::string> wanted(only->begin(), only->end());
  StateDict out;
  for (auto& kv : all)
    if (wanted.count(kv.first)) out.push_back(std::move(kv));
  if (out.size() != wanted.size()) {
    std::set<std::string> have;
    for (const auto& kv : out) have.insert(kv.first);
    for (const auto& name : wanted)
      if (!have.count(name)) throw CheckpointError("tensor '" + name + "' is missing from '" + path + "'");
  }
  return out;
}

std::string read_text_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open", path, errno);
  Fd guard(fd);
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot read", path, errno);
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// What a checkpoint path resolves to: the files to load in order, each with the names the index
// assigns to it (all of the file when there is no index). Built (and, for an index, completely
// validated) before any tensor data is read.
struct ShardPlan {
  std::string file;                         // path of the file
  bool restricted = false;                  // true: only `names` (from the index)
  std::vector<std::string> names;           // the index's names for this file
  std::optional<SafetensorsHeader> header;  // when already read during validation
};

struct CheckpointPlan {
  std::string index_path;  // empty: a single file
  std::vector<ShardPlan> shards;
};

CheckpointPlan plan_index(const std::string& index_path) {
  const std::string dir = fs::path(index_path).parent_path().string();
  const std::string shard_dir = dir.empty() ? std::string(".") : dir;
  std::map<std::string, std::vector<std::string>> by_file =
      detail::parse_weight_map(read_text_file(index_path), index_path);
  // Validate before reading any tensor data.
  CheckpointPlan plan;
  plan.index_path = index_path;
  for (auto& [file, names] : by_file) {
    ShardPlan shard;
    shard.file = join(shard_dir, file);
    shard.restricted = true;
    if (!is_regular_file(shard.file))
      throw CheckpointError("index '" + index_path + "' references missing shard '" + shard.file + "'");
    if (!is_bin_file(shard.file)) {  // .bin: names checked when the shard is loaded
      shard.header = read_safetensors_header(shard.file);
      std::set<std::string> present;
      for (const auto& e : shard.header->tensors) present.insert(e.name);
      for (const auto& name : names)
        if (!present.count(name))
          throw CheckpointError("tensor '" + name + "' listed in index '" + index_path + "' is missing from shard '" +
                                shard.file + "'");
    }
    shard.names = std::move(names);
    plan.shards.push_back(std::move(shard));
  }
  return plan;
}

CheckpointPlan plan_single_file(const std::string& file) {
  CheckpointPlan plan;
  plan.shards.emplace_back();
  plan.shards.back().file = file;
  return plan;
}

// Resolves `path` as load_state_dict documents it.
CheckpointPlan plan_checkpoint(const std::string& path, const std::string& base) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw_errno("cannot load checkpoint", path, errno);
  if (S_ISREG(st.st_mode)) return ends_with(path, ".index.json") ? plan_index(path) : plan_single_file(path);
  if (!S_ISDIR(st.st_mode)) throw CheckpointError("cannot load checkpoint '" + path + "': not a file or directory");

  // transformers' order: single safetensors, safetensors index, single bin, bin index.
  const std::vector<std::string> candidates = {
      base + ".safetensors",      base + ".safetensors.index.json",   "pytorch_" + base + ".bin",
      base + ".bin",              "pytorch_" + base + ".bin.index.json", base + ".bin.index.json"};
  std::vector<std::string> looked;
  for (const auto& name : candidates) {
    const std::string file = join(path, name);
    if (is_regular_file(file)) return ends_with(name, ".index.json") ? plan_index(file) : plan_single_file(file);
    if (std::find(looked.begin(), looked.end(), name) == looked.end()) looked.push_back(name);
  }
  std::string list;
  for (const auto& name : looked) list += (list.empty() ? "" : ", ") + name;
  throw CheckpointError("no checkpoint in directory '" + path + "' (looked for " + list + ")");
}

// Runs `f` on one file of the plan; errors of a file listed in an index name the index.
template <class F>
auto with_index_context(const CheckpointPlan& plan, F&& f) -> decltype(f()) {
  if (plan.index_path.empty()) return f();
  try {
    return f();
  } catch (const CheckpointError& e) {
    throw CheckpointError(std::string(e.what()) + " (listed in index '" + plan.index_path + "')");
  }
}

StateDict load_shard(const CheckpointPlan& plan, const ShardPlan& shard) {
  return with_index_context(plan, [&] { return load_file(shard.file, shard.restricted ? &shard.names : nullptr); });
}

}  // namespace

// ---- public API -----------------------------------------------------------------------------

std::vector<std::vector<size_t>> split_into_shards(const std::vector<int64_t>& tensor_bytes, int64_t max_shard_bytes) {
  if (max_shard_bytes <= 0)
    throw std::invalid_argument("split_into_shards: max_shard_bytes must be positive, got " +
                                std::to_string(max_shard_bytes));
  // huggingface_hub split_state_dict_into_shards_factory: a tensor over the limit becomes its own
  // shard at once (appended before the shard being filled, which goes on collecting the tensors
  // around it); otherwise the current shard is closed when the next tensor would exceed the limit.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  int64_t current_size = 0;
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    const int64_t size = tensor_bytes[i];
    if (size < 0) throw std::invalid_argument("split_into_shards: negative tensor size");
    if (size > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_size > max_shard_bytes - size) {  // current_size + size > max, without overflow
      shards.push_back(std::move(current));
      current.clear();
      current_size = 0;
    }
    current.push_back(i);
    current_size += size;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

void atomic_write_directory(const std::string& dir, const std::map<std::string, std::string>& files) {
  for (const auto& [name, bytes] : files)
    if (!is_plain_file_name(name)) throw std::invalid_argument("atomic_write_directory: '" + name + "' is not a plain file name");
  as_checkpoint_error([&] {
    io::atomic_write_directory(dir, [&](const std::string& tmp) {
      for (const auto& [name, bytes] : files) io::write_new_file(join(tmp, name), bytes);
    });
  });
}

void save_state_dict(const std::string& dir, const StateDict& state, const SaveOptions& options, const std::string& base,
                     const std::map<std::string, std::string>& extra_files) {
  // Drop tied tensors: same storage, offset, shape, strides, dtype -> written once, first name.
  using TieKey = std::tuple<const void*, int64_t, std::vector<int64_t>, std::vector<int64_t>, int, std::string>;
  std::map<TieKey, size_t> seen;
  std::set<std::string> names;
  std::vector<size_t> unique;  // indices into state
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& [name, t] = state[i];
    if (!names.insert(name).second) throw CheckpointError("cannot save '" + dir + "': duplicate tensor name '" + name + "'");
    if (!t.defined()) throw CheckpointError("cannot save '" + dir + "': tensor '" + name + "' is undefined");
    if (t.has_storage()) {
      TieKey key{t.storage().unsafeGetStorageImpl(), t.storage_offset(), t.sizes().vec(), t.strides().vec(),
                 static_cast<int>(t.scalar_type()), t.device().str()};
      if (!seen.emplace(std::move(key), i).second) continue;
    }
    unique.push_back(i);
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  save_state_dict_streamed(dir, specs, options, [&](size_t k) { return state[unique[k]].second; }, base, extra_files);
}

StateDict load_state_dict(const std::string& path, const std::string& base) {
  StateDict out;
  for_each_checkpoint_shard(path, base, [&](const StateDict& shard) { out.insert(out.end(), shard.begin(), shard.end()); });
  return out;
}

void for_each_checkpoint_shard(const std::string& path, const std::string& base,
                               const std::function<void(const StateDict& shard)>& fn) {
  const CheckpointPlan plan = plan_checkpoint(path, base);
  for (const auto& shard : plan.shards) {
    const StateDict part = load_shard(plan, shard);
    fn(part);
  }  // `part` (and the file's mapping) is gone before the next file is read
}

std::vector<CheckpointTensorInfo> list_checkpoint_tensors(const std::string& path, const std::string& base) {
  const CheckpointPlan plan = plan_checkpoint(path, base);
  std::vector<CheckpointTensorInfo> out;
  for (const auto& shard : plan.shards) {
    if (is_bin_file(shard.file)) {
      for (const auto& [name, tensor] : load_shard(plan, shard))
        out.push_back({name, tensor.scalar_type(), tensor.sizes().vec(), shard.file});
      continue;
    }
    with_index_context(plan, [&] {
      const SafetensorsHeader header = shard.header ? *shard.header : read_safetensors_header(shard.file);
      std::set<std::string> wanted(shard.names.begin(), shard.names.end());
      for (const auto& e : header.tensors)  // header order, as load_safetensors returns them
        if (!shard.restricted || wanted.count(e.name))
          out.push_back({e.name, scalar_type_from_safetensors(e.dtype), e.shape, shard.file});
    });
  }
  return out;
}

}  // namespace booster::checkpoint
