// autograd_group.h — (library-internal) a process group carried through an autograd Function's
// context: AutogradContext::saved_data holds IValues only, so the group travels in a capsule. Used
// by the tensor- and sequence-parallel autograd functions (tensor_parallel_ops.cpp,
// sequence_parallel.cpp), with the two checks they share.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/custom_class.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "booster/dist/process_group.h"

namespace booster::nn::detail {

struct GroupHolder : torch::CustomClassHolder {
  explicit GroupHolder(std::shared_ptr<dist::ProcessGroup> g) : group(std::move(g)) {}
  std::shared_ptr<dist::ProcessGroup> group;
};

// Stores `group` in ctx->saved_data["group"] (forward).
inline void save_group(torch::autograd::AutogradContext* ctx, const std::shared_ptr<dist::ProcessGroup>& group) {
  ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupHolder>(group));
}

// The group save_group stored (backward).
inline std::shared_ptr<dist::ProcessGroup> saved_group(torch::autograd::AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<GroupHolder>(ctx->saved_data["group"].toCapsule())->group;
}

// Whether `group` splits anything: a group of one rank behaves as no group (T = 1).
inline bool group_active(const std::shared_ptr<dist::ProcessGroup>& group) { return group && group->size() > 1; }

// Throws std::invalid_argument naming booster::nn::<op> unless x is a defined floating-point tensor.
inline void check_floating(const at::Tensor& x, const char* op) {
  if (!x.defined() || !at::isFloatingType(x.scalar_type()))
    throw std::invalid_argument(std::string("booster::nn::") + op + ": needs a defined floating-point tensor, got " +
                                (x.defined() ? std::string(c10::toString(x.scalar_type())) : std::string("undefined")));
}

}  // namespace booster::nn::detail
