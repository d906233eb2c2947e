// device_backend.cpp — the registry of device collective backends (contract in
// booster/dist/device_backend.h).
#include "booster/dist/device_backend.h"

#include <map>
#include <mutex>

namespace booster::dist {
namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, DeviceBackendEntry>& registry() {
  static std::map<std::string, DeviceBackendEntry> r;
  return r;
}
}  // namespace

void register_device_backend(const std::string& name, c10::DeviceType device_type,
                             c10d::ProcessGroup::BackendType type, DeviceBackendFactory factory,
                             DeviceBackendNonMember non_member) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[name] = DeviceBackendEntry{device_type, type, std::move(factory), std::move(non_member)};
}

DeviceBackendEntry find_device_backend(const std::string& name) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(name);
  return it == registry().end() ? DeviceBackendEntry{} : it->second;
}

}  // namespace booster::dist
