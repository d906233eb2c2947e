// shm_ring.h — a single-producer single-consumer ring of fixed-size messages in POSIX shared memory,
// the pipeline's same-host path for activations and gradients (pipeline_stage.h). Over Gloo every
// message needs the receiver to post a receive, both sides' Gloo I/O threads to run and the pair's
// lock: 0.2-0.8 ms of a busy 2-core machine per 128 KiB message, measured. Through the ring the
// sender copies the tensor into a slot and wakes the receiver (futex), the receiver copies it out:
// no third thread, no posted receive.
//
// Layout: a header (the consumed count) and `slots` slots of (sequence word, payload of
// `payload_bytes`), each 64-byte aligned. Message s (0, 1, 2, ...) goes to slot s % slots; the sender
// waits while the slot still holds message s - slots that the receiver has not consumed. Ordering:
// release store of the slot's sequence after the payload, acquire load before reading it (the same
// for the consumed count). Waiting spins briefly, then sleeps in FUTEX_WAIT (shared futexes) in
// 50 ms slices, checking the deadline and that the peer process is alive.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace booster::parallel {

class ShmRing {
 public:
  ShmRing() = default;
  ShmRing(const ShmRing&) = delete;
  ShmRing& operator=(const ShmRing&) = delete;
  ShmRing(ShmRing&& o) noexcept;
  ShmRing& operator=(ShmRing&& o) noexcept;
  ~ShmRing();  // unmaps (the name was unlinked by unlink())

  // Creates the shared-memory object `name` ("/..." as shm_open wants) of slots x payload_bytes and
  // reserves its pages (posix_fallocate, so a full /dev/shm is an error here, never a SIGBUS later).
  // Returns an empty ring (valid() false) with `error` set when shm_open, ftruncate, fallocate or
  // mmap fails (e.g. /dev/shm too small): the caller then keeps its Gloo path.
  static ShmRing create(const std::string& name, int64_t slots, int64_t payload_bytes, std::string* error);
  // Maps the object another process created with the same slots and payload_bytes (the size is
  // checked against the object's). Empty ring and `error` on failure (e.g. another /dev/shm).
  static ShmRing open(const std::string& name, int64_t slots, int64_t payload_bytes, std::string* error);
  // Removes the name (the mappings stay valid). Both sides call it once mapped; an absent name is fine.
  static void unlink(const std::string& name);

  bool valid() const { return base_ != nullptr; }
  int64_t payload_bytes() const { return payload_bytes_; }

  // Sender side. Copies `t` (contiguous, CPU, exactly payload_bytes() bytes, else
  // std::invalid_argument naming both sizes) into the next slot, waiting while it is still full.
  // Throws std::runtime_error naming `what` when the ring stays full for timeout_s seconds or the
  // process peer_pid (> 0) has exited meanwhile.
  void send(const at::Tensor& t, double timeout_s, int peer_pid, const std::string& what);
  // Receiver side. Waits for the next message and copies it into `out` (contiguous, CPU, exactly
  // payload_bytes() bytes). Same errors as send() when nothing arrives in time or the peer exited.
  void recv(at::Tensor& out, double timeout_s, int peer_pid, const std::string& what);

 private:
  struct Header;
  // An unmapped ring with the layout for slots x payload_bytes (mapped_bytes_ = the object's size).
  // Throws std::invalid_argument for slots < 1 or payload_bytes < 0.
  static ShmRing sized(int64_t slots, int64_t payload_bytes);
  void wait_until(const void* word, const std::function<bool()>& done, double timeout_s, int peer_pid,
                  const std::string& what) const;
  uint8_t* slot(uint64_t seq) const;
  void release();

  uint8_t* base_ = nullptr;
  size_t mapped_bytes_ = 0;
  int64_t slots_ = 0, payload_bytes_ = 0;
  size_t slot_stride_ = 0;
  uint64_t next_ = 0;  // this side's count of messages sent (sender) or received (receiver)
};

// An identifier of this machine's running kernel and shared-memory namespace (hostname, boot id and
// /dev/shm's device), equal for two processes exactly when they can share a ShmRing. Hashed to 63 bits.
int64_t shm_host_id();

}  // namespace booster::parallel
