// replica.h — keeping model replicas identical across data-parallel ranks (used at configure time
// by every data-parallel plugin, and for DDP's per-forward buffer broadcast).
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

#include "booster/export.h"

namespace booster {
namespace dist {
class ProcessGroup;
}

// Checks that every rank has the same parameter names, shapes and dtypes in the same order.
// Collective. Throws std::runtime_error on every rank when any rank differs, naming the first
// differing parameter, its shape on rank 0 and on the offending rank, and the fix ("build the same
// model on every rank").
BOOSTER_API void verify_replicas(dist::ProcessGroup& group,
                                 const std::vector<std::pair<std::string, torch::Tensor>>& named_tensors);

// Broadcasts tensors from `root` in place, coalesced: tensors of one dtype are flattened into
// buffers of at most bucket_bytes (bytes), one broadcast per buffer, then copied back. Collective.
BOOSTER_API void broadcast_coalesced(dist::ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                                     int root, int64_t bucket_bytes = 250LL << 20);

// SUM-allreduces `tensors` over `group` in place (divided by the group size when `average`),
// coalesced: tensors of one dtype (any shapes, any device the group serves; possibly views) are
// flattened into buffers of at most bucket_bytes (bytes; a larger tensor is a buffer of its own),
// one allreduce per buffer, then copied back. Collective: every rank passes tensors of the same
// dtypes and sizes in the same order. Nothing happens on a group of one rank.
BOOSTER_API void allreduce_coalesced(dist::ProcessGroup& group, const std::vector<torch::Tensor>& tensors,
                                     int64_t bucket_bytes, bool average);

// What every data-parallel plugin does at configure time: verify_replicas over the module's
// parameters and buffers (names, dtypes, shapes), then broadcast_coalesced of all of them from rank 0.
// Collective. Throws as verify_replicas.
BOOSTER_API void sync_replicas(dist::ProcessGroup& group, const torch::nn::Module& module);

// The module's parameters (and buffers) with their dotted names, in registration order.
BOOSTER_API std::vector<std::pair<std::string, torch::Tensor>> named_parameters_of(const torch::nn::Module& m,
                                                                                   bool only_requires_grad);
BOOSTER_API std::vector<std::pair<std::string, torch::Tensor>> named_buffers_of(const torch::nn::Module& m);

}  // namespace booster
