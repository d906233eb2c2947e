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
  return buf;
}

}  // namespace booster
