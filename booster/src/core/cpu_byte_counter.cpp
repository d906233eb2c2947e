// cpu_byte_counter.cpp — the counting CPU allocator (see cpu_byte_counter.h).
#include "booster/core/cpu_byte_counter.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <stdexcept>

namespace booster {

namespace {

std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
std::atomic<bool> g_installed{false};
std::atomic<at::Allocator*> g_inner{nullptr};  // the allocator the counter forwards to
constexpr size_t kHeader = 64;  // the size, then the serving allocator's deleter; keeps the data 64-byte aligned

// Context == data (raw_allocate callers, e.g. oneDNN, require it): the size and the deleter of the
// allocator that served the block sit in the header right before the data.
void free_counted(void* data) {
  char* base = static_cast<char*>(data) - kHeader;
  g_live.fetch_sub(static_cast<int64_t>(*reinterpret_cast<size_t*>(base)), std::memory_order_relaxed);
  const at::DeleterFnPtr inner_free = *reinterpret_cast<at::DeleterFnPtr*>(base + sizeof(size_t));
  inner_free(base);
}

class CountingAllocator final : public at::Allocator {
 public:
  at::DataPtr allocate(size_t n) override {
    at::Allocator* inner = g_inner.load(std::memory_order_acquire);
    char* base = static_cast<char*>(inner->raw_allocate(n + kHeader));
    *reinterpret_cast<size_t*>(base) = n;
    *reinterpret_cast<at::DeleterFnPtr*>(base + sizeof(size_t)) = inner->raw_deleter();
    const int64_t live = g_live.fetch_add(static_cast<int64_t>(n), std::memory_order_relaxed) + static_cast<int64_t>(n);
    int64_t peak = g_peak.load(std::memory_order_relaxed);
    while (live > peak && !g_peak.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
    char* data = base + kHeader;
    return at::DataPtr(data, data, &free_counted, at::Device(at::kCPU));
  }
  at::DeleterFnPtr raw_deleter() const override { return &free_counted; }
  // Tensor clones within this allocator: a plain memcpy, as LibTorch's default CPU allocator does.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

}  // namespace

void install_cpu_byte_counter() {
  static std::once_flag once;
  std::call_once(once, [] {
    at::Allocator* inner = c10::GetCPUAllocator();
    if (inner->raw_deleter() == nullptr) return;  // cannot wrap it: nothing is counted (auto sees no non-model data)
    g_inner.store(inner, std::memory_order_release);
    static CountingAllocator counter;  // immortal: its allocations outlive plugins
    c10::SetCPUAllocator(&counter, /*priority=*/255);
    g_installed = true;
  });
}

c10::Allocator* cpu_byte_counter_inner() { return g_installed.load() ? g_inner.load(std::memory_order_acquire) : nullptr; }

void set_cpu_byte_counter_inner(c10::Allocator* inner) {
  if (inner == nullptr || inner->raw_deleter() == nullptr)
    throw std::invalid_argument("booster: set_cpu_byte_counter_inner needs an allocator with a raw deleter");
  if (!g_installed.load()) throw std::logic_error("booster: set_cpu_byte_counter_inner: the counter is not installed");
  if (inner == c10::GetCPUAllocator()) throw std::invalid_argument("booster: set_cpu_byte_counter_inner: the counter itself");
  g_inner.store(inner, std::memory_order_release);
}

bool cpu_byte_counter_installed() { return g_installed.load(); }

int64_t counted_cpu_bytes() { return g_live.load(std::memory_order_relaxed); }
int64_t peak_cpu_bytes() { return g_peak.load(std::memory_order_relaxed); }
void reset_peak_cpu_bytes() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

}  // namespace booster
