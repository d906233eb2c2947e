// gloo_backend.cpp — the Gloo backend of dist::ProcessGroup (contract and the header caveat in
// gloo_backend.h).
#include "gloo_backend.h"

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>
#include <utility>

namespace booster::dist::detail {

struct GlooTransport {
  c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> options;
};

std::shared_ptr<const GlooTransport> make_gloo_transport(const std::string& host, int world_size,
                                                         std::chrono::milliseconds timeout) {
  // c10d's flight recorder (a debugging trace of every collective, on by default with 2000 entries)
  // crashes in 2.11 (SIGSEGV inserting into its std::map in FlightRecorder::recordWithResetEnabled)
  // when several Gloo groups of one process issue collectives from several threads, as the
  // thread-rank tests and concurrent sub-groups do. Off unless the user asks for it; it is read once,
  // when the first group is made.
  setenv("TORCH_FR_BUFFER_SIZE", "0", /*overwrite=*/0);
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  const bool loopback = host == "127.0.0.1" || host == "localhost" || world_size == 1;
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname)
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  else if (loopback)
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  else
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  options->threads = 2;
  auto transport = std::make_shared<GlooTransport>();
  transport->options = std::move(options);
  return transport;
}

c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                               int rank, int size, const GlooTransport& transport) {
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
  c10::intrusive_ptr<c10d::Backend> gloo =
      c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, transport.options);
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  return group;
}

}  // namespace booster::dist::detail
