// lora_impl.h — the hook a LoRA layer carries and the helpers of lora.cpp (booster/nn/lora.h).
// Private to booster/src/nn; other components read a model's LoRA layers through
// booster::nn::lora_layers.
#pragma once

#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "booster/nn/tensor_parallel.h"

namespace booster::nn::lora_detail {

// The hook a LoRA layer carries (LinearForwardHook): found again with std::function::target.
struct LoraHook {
  int64_t r = 0;
  double lora_alpha = 0;
  double lora_dropout = 0;
  std::string target;  // the target_modules entry that matched this layer
  // The layer's lora_A / lora_B sub-modules, held here so that a forward does not look them up.
  std::shared_ptr<torch::nn::LinearImpl> a, b;
  const torch::nn::Module* owner = nullptr;  // the layer they belong to (a clone of it is another)
  // Tensor parallelism: the layer's tp group (null: T = 1) and kind. A column-parallel layer has A
  // [r, in] (replicated) and B [out/T, r] (split like its weight's rows); a row-parallel one A
  // [r, in/T] (split like its weight's columns) and B [out, r] (replicated).
  std::shared_ptr<dist::ProcessGroup> group;
  bool row_parallel = false;
  bool gather_output = false;         // column: the layer all-gathers its output
  bool input_is_parallel = true;      // row: x is already split along its last dim
  int64_t full_out = 0, full_in = 0;  // the dense base weight's shape
  double scaling() const { return lora_alpha / static_cast<double>(r); }
  // y + scaling · B(A(dropout(x))), with the tp communication of the layer's kind.
  at::Tensor operator()(torch::nn::Module& layer, const at::Tensor& x, const at::Tensor& y) const;
};

LinearForwardHook* hook_slot(torch::nn::Module& m);  // null unless Column/RowParallelLinear
const LoraHook* lora_hook(torch::nn::Module& m);     // null unless the layer has LoRA
at::Tensor& base_weight(torch::nn::Module& m);       // a Column/RowParallelLinear's weight

// "a, b, c, ... (N in all)"
std::string join(const std::vector<std::string>& v, size_t limit = 12);

}  // namespace booster::nn::lora_detail
