// lora.h — LoRA, low-rank adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
// Models"; reference implementation: PEFT 0.21's LoraLayer / LoraModel, peft/tuners/lora/layer.py),
// and PEFT's adapter files (adapter_config.json + adapter_model.safetensors, as
// PeftModel.save_pretrained writes them and PeftModel.from_pretrained reads them).
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

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "booster/checkpoint/state_dict_adapter.h"
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

// PEFT's file layout of the model's LoRA layers as a partial state-dict adapter (checkpoint/
// state_dict_adapter.h: AdapterFormat weights_name "adapter_model", config_file
// "adapter_config.json", partial): one rule per adapter tensor, `<module>.lora_A.weight` ->
// `base_model.model.<HF module>.lora_A.weight` (likewise lora_B) with the row / column permutation
// described at save_lora_as_pretrained, and adapter_config.json as its config text; every base-model
// tensor is left out. Any CheckpointIO saves / loads the adapters through it (Booster::
// save_lora_as_pretrained / load_lora: gathered from tp shards, FlatParameters and pipeline stages).
// Needs the layers' full shapes only, so it works on a sharded model. Throws what
// save_lora_as_pretrained throws for the layers and the adapter's rules.
BOOSTER_API std::shared_ptr<booster::checkpoint::StateDictAdapter> lora_state_dict_adapter(
    torch::nn::Module& model, const std::string& base_model_name_or_path,
    const booster::checkpoint::StateDictAdapter& adapter);

// The configuration checks of load_lora (dir/adapter_config.json against the model's LoRA layers);
// throws CheckpointError naming the field, or when the file is missing or not JSON.
BOOSTER_API void check_lora_adapter_config(torch::nn::Module& model, const std::string& dir,
                                           const booster::checkpoint::StateDictAdapter& adapter);

// Writes PEFT's layout into directory `dir` (atomically replaced): adapter_config.json (the keys and
// defaults peft 0.21.2's LoraConfig.save_pretrained writes; task_type "CAUSAL_LM", inference_mode
// true, target_modules = the config's targets that matched, sorted) and adapter_model.safetensors
// with `base_model.model.<HF module>.lora_A.weight` / `.lora_B.weight` (the base weight's dtype).
// The HuggingFace names and layouts come from `adapter` (e.g. make_state_dict_adapter("llama",
// config)): the rule of `<module>.weight` gives the HF module name; its to_hf must be a permutation
// of the weight's rows and / or columns (llama's rotary permutation of q_proj / k_proj rows), which
// is applied to B's rows / A's columns (B A's rows / columns are W's), optionally with a transpose
// (GPT-2's Conv1D, c_attn's q|k|v row reorder included: PEFT keeps A [r, in] and B [out, r] in
// nn.Linear's layout and sets fan_in_fan_out true, so only the permutation applies). The
// permutations are found by running to_hf on index tensors. A rule that splits or reshapes a weight
// (a fused q/k/v stored split) throws CheckpointError naming the tensor.
// std::invalid_argument when the model has no (unmerged) LoRA, the layers' r / alpha / dropout
// differ, or a layer is tensor-parallel (this process holds a shard: use Booster::
// save_lora_as_pretrained). One process; a boosted model saves through the Booster.
BOOSTER_API void save_lora_as_pretrained(torch::nn::Module& model, const std::string& dir,
                                         const std::string& base_model_name_or_path,
                                         const booster::checkpoint::StateDictAdapter& adapter);

// Reads PEFT's layout from `dir` into the model's LoRA layers (enable_lora first, with the same
// config). Checks adapter_config.json (peft_type "LORA", r, lora_alpha, the set of target_modules
// and fan_in_fan_out equal to the model's; bias "none"; use_dora / use_rslora false) and the tensors
// strictly: every expected key present with its shape, no unexpected key. Throws CheckpointError
// naming the field or the tensors; values are converted to the model's dtype. One process:
// std::invalid_argument for a tensor-parallel layer (use Booster::load_lora).
BOOSTER_API void load_lora(torch::nn::Module& model, const std::string& dir,
                           const booster::checkpoint::StateDictAdapter& adapter);

}  // namespace booster::nn
