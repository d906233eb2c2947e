// host_allocator.cpp — glibc malloc retention (see host_allocator.h).
#include "booster/core/host_allocator.h"

#include "booster/core/host_cache.h"

#include <malloc.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace booster {

int64_t default_host_cache_limit(int64_t model_state_bytes) {
  return std::max(kHostCacheFloorBytes,
                  static_cast<int64_t>(kHostCacheModelStateFraction * static_cast<double>(std::max<int64_t>(0, model_state_bytes))));
}

std::string configure_host_allocator(const std::string& mode, int64_t cache_limit_bytes) {
  if (mode != "cache" && mode != "retain" && mode != "return" && mode != "system")
    throw std::invalid_argument("booster: malloc = \"" + mode + "\" is not a mode; use \"cache\" (keep freed tensor "
                                "blocks for reuse, up to a bound), \"retain\" (keep freed memory in glibc's heap), "
                                "\"return\" (give freed blocks of 1 MiB and more back to the system) or \"system\" "
                                "(glibc's defaults)");
  if (mode == "cache" && cache_limit_bytes < 0)
    throw std::invalid_argument("booster: malloc_cache_mb must be >= 0 (the most freed tensor memory kept for "
                                "reuse), got " + std::to_string(cache_limit_bytes >> 20) + " MiB");
  if (mode == "system") return "malloc = \"system\": glibc's defaults";
  const std::string label = "malloc = \"" + mode + "\": ";
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer's allocator replaces glibc's (BOOSTER_SANITIZE builds); mallopt has no effect.
  return label + "AddressSanitizer's allocator is in use, glibc settings left alone";
#endif
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload != nullptr) {
    const std::string p = preload;
    for (const char* other : {"jemalloc", "mimalloc", "tcmalloc"})
      if (p.find(other) != std::string::npos)
        return label + other + " is preloaded (LD_PRELOAD): it serves the tensors, glibc settings and the "
                       "tensor cache left alone";
  }
  struct Setting {
    int param;
    const char* env;
    const char* name;
    int64_t value;
  };
  const std::vector<Setting> settings =
      mode == "cache"
          ? std::vector<Setting>{{M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", "M_MMAP_THRESHOLD", 1LL << 20},
                                 {M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", "M_TRIM_THRESHOLD", 32LL << 20}}
      : mode == "retain"
          ? std::vector<Setting>{{M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", "M_MMAP_THRESHOLD", 32LL << 20},
                                 {M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", "M_TRIM_THRESHOLD", 0x7fffffff}}
          : std::vector<Setting>{{M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_", "M_MMAP_THRESHOLD", 1LL << 20},
                                 {M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_", "M_TRIM_THRESHOLD", 1LL << 20}};
  std::string set, kept;
  // MALLOC_TOP_PAD_ alone also fixes glibc's thresholds: a user who set it chose glibc's behaviour.
  const bool user_tuned = std::getenv("MALLOC_TOP_PAD_") != nullptr;
  for (const Setting& s : settings) {
    if (user_tuned || std::getenv(s.env) != nullptr) {
      kept += (kept.empty() ? "" : ", ") + std::string(s.env);
      continue;
    }
    const int value = static_cast<int>(s.value);
    if (::mallopt(s.param, value) != 1)
      throw std::runtime_error(std::string("booster: mallopt(") + s.name + ", " + std::to_string(value) + ") failed");
    set += (set.empty() ? "" : ", ") + std::string(s.name) + " = " + std::to_string(value);
  }
  std::string cache;
  if (mode == "cache") {
    install_host_cache(cache_limit_bytes);
    cache = "tensor blocks of 1 MiB and more cached, at most " + std::to_string(cache_limit_bytes >> 20) +
            " MiB held free, " +
            (host_cache_stats().huge_pages
                 ? std::string("2 MiB huge pages for blocks of 2 MiB and more")
                 : "4 KiB pages (transparent huge pages: " + transparent_huge_pages_mode() + ")") +
            "; ";
  }
  return label + cache + "glibc: " + (set.empty() ? std::string("nothing set") : set) +
         (kept.empty() ? "" : "; kept from the environment: " + kept);
}

}  // namespace booster
