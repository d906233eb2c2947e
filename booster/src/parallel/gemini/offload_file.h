// offload_file.h — Gemini's disk tier (ZeRO-Infinity's NVMe offload, Rajbhandari et al., SC21, on a
// file): tensors whose storage is written to a per-rank file and freed, and read back on demand.
//
// Invariants:
//  - One file per rank in `dir`, created at construction and unlinked at once (nothing is left behind
//    when the process ends, however it ends); its space is reserved up front (posix_fallocate), so a
//    full disk is reported when the slot is reserved, not in the middle of a step.
//  - A tensor handled here is contiguous, starts at its storage's offset 0 and is its storage's only
//    user (a master shard, an optimizer state tensor, a parameter shard); every handle of the same
//    storage sees the swap (the StorageImpl is changed in place, as FlatParameter frees its buffer).
//  - Swapped out: the storage has 0 bytes and no data pointer; the tensor must not be read.
//    Swapped in: the storage is an anonymous mapping of its own (munmap when freed), so a swap out
//    returns the memory to the OS at once, whatever the heap's thresholds (RSS drops by its size).
// Errors: std::runtime_error naming the directory or file and the system's reason (missing, not a
// directory, read-only, full, I/O error). A failed swap_out leaves the tensor resident and intact.
// Not thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace booster::parallel::gemini {

class OffloadFile {
 public:
  // Opens a new file in `dir` for `rank`. Throws std::runtime_error when dir is missing, is not a
  // directory, or a file cannot be created in it (read-only).
  OffloadFile(const std::string& dir, int rank);
  ~OffloadFile();
  OffloadFile(const OffloadFile&) = delete;
  OffloadFile& operator=(const OffloadFile&) = delete;

  // Reserves `nbytes` (rounded up to 4 KiB) of the file and returns its byte offset. Throws
  // std::runtime_error when the disk has no room (names dir and the bytes asked for).
  int64_t reserve(int64_t nbytes);
  // Writes t's bytes at `offset` (a slot from reserve of at least t's bytes) and frees t's storage.
  // No-op when t is already swapped out.
  void swap_out(at::Tensor& t, int64_t offset);
  // Frees t's storage without writing (the slot already holds these values).
  void release(at::Tensor& t);
  // Allocates t's storage (t's numel * element size bytes) and reads it from `offset`. No-op when t
  // is resident.
  void swap_in(at::Tensor& t, int64_t offset);
  static bool resident(const at::Tensor& t);
  // Bytes of all swapped-in storages of the process now (they bypass LibTorch's allocator).
  static int64_t mapped_bytes();
  const std::string& path() const { return path_; }
  int64_t reserved_bytes() const { return size_; }
  int64_t bytes_written() const { return written_; }
  int64_t bytes_read() const { return read_; }

 private:
  std::string dir_, path_;
  int fd_ = -1;
  int64_t size_ = 0, written_ = 0, read_ = 0;
};

}  // namespace booster::parallel::gemini
