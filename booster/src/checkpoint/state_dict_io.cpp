// state_dict_io.cpp — HuggingFace-layout checkpoint directories (see booster/checkpoint/state_dict_io.h).
//
// Saving: tied tensors are dropped (first name wins), the rest is split into shards with
// huggingface_hub's rule, and every file (shards, index, extra files) is written into a fresh
// `<dir>.tmp-<pid>-<n>` next to the target, fsynced, and swapped in with renameat2(RENAME_EXCHANGE)
// (or renamed when the target does not exist yet), so `dir` always holds a complete checkpoint.
// `.bin` files are streamed through the same Pickler + PyTorchStreamWriter pair that
// torch::pickle_save uses (identical bytes, but straight to the file instead of a buffer).
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
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/import_read.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace booster::checkpoint {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may or may not be buf).
  return std::string(strerror_r(err, buf, sizeof(buf)));
}

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int err) {
  throw CheckpointError(what + " '" + path + "': " + errno_text(err));
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

// A plain file name: no directory part, not "." / "..", no separators or NUL.
bool is_plain_file_name(const std::string& name) {
  if (name.empty() || name == "." || name == "..") return false;
  return name.find_first_of(std::string("/\\\0", 3)) == std::string::npos;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes and reports the error of close (a late write error on some file systems).
  int close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

void write_all(int fd, const char* data, size_t size, const std::string& path) {
  while (size > 0) {
    ssize_t n = ::write(fd, data, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot write", path, errno);
    }
    data += n;
    size -= static_cast<size_t>(n);
  }
}

void fsync_close(Fd& fd, const std::string& path) {
  if (::fsync(fd.get()) != 0) throw_errno("cannot fsync", path, errno);
  if (int err = fd.close()) throw_errno("cannot close", path, err);
}

int create_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw_errno("cannot create", path, errno);
  return fd;
}

// Writes a new file (must not exist) and fsyncs it.
void write_new_file(const std::string& path, const std::string& bytes) {
  Fd fd(create_file(path));
  write_all(fd.get(), bytes.data(), bytes.size(), path);
  fsync_close(fd, path);
}

void fsync_directory(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open directory", path, errno);
  Fd guard(fd);
  if (::fsync(fd) != 0 && errno != EINVAL) throw_errno("cannot fsync directory", path, errno);
}

void remove_tree_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

int rename_exchange(const std::string& a, const std::string& b) {
  long rc = ::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE);
  return rc == 0 ? 0 : errno;
}

std::atomic<uint64_t> g_temp_counter{0};

// The atomic directory write: `fill(tmp)` creates the files inside `tmp` (each fsynced), then the
// directory is fsynced and put in place of `dir`.
void atomic_write_directory_with(const std::string& dir_in, const std::function<void(const std::string&)>& fill) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  fs::path target(dir);
  const std::string leaf = target.filename().string();
  if (dir.empty() || leaf.empty() || leaf == "." || leaf == "..")
    throw CheckpointError("invalid checkpoint directory '" + dir_in + "'");

  // Replace the directory a symlink points to, not the symlink.
  struct stat st {};
  bool exists = false;
  if (::lstat(dir.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      fs::path real = fs::canonical(target, ec);
      if (ec) throw CheckpointError("cannot resolve symlink '" + dir + "': " + ec.message());
      return atomic_write_directory_with(real.string(), fill);
    }
    if (!S_ISDIR(st.st_mode)) throw CheckpointError("cannot write checkpoint: '" + dir + "' exists and is not a directory");
    exists = true;
  } else if (errno != ENOENT) {
    throw_errno("cannot stat", dir, errno);
  }

  fs::path parent_path = target.parent_path();
  const std::string parent = parent_path.empty() ? std::string(".") : parent_path.string();
  if (!exists) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) throw CheckpointError("cannot create directory '" + parent + "': " + ec.message());
  }

  const std::string tmp = dir + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(g_temp_counter++);
  if (::mkdir(tmp.c_str(), 0755) != 0) throw_errno("cannot create temporary directory", tmp, errno);

  try {
    fill(tmp);
    fsync_directory(tmp);
    bool swapped = false;  // true: the old checkpoint is now at `tmp`
    if (exists) {
      int err = rename_exchange(tmp, dir);
      if (err == 0) {
        swapped = true;
      } else if (err == EINVAL || err == ENOSYS || err == ENOTSUP || err == EOPNOTSUPP) {
        // No RENAME_EXCHANGE on this file system: move the old one aside first (a crash between
        // the two renames leaves `dir` missing and the old checkpoint at `<dir>.old-...`).
        const std::string old = dir + ".old-" + std::to_string(::getpid()) + "-" + std::to_string(g_temp_counter++);
        if (::rename(dir.c_str(), old.c_str()) != 0) throw_errno("cannot rename", dir, errno);
        if (::rename(tmp.c_str(), dir.c_str()) != 0) {
          int e = errno;
          ::rename(old.c_str(), dir.c_str());
          throw_errno("cannot rename '" + tmp + "' to", dir, e);
        }
        fsync_directory(parent);
        remove_tree_quietly(old);
        return;
      } else {
        throw_errno("cannot replace", dir, err);
      }
    } else if (::rename(tmp.c_str(), dir.c_str()) != 0) {
      int err = errno;
      if (err != ENOTEMPTY && err != EEXIST) throw_errno("cannot rename '" + tmp + "' to", dir, err);
      // Someone created it meanwhile: swap with theirs.
      err = rename_exchange(tmp, dir);
      if (err != 0) throw_errno("cannot replace", dir, err);
      swapped = true;
    }
    try {
      fsync_directory(parent);
    } catch (...) {
      if (swapped) remove_tree_quietly(tmp);
      throw;  // the new checkpoint is in place but its rename may not be durable
    }
    if (swapped) remove_tree_quietly(tmp);
  } catch (...) {
    remove_tree_quietly(tmp);
    throw;
  }
}

// ---- .bin (torch.save zip) -------------------------------------------------------------------

// A tensor the pickler writes as exactly its own bytes: CPU, contiguous, and owning its whole
// storage from offset 0 (a view would otherwise drag its entire storage into the file).
at::Tensor standalone(const at::Tensor& t) {
  at::Tensor c = t.detach();
  if (!c.device().is_cpu()) c = c.to(at::kCPU);
  c = c.contiguous();
  if (c.has_storage() &&
      (c.storage_offset() != 0 || c.storage().nbytes() != static_cast<size_t>(c.numel()) * c.element_size()))
    c = c.clone();
  return c;
}

void write_bin_impl(const std::string& path, const StateDict& state) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, tensor] : state) {
    if (!tensor.defined()) throw CheckpointError(path + ": tensor '" + name + "' is undefined");
    if (dict.contains(name)) throw CheckpointError(path + ": duplicate tensor name '" + name + "'");
    dict.insert(name, standalone(tensor));
  }

  Fd fd(create_file(path));
  int write_errno = 0;
  try {
    // What torch::pickle_save does, with the zip written straight to the file.
    std::vector<char> pickle_data;
    torch::jit::Pickler pickler(
        [&](const char* buf, size_t size) { pickle_data.insert(pickle_data.end(), buf, buf + size); });
    pickler.protocol();
    pickler.pushIValue(c10::IValue(dict));
    pickler.stop();
    // After a write error the rest is discarded but reported as written: a short count would make
    // the writer throw, and it throws again from its destructor (std::terminate in LibTorch 1.13).
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t len) -> size_t {
      const char* p = static_cast<const char*>(bytes);
      size_t left = write_errno != 0 ? 0 : len;
      while (left > 0) {
        ssize_t n = ::write(fd.get(), p, std::min<size_t>(left, size_t{1} << 30));
        if (n < 0) {
          if (errno == EINTR) continue;
          write_errno = errno;
          break;
        }
        p += n;
        left -= static_cast<size_t>(n);
      }
      return len;
    });
    torch::jit::writeArchiveAndTensors("data", pickle_data.data(), pickle_data.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    if (write_errno != 0) throw_errno("cannot write", path, write_errno);
    throw CheckpointError("cannot write '" + path + "': " + e.what());
  }
  if (write_errno != 0) throw_errno("cannot write", path, write_errno);
  fsync_close(fd, path);
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// True if the archive's pickle starts with a collections.OrderedDict (protocol 2: PROTO 2, GLOBAL).
bool pickles_ordered_dict(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    if (!reader.hasRecord("data.pkl")) return false;
    auto [data, size] = reader.getRecord("data.pkl");
    static const std::string prefix = std::string("\x80\x02", 2) + "ccollections\nOrderedDict\n";
    return size >= prefix.size() && std::memcmp(data.get(), prefix.data(), prefix.size()) == 0;
  } catch (const std::exception&) {
    return false;
  }
}

StateDict read_bin_impl(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw_errno("cannot open", path, errno);
  if (!S_ISREG(st.st_mode)) throw CheckpointError("'" + path + "' is not a regular file");
  c10::IValue value;
  try {
    // What torch::pickle_load does, reading from the file instead of a buffer in memory.
    caffe2::serialize::PyTorchStreamReader reader(path);
    value = torch::jit::readArchiveAndTensors("data", "", "", c10::nullopt, c10::nullopt, c10::nullopt, reader);
  } catch (const std::exception& e) {
    if (pickles_ordered_dict(path))
      throw CheckpointError("'" + path +
                            "' holds a collections.OrderedDict (torch.save(model.state_dict())), which LibTorch's "
                            "unpickler cannot rebuild; re-save it from Python as a plain dict: "
                            "torch.save(dict(state_dict), path)");
    throw CheckpointError("'" + path + "' is not a readable torch.save zip archive of a dict of tensors: " +
                          first_line(e.what()));
  }
  if (!value.isGenericDict())
    throw CheckpointError("'" + path + "' holds a " + value.tagKind() + ", expected a dict of str -> Tensor");
  StateDict out;
  for (const auto& item : value.toGenericDict()) {
    if (!item.key().isString())
      throw CheckpointError("'" + path + "': a key is a " + item.key().tagKind() + ", expected str");
    const std::string name = item.key().toStringRef();
    if (!item.value().isTensor())
      throw CheckpointError("'" + path + "': value of '" + name + "' is a " + item.value().tagKind() +
                            ", expected a Tensor");
    out.emplace_back(name, item.value().toTensor().detach());  // no autograd flags from the file
  }
  return out;
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
  StateDict all = read_bin_impl(path);
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
  nlohmann::json index;
  try {
    index = nlohmann::json::parse(read_text_file(index_path));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("index '" + index_path + "' is not valid JSON: " + e.what());
  }
  if (!index.is_object()) throw CheckpointError("index '" + index_path + "' is not a JSON object");
  if (index.contains("metadata") && !index["metadata"].is_object())
    throw CheckpointError("index '" + index_path + "': \"metadata\" is not an object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object())
    throw CheckpointError("index '" + index_path + "' has no \"weight_map\" object");

  std::map<std::string, std::vector<std::string>> by_file;  // sorted by file name = shard order
  for (auto it = wm->begin(); it != wm->end(); ++it) {
    if (!it.value().is_string())
      throw CheckpointError("index '" + index_path + "': weight_map entry '" + it.key() + "' is not a string");
    const std::string file = it.value().get<std::string>();
    if (!is_plain_file_name(file))
      throw CheckpointError("index '" + index_path + "': weight_map entry '" + it.key() + "' names '" + file +
                            "', which is not a plain file name inside the checkpoint directory");
    by_file[file].push_back(it.key());
  }
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

std::string bin_stem(const std::string& base) { return base == "model" ? "pytorch_model" : base; }

std::string shard_file_name(const std::string& stem, const std::string& ext, size_t i, size_t n) {
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), "-%05zu-of-%05zu", i + 1, n);
  return stem + suffix + "." + ext;
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

void write_bin(const std::string& path, const StateDict& state) { write_bin_impl(path, state); }

StateDict read_bin(const std::string& path) { return read_bin_impl(path); }

void atomic_write_directory(const std::string& dir, const std::map<std::string, std::string>& files) {
  for (const auto& [name, bytes] : files)
    if (!is_plain_file_name(name)) throw std::invalid_argument("atomic_write_directory: '" + name + "' is not a plain file name");
  atomic_write_directory_with(dir, [&](const std::string& tmp) {
    for (const auto& [name, bytes] : files) write_new_file(join(tmp, name), bytes);
  });
}

void save_state_dict(const std::string& dir, const StateDict& state, const SaveOptions& options, const std::string& base,
                     const std::map<std::string, std::string>& extra_files) {
  if (!is_plain_file_name(base)) throw std::invalid_argument("save_state_dict: invalid base name '" + base + "'");
  for (const auto& [name, text] : extra_files)
    if (!is_plain_file_name(name)) throw std::invalid_argument("save_state_dict: extra file '" + name + "' is not a plain file name");

  // Drop tied tensors: same storage, offset, shape, strides, dtype -> written once, first name.
  using TieKey = std::tuple<const void*, int64_t, std::vector<int64_t>, std::vector<int64_t>, int, std::string>;
  std::map<TieKey, size_t> seen;
  std::set<std::string> names;
  std::vector<size_t> unique;  // indices into state
  std::vector<int64_t> bytes;
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
    bytes.push_back(static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size()));
  }

  std::vector<std::vector<size_t>> shards;  // positions in `unique`
  if (options.shard) {
    if (options.size_per_shard_mb <= 0)
      throw std::invalid_argument("save_state_dict: size_per_shard_mb must be positive, got " +
                                  std::to_string(options.size_per_shard_mb));
    const int64_t max_mb = std::numeric_limits<int64_t>::max() >> 20;
    const int64_t limit = options.size_per_shard_mb > max_mb ? std::numeric_limits<int64_t>::max()
                                                             : options.size_per_shard_mb << 20;
    shards = split_into_shards(bytes, limit);
  }
  if (shards.size() <= 1) {
    shards.assign(1, {});
    for (size_t k = 0; k < unique.size(); ++k) shards[0].push_back(k);
  }

  const std::string ext = options.use_safetensors ? "safetensors" : "bin";
  const std::string stem = options.use_safetensors ? base : bin_stem(base);
  const bool sharded = shards.size() > 1;
  std::vector<std::string> file_names;
  for (size_t s = 0; s < shards.size(); ++s)
    file_names.push_back(sharded ? shard_file_name(stem, ext, s, shards.size()) : stem + "." + ext);
  const std::string index_name = stem + "." + ext + ".index.json";

  std::string index_text;
  if (sharded) {
    nlohmann::json index;
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    index["metadata"] = nlohmann::json::object({{"total_size", total}});
    index["weight_map"] = nlohmann::json::object();
    for (size_t s = 0; s < shards.size(); ++s)
      for (size_t k : shards[s]) index["weight_map"][state[unique[k]].first] = file_names[s];
    try {
      // json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers writes it.
      index_text = index.dump(2, ' ', true) + "\n";
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError("cannot save '" + dir + "': a tensor name is not valid UTF-8: " + e.what());
    }
  }
  std::set<std::string> generated(file_names.begin(), file_names.end());
  if (sharded) generated.insert(index_name);
  for (const auto& [name, text] : extra_files)
    if (generated.count(name))
      throw std::invalid_argument("save_state_dict: extra file '" + name + "' collides with a checkpoint file");

  atomic_write_directory_with(dir, [&](const std::string& tmp) {
    for (size_t s = 0; s < shards.size(); ++s) {
      StateDict part;
      part.reserve(shards[s].size());
      for (size_t k : shards[s]) part.push_back(state[unique[k]]);
      const std::string path = join(tmp, file_names[s]);
      if (options.use_safetensors)
        write_safetensors(path, part);
      else
        write_bin_impl(path, part);
    }
    if (sharded) write_new_file(join(tmp, index_name), index_text);
    for (const auto& [name, text] : extra_files) write_new_file(join(tmp, name), text);
  });
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
