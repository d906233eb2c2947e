// gemini_detail.h — small helpers shared by the gemini plugin's sources (private).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "offload_file.h"

namespace booster::parallel::gemini::detail {

// "12.345 MiB"
inline std::string mib(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.3f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// Bytes a tensor holds in memory now (0 when undefined or swapped out).
inline int64_t bytes_of(const at::Tensor& t) {
  return t.defined() && OffloadFile::resident(t) ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace booster::parallel::gemini::detail
