// lora.h — LoRA, low-rank adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
// Models"; reference implementation: PEFT 0.21's LoraLayer / LoraModel, peft/tuners/lora/layer.py).
// PEFT's adapter files (adapter_config.json + adapter_model.safetensors) are checkpoint/peft_lora.h's.
//
// A LoRA layer computes y = base(x) + scaling · B(A(dropout(x))), scaling = lora_alpha / r, with
// A [r, in] (lora_A.weight, Kaiming-uniform with a = sqrt(5), as nn.Linear / PEFT's
// reset_lora_parameters) and B [out, r] (lora_B.weight, zeros), so the model's outputs are unchanged
// at initialisation. Only A and B train; every base parameter is frozen.
//
// How forward includes the term (LibTorch has no forward hooks, and a parent's typed member — e.g.
// llama's `ColumnParallelLinear q_proj` — cannot be swapped for a wrapper module): the target layer
// gets sub-modules "lora_A" and "lora_B" (torch::nn::Linear without bias), so the names are
// `<module>.weight` (base, unchanged) and `<module>.lora_A.weight` / `<module>.lora_B.weight`
// (PEFT's, less its adapter name "default"), and its LinearForwardHook (tensor_parallel.h) adds the
// low-rank term. Hence the targets are booster::nn::Linear (torch::nn::Linear with a hook point:
// same options, parameters, init and outputs) and booster::nn::ColumnParallelLinear /
// RowParallelLinear (at tp = 1 these are the dense layer too). A torch::nn::Linear target is refused
// (std::invalid_argument naming booster::nn::Linear as the fix): its forward is non-virtual and has
// no hook point, so a LoRA on it would be silently ignored.
//
// Tensor parallelism (tp > 1, as in PEFT's / Megatron's LoRA on parallel linear layers): the full A
// and B are drawn as at tp = 1 and split like the base weight, with the split registered as their
// TensorParallelSpec (checkpoints gather them):
//   ColumnParallelLinear (weight [out/T, in]): A [r, in] replicated, B [out/T, r] split by rows;
//     forward y + s · B(f(A(dropout(x)))) (f = copy_to_tensor_parallel_region, so A's gradient is
//     summed over the tp ranks), all-gathered like the output when gather_output;
//   RowParallelLinear (weight [out, in/T]): A [r, in/T] split by columns, B [out, r] replicated;
//     forward y + s · B(g(A(dropout(x_local)))) (g = reduce_from_tensor_parallel_region); the dropout
//     is tensor_parallel_dropout (x_local differs per tp rank).
// At tp = 1 the dropout is torch::dropout from the global generator, as PEFT's. merge_lora adds the
// local product (B A is split like W).
// Limitation: a LoRA layer cannot be clone()d (Cloneable's reset() does not re-create the adapters):
// clone() or the clone's forward throws (std::logic_error from the forward), never using the
// original's adapters.
//
// Dtypes / devices: A and B take the base weight's dtype and device at enable_lora.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "booster/export.h"

namespace booster::nn {

// PEFT's LoraConfig names and defaults (the subset supported).
struct LoraConfig {
  int64_t r = 8;                            // rank, >= 1
  double lora_alpha = 8;                    // scaling = lora_alpha / r; > 0
  double lora_dropout = 0.0;                // dropout on the LoRA branch's input, in [0, 1)
  std::vector<std::string> target_modules;  // module name suffixes (PEFT's rule: name == t or ends with "." + t)
  std::string bias = "none";                // only "none"
};

struct LoraReport {
  std::vector<std::string> modules;     // the dotted names of the layers that got LoRA, in named_modules() order
  int64_t trainable_parameters = 0;     // elements of all A and B (the only trainable parameters)
  int64_t total_parameters = 0;         // elements of every parameter of the model, A and B included
};

// Adds LoRA to every ColumnParallelLinear / RowParallelLinear of `model` whose dotted name (from
// named_modules(), relative to `model`) matches a target, freezes every other parameter
// (requires_grad false) and returns what it did. Draws A from the global torch RNG.
// std::invalid_argument (naming the problem and the fix) for: r <= 0, lora_alpha <= 0, lora_dropout
// outside [0, 1), bias other than "none", empty target_modules, targets matching no supported layer
// (the message lists a few module names), a matched torch::nn::Linear or other module type, a layer
// that already has LoRA or another forward_hook.
BOOSTER_API LoraReport enable_lora(torch::nn::Module& model, const LoraConfig& config);

// The dotted names of the layers with LoRA (unmerged), in named_modules() order.
BOOSTER_API std::vector<std::string> lora_modules(torch::nn::Module& model);

// Merges every LoRA layer: W += scaling · B A (in W's dtype, without autograd), then removes its
// adapters (sub-modules lora_A / lora_B and the hook): the layer computes the base only, and the
// model's state dict is the base model's again. Base parameters stay frozen. Returns the merged names.
BOOSTER_API std::vector<std::string> merge_lora(torch::nn::Module& model);

// One LoRA layer as enable_lora made it, described by value (for code that reads or stores the
// adapters, e.g. checkpoint/peft_lora.h). The fields are a snapshot; `module` points into the model
// (valid while the model holds the layer) and lora_A / lora_B are handles of the layer's own
// sub-modules (not copies), which stop being the layer's at merge_lora.
struct LoraLayerInfo {
  std::string name;                     // dotted name from named_modules() relative to the model ("" = the model)
  torch::nn::Module* module = nullptr;  // the layer: booster::nn::Linear / ColumnParallelLinear / RowParallelLinear
  std::string target;                   // the target_modules entry that matched it
  int64_t r = 0;
  double lora_alpha = 0, lora_dropout = 0;
  // The sub-modules "lora_A" / "lora_B" (no bias), in the base weight's dtype and device: this
  // process's A [r, in] and B [out, r], or their tensor-parallel shards (below).
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};
  // tp > 1: this process holds a shard of the adapters (a column-parallel layer B [out/T, r] split
  // by rows, A replicated; a row-parallel one A [r, in/T] split by columns, B replicated).
  bool tensor_parallel = false;
  bool row_parallel = false;            // a RowParallelLinear (at any tp)
  int64_t full_out = 0, full_in = 0;    // the dense base weight's shape [out, in] (unsharded)
};

// A model's LoRA layers, which share one r / lora_alpha / lora_dropout (PEFT's adapter_config.json
// holds one).
struct ModelLoraInfo {
  std::vector<LoraLayerInfo> layers;  // named_modules() order
  int64_t r = 0;
  double lora_alpha = 0, lora_dropout = 0;
  std::vector<std::string> targets;  // the layers' matched target_modules entries, sorted, unique
};

// The model's (unmerged) LoRA layers. std::invalid_argument, its message starting with
// error_prefix, when the model has none (call enable_lora first) or two layers differ in r /
// lora_alpha / lora_dropout.
BOOSTER_API ModelLoraInfo lora_layers(torch::nn::Module& model,
                                      const std::string& error_prefix = "booster::nn::lora_layers: ");

}  // namespace booster::nn
