// checkpoint_detail.h — helpers shared by the checkpoint file formats (private to libbooster): the
// safetensors header parser (safetensors_header.cpp, which the fuzzer compiles alone), the
// safetensors reader/writer, the torch pickle format and the HF layout.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "booster/checkpoint/safetensors.h"
#include "booster/io/atomic_write.h"

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

// Opens a regular file for reading; returns the descriptor and sets *size. Throws CheckpointError.
Fd open_for_reading(const std::string& path, uint64_t* size);
// Reads exactly n bytes at offset (the file may not shrink meanwhile). Throws CheckpointError.
void pread_all(int fd, uint8_t* buf, size_t n, uint64_t offset, const std::string& path);

}  // namespace booster::checkpoint::detail
