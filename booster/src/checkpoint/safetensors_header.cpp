// safetensors_header.cpp — the safetensors header parser and read_safetensors_header (see
// safetensors.h). No LibTorch code: the fuzzer (tests/fuzz) compiles this file alone.
//
// The header is parsed with nlohmann's SAX interface into exactly the fields a header may hold: no
// JSON DOM is built, so nesting depth and unknown fields cost no memory beyond the parser's own bit
// stack, and nothing is allocated from a header value before it is checked. A JSON syntax or
// encoding error wins over a structural one (the structural error is kept and reported only if the
// whole header is valid JSON).
#include "booster/checkpoint/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "checkpoint_detail.h"


namespace booster::checkpoint {

namespace detail {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw CheckpointError(source + ": " + what);
}

std::string errno_text(int err) { return std::strerror(err); }

// 'text' for messages: control characters escaped, at most max_bytes (cut at a UTF-8 boundary).
// With raw_high_bytes false, bytes >= 0x80 are escaped too (for text that may not be UTF-8).
std::string quote(const std::string& s, bool raw_high_bytes, size_t max_bytes) {
  size_t n = s.size();
  bool cut = false;
  if (n > max_bytes) {
    n = max_bytes;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;  // keep whole characters
    cut = true;
  }
  std::string out = "'";
  static const char* hex = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F || (c >= 0x80 && !raw_high_bytes)) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += cut ? "'..." : "'";
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    if (i == 16 && shape.size() > 17) {
      s += "... (" + std::to_string(shape.size()) + " dims)";
      break;
    }
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string tensor_label(const std::string& name) { return "tensor " + quote(name); }

// Opens a regular file for reading; returns the descriptor and its size.
Fd open_for_reading(const std::string& path, uint64_t* size) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail(path, "cannot open: " + errno_text(errno));
  Fd file(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  *size = static_cast<uint64_t>(st.st_size);
  return file;
}

// Reads exactly n bytes at offset (the file may not shrink meanwhile).
void pread_all(int fd, uint8_t* buf, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t r = ::pread(fd, buf, std::min<size_t>(n, size_t{1} << 30), static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(path, "read error: " + errno_text(errno));
    }
    if (r == 0) fail(path, "file is truncated (it shrank while being read)");
    buf += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

}  // namespace detail

using namespace detail;

namespace {

// ---------------------------------------------------------------------------------------------
// Header parser: a SAX handler that fills the entries and the metadata map and records the first
// structural problem. Valid headers nest three deep at most (object -> entry -> shape array);
// values of unknown entry fields are skipped with a counter.

struct RawEntry {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<uint64_t> offsets;
  bool has_dtype = false, has_shape = false, has_offsets = false;
};

class HeaderSax {
 public:
  using json = nlohmann::json;

  std::vector<RawEntry> entries;
  std::map<std::string, std::string> metadata;
  std::string error;       // first structural problem ("" = none)
  std::string json_error;  // syntax / encoding error from the parser
  bool root_done = false;

  bool null() { return scalar("null"); }
  bool boolean(bool) { return scalar("a boolean"); }
  bool number_float(json::number_float_t, const std::string&) { return scalar("a non-integer number"); }
  bool binary(json::binary_t&) { return scalar("binary data"); }

  bool number_integer(json::number_integer_t v) {
    // nlohmann reports non-negative integers through number_unsigned, except "-0".
    if (v >= 0) return number_unsigned(static_cast<json::number_unsigned_t>(v));
    if (skipping()) return true;
    switch (ctx()) {
      case Ctx::Shape:
        return fail(tensor_label(entries.back().name) + ": negative dimension " + std::to_string(v) + " in \"shape\"");
      case Ctx::Offsets:
        return fail(tensor_label(entries.back().name) + ": negative value " + std::to_string(v) +
                    " in \"data_offsets\"");
      default:
        return scalar("a negative integer");
    }
  }

  bool number_unsigned(json::number_unsigned_t v) {
    if (skipping()) return true;
    switch (ctx()) {
      case Ctx::Shape:
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
          return fail(tensor_label(entries.back().name) + ": dimension " + std::to_string(v) +
                      " in \"shape\" is too large");
        entries.back().shape.push_back(static_cast<int64_t>(v));
        return true;
      case Ctx::Offsets:
        if (entries.back().offsets.size() >= 2) return fail(offsets_type_error());
        entries.back().offsets.push_back(v);
        return true;
      default:
        return scalar("an integer");
    }
  }

  bool string(std::string& s) {
    if (skipping()) return true;
    switch (ctx()) {
      case Ctx::Entry:
        if (key_ == "dtype") {
          entries.back().dtype = std::move(s);
          entries.back().has_dtype = true;
          return true;
        }
        return scalar("a string");
      case Ctx::Meta:
        metadata.emplace(key_, std::move(s));
        return true;
      default:
        return scalar("a string");
    }
  }

  bool start_object(std::size_t) {
    if (skipping()) return enter_skipped();
    switch (ctx()) {
      case Ctx::None:
        return push(Ctx::Root);
      case Ctx::Root:
        if (key_ == "__metadata__") return push(Ctx::Meta);
        entries.emplace_back();
        entries.back().name = key_;
        return push(Ctx::Entry);
      case Ctx::Entry:
        if (!known_field()) return enter_skipped();
        return scalar("an object");
      default:
        return scalar("an object");
    }
  }

  bool start_array(std::size_t) {
    if (skipping()) return enter_skipped();
    if (ctx() == Ctx::Entry) {
      if (key_ == "shape") {
        entries.back().has_shape = true;
        return push(Ctx::Shape);
      }
      if (key_ == "data_offsets") {
        entries.back().has_offsets = true;
        return push(Ctx::Offsets);
      }
      if (!known_field()) return enter_skipped();
    }
    return scalar("an array");
  }

  bool key(std::string& k) {
    if (skipping()) return true;
    switch (ctx()) {
      case Ctx::Root:
        if (!names_.insert(k).second) {
          return fail(k == "__metadata__" ? std::string("duplicate \"__metadata__\" key")
                                          : "duplicate tensor name " + quote(k));
        }
        break;
      case Ctx::Entry: {
        const RawEntry& e = entries.back();
        if ((k == "dtype" && e.has_dtype) || (k == "shape" && e.has_shape) || (k == "data_offsets" && e.has_offsets))
          return fail(tensor_label(e.name) + ": duplicate key \"" + k + "\"");
        break;
      }
      case Ctx::Meta:
        if (metadata.count(k)) return fail("__metadata__ has a duplicate key " + quote(k));
        break;
      default:
        break;
    }
    key_ = std::move(k);
    return true;
  }

  bool end_object() {
    if (skipping()) return leave_skipped();
    if (ctx() == Ctx::Entry) {
      const RawEntry& e = entries.back();
      const char* missing = !e.has_dtype ? "dtype" : !e.has_shape ? "shape" : !e.has_offsets ? "data_offsets" : nullptr;
      if (missing) return fail(tensor_label(e.name) + ": missing \"" + missing + "\"");
    }
    if (ctx() == Ctx::Root) root_done = true;
    stack_.pop_back();
    return true;
  }

  bool end_array() {
    if (skipping()) return leave_skipped();
    if (ctx() == Ctx::Offsets && entries.back().offsets.size() != 2) return fail(offsets_type_error());
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    json_error = ex.what();
    return false;
  }

 private:
  enum class Ctx : uint8_t { None, Root, Entry, Meta, Shape, Offsets };  // None: before the root value

  std::vector<Ctx> stack_;  // at most 3 deep
  uint64_t skip_ = 0;       // > 0: inside a skipped value (unknown entry field) or after an error
  std::string key_;         // key of the value that comes next (in Root, Entry or Meta)
  std::unordered_set<std::string> names_;

  Ctx ctx() const { return stack_.empty() ? Ctx::None : stack_.back(); }
  // After the first error nothing is stored: the rest is only checked for JSON validity.
  bool skipping() const { return skip_ > 0 || !error.empty(); }
  bool known_field() const { return key_ == "dtype" || key_ == "shape" || key_ == "data_offsets"; }
  bool enter_skipped() {
    if (error.empty()) ++skip_;
    return true;
  }
  bool leave_skipped() {
    if (error.empty()) --skip_;
    return true;
  }
  bool push(Ctx c) {
    stack_.push_back(c);
    return true;
  }
  bool fail(std::string msg) {
    if (error.empty()) error = std::move(msg);
    return true;  // keep parsing: a JSON error later in the header is reported instead
  }
  std::string offsets_type_error() const {
    return tensor_label(entries.back().name) + ": \"data_offsets\" must be an array of two non-negative integers";
  }

  // A value of the wrong JSON type (`what`) in the current position.
  bool scalar(const char* what) {
    if (skipping()) return true;
    std::string got = std::string(" (got ") + what + ")";
    switch (ctx()) {
      case Ctx::None:
        return fail("header is not a JSON object" + got);
      case Ctx::Root:
        if (key_ == "__metadata__") return fail("\"__metadata__\" must be an object of strings" + got);
        return fail(tensor_label(key_) + " is not a JSON object" + got);
      case Ctx::Entry: {
        const std::string& name = entries.back().name;
        if (key_ == "dtype") return fail(tensor_label(name) + ": \"dtype\" must be a string" + got);
        if (key_ == "shape")
          return fail(tensor_label(name) + ": \"shape\" must be an array of non-negative integers" + got);
        if (key_ == "data_offsets") return fail(offsets_type_error() + got);
        return true;  // unknown field: ignored
      }
      case Ctx::Meta:
        return fail("\"__metadata__\" value of " + quote(key_) + " must be a string" + got);
      case Ctx::Shape:
        return fail(tensor_label(entries.back().name) + ": \"shape\" must be an array of non-negative integers" + got);
      case Ctx::Offsets:
        return fail(offsets_type_error() + got);
    }
    return true;
  }
};

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

size_t safetensors_dtype_size(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

SafetensorsHeader parse_safetensors_header(const uint8_t* data, size_t size, uint64_t file_size,
                                           const std::string& source) {
  if (file_size < 8) {
    fail(source, "file is too short to be safetensors (" + std::to_string(file_size) +
                     " bytes, the 8-byte header length alone needs 8)");
  }
  if (size < 8) fail(source, "header is truncated (" + std::to_string(size) + " bytes available)");
  const uint64_t n = read_le64(data);
  if (n > SAFETENSORS_MAX_HEADER_BYTES) {
    fail(source, "header length " + std::to_string(n) + " exceeds the limit of " +
                     std::to_string(SAFETENSORS_MAX_HEADER_BYTES) + " bytes");
  }
  const uint64_t data_start = 8 + n;  // no overflow: n <= 1e8
  if (data_start > file_size) {
    fail(source,
         "header length " + std::to_string(n) + " is longer than the file (" + std::to_string(file_size) + " bytes)");
  }
  if (size < data_start) {
    fail(source,
         "header is truncated (" + std::to_string(size) + " of " + std::to_string(data_start) + " bytes available)");
  }

  const char* json_begin = reinterpret_cast<const char*>(data + 8);
  const char* json_end = json_begin + n;
  if (n >= 3 && std::memcmp(json_begin, "\xEF\xBB\xBF", 3) == 0) {
    fail(source, "invalid JSON header: starts with a UTF-8 byte order mark");  // nlohmann would skip it
  }
  // nlohmann's lexer takes a NUL byte for the end of the input (and would ignore what follows); a
  // raw NUL is never valid JSON, inside strings or out.
  if (const void* nul = std::memchr(json_begin, 0, static_cast<size_t>(n))) {
    fail(source, "invalid JSON header: NUL byte at header offset " +
                     std::to_string(static_cast<const char*>(nul) - json_begin));
  }
  HeaderSax sax;
  bool ok;
  try {
    ok = nlohmann::json::sax_parse(json_begin, json_end, &sax, nlohmann::json::input_format_t::json,
                                   /*strict=*/true, /*ignore_comments=*/false);
  } catch (const nlohmann::json::exception& e) {  // not expected: parse errors go to the handler
    ok = false;
    sax.json_error = e.what();
  }
  if (!ok || !sax.json_error.empty()) {
    fail(source, "invalid JSON header: " + quote(sax.json_error.empty() ? "parse error" : sax.json_error, false, 400));
  }
  if (!sax.error.empty()) fail(source, sax.error);
  if (!sax.root_done) fail(source, "header is not a JSON object");

  // Sizes.
  for (const RawEntry& e : sax.entries) {
    const size_t esize = safetensors_dtype_size(e.dtype);
    if (esize == 0) {
      fail(source, tensor_label(e.name) + ": unknown dtype " + quote(e.dtype) +
                       " (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL U16 U32)");
    }
    uint64_t numel = 1;
    bool overflow = false;
    for (int64_t d : e.shape) overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel);
    uint64_t bytes = 0;
    overflow |= numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
    overflow |= __builtin_mul_overflow(numel, static_cast<uint64_t>(esize), &bytes);
    if (overflow)
      fail(source, tensor_label(e.name) + ": shape " + shape_text(e.shape) + " is too large (size overflows)");
    const uint64_t begin = e.offsets[0], end = e.offsets[1];
    if (end < begin) {
      fail(source, tensor_label(e.name) + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                       "] end before begin");
    }
    if (end - begin != bytes) {
      fail(source, tensor_label(e.name) + ": size mismatch: data_offsets [" + std::to_string(begin) + ", " +
                       std::to_string(end) + "] hold " + std::to_string(end - begin) + " bytes but " + e.dtype + " " +
                       shape_text(e.shape) + " needs " + std::to_string(bytes));
    }
  }

  // Layout: sorted by offset the tensors must tile [0, total) exactly.
  std::vector<size_t> order(sax.entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto& x = sax.entries[a].offsets;
    const auto& y = sax.entries[b].offsets;
    return x[0] != y[0] ? x[0] < y[0] : x[1] < y[1];
  });
  uint64_t expected = 0;
  const RawEntry* prev = nullptr;
  for (size_t i : order) {
    const RawEntry& e = sax.entries[i];
    const uint64_t begin = e.offsets[0];
    if (!prev && begin != 0) {
      fail(source, "data offsets do not start at 0 (first tensor " + quote(e.name) + " begins at byte " +
                       std::to_string(begin) + ")");
    }
    if (begin < expected) {
      fail(source, tensor_label(e.name) + " overlaps tensor " + quote(prev->name) + " (begins at byte " +
                       std::to_string(begin) + ", before " + std::to_string(expected) + ")");
    }
    if (begin > expected) {
      fail(source, "gap of " + std::to_string(begin - expected) + " bytes in the data before " + tensor_label(e.name) +
                       " (byte " + std::to_string(expected) + " to " + std::to_string(begin) + ")");
    }
    expected = e.offsets[1];
    prev = &e;
  }
  const uint64_t available = file_size - data_start;
  if (expected > available) {
    fail(source, "file is truncated: the tensors need " + std::to_string(expected) + " data bytes, the file has " +
                     std::to_string(available));
  }
  if (expected < available) {
    fail(source, std::to_string(available - expected) + " trailing bytes after the last tensor (data is " +
                     std::to_string(expected) + " bytes, the file has " + std::to_string(available) + ")");
  }

  SafetensorsHeader header;
  header.header_bytes = n;
  header.data_start = data_start;
  header.metadata = std::move(sax.metadata);
  header.tensors.reserve(order.size());
  for (size_t i : order) {
    RawEntry& e = sax.entries[i];
    SafetensorsEntry out;
    out.name = std::move(e.name);
    out.dtype = std::move(e.dtype);
    out.shape = std::move(e.shape);
    out.begin = e.offsets[0];
    out.end = e.offsets[1];
    header.tensors.push_back(std::move(out));
  }
  return header;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  uint64_t file_size = 0;
  Fd fd = open_for_reading(path, &file_size);
  uint8_t prefix[8];
  const size_t got = static_cast<size_t>(std::min<uint64_t>(file_size, 8));
  pread_all(fd.get(), prefix, got, 0, path);
  if (got < 8) return parse_safetensors_header(prefix, got, file_size, path);  // throws: too short
  const uint64_t n = read_le64(prefix);
  if (n > SAFETENSORS_MAX_HEADER_BYTES || 8 + n > file_size) {
    return parse_safetensors_header(prefix, 8, file_size, path);  // throws: the length is checked first
  }
  std::vector<uint8_t> buf(static_cast<size_t>(8 + n));  // checked above: <= 1e8 + 8 and within the file
  std::memcpy(buf.data(), prefix, 8);
  pread_all(fd.get(), buf.data() + 8, static_cast<size_t>(n), 8, path);
  return parse_safetensors_header(buf.data(), buf.size(), file_size, path);
}

}  // namespace booster::checkpoint
