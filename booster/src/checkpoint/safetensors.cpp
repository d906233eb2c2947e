// safetensors.cpp — the safetensors reader (memory-mapped) and writer (see safetensors.h); the
// header parser is in safetensors_header.cpp. The writer is built from pieces declared in
// checkpoint_detail.h (header from the tensors' specs, then each tensor's data), which the streamed
// checkpoint save (state_dict_stream.cpp) uses to write a shard as its tensors arrive.
#include "booster/checkpoint/safetensors.h"

#include <errno.h>
#include <sys/mman.h>

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "booster/checkpoint/async_save.h"  // host_copy_for_write
#include "booster/checkpoint/state_dict_io.h"  // TensorSpec
#include "booster/io/atomic_write.h"
#include "checkpoint_detail.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors.cpp copies tensor bytes as they are: little-endian hosts only");

namespace booster::checkpoint {

using namespace detail;

namespace {

// A read-only private mapping of a whole file, unmapped on destruction.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    Fd fd = open_for_reading(path, &size_);
    if (size_ == 0) return;
    if (size_ > std::numeric_limits<size_t>::max()) fail(path, "file too large to map");
    void* p = ::mmap(nullptr, static_cast<size_t>(size_), PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) fail(path, "cannot mmap: " + errno_text(errno));
    addr_ = p;
    ::madvise(addr_, static_cast<size_t>(size_), MADV_SEQUENTIAL);
  }  // the descriptor is closed here; the mapping stays
  ~MappedFile() {
    if (addr_) ::munmap(addr_, static_cast<size_t>(size_));
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return static_cast<const uint8_t*>(addr_); }
  uint64_t size() const { return size_; }

 private:
  void* addr_ = nullptr;
  uint64_t size_ = 0;
};

const uint8_t kEmpty[8] = {};

// U16 and U32 have no LibTorch dtype: they load widened into int32 / int64.
bool widened(const std::string& dtype) { return dtype == "U16" || dtype == "U32"; }

// Copies `numel` U16/U32 elements from src into dst (int32 / int64 data), widening each.
void widen(const uint8_t* src, const std::string& dtype, size_t numel, void* dst) {
  if (dtype == "U16") {
    auto* out = static_cast<int32_t*>(dst);
    for (size_t i = 0; i < numel; ++i) {
      uint16_t v;
      std::memcpy(&v, src + 2 * i, 2);
      out[i] = v;
    }
  } else {
    auto* out = static_cast<int64_t*>(dst);
    for (size_t i = 0; i < numel; ++i) {
      uint32_t v;
      std::memcpy(&v, src + 4 * i, 4);
      out[i] = v;
    }
  }
}

// BOOL bytes must be 0 or 1; `first` is the index of p[0] in the tensor (for the message).
void check_bool_bytes(const uint8_t* p, size_t n, uint64_t first, const std::string& path, const std::string& name) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] > 1) {
      fail(path, tensor_label(name) + ": BOOL element " + std::to_string(first + i) + " is " + std::to_string(p[i]) +
                     " (must be 0 or 1)");
    }
  }
}


}  // namespace

std::string safetensors_dtype(at::ScalarType type) {
  switch (type) {
    case at::kDouble:
      return "F64";
    case at::kFloat:
      return "F32";
    case at::kHalf:
      return "F16";
    case at::kBFloat16:
      return "BF16";
    case at::kLong:
      return "I64";
    case at::kInt:
      return "I32";
    case at::kShort:
      return "I16";
    case at::kChar:
      return "I8";
    case at::kByte:
      return "U8";
    case at::kBool:
      return "BOOL";
    default:
      throw CheckpointError(std::string("safetensors: unsupported dtype ") + c10::toString(type) +
                            " (supported: float64 float32 float16 bfloat16 int64 int32 int16 int8 uint8 bool)");
  }
}

at::ScalarType scalar_type_from_safetensors(const std::string& dtype) {
  if (dtype == "F64") return at::kDouble;
  if (dtype == "F32") return at::kFloat;
  if (dtype == "F16") return at::kHalf;
  if (dtype == "BF16") return at::kBFloat16;
  if (dtype == "I64" || dtype == "U32") return at::kLong;
  if (dtype == "I32" || dtype == "U16") return at::kInt;
  if (dtype == "I16") return at::kShort;
  if (dtype == "I8") return at::kChar;
  if (dtype == "U8") return at::kByte;
  if (dtype == "BOOL") return at::kBool;
  throw CheckpointError("safetensors: unsupported dtype " + quote(dtype) +
                        " (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL U16 U32)");
}

StateDict load_safetensors(const std::string& path, const std::vector<std::string>* only) {
  MappedFile file(path);
  const uint8_t* base = file.data() ? file.data() : kEmpty;
  SafetensorsHeader header = parse_safetensors_header(base, static_cast<size_t>(file.size()), file.size(), path);

  std::unordered_set<std::string> wanted;
  if (only) {
    wanted.insert(only->begin(), only->end());
    std::unordered_set<std::string> present;
    for (const auto& e : header.tensors) present.insert(e.name);
    for (const auto& name : *only) {
      if (!present.count(name)) fail(path, "no tensor named " + quote(name) + " in the file");
    }
  }

  StateDict out;
  out.reserve(only ? wanted.size() : header.tensors.size());
  for (const SafetensorsEntry& e : header.tensors) {
    if (only && !wanted.count(e.name)) continue;
    const uint8_t* src = base + header.data_start + e.begin;
    const size_t bytes = static_cast<size_t>(e.end - e.begin);
    const at::ScalarType type = scalar_type_from_safetensors(e.dtype);
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(type));
    if (widened(e.dtype)) {
      widen(src, e.dtype, static_cast<size_t>(t.numel()), t.data_ptr());
    } else {
      if (e.dtype == "BOOL") check_bool_bytes(src, bytes, 0, path, e.name);
      if (bytes) std::memcpy(t.data_ptr(), src, bytes);
    }
    out.emplace_back(e.name, std::move(t));
  }
  return out;
}

at::Tensor read_safetensors_range(const std::string& path, const SafetensorsHeader& header,
                                  const SafetensorsEntry& entry, int64_t begin, int64_t count, at::Tensor out) {
  const at::ScalarType type = scalar_type_from_safetensors(entry.dtype);
  const uint64_t esize = safetensors_dtype_size(entry.dtype);
  if (esize == 0 || entry.end < entry.begin) fail(path, tensor_label(entry.name) + ": invalid header entry");
  const uint64_t numel = (entry.end - entry.begin) / esize;
  if (begin < 0 || count < 0 || static_cast<uint64_t>(begin) > numel ||
      static_cast<uint64_t>(count) > numel - static_cast<uint64_t>(begin)) {
    const bool end_fits = count >= 0 && begin <= std::numeric_limits<int64_t>::max() - count;
    fail(path, tensor_label(entry.name) + ": elements [" + std::to_string(begin) + ", " +
                   (end_fits ? std::to_string(begin + count) : std::to_string(begin) + " + " + std::to_string(count)) +
                   ") are outside its " + std::to_string(numel) + " elements");
  }
  if (out.defined()) {
    if (out.scalar_type() != type || out.numel() != count || !out.is_contiguous() || !out.device().is_cpu()) {
      fail(path, tensor_label(entry.name) + ": read_safetensors_range needs a contiguous CPU output of dtype " +
                     std::string(c10::toString(type)) + " and " + std::to_string(count) + " elements");
    }
  } else {
    out = at::empty({count}, at::TensorOptions().dtype(type));
  }
  if (count == 0) return out;

  uint64_t file_size = 0;
  Fd fd = open_for_reading(path, &file_size);
  const uint64_t expected = header.data_start + (header.tensors.empty() ? 0 : header.tensors.back().end);
  if (file_size != expected) {
    fail(path, "is " + std::to_string(file_size) + " bytes but its header describes " + std::to_string(expected) +
                   " (the file changed since its header was read)");
  }
  const uint64_t offset = header.data_start + entry.begin + static_cast<uint64_t>(begin) * esize;
  const size_t bytes = static_cast<size_t>(count) * static_cast<size_t>(esize);
  if (widened(entry.dtype)) {
    std::vector<uint8_t> raw(bytes);
    pread_all(fd.get(), raw.data(), bytes, offset, path);
    widen(raw.data(), entry.dtype, static_cast<size_t>(count), out.data_ptr());
  } else {
    auto* dst = static_cast<uint8_t*>(out.data_ptr());
    pread_all(fd.get(), dst, bytes, offset, path);
    if (entry.dtype == "BOOL") check_bool_bytes(dst, bytes, static_cast<uint64_t>(begin), path, entry.name);
  }
  return out;
}

namespace detail {

std::string safetensors_header_bytes(const std::string& source, const std::vector<TensorSpec>& specs,
                                     const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::unordered_set<std::string> names;
  uint64_t offset = 0;
  for (const TensorSpec& spec : specs) {
    if (spec.name == "__metadata__") fail(source, "\"__metadata__\" cannot be a tensor name");
    if (!names.insert(spec.name).second) fail(source, "duplicate tensor name " + quote(spec.name));
    std::string dtype;
    try {
      dtype = safetensors_dtype(spec.dtype);
    } catch (const CheckpointError& e) {
      fail(source, tensor_label(spec.name) + ": " + e.what());
    }
    uint64_t numel = 1;
    for (int64_t d : spec.shape) numel *= static_cast<uint64_t>(d);  // callers' shapes are valid
    const uint64_t bytes = numel * static_cast<uint64_t>(c10::elementSize(spec.dtype));
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = dtype;
    entry["shape"] = spec.shape;
    entry["data_offsets"] = {offset, offset + bytes};
    header[spec.name] = std::move(entry);
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
  } catch (const nlohmann::json::exception& e) {
    fail(source, "tensor names and metadata must be valid UTF-8 (" + std::string(e.what()) + ")");
  }
  while ((8 + text.size()) % 8 != 0) text += ' ';
  if (text.size() > SAFETENSORS_MAX_HEADER_BYTES) {
    fail(source, "header would be " + std::to_string(text.size()) + " bytes, over the limit of " +
                     std::to_string(SAFETENSORS_MAX_HEADER_BYTES));
  }
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(static_cast<uint8_t>(n >> (8 * i)));
  return out + text;
}

void check_safetensors_writable(const std::string& source, const std::string& name, const at::Tensor& t) {
  if (!t.defined()) fail(source, tensor_label(name) + " is undefined");
  if (t.layout() != at::kStrided) {
    fail(source, tensor_label(name) + ": only dense tensors can be written (layout " + c10::str(t.layout()) + ")");
  }
  if (t.is_meta()) fail(source, tensor_label(name) + " is on the meta device (it has no data)");
}

void write_safetensors_data(io::OutputFile& out, const std::string& source, const std::string& name,
                            const at::Tensor& t) {
  if (t.numel() == 0) return;
  // One tensor at a time: at most one extra contiguous CPU copy alive.
  at::Tensor c;
  try {
    c = host_copy_for_write(t.resolve_conj().resolve_neg());
  } catch (const c10::Error& e) {
    fail(source, tensor_label(name) + ": cannot copy to the CPU: " + e.what_without_backtrace());
  }
  out.write(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
}

}  // namespace detail

void write_safetensors(const std::string& path, const StateDict& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // Validate everything and build the header before touching the file.
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    check_safetensors_writable(path, name, t);
    specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  }
  const std::string header = safetensors_header_bytes(path, specs, metadata);
  as_checkpoint_error([&] {
    io::OutputFile out(path, /*exclusive=*/false);
    out.write(header.data(), header.size());
    for (const auto& [name, t] : tensors) write_safetensors_data(out, path, name, t);
    out.sync_and_close();
  });
}

}  // namespace booster::checkpoint
