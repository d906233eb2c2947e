// host_allocator.cpp — glibc malloc retention (see host_allocator.h).
#include "booster/core/host_allocator.h"

#include <malloc.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace booster {

std::string configure_host_allocator(const std::string& mode) {
  if (mode == "system") return "malloc = \"system\": glibc's defaults";
  if (mode != "retain" && mode != "return")
    throw std::invalid_argument("booster: malloc = \"" + mode + "\" is not a mode; use \"retain\" (keep freed "
                                "memory for reuse), \"return\" (give freed blocks of 1 MiB and more back to the "
                                "system) or \"system\" (glibc's defaults)");
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
        return label + other + " is preloaded (LD_PRELOAD), glibc settings left alone";
  }
  struct Setting {
    int param;
    const char* env;
    const char* name;
    int64_t value;
  };
  const std::vector<Setting> settings =
      mode == "retain"
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
  return label + (set.empty() ? std::string("nothing set") : set) +
         (kept.empty() ? "" : "; kept from the environment: " + kept);
}

}  // namespace booster
