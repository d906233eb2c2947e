// replica.cpp — verify_replicas, broadcast_coalesced, named parameter/buffer listing.
#include "booster/core/replica.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/utils/tensor_flatten.h>

#include <map>
#include <sstream>
#include <stdexcept>

#include "booster/dist/process_group.h"

namespace booster {

namespace {

// One line per tensor: "name|dtype|d0,d1,..." (the description compared across ranks).
std::string describe_tensors(const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  std::ostringstream os;
  for (const auto& [name, t] : named) {
    os << name << "|" << c10::toString(t.scalar_type()) << "|";
    for (int64_t d = 0; d < t.dim(); ++d) os << (d ? "," : "") << t.size(d);
    os << "\n";
  }
  return os.str();
}

}  // namespace

void verify_replicas(dist::ProcessGroup& group, const std::vector<std::pair<std::string, torch::Tensor>>& named) {
  if (group.size() == 1) return;
  std::string mine = describe_tensors(named);
  std::string root = group.broadcast_string(mine, 0);
  double mismatch = group.allreduce_scalar(mine == root ? 0.0 : 1.0, dist::ReduceOp::MAX);
  if (mismatch == 0.0) return;
  if (mine == root) {
    throw std::runtime_error("booster: the model differs between ranks (another rank reported the difference); "
                             "build the same model on every rank");
  }
  // Name the first differing line.
  std::istringstream a(root), b(mine);
  std::string la, lb;
  size_t index = 0;
  while (true) {
    bool ha = static_cast<bool>(std::getline(a, la));
    bool hb = static_cast<bool>(std::getline(b, lb));
    if (!ha || !hb || la != lb) {
      std::string msg = "booster: the model differs between ranks at parameter #" + std::to_string(index) +
                        ": rank 0 has " + (ha ? "'" + la + "'" : "no more parameters") + ", rank " +
                        std::to_string(group.rank()) + " has " + (hb ? "'" + lb + "'" : "no more parameters") +
                        " (name|dtype|shape); build the same model on every rank";
      throw std::runtime_error(msg);
    }
    ++index;
  }
}

void allreduce_coalesced(dist::ProcessGroup& group, const std::vector<torch::Tensor>& tensors, int64_t bucket_bytes,
                         bool average) {
  if (group.size() == 1 || tensors.empty()) return;
  at::NoGradGuard no_grad;
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, list] : by_dtype) {
    size_t i = 0;
    while (i < list.size()) {
      std::vector<at::Tensor> bucket;
      int64_t bytes = 0;
      while (i < list.size() && (bucket.empty() || bytes + static_cast<int64_t>(list[i].nbytes()) <= bucket_bytes)) {
        bytes += static_cast<int64_t>(list[i].nbytes());
        bucket.push_back(list[i++]);
      }
      std::vector<at::Tensor> flat_parts;
      for (const auto& t : bucket) flat_parts.push_back(t.reshape({-1}));
      at::Tensor flat = at::cat(flat_parts);
      group.allreduce(flat, dist::ReduceOp::SUM).wait();
      if (average) flat.div_(group.size());
      int64_t off = 0;
      for (auto& t : bucket) {
        const_cast<at::Tensor&>(t).copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
        off += t.numel();
      }
    }
  }
}

void broadcast_coalesced(dist::ProcessGroup& group, const std::vector<torch::Tensor>& tensors, int root,
                         int64_t bucket_bytes) {
  if (group.size() == 1 || tensors.empty()) return;
  // Group consecutive tensors of one dtype into buffers of at most bucket_bytes.
  std::vector<std::vector<at::Tensor>> buckets;
  int64_t bytes = 0;
  for (const auto& t : tensors) {
    int64_t tb = t.numel() * static_cast<int64_t>(t.element_size());
    if (buckets.empty() || buckets.back().front().scalar_type() != t.scalar_type() || bytes + tb > bucket_bytes) {
      buckets.emplace_back();
      bytes = 0;
    }
    buckets.back().push_back(t);
    bytes += tb;
  }
  for (auto& b : buckets) {
    at::NoGradGuard no_grad;
    at::Tensor flat = torch::utils::flatten_dense_tensors(b);
    group.broadcast(flat, root).wait();
    auto parts = torch::utils::unflatten_dense_tensors(flat, b);
    for (size_t i = 0; i < b.size(); ++i) b[i].copy_(parts[i]);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> named_parameters_of(const torch::nn::Module& m,
                                                                       bool only_requires_grad) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : m.named_parameters(true))
    if (!only_requires_grad || item.value().requires_grad()) out.emplace_back(item.key(), item.value());
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> named_buffers_of(const torch::nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : m.named_buffers(true)) out.emplace_back(item.key(), item.value());
  return out;
}

void sync_replicas(dist::ProcessGroup& group, const torch::nn::Module& module) {
  auto all = named_parameters_of(module, false);
  auto buffers = named_buffers_of(module);
  all.insert(all.end(), buffers.begin(), buffers.end());
  verify_replicas(group, all);
  std::vector<torch::Tensor> tensors;
  for (auto& [name, t] : all) tensors.push_back(t);
  broadcast_coalesced(group, tensors, 0);
}

}  // namespace booster
