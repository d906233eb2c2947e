// device.cpp — [booster] device and the CUDA support library (contract in booster/device.h).
#include "booster/device.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <stdexcept>

namespace booster {
namespace {

namespace fs = std::filesystem;

void locate_this_library() {}

// $BOOSTER_CUDA_LIBRARY, else libbooster_cuda.so beside libbooster.so (symlinks resolved).
std::string cuda_library_path() {
  if (const char* env = std::getenv("BOOSTER_CUDA_LIBRARY"); env && *env) return env;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&locate_this_library), &info) == 0 || info.dli_fname == nullptr)
    return "libbooster_cuda.so";
  std::error_code ec;
  fs::path library = fs::canonical(info.dli_fname, ec);
  if (ec) library = fs::absolute(info.dli_fname, ec);
  return (library.parent_path() / "libbooster_cuda.so").string();
}

std::mutex load_mutex;
bool loaded = false;

}  // namespace

void load_cuda_support() {
  std::lock_guard<std::mutex> lock(load_mutex);
  if (loaded) return;
  const std::string path = cuda_library_path();
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw std::runtime_error("booster: CUDA support is not built: " + path +
                             " does not exist (this build found no CUDA toolkit; configure with "
                             "-DBOOSTER_WITH_CUDA=ON, or set BOOSTER_CUDA_LIBRARY to the library)");
  // Never closed: the backends and kernels it registers live as long as the process.
  if (::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL) == nullptr) {
    const char* err = ::dlerror();
    throw std::runtime_error("booster: loading CUDA support (" + path + ") failed: " + (err ? err : "unknown error") +
                             " (LibTorch's CUDA libraries must be found: put LibTorch's lib directory and its "
                             "nvidia/*/lib directories on LD_LIBRARY_PATH)");
  }
  loaded = true;
}

bool cuda_support_loaded() {
  std::lock_guard<std::mutex> lock(load_mutex);
  return loaded;
}

int cuda_device_count() {
  try {
    load_cuda_support();
    if (!at::globalContext().hasCUDA()) return 0;
    return static_cast<int>(at::accelerator::deviceCount());
  } catch (const std::exception&) {
    return 0;
  }
}

c10::Device select_device(const std::string& name, int local_rank, int local_world_size, const std::string& backend) {
  if (name == "cpu") {
    if (backend == "nccl")
      throw std::invalid_argument("booster: distributed.backend = \"nccl\" needs device = \"cuda\" (NCCL reduces CUDA "
                                  "tensors only), and booster.device is \"cpu\"; set booster.device = \"cuda\" or "
                                  "distributed.backend = \"gloo\"");
    return c10::Device(c10::kCPU);
  }
  if (name != "cuda")
    throw std::invalid_argument("booster: booster.device = \"" + name + "\" is not a device; use \"cpu\" or \"cuda\"");
  try {
    load_cuda_support();
  } catch (const std::exception& e) {
    throw std::invalid_argument(std::string("booster: booster.device = \"cuda\", but ") + e.what() +
                                "; or set booster.device = \"cpu\"");
  }
  const int count = cuda_device_count();
  if (count == 0)
    throw std::invalid_argument("booster: booster.device = \"cuda\", but this process sees no CUDA device (no GPU, "
                                "no driver, or CUDA_VISIBLE_DEVICES is empty); set booster.device = \"cpu\"");
  if (local_rank < 0) local_rank = 0;
  if (backend == "nccl" && local_rank >= count)
    throw std::invalid_argument("booster: LOCAL_RANK " + std::to_string(local_rank) + " is beyond the " +
                                std::to_string(count) + " visible CUDA device(s), and NCCL runs one rank per GPU; "
                                "start at most " + std::to_string(count) + " ranks per node, or use "
                                "distributed.backend = \"gloo\" to share GPUs");
  if (backend == "nccl" && local_world_size > count)
    throw std::invalid_argument("booster: " + std::to_string(local_world_size) + " ranks on this node but " +
                                std::to_string(count) + " visible CUDA device(s), and NCCL runs one rank per GPU; "
                                "start at most " + std::to_string(count) + " ranks per node, or use "
                                "distributed.backend = \"gloo\" to share GPUs");
  const auto index = static_cast<c10::DeviceIndex>(local_rank % count);
  at::accelerator::setDeviceIndex(index);
  return c10::Device(c10::kCUDA, index);
}

DeviceMemory device_memory(const c10::Device& device) {
  DeviceMemory m;
  if (!device.is_cuda()) return m;
  const auto stats = at::accelerator::getDeviceStats(device.index());
  using Agg = c10::CachingAllocator::StatType;
  const auto all = static_cast<size_t>(Agg::AGGREGATE);
  m.allocated = stats.allocated_bytes[all].current;
  m.peak_allocated = stats.allocated_bytes[all].peak;
  m.reserved = stats.reserved_bytes[all].current;
  m.peak_reserved = stats.reserved_bytes[all].peak;
  const auto [free_bytes, total_bytes] = at::accelerator::getMemoryInfo(device.index());
  m.free = static_cast<int64_t>(free_bytes);
  m.total = static_cast<int64_t>(total_bytes);
  return m;
}

void reset_device_peak(const c10::Device& device) {
  if (device.is_cuda()) at::accelerator::resetPeakStats(device.index());
}

at::Tensor pinned_host_copy(const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  host.copy_(t);
  return host;
}

at::Tensor pinned_host_copy_async(const at::Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  at::Tensor host = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
  host.copy_(t, /*non_blocking=*/true);
  return host;
}

struct StreamEvent::Impl {
  explicit Impl(c10::DeviceType type) : event(type) {}
  c10::Event event;
};

StreamEvent::StreamEvent(c10::Device device) : device_(device) {
  if (!device.is_cpu()) impl_ = std::make_unique<Impl>(device.type());
}
StreamEvent::~StreamEvent() = default;
StreamEvent::StreamEvent(StreamEvent&&) noexcept = default;
StreamEvent& StreamEvent::operator=(StreamEvent&&) noexcept = default;

void StreamEvent::record() {
  if (!impl_) return;
  c10::Device device = device_;
  if (!device.has_index()) device = c10::Device(device.type(), c10::impl::VirtualGuardImpl(device.type()).getDevice().index());
  impl_->event.record(c10::impl::VirtualGuardImpl(device.type()).getStream(device));
}

void StreamEvent::synchronize() const {
  if (impl_) impl_->event.synchronize();
}

bool StreamEvent::query() const { return !impl_ || impl_->event.query(); }

}  // namespace booster
