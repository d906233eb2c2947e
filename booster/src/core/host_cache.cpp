// host_cache.cpp — the caching CPU allocator (see host_cache.h).
#include "booster/core/host_cache.h"

#include "booster/core/cpu_byte_counter.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <fstream>
#include <cstring>
#include <list>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace booster {

int64_t host_cache_size_class(int64_t bytes) {
  constexpr int64_t kPage = 4096;
  if (bytes <= kPage) return kPage;
  int shift = 63 - __builtin_clzll(static_cast<unsigned long long>(bytes));
  const int64_t step = std::max<int64_t>(kPage, int64_t{1} << std::max(0, shift - 3));
  return (bytes + step - 1) / step * step;
}

namespace {

class HostCache final : public c10::Allocator {
 public:
  static constexpr int64_t kHugePage = int64_t{2} << 20;

  explicit HostCache(c10::Allocator* previous) : previous_(previous) {}

  void set_huge_pages(bool on) { huge_pages_.store(on); }

  c10::DataPtr allocate(size_t n) override {
    if (static_cast<int64_t>(n) < kHostCacheMinBytes) return previous_->allocate(n);
    const int64_t bytes = host_cache_size_class(static_cast<int64_t>(n));
    void* ptr = take_held(bytes);
    if (ptr == nullptr) {
      ptr = map(bytes, static_cast<int64_t>(n));
      if (ptr == nullptr) {
        // Held blocks of other classes may be what stands between this request and the system's limit.
        trim(0);
        ptr = map(bytes, static_cast<int64_t>(n));
      }
      if (ptr == nullptr)
        throw c10::OutOfMemoryError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
                                    "booster host cache: mmap of " + std::to_string(bytes) +
                                        " bytes failed: " + std::strerror(errno));
    }
    std::lock_guard<std::mutex> lock(mu_);
    live_.emplace(ptr, bytes);
    stats_.in_use_bytes += bytes;
    stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
    return {ptr, ptr, &HostCache::deleter, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &HostCache::deleter; }

  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  void set_limit(int64_t limit) {
    std::vector<std::pair<void*, int64_t>> victims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stats_.limit_bytes = limit;
      evict_locked(limit, victims);
    }
    unmap(victims);
  }

  int64_t trim(int64_t keep) {
    std::vector<std::pair<void*, int64_t>> victims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      evict_locked(keep, victims);
    }
    return unmap(victims);
  }

  HostCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    HostCacheStats s = stats_;
    s.installed = true;
    s.huge_pages = huge_pages_.load();
    return s;
  }

  static HostCache* instance;

 private:
  struct FreeBlock {
    void* ptr;
    int64_t bytes;
  };
  using Lru = std::list<FreeBlock>;

  static void deleter(void* ptr) { instance->release(ptr); }

  // A held block of exactly this class (the most recently freed: its pages are the likeliest warm),
  // or null.
  void* take_held(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_by_class_.find(bytes);
    if (it == free_by_class_.end() || it->second.empty()) {
      ++stats_.misses;
      return nullptr;
    }
    const Lru::iterator node = it->second.back();
    it->second.pop_back();
    void* ptr = node->ptr;
    lru_.erase(node);
    stats_.held_bytes -= bytes;
    ++stats_.hits;
    return ptr;
  }

  // A fresh mapping of `bytes` (a size class) for a request of `requested` bytes. With huge pages,
  // blocks of 2 MiB and more start on a 2 MiB boundary and the whole 2 MiB pages within the request
  // are marked MADV_HUGEPAGE: touching one faults in 2 MiB at once (one fault instead of 512), which
  // is what makes the blocks above the limit cheap to map again. The rest (the request's last partial
  // huge page and the class's rounding) keeps 4 KiB pages, so untouched rounding stays off RSS.
  void* map(int64_t bytes, int64_t requested) const {
    if (huge_pages_.load() && bytes >= kHugePage) {
      const size_t span = static_cast<size_t>(bytes + kHugePage);
      void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (raw == MAP_FAILED) return nullptr;
      const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
      const uintptr_t aligned = (start + kHugePage - 1) & ~static_cast<uintptr_t>(kHugePage - 1);
      const uintptr_t end = start + span;
      if (aligned > start) ::munmap(raw, aligned - start);
      if (end > aligned + bytes) ::munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
      const int64_t huge = requested / kHugePage * kHugePage;
      ::madvise(reinterpret_cast<void*>(aligned), static_cast<size_t>(huge), MADV_HUGEPAGE);
      if (bytes > huge) ::madvise(reinterpret_cast<void*>(aligned + huge), static_cast<size_t>(bytes - huge), MADV_NOHUGEPAGE);
      return reinterpret_cast<void*>(aligned);
    }
    void* p = ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    // Huge pages off: 4 KiB pages also where the kernel's mode is "always".
    if (bytes >= kHugePage) ::madvise(p, static_cast<size_t>(bytes), MADV_NOHUGEPAGE);
    return p;
  }

  void release(void* ptr) {
    std::vector<std::pair<void*, int64_t>> victims;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = live_.find(ptr);
      if (it == live_.end()) {
        // raw_deallocate of a block the previous allocator served (raw_deleter is ours).
        previous_->raw_deallocate(ptr);
        return;
      }
      const int64_t bytes = it->second;
      live_.erase(it);
      stats_.in_use_bytes -= bytes;
      lru_.push_back({ptr, bytes});
      free_by_class_[bytes].push_back(std::prev(lru_.end()));
      stats_.held_bytes += bytes;
      evict_locked(stats_.limit_bytes, victims);
      stats_.peak_held_bytes = std::max(stats_.peak_held_bytes, stats_.held_bytes);
    }
    unmap(victims);
  }

  // Moves the least recently freed blocks out of the cache until at most `keep` bytes are held.
  void evict_locked(int64_t keep, std::vector<std::pair<void*, int64_t>>& victims) {
    while (stats_.held_bytes > keep && !lru_.empty()) {
      const FreeBlock victim = lru_.front();
      auto& list = free_by_class_[victim.bytes];
      for (auto it = list.begin(); it != list.end(); ++it)
        if (*it == lru_.begin()) {
          list.erase(it);
          break;
        }
      lru_.pop_front();
      stats_.held_bytes -= victim.bytes;
      stats_.released_bytes += victim.bytes;
      victims.emplace_back(victim.ptr, victim.bytes);
    }
  }

  static int64_t unmap(const std::vector<std::pair<void*, int64_t>>& victims) {
    int64_t total = 0;
    for (const auto& [ptr, bytes] : victims) {
      ::munmap(ptr, static_cast<size_t>(bytes));
      total += bytes;
    }
    return total;
  }

  c10::Allocator* previous_;
  std::atomic<bool> huge_pages_{false};
  std::mutex mu_;
  HostCacheStats stats_;
  std::unordered_map<void*, int64_t> live_;
  Lru lru_;  // free blocks, least recently freed first
  std::unordered_map<int64_t, std::vector<Lru::iterator>> free_by_class_;
};

HostCache* HostCache::instance = nullptr;
std::once_flag install_once;

}  // namespace

std::string transparent_huge_pages_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "unavailable";
  const size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unavailable";
  return line.substr(open + 1, close - open - 1);
}

void install_host_cache(int64_t limit_bytes, bool huge_pages) {
  if (limit_bytes < 0)
    throw std::invalid_argument("booster: host cache limit " + std::to_string(limit_bytes) +
                                " bytes is negative; use 0 (keep no free blocks) or more");
  std::call_once(install_once, [] {
    // Never destroyed: storage it served may be freed at any point until the process exits.
    if (at::Allocator* below = cpu_byte_counter_inner()) {
      // The byte counter (core/cpu_byte_counter.h, priority 255) is LibTorch's CPU allocator already:
      // the cache goes under it, over what it forwarded to.
      HostCache::instance = new HostCache(below);
      set_cpu_byte_counter_inner(HostCache::instance);
    } else {
      HostCache::instance = new HostCache(c10::GetCPUAllocator());
      c10::SetCPUAllocator(HostCache::instance, /*priority=*/1);
    }
  });
  const std::string thp = transparent_huge_pages_mode();
  HostCache::instance->set_huge_pages(huge_pages && (thp == "always" || thp == "madvise"));
  HostCache::instance->set_limit(limit_bytes);
}

int64_t trim_host_cache(int64_t keep_bytes) {
  return HostCache::instance == nullptr ? 0 : HostCache::instance->trim(std::max<int64_t>(0, keep_bytes));
}

HostCacheStats host_cache_stats() {
  return HostCache::instance == nullptr ? HostCacheStats{} : HostCache::instance->stats();
}

}  // namespace booster
