// memory.cpp — MemoryReport formatting.
#include "booster/core/memory.h"

#include <cstdio>

namespace booster {

std::string MemoryReport::to_string() const {
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "params %.1f MiB, grads %.1f MiB, master weights %.1f MiB, optimizer states %.1f MiB, "
                "communication buffers %.1f MiB; model states %.1f MiB",
                mib(parameters), mib(gradients), mib(master_weights), mib(optimizer_states),
                mib(communication_buffers), mib(model_states()));
  std::string out = buf;
  if (host_cache_held > 0) {
    std::snprintf(buf, sizeof buf, "; host cache holds %.1f MiB free", mib(host_cache_held));
    out += buf;
  }
  return out;
}

}  // namespace booster
