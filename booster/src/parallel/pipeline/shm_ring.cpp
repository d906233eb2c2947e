// shm_ring.cpp — see shm_ring.h.
#include "shm_ring.h"

#include <fcntl.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace booster::parallel {

namespace {

constexpr size_t kAlign = 64;
size_t round_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::atomic<uint32_t>& word_at(uint8_t* p) { return *reinterpret_cast<std::atomic<uint32_t>*>(p); }

void futex_wait(const void* word, uint32_t expected, int64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake(const void* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0); }

std::string errno_text(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

}  // namespace

// The header: the receiver's count of consumed messages (low 32 bits), in its own cache line.
struct ShmRing::Header {
  std::atomic<uint32_t> consumed;
};

ShmRing::ShmRing(ShmRing&& o) noexcept { *this = std::move(o); }
ShmRing& ShmRing::operator=(ShmRing&& o) noexcept {
  if (this != &o) {
    release();
    base_ = o.base_;
    mapped_bytes_ = o.mapped_bytes_;
    slots_ = o.slots_;
    payload_bytes_ = o.payload_bytes_;
    slot_stride_ = o.slot_stride_;
    next_ = o.next_;
    o.base_ = nullptr;
    o.mapped_bytes_ = 0;
  }
  return *this;
}
ShmRing::~ShmRing() { release(); }
void ShmRing::release() {
  if (base_) munmap(base_, mapped_bytes_);
  base_ = nullptr;
}

ShmRing ShmRing::sized(int64_t slots, int64_t payload_bytes) {
  if (slots < 1 || payload_bytes < 0) throw std::invalid_argument("ShmRing: slots must be >= 1, payload_bytes >= 0");
  ShmRing r;
  r.slots_ = slots;
  r.payload_bytes_ = payload_bytes;
  r.slot_stride_ = kAlign + round_up(static_cast<size_t>(payload_bytes));
  r.mapped_bytes_ = kAlign + r.slot_stride_ * static_cast<size_t>(slots);
  return r;
}

ShmRing ShmRing::create(const std::string& name, int64_t slots, int64_t payload_bytes, std::string* error) {
  ShmRing r = sized(slots, payload_bytes);
  const size_t bytes = r.mapped_bytes_;
  const int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    *error = errno_text("shm_open");
    return ShmRing();
  }
  auto fail = [&](const char* call) {
    *error = errno_text(call);
    close(fd);
    shm_unlink(name.c_str());
    return ShmRing();
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("ftruncate");
  if (const int rc = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); rc != 0) {
    errno = rc;
    return fail("posix_fallocate");
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail("mmap");
  close(fd);
  r.base_ = static_cast<uint8_t*>(p);
  // A fresh object reads as zeros: consumed = 0 and every slot's sequence 0 (empty).
  return r;
}

ShmRing ShmRing::open(const std::string& name, int64_t slots, int64_t payload_bytes, std::string* error) {
  ShmRing r = sized(slots, payload_bytes);
  const size_t bytes = r.mapped_bytes_;
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    *error = errno_text("shm_open");
    return ShmRing();
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    *error = "the shared-memory object " + name + " has " + std::to_string(st.st_size) + " bytes, expected " +
             std::to_string(bytes);
    close(fd);
    return ShmRing();
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    *error = errno_text("mmap");
    return ShmRing();
  }
  r.base_ = static_cast<uint8_t*>(p);
  return r;
}

void ShmRing::unlink(const std::string& name) { shm_unlink(name.c_str()); }

uint8_t* ShmRing::slot(uint64_t seq) const {
  return base_ + kAlign + slot_stride_ * static_cast<size_t>(seq % static_cast<uint64_t>(slots_));
}

void ShmRing::wait_until(const void* word, const std::function<bool()>& done, double timeout_s, int peer_pid,
                         const std::string& what) const {
  for (int i = 0; i < 256; ++i) {
    if (done()) return;
    _mm_pause();
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  auto* w = static_cast<const std::atomic<uint32_t>*>(word);
  while (true) {
    const uint32_t seen = w->load(std::memory_order_acquire);
    if (done()) return;
    futex_wait(word, seen, 50'000'000);
    if (done()) return;
    if (peer_pid > 0 && kill(peer_pid, 0) != 0 && errno == ESRCH)
      throw std::runtime_error("booster: pipeline: " + what + ": the peer process (pid " + std::to_string(peer_pid) +
                               ") has exited");
    if (Clock::now() > deadline)
      throw std::runtime_error("booster: pipeline: " + what + ": nothing moved for " + std::to_string(timeout_s) +
                               " s ([distributed] timeout_s); is the peer rank stuck or stopped?");
  }
}

void ShmRing::send(const at::Tensor& t, double timeout_s, int peer_pid, const std::string& what) {
  if (!t.is_contiguous() || !t.device().is_cpu() || static_cast<int64_t>(t.nbytes()) != payload_bytes_)
    throw std::invalid_argument("booster: pipeline: " + what + ": a message of " + std::to_string(t.nbytes()) +
                                " bytes for a stream of " + std::to_string(payload_bytes_) +
                                "-byte messages (activation shapes changed under the same batch shapes; set "
                                "[plugin] enable_metadata_cache = false for such a model)");
  auto& consumed = reinterpret_cast<Header*>(base_)->consumed;
  const uint64_t seq = next_;
  // Slot free when the receiver has consumed message seq - slots: seq - consumed < slots (mod 2^32).
  wait_until(&consumed, [&] {
    return static_cast<uint32_t>(seq - consumed.load(std::memory_order_acquire)) < static_cast<uint64_t>(slots_);
  }, timeout_s, peer_pid, what);
  uint8_t* s = slot(seq);
  std::memcpy(s + kAlign, t.data_ptr(), static_cast<size_t>(payload_bytes_));
  word_at(s).store(static_cast<uint32_t>(seq + 1), std::memory_order_release);
  futex_wake(s);
  ++next_;
}

void ShmRing::recv(at::Tensor& out, double timeout_s, int peer_pid, const std::string& what) {
  if (!out.is_contiguous() || !out.device().is_cpu() || static_cast<int64_t>(out.nbytes()) != payload_bytes_)
    throw std::invalid_argument("booster: pipeline: " + what + ": a receive buffer of " + std::to_string(out.nbytes()) +
                                " bytes for a stream of " + std::to_string(payload_bytes_) + "-byte messages");
  const uint64_t seq = next_;
  uint8_t* s = slot(seq);
  auto& full = word_at(s);
  wait_until(s, [&] { return full.load(std::memory_order_acquire) == static_cast<uint32_t>(seq + 1); }, timeout_s,
             peer_pid, what);
  std::memcpy(out.data_ptr(), s + kAlign, static_cast<size_t>(payload_bytes_));
  auto& consumed = reinterpret_cast<Header*>(base_)->consumed;
  consumed.store(static_cast<uint32_t>(seq + 1), std::memory_order_release);
  futex_wake(&consumed);
  ++next_;
}

int64_t shm_host_id() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string id = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id;
  std::getline(boot, boot_id);
  id += "/" + boot_id;
  struct stat st {};
  if (stat("/dev/shm", &st) == 0) id += "/" + std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino);
  // FNV-1a, 63 bits (stable across processes, unlike std::hash's unspecified seed policy).
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  return static_cast<int64_t>(h >> 1);
}

}  // namespace booster::parallel
