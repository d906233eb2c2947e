// gloo_backend.h — private to libbooster: the Gloo backend under dist::ProcessGroup.
//
// c10d 2.x's layering: a c10d::ProcessGroup holds one c10d::Backend per device type and sends each
// collective to the backend of its tensors' device. Gloo serves CPU tensors; a CUDA backend (NCCL) is
// set beside it by the GPU path.
//
// gloo_backend.cpp is the one translation unit of the library that includes ProcessGroupGloo.hpp.
// LibTorch's wheel ships no gloo headers, so Debian's libgloo-dev supplies them, and they are not
// the gloo revision libtorch_cpu.so was built with (no GLOO_STORE_HAS_STORE_V2: another vtable for
// gloo::rendezvous::Store). That TU therefore only calls functions defined inside libtorch_cpu.so
// (the ProcessGroupGloo and Options constructors, the device factories) and instantiates no gloo
// type's inline code: `nm -C` on its object shows no defined gloo:: symbol beyond std containers of
// shared_ptr (ctest gloo_confinement, tests/build_checks/gloo_confinement.sh; docs/architecture.md).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>

namespace booster::dist::detail {

// The Gloo transport a world group and its sub-groups share: its device (one TCP listener), two
// I/O threads per group, and the timeout of every collective. Opaque outside gloo_backend.cpp.
struct GlooTransport;

// The transport for a rendezvous at `host` among `world_size` ranks: on the interface named by
// GLOO_SOCKET_IFNAME when set; else on 127.0.0.1 when `host` is 127.0.0.1 or localhost or
// world_size is 1; else on the address this machine's hostname resolves to (c10d's default device).
// Throws what c10d throws (c10::Error) when the interface or address cannot be bound.
// Sets TORCH_FR_BUFFER_SIZE=0 (c10d's flight recorder off) unless the environment sets it: in 2.11
// the recorder crashes when several groups of one process run collectives from several threads.
std::shared_ptr<const GlooTransport> make_gloo_transport(const std::string& host, int world_size,
                                                         std::chrono::milliseconds timeout);

// A c10d::ProcessGroup of `size` ranks whose CPU backend is Gloo on `transport`, connected through
// `store` (each group passes its own key prefix). Blocks until all `size` ranks have called it;
// throws what ProcessGroupGloo throws (c10::Error, std::runtime_error) when a peer does not connect
// within the transport's timeout.
c10::intrusive_ptr<c10d::ProcessGroup> make_gloo_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                               int rank, int size, const GlooTransport& transport);

}  // namespace booster::dist::detail
