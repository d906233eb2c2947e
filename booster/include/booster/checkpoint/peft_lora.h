// peft_lora.h — PEFT's adapter files for a model's LoRA layers (booster/nn/lora.h): adapter_config.json
// + adapter_model.safetensors, as PeftModel.save_pretrained writes them and
// PeftModel.from_pretrained reads them (peft 0.21.2). The layers are read through
// booster::nn::lora_layers; the HuggingFace module names and layouts come from the base model's
// state-dict adapter (state_dict_adapter.h).
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>

#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/export.h"

namespace booster::checkpoint {

// PEFT's file layout of the model's LoRA layers as a partial state-dict adapter (state_dict_adapter.h:
// AdapterFormat weights_name "adapter_model", config_file "adapter_config.json", partial): one rule
// per adapter tensor, `<module>.lora_A.weight` -> `base_model.model.<HF module>.lora_A.weight`
// (likewise lora_B) with the row / column permutation described at save_lora_as_pretrained, and
// adapter_config.json as its config text; every base-model tensor is left out. Any CheckpointIO
// saves / loads the adapters through it (Booster::save_lora_as_pretrained / load_lora: gathered
// from tp shards, FlatParameters and pipeline stages). Needs the layers' full shapes only, so it
// works on a sharded model. Throws what save_lora_as_pretrained throws for the layers and the
// adapter's rules.
BOOSTER_API std::shared_ptr<StateDictAdapter> lora_state_dict_adapter(torch::nn::Module& model,
                                                                      const std::string& base_model_name_or_path,
                                                                      const StateDictAdapter& adapter);

// The configuration checks of load_lora (dir/adapter_config.json against the model's LoRA layers);
// throws CheckpointError naming the field, or when the file is missing or not JSON.
BOOSTER_API void check_lora_adapter_config(torch::nn::Module& model, const std::string& dir,
                                           const StateDictAdapter& adapter);

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
                                         const std::string& base_model_name_or_path, const StateDictAdapter& adapter);

// Reads PEFT's layout from `dir` into the model's LoRA layers (enable_lora first, with the same
// config). Checks adapter_config.json (peft_type "LORA", r, lora_alpha, the set of target_modules
// and fan_in_fan_out equal to the model's; bias "none"; use_dora / use_rslora false) and the tensors
// strictly: every expected key present with its shape, no unexpected key. Throws CheckpointError
// naming the field or the tensors; values are converted to the model's dtype. One process:
// std::invalid_argument for a tensor-parallel layer (use Booster::load_lora).
BOOSTER_API void load_lora(torch::nn::Module& model, const std::string& dir, const StateDictAdapter& adapter);

}  // namespace booster::checkpoint
