// offload_file.cpp — the per-rank offload file (see offload_file.h).
#include "offload_file.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace booster::parallel::gemini {

namespace {

std::string reason() { return std::strerror(errno); }

std::atomic<int64_t> g_mapped{0};

void unmap(void* ctx) {
  const size_t total = *static_cast<size_t*>(ctx);
  g_mapped.fetch_sub(static_cast<int64_t>(total), std::memory_order_relaxed);
  munmap(ctx, total);
}

// nbytes of anonymous memory of its own; the first 64 bytes hold the mapping's size (for munmap),
// the data starts at +64 (aligned for every SIMD path).
at::DataPtr map_bytes(size_t nbytes) {
  const size_t total = nbytes + 64;
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) throw std::runtime_error("gemini: cannot map " + std::to_string(nbytes) + " bytes: " + reason());
  *static_cast<size_t*>(base) = total;
  g_mapped.fetch_add(static_cast<int64_t>(total), std::memory_order_relaxed);
  return at::DataPtr(static_cast<char*>(base) + 64, base, &unmap, at::Device(at::kCPU));
}

c10::StorageImpl* storage_of(const at::Tensor& t) { return t.storage().unsafeGetStorageImpl(); }

size_t tensor_bytes(const at::Tensor& t) { return static_cast<size_t>(t.numel()) * t.element_size(); }

void check_owned(const at::Tensor& t) {
  if (!t.is_contiguous() || t.storage_offset() != 0 || !t.device().is_cpu())
    throw std::logic_error("gemini: offload of a tensor that is not a contiguous CPU tensor at its storage's start");
}

}  // namespace

OffloadFile::OffloadFile(const std::string& dir, int rank) : dir_(dir) {
  struct stat st {};
  if (dir.empty() || ::stat(dir.c_str(), &st) != 0)
    throw std::runtime_error("gemini: offload_dir \"" + dir + "\" does not exist (" + reason() +
                             "); create it or set plugin.offload_dir to an existing directory");
  if (!S_ISDIR(st.st_mode))
    throw std::runtime_error("gemini: offload_dir \"" + dir + "\" is not a directory; set plugin.offload_dir to a directory");
  path_ = dir + "/gemini-offload-rank" + std::to_string(rank) + "-pid" + std::to_string(::getpid()) + ".bin";
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd_ < 0)
    throw std::runtime_error("gemini: cannot create the offload file " + path_ + " (" + reason() +
                             "); plugin.offload_dir must be a writable directory");
  ::unlink(path_.c_str());  // the open descriptor keeps it; nothing remains after the process
}

OffloadFile::~OffloadFile() {
  if (fd_ >= 0) ::close(fd_);
}

int64_t OffloadFile::reserve(int64_t nbytes) {
  const int64_t offset = size_;
  const int64_t rounded = (std::max<int64_t>(nbytes, 1) + 4095) / 4096 * 4096;
  const int err = ::posix_fallocate(fd_, offset, rounded);
  if (err != 0)
    throw std::runtime_error("gemini: offload_dir \"" + dir_ + "\" cannot hold " + std::to_string(rounded >> 20) +
                             " MiB more (" + std::strerror(err) + "; " + std::to_string(size_ >> 20) +
                             " MiB reserved so far); free space there, choose another plugin.offload_dir, or lower "
                             "the offload fractions");
  size_ += rounded;
  return offset;
}

int64_t OffloadFile::mapped_bytes() { return g_mapped.load(std::memory_order_relaxed); }

bool OffloadFile::resident(const at::Tensor& t) { return storage_of(t)->data() != nullptr || t.numel() == 0; }

void OffloadFile::swap_out(at::Tensor& t, int64_t offset) {
  if (!resident(t) || t.numel() == 0) return;
  check_owned(t);
  const char* data = static_cast<const char*>(t.data_ptr());
  const size_t n = tensor_bytes(t);
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::pwrite(fd_, data + done, n - done, static_cast<off_t>(offset + done));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("gemini: writing " + std::to_string(n) + " bytes to the offload file " + path_ +
                               " failed (" + reason() + "); the tensor stays in memory");
    }
    done += static_cast<size_t>(w);
  }
  written_ += static_cast<int64_t>(n);
  release(t);
}

void OffloadFile::release(at::Tensor& t) {
  c10::StorageImpl* s = storage_of(t);
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void OffloadFile::swap_in(at::Tensor& t, int64_t offset) {
  if (resident(t)) return;
  const size_t n = tensor_bytes(t);
  at::DataPtr mem = map_bytes(n);
  char* data = static_cast<char*>(mem.get());
  for (size_t done = 0; done < n;) {
    const ssize_t r = ::pread(fd_, data + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      throw std::runtime_error("gemini: reading " + std::to_string(n) + " bytes from the offload file " + path_ +
                               " failed (" + (r < 0 ? reason() : std::string("unexpected end of file")) + ")");
    done += static_cast<size_t>(r);
  }
  read_ += static_cast<int64_t>(n);
  c10::StorageImpl* s = storage_of(t);
  s->set_data_ptr_noswap(std::move(mem));
  s->set_nbytes(n);
}

}  // namespace booster::parallel::gemini
