// tensor_test_util.h — LibTorch-side helpers shared by the unit tests.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "booster/dist/process_group.h"

namespace booster::testing {

// The world of this process alone (rank 0 of 1, default rendezvous options), made once per process:
// the group a plugin or optimizer gets in a single-process test.
inline std::shared_ptr<dist::ProcessGroup> world_of_one() {
  static auto group = dist::ProcessGroup::rendezvous(dist::RendezvousOptions{});
  return group;
}

// The elements of `t` (any dtype, any shape) as doubles in row-major order.
inline std::vector<double> values_of(const at::Tensor& t) {
  at::Tensor d = t.to(at::kDouble).contiguous().view({-1});
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

}  // namespace booster::testing
