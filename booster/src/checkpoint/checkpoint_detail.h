// checkpoint_detail.h — helpers shared by the checkpoint file formats (private to libbooster): the
// safetensors header parser (safetensors_header.cpp, which the fuzzer compiles alone), the
// safetensors reader/writer, the torch pickle format and the HF layout.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "booster/checkpoint/safetensors.h"
#include "booster/io/atomic_write.h"
#include "index_json.h"  // is_plain_file_name: checkpoint file names, weight_map values, extra files

namespace booster::checkpoint {
struct TensorSpec;  // state_dict_io.h
}  // namespace booster::checkpoint

namespace booster::checkpoint::detail {

// Throws CheckpointError("<source>: <what>").
[[noreturn]] void fail(const std::string& source, const std::string& what);
std::string errno_text(int err);
// 'text' for messages: control characters escaped, at most max_bytes (cut at a UTF-8 boundary).
// With raw_high_bytes false, bytes >= 0x80 are escaped too (for text that may not be UTF-8).
std::string quote(const std::string& s, bool raw_high_bytes = true, size_t max_bytes = 200);
// "[2, 3]"
std::string shape_text(const std::vector<int64_t>& shape);
// "tensor 'name'"
std::string tensor_label(const std::string& name);

// `dir` + "/" + `name`: a file's path in a checkpoint directory.
inline std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

// A file descriptor closed on destruction (movable, not copyable).
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd& operator=(Fd&&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Runs f (a step of booster/io), reporting an io::IoError as a CheckpointError with the same
// message; everything else propagates unchanged.
template <class F>
void as_checkpoint_error(F&& f) {
  try {
    f();
  } catch (const io::IoError& e) {
    throw CheckpointError(e.what());
  }
}

// The safetensors writer in pieces (safetensors.cpp), so that a file's header can be written before
// its tensors are at hand: write_safetensors is these over a StateDict, save_state_dict_streamed
// writes each shard with them as its tensors arrive.
//
// The first bytes of a safetensors file holding tensors with these names, dtypes and shapes in this
// order (consecutive data offsets from 0): the 8-byte little-endian length, then the JSON header
// (`metadata` as "__metadata__" unless empty) padded with spaces to a multiple of 8. No I/O. Throws
// CheckpointError naming `source`: "__metadata__" as a tensor name, a duplicate name, an unsupported
// dtype, a name or metadata that is not valid UTF-8, a header over SAFETENSORS_MAX_HEADER_BYTES.
std::string safetensors_header_bytes(const std::string& source, const std::vector<TensorSpec>& specs,
                                     const std::map<std::string, std::string>& metadata);
// Throws CheckpointError naming `source` when `t` has no data to write: undefined, not dense (sparse
// ...), or on the meta device.
void check_safetensors_writable(const std::string& source, const std::string& name, const at::Tensor& t);
// Appends `t`'s data (C order, little-endian; a contiguous CPU copy is made when needed and dropped
// on return) to `out`. Throws io::IoError, or CheckpointError when the copy to the CPU fails.
void write_safetensors_data(io::OutputFile& out, const std::string& source, const std::string& name,
                            const at::Tensor& t);

// Opens a regular file for reading; returns the descriptor and sets *size. Throws CheckpointError.
Fd open_for_reading(const std::string& path, uint64_t* size);
// Reads exactly n bytes at offset (the file may not shrink meanwhile). Throws CheckpointError.
void pread_all(int fd, uint8_t* buf, size_t n, uint64_t offset, const std::string& path);

}  // namespace booster::checkpoint::detail
