// state_dict_adapter.h — state-dict adapters: how a model's tensors map to a HuggingFace
// architecture's checkpoint (torchtitan's per-model StateDictAdapter to_hf / from_hf).
//
// An adapter is a list of rules, one per kind of tensor. A rule names one of the model's tensors by
// a pattern ("transformer.h.{i}.attn.c_attn.weight": "{i}" matches a decimal layer index) and the
// HuggingFace tensor or tensors it is stored as ("transformer.h.{i}.attn.c_attn.weight", or
// "model.layers.{i}.self_attn.q_proj.weight" + "...k_proj.weight" + "...v_proj.weight" for a fused
// q/k/v written split), with the two transforms between them (a transpose for GPT-2's Conv1D, a
// row reorder for a fused q/k/v, the rotary permutation of Llama's q/k). It also carries the
// config.json the checkpoint directory gets (and is checked against on load), and the HuggingFace
// names a load drops (a tied lm_head.weight, GPT-2's legacy attn.bias buffers).
//
// The transforms see one FULL tensor (a tp shard is gathered, a FlatParameter's view taken, before
// the adapter runs), so every plugin saves and loads through the same adapter, one tensor at a time
// (checkpoint_io.h: ModelSaveOptions::adapter, ModelLoadOptions::adapter; `booster ckpt convert
// --adapter NAME` applies one offline).
//
// The built-in adapters (registered by name, made from a HuggingFace config.json):
//   "gpt2"  examples/gpt's model <-> transformers' GPT2LMHeadModel
//   "llama" examples/llama's model <-> transformers' LlamaForCausalLM
// Users register their own with register_state_dict_adapter.
#pragma once

#include <ATen/Tensor.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "booster/checkpoint/state_dict_io.h"
#include "booster/export.h"

namespace booster::checkpoint {

// One kind of the model's tensors and how it is stored.
//  ours:    the model's name pattern; "{i}" (any number of them) matches a decimal index.
//  hf:      the HuggingFace name patterns (with the same "{i}"s, in the same order): one, or several
//           when the model's tensor is stored split (a fused q/k/v).
//  to_hf:   the model's full tensor -> the HuggingFace tensors, one per `hf` entry, in order. Empty:
//           the identity (hf must then have one entry). It must use view / permute / reshape /
//           split / cat style operations only (it is also run on meta tensors to plan shapes), and
//           return tensors that do not alias each other.
//  from_hf: the inverse: the HuggingFace tensors, in `hf` order -> the model's full tensor.
// Dtypes pass through unchanged; devices are whatever the caller's tensor is on (CPU in the
// checkpoint paths).
struct BOOSTER_API AdapterRule {
  std::string ours;
  std::vector<std::string> hf;
  std::function<std::vector<at::Tensor>(const at::Tensor&)> to_hf;
  std::function<at::Tensor(const std::vector<at::Tensor>&)> from_hf;

  // Same name, same layout ("{i}" allowed).
  static AdapterRule rename(std::string ours, std::string hf);
  // A 2-D tensor stored transposed ([out, in] here, [in, out] in the file: GPT-2's Conv1D).
  static AdapterRule transposed(std::string ours, std::string hf);
};

// A model's tensors matched to their rules (StateDictAdapter::plan). Index j is the model tensor
// given to plan() at position j.
// The rule pointer refers into the adapter: keep the adapter alive while the plan is used.
struct AdaptedTensor {
  std::string ours;                   // the model's name
  std::vector<int64_t> shape;         // its full shape
  std::vector<TensorSpec> hf;         // the HuggingFace tensors it is stored as (name, dtype, shape);
                                      // empty: not part of a partial format (rule null)
  const AdapterRule* rule = nullptr;  // owned by the adapter
};

// The files of an adapter's format. A full model: model.safetensors (or shards + index) and
// config.json, every model tensor covered. A partial format stores some of the model's tensors
// only, e.g. PEFT's LoRA adapters (peft_lora.h: lora_state_dict_adapter): adapter_model.
// safetensors + adapter_config.json, with the base model's tensors left out.
struct AdapterFormat {
  std::string weights_name = "model";       // state_dict_io.h's `base`: <weights_name>.safetensors
  std::string config_file = "config.json";  // the file config_json_text() goes to (a plain file name)
  // true: a model tensor no rule covers is not part of the format (not written on save, not
  // expected on load; its AdaptedTensor has no hf tensors) instead of an error.
  bool partial = false;
};

class BOOSTER_API StateDictAdapter {
 public:
  // architecture: transformers' class name written as config.json's "architectures" ("GPT2LMHeadModel").
  // config: config.json's content (model_type and the sizes included); size_keys: the config fields
  // that must be equal in a checkpoint's config.json to load it ("n_layer", "n_embd", ...).
  // ignore_on_load: HuggingFace name patterns a load accepts and drops (a tied lm_head.weight).
  // Throws std::invalid_argument for a rule without names, a to_hf without from_hf (or the other
  // way), several hf names with no to_hf, or patterns whose "{i}" counts differ.
  // format: the file names and whether the format is partial (AdapterFormat); std::invalid_argument
  // for an empty weights_name or a config_file that is not a plain file name.
  StateDictAdapter(std::string architecture, nlohmann::json config, std::vector<std::string> size_keys,
                   std::vector<AdapterRule> rules, std::vector<std::string> ignore_on_load = {},
                   AdapterFormat format = {});

  const std::string& architecture() const { return architecture_; }
  const nlohmann::json& config() const { return config_; }
  const AdapterFormat& format() const { return format_; }
  // A copy of this adapter (rules, config, names) with another format, e.g. partial to load a base
  // model's checkpoint into a model with LoRA adapters (which the base checkpoint does not hold).
  // std::invalid_argument for bad file names, as the constructor.
  std::shared_ptr<StateDictAdapter> with_format(AdapterFormat format) const;
  // config() with "architectures": [architecture()] (none when architecture() is empty), as written
  // to format().config_file (indent 2, sorted keys, trailing newline, as transformers and PEFT
  // write it).
  std::string config_json_text() const;

  // Matches every model tensor (name, full shape, dtype) to the first rule whose `ours` pattern it
  // fits and plans the HuggingFace tensors (names with the indices substituted, shapes by running
  // to_hf on a meta tensor; dtype unchanged), checking that from_hf(to_hf(x)) has x's shape.
  // Throws CheckpointError naming every tensor no rule covers (a partial format plans those with no
  // hf tensors instead), every transform whose shapes do not round-trip (or that throws), and every
  // HuggingFace name two tensors would both write.
  std::vector<AdaptedTensor> plan(const std::vector<TensorSpec>& model_tensors) const;

  // The inverse planning, for converting a checkpoint without the model (`booster ckpt convert
  // --adapter NAME --direction from_hf`): groups a HuggingFace checkpoint's tensors (ignored names
  // skipped) by the rule and indices whose `hf` patterns they match, and names each group's model
  // tensor (shape by running from_hf on meta tensors); in the order of each group's first tensor.
  // Throws CheckpointError naming the tensors no rule covers and the groups with a part missing.
  std::vector<AdaptedTensor> plan_from_hf(const std::vector<TensorSpec>& hf_tensors) const;

  // Checks that some rule's `ours` pattern matches each name; throws CheckpointError listing the
  // names none matches (the registration check: Booster::set_state_dict_adapter). A partial format
  // passes any names.
  void check_covers(const std::vector<std::string>& model_names) const;

  // Whether a load drops this HuggingFace name (ignore_on_load).
  bool ignored_on_load(const std::string& hf_name) const;

  // "n_embd = 64, n_layer = 2, ..." over the size keys config() states (for error messages).
  std::string size_summary() const;

  // Checks a checkpoint's config.json document (its directory `path` for the message) against
  // config(): the same model_type, and every size key that both state equal (a field one side
  // omits takes transformers' default there and is not compared). An empty document (no
  // config.json) passes. Throws CheckpointError naming the fields, both values and both
  // architectures.
  void check_config(const nlohmann::json& file_config, const std::string& path) const;

 private:
  std::string architecture_;
  nlohmann::json config_;
  std::vector<std::string> size_keys_;
  std::vector<AdapterRule> rules_;
  std::vector<std::string> ignore_on_load_;
  AdapterFormat format_;
};

// Applies `tensor`'s rule: the model's full tensor -> its HuggingFace tensors (contiguous, same
// dtype and device), checked against the plan's shapes. Throws CheckpointError on a mismatch.
BOOSTER_API std::vector<at::Tensor> to_hf(const AdaptedTensor& tensor, const at::Tensor& full);
// The inverse: the HuggingFace tensors (in the plan's order) -> the model's full tensor, checked
// against the plan's shape.
BOOSTER_API at::Tensor from_hf(const AdaptedTensor& tensor, const std::vector<at::Tensor>& parts);

// A streamed save (state_dict_io.h: save_state_dict_streamed) of the model's tensors `ours`
// (specs in order; fetch_ours(j) gives tensor j, each once in increasing j) turned into the
// equivalent streamed save of the HuggingFace tensors: specs are the plan's HuggingFace specs in
// the same order, fetch(i) fetches the model tensor the HuggingFace tensor i comes from once and
// keeps its other parts until they are fetched (peak: one model tensor's parts).
struct AdaptedSave {
  std::vector<TensorSpec> specs;
  std::function<at::Tensor(size_t i)> fetch;
};
BOOSTER_API AdaptedSave adapt_save(const std::vector<AdaptedTensor>& plan,
                                   std::function<at::Tensor(size_t j)> fetch_ours);

// A model save through `adapter`: the plan of the model's tensors `tensors` (full shapes, in save
// order; ties already removed), the files' base name (adapter.format().weights_name) and the files
// the directory gets besides the tensors ({config_file: adapter.config_json_text()}). Throws
// CheckpointError for a non-empty prefix (HuggingFace names have none) and whatever plan() throws.
struct AdaptedModel {
  std::vector<AdaptedTensor> plan;
  std::string weights_name = "model";
  std::map<std::string, std::string> extra_files;
};
BOOSTER_API AdaptedModel adapt_model(const StateDictAdapter& adapter, const std::vector<TensorSpec>& tensors,
                                     const std::string& prefix);

// Reads directory `path`'s config.json (or `file`); an empty object when there is none (or `path`
// is a file). Throws CheckpointError when it exists and is not a JSON object.
BOOSTER_API nlohmann::json read_config_json(const std::string& path, const std::string& file = "config.json");

// ---- Registry of named adapters (for `booster ckpt convert --adapter NAME` and trainers).
// A factory builds the adapter of one model size from a HuggingFace config.json document; it throws
// CheckpointError for a config it cannot describe (another model_type, a missing size field).
using StateDictAdapterFactory = std::function<std::shared_ptr<StateDictAdapter>(const nlohmann::json& hf_config)>;
// Throws std::invalid_argument when `name` is empty or already registered.
BOOSTER_API void register_state_dict_adapter(const std::string& name, StateDictAdapterFactory factory);
// The adapter `name` for this config. Throws CheckpointError for an unknown name (listing the
// registered ones) and whatever the factory throws.
BOOSTER_API std::shared_ptr<StateDictAdapter> make_state_dict_adapter(const std::string& name,
                                                                      const nlohmann::json& hf_config);
BOOSTER_API std::vector<std::string> state_dict_adapter_names();

}  // namespace booster::checkpoint
