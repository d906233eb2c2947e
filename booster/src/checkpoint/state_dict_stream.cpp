// state_dict_stream.cpp — save_state_dict_streamed (see booster/checkpoint/state_dict_io.h), the one
// writer of HuggingFace-layout checkpoint directories; save_state_dict is it over a StateDict.
//
// A save is planned completely from the specs before the first fetch (plan_save): the argument
// checks, huggingface_hub's shard split, the file names, the index text and, for safetensors, every
// file's header, so a bad call fails before anything is written or fetched. Then, inside one
// io::atomic_write_directory, the tensors are fetched in order. Safetensors: a file is created with
// its header when its first tensor arrives and each tensor's bytes are appended at once (with
// huggingface_hub's rule a tensor over the limit is a file of its own in the middle of another one,
// so up to two files are open). .bin: a file's tensors are collected until its last one arrives,
// then LibTorch's pickler writes the file and they are released.

#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "booster/checkpoint/state_dict_io.h"
#include "booster/checkpoint/torch_pickle.h"
#include "booster/io/atomic_write.h"
#include "checkpoint_detail.h"

namespace booster::checkpoint {
namespace {

using detail::as_checkpoint_error;
using detail::is_plain_file_name;
using detail::quote;
using detail::shape_text;

// The metadata write_safetensors writes by default, as transformers' save_pretrained does.
const std::map<std::string, std::string> kSafetensorsMetadata = {{"format", "pt"}};

std::string bin_stem(const std::string& base) { return base == "model" ? "pytorch_model" : base; }

std::string shard_file_name(const std::string& stem, const std::string& ext, size_t i, size_t n) {
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), "-%05zu-of-%05zu", i + 1, n);
  return stem + suffix + "." + ext;
}

[[noreturn]] void invalid(const std::string& dir, const std::string& what) {
  throw std::invalid_argument("cannot save '" + dir + "': " + what);
}

// numel * element size of a spec; std::invalid_argument for a spec that describes no tensor.
int64_t spec_bytes(const std::string& dir, const TensorSpec& spec) {
  if (spec.dtype == at::ScalarType::Undefined) invalid(dir, detail::tensor_label(spec.name) + " has no dtype (Undefined)");
  int64_t numel = 1;
  bool overflow = false;
  for (int64_t d : spec.shape) {
    if (d < 0) invalid(dir, detail::tensor_label(spec.name) + " has a negative dimension: " + shape_text(spec.shape));
    overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  }
  for (int64_t d : spec.shape)
    if (d == 0) return 0;
  int64_t bytes = 0;
  if (overflow || __builtin_mul_overflow(numel, static_cast<int64_t>(c10::elementSize(spec.dtype)), &bytes))
    invalid(dir, detail::tensor_label(spec.name) + " of shape " + shape_text(spec.shape) + " is over int64 bytes");
  return bytes;
}

struct FilePlan {
  std::string name;
  std::vector<size_t> tensors;  // spec indices, increasing
  std::string header;           // safetensors: the bytes before the data
};

struct SavePlan {
  std::vector<FilePlan> files;  // in shard order
  std::vector<size_t> file_of;  // spec index -> file
  std::string index_name;       // empty: a single file, no index
  std::string index_text;
};

SavePlan plan_save(const std::string& dir, const std::vector<TensorSpec>& specs, const SaveOptions& options,
                   const std::string& base, const std::map<std::string, std::string>& extra_files) {
  if (!is_plain_file_name(base)) invalid(dir, "invalid base name " + quote(base));
  for (const auto& [name, text] : extra_files)
    if (!is_plain_file_name(name)) invalid(dir, "extra file " + quote(name) + " is not a plain file name");

  std::set<std::string> names;
  std::vector<int64_t> bytes;
  bytes.reserve(specs.size());
  for (const TensorSpec& spec : specs) {
    if (!names.insert(spec.name).second) invalid(dir, "duplicate tensor name " + quote(spec.name));
    bytes.push_back(spec_bytes(dir, spec));
  }

  std::vector<std::vector<size_t>> shards;
  if (options.shard) {
    if (options.size_per_shard_mb <= 0)
      invalid(dir, "size_per_shard_mb must be positive, got " + std::to_string(options.size_per_shard_mb));
    const int64_t max_mb = std::numeric_limits<int64_t>::max() >> 20;
    const int64_t limit = options.size_per_shard_mb > max_mb ? std::numeric_limits<int64_t>::max()
                                                             : options.size_per_shard_mb << 20;
    shards = split_into_shards(bytes, limit);
  }
  if (shards.size() <= 1) {
    shards.assign(1, {});
    for (size_t i = 0; i < specs.size(); ++i) shards[0].push_back(i);
  }

  const std::string ext = options.use_safetensors ? "safetensors" : "bin";
  const std::string stem = options.use_safetensors ? base : bin_stem(base);
  const bool sharded = shards.size() > 1;
  SavePlan plan;
  plan.file_of.resize(specs.size());
  for (size_t s = 0; s < shards.size(); ++s) {
    FilePlan file;
    file.name = sharded ? shard_file_name(stem, ext, s, shards.size()) : stem + "." + ext;
    for (size_t i : shards[s]) plan.file_of[i] = s;
    file.tensors = std::move(shards[s]);
    plan.files.push_back(std::move(file));
  }

  if (sharded) {
    plan.index_name = stem + "." + ext + ".index.json";
    nlohmann::json index;
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    index["metadata"] = nlohmann::json::object({{"total_size", total}});
    index["weight_map"] = nlohmann::json::object();
    for (const FilePlan& file : plan.files)
      for (size_t i : file.tensors) index["weight_map"][specs[i].name] = file.name;
    try {
      // json.dumps(index, indent=2, sort_keys=True) + "\n", as transformers writes it.
      plan.index_text = index.dump(2, ' ', true) + "\n";
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError("cannot save '" + dir + "': a tensor name is not valid UTF-8: " + e.what());
    }
  }
  std::set<std::string> generated;
  for (const FilePlan& file : plan.files) generated.insert(file.name);
  if (sharded) generated.insert(plan.index_name);
  for (const auto& [name, text] : extra_files)
    if (generated.count(name)) invalid(dir, "extra file " + quote(name) + " collides with a checkpoint file");

  if (options.use_safetensors) {
    for (FilePlan& file : plan.files) {
      std::vector<TensorSpec> file_specs;
      file_specs.reserve(file.tensors.size());
      for (size_t i : file.tensors) file_specs.push_back(specs[i]);
      file.header = detail::safetensors_header_bytes(dir + "/" + file.name, file_specs, kSafetensorsMetadata);
    }
  }
  return plan;
}

// std::invalid_argument unless fetch(i) returned what specs[i] promised.
void check_fetched(const std::string& dir, size_t i, const TensorSpec& spec, const at::Tensor& t) {
  const std::string promised = std::string(c10::toString(spec.dtype)) + " " + shape_text(spec.shape);
  if (!t.defined())
    invalid(dir, "fetch(" + std::to_string(i) + ") returned an undefined tensor for " + detail::tensor_label(spec.name) +
                     " (spec: " + promised + ")");
  if (t.scalar_type() != spec.dtype || t.sizes() != c10::IntArrayRef(spec.shape))
    invalid(dir, "fetch(" + std::to_string(i) + ") returned " + detail::tensor_label(spec.name) + " as " +
                     c10::toString(t.scalar_type()) + " " + shape_text(t.sizes().vec()) + ", but its spec says " +
                     promised);
}

}  // namespace

void save_state_dict_streamed(const std::string& dir, const std::vector<TensorSpec>& specs,
                              const SaveOptions& options, const std::function<at::Tensor(size_t i)>& fetch,
                              const std::string& base, const std::map<std::string, std::string>& extra_files) {
  const SavePlan plan = plan_save(dir, specs, options, base, extra_files);

  // An exception from fetch propagates unchanged (as_checkpoint_error would turn an io::IoError of
  // the caller's into a CheckpointError): kept here, rethrown once the temporary directory is gone.
  std::exception_ptr fetch_error;
  auto fill = [&](const std::string& tmp) {
    // Per file: tensors received so far; the open safetensors file; the collected .bin tensors.
    std::vector<size_t> received(plan.files.size(), 0);
    std::vector<std::unique_ptr<io::OutputFile>> open(plan.files.size());
    std::vector<StateDict> pending(plan.files.size());
    auto open_safetensors = [&](size_t f) {  // creates the file and writes its header, once
      if (!open[f]) {
        open[f] = std::make_unique<io::OutputFile>(tmp + "/" + plan.files[f].name);
        size_t total = plan.files[f].header.size();  // a staged (asynchronous) save sizes its buffer once
        for (size_t i : plan.files[f].tensors) {
          size_t n = c10::elementSize(specs[i].dtype);
          for (int64_t d : specs[i].shape) n *= static_cast<size_t>(d);
          total += n;
        }
        open[f]->reserve(total);
        open[f]->write(plan.files[f].header.data(), plan.files[f].header.size());
      }
    };
    for (size_t i = 0; i < specs.size(); ++i) {
      at::Tensor t;
      try {
        t = fetch(i);
      } catch (...) {
        fetch_error = std::current_exception();
        throw;
      }
      check_fetched(dir, i, specs[i], t);
      const size_t f = plan.file_of[i];
      const FilePlan& file = plan.files[f];
      const bool last = ++received[f] == file.tensors.size();
      if (options.use_safetensors) {
        detail::check_safetensors_writable(dir + "/" + file.name, specs[i].name, t);
        open_safetensors(f);
        detail::write_safetensors_data(*open[f], dir + "/" + file.name, specs[i].name, t);
        if (last) {
          open[f]->sync_and_close();
          open[f].reset();
        }
      } else {
        pending[f].emplace_back(specs[i].name, std::move(t));
        if (last) {
          write_bin(tmp + "/" + file.name, pending[f]);
          StateDict().swap(pending[f]);  // released: nothing of this file is held any more
        }
      }
    }  // `t` is released here (safetensors) or held in pending[f] until its file is written (.bin)
    for (size_t f = 0; f < plan.files.size(); ++f) {  // a file without tensors (an empty state dict)
      if (!plan.files[f].tensors.empty()) continue;
      if (options.use_safetensors) {
        open_safetensors(f);
        open[f]->sync_and_close();
      } else {
        write_bin(tmp + "/" + plan.files[f].name, {});
      }
    }
    if (!plan.index_name.empty()) io::write_new_file(tmp + "/" + plan.index_name, plan.index_text);
    for (const auto& [name, text] : extra_files) io::write_new_file(tmp + "/" + name, text);
  };
  try {
    as_checkpoint_error([&] { io::atomic_write_directory(dir, fill); });
  } catch (...) {
    if (fetch_error) std::rethrow_exception(fetch_error);
    throw;
  }
}

}  // namespace booster::checkpoint
