// memory.cpp — MemoryReport formatting and process_memory().
#include "booster/core/memory.h"

#include <ATen/core/Tensor.h>
#include <sys/resource.h>

#include <cstdio>
#include <fstream>

namespace booster {

MemoryVisitor::~MemoryVisitor() = default;

void MemoryVisitor::visit(MemoryCategory category, const at::Tensor& t, bool check_pinned) {
  PlacedBytes b;
  b.add(t, check_pinned);
  if (b.total > 0) visit(category, b);
}

void MemoryVisitor::visit_planned(MemoryCategory category, int64_t bytes, bool on_device, bool pinned) {
  PlacedBytes b;
  b.total = bytes;
  if (on_device) b.on_device = bytes;
  else if (pinned) b.pinned = bytes;
  visit(category, b);
}

void MemoryReportBuilder::visit(MemoryCategory category, const PlacedBytes& b) {
  MemoryReport& r = report_;
  switch (category) {
    case MemoryCategory::kParameters:
      r.parameters += b.total;
      r.parameters_on_device += b.on_device;
      break;
    case MemoryCategory::kGradients:
      r.gradients += b.total;
      r.gradients_on_device += b.on_device;
      break;
    case MemoryCategory::kMasterWeights:
      r.master_weights += b.total;
      r.master_weights_on_device += b.on_device;
      break;
    case MemoryCategory::kOptimizerStates:
      r.optimizer_states += b.total;
      r.optimizer_states_on_device += b.on_device;
      break;
    case MemoryCategory::kCommunicationBuffers:
      r.communication_buffers += b.total;
      r.communication_buffers_on_device += b.on_device;
      break;
  }
  if (category != MemoryCategory::kCommunicationBuffers) r.pinned_host_bytes += b.pinned;
}

void PlacedBytes::add(const at::Tensor& t, bool check_pinned) {
  if (!t.defined()) return;
  const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
  total += bytes;
  if (!t.device().is_cpu()) on_device += bytes;
  else if (check_pinned && t.is_pinned()) pinned += bytes;
}

std::string MemoryReport::to_string() const {
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  char buf[320];
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
  if (!on_accelerator()) return out;
  std::snprintf(buf, sizeof buf,
                "; on %s: params %.1f MiB, grads %.1f MiB, master weights %.1f MiB, optimizer states %.1f MiB, "
                "communication buffers %.1f MiB; model states %.1f MiB",
                device.c_str(), mib(parameters_on_device), mib(gradients_on_device), mib(master_weights_on_device),
                mib(optimizer_states_on_device), mib(communication_buffers_on_device), mib(model_states_on_device()));
  out += buf;
  std::snprintf(buf, sizeof buf, "; on the host: model states %.1f MiB (%.1f MiB pinned)", mib(model_states_on_host()),
                mib(pinned_host_bytes));
  out += buf;
  std::snprintf(buf, sizeof buf, "; %s allocator: allocated %.1f MiB (peak %.1f), reserved %.1f MiB (peak %.1f)",
                device.c_str(), mib(device_allocated), mib(device_peak_allocated), mib(device_reserved),
                mib(device_peak_reserved));
  out += buf;
  return out;
}

ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) m.rss_bytes = std::stoll(line.substr(6)) * 1024;
    if (line.rfind("VmHWM:", 0) == 0) m.peak_rss_bytes = std::stoll(line.substr(6)) * 1024;
  }
  rusage usage{};
  if (::getrusage(RUSAGE_SELF, &usage) == 0) m.minor_faults = usage.ru_minflt;
  return m;
}

}  // namespace booster
