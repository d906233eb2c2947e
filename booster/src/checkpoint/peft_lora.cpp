// peft_lora.cpp — PEFT's adapter files for LoRA layers (booster/checkpoint/peft_lora.h): the partial
// state-dict adapter that names and lays out the adapters as PEFT does, and the one-process save / load.
#include "booster/checkpoint/peft_lora.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>

#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/nn/lora.h"

namespace booster::checkpoint {

namespace {

using booster::nn::ModelLoraInfo;
using json = nlohmann::json;

// "a, b, c, ... (N in all)"
std::string join_names(const std::vector<std::string>& v, size_t limit = 12) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < limit; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > limit) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

// How the adapter stores one LoRA layer's base weight: its HF module name and whether the HF tensor
// is W with its rows / columns permuted (row_perm / col_perm: HF index -> our index) or W transposed.
struct HfLayout {
  std::string hf_module;
  at::Tensor row_perm, col_perm;  // int64
  bool transposed = false;
};

HfLayout hf_layout(const StateDictAdapter& adapter, const std::string& module, int64_t out, int64_t in) {
  const std::string wname = module.empty() ? "weight" : module + ".weight";
  TensorSpec spec{wname, at::kDouble, {out, in}};
  auto plan = adapter.plan({spec});
  const auto& t = plan.at(0);
  if (t.hf.size() != 1)
    throw CheckpointError("save_lora_as_pretrained / load_lora: the adapter stores " + wname + " as " +
                          std::to_string(t.hf.size()) +
                          " HuggingFace tensors (a fused weight stored split); LoRA on such a layer has no PEFT "
                          "equivalent: target other modules");
  HfLayout L;
  const std::string& hf = t.hf[0].name;
  const std::string suffix = ".weight";
  if (hf.size() <= suffix.size() || hf.compare(hf.size() - suffix.size(), suffix.size(), suffix) != 0)
    throw CheckpointError("save_lora_as_pretrained / load_lora: " + wname + " is stored as " + hf +
                          ", not as a module's \".weight\"");
  L.hf_module = hf.substr(0, hf.size() - suffix.size());
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor rows = at::arange(out, opts).unsqueeze(1).expand({out, in}).contiguous();
  at::Tensor cols = at::arange(in, opts).unsqueeze(0).expand({out, in}).contiguous();
  at::Tensor hr = to_hf(t, rows).at(0), hc = to_hf(t, cols).at(0);
  auto fail = [&] {
    throw CheckpointError("save_lora_as_pretrained / load_lora: the adapter's rule for " + wname + " (stored as " + hf +
                          ") is neither a permutation of rows / columns nor a transpose, so it has no LoRA "
                          "equivalent: target other modules");
  };
  // hr / hc in our [out, in] orientation: each row of hr constant (a row permutation) and each column
  // of hc constant (a column permutation).
  auto is_permutation = [&](const at::Tensor& r, const at::Tensor& c) {
    return r.sizes() == at::IntArrayRef({out, in}) && r.eq(r.select(1, 0).unsqueeze(1)).all().item<bool>() &&
           c.eq(c.select(0, 0).unsqueeze(0)).all().item<bool>();
  };
  if (hr.dim() != 2) fail();
  if (is_permutation(hr, hc)) {
  } else if (is_permutation(hr.t(), hc.t())) {  // stored as [in, out] (GPT-2's Conv1D), maybe permuted too
    L.transposed = true;
    hr = hr.t();
    hc = hc.t();
  } else {
    fail();
  }
  L.row_perm = hr.select(1, 0).to(at::kLong).contiguous();
  L.col_perm = hc.select(0, 0).to(at::kLong).contiguous();
  return L;
}

std::string number_text(double v) {
  json j = (v == std::floor(v) && std::abs(v) < 1e15) ? json(static_cast<int64_t>(v)) : json(v);
  return j.dump();
}


const char* kPrefix = "base_model.model.";

// Selects `perm` along `dim` (HF index -> our index); the identity leaves the tensor as it is. On
// meta tensors (shape planning) only the shape matters, and it is unchanged.
at::Tensor select_along(const at::Tensor& t, int64_t dim, const at::Tensor& perm) {
  if (t.is_meta()) return at::empty_like(t);
  return t.index_select(dim, perm.to(t.device())).contiguous();
}

bool is_identity(const at::Tensor& perm) { return perm.equal(at::arange(perm.numel(), perm.options())); }

// A rule for one adapter tensor stored with its `dim` permuted by `perm` (HF index -> our index).
AdapterRule permuted_rule(const std::string& ours, const std::string& hf, int64_t dim, const at::Tensor& perm) {
  if (is_identity(perm)) return AdapterRule::rename(ours, hf);
  at::Tensor inverse = at::argsort(perm);
  return AdapterRule{ours,
                     {hf},
                     [dim, perm](const at::Tensor& t) { return std::vector<at::Tensor>{select_along(t, dim, perm)}; },
                     [dim, inverse](const std::vector<at::Tensor>& p) { return select_along(p.at(0), dim, inverse); }};
}

struct PeftPlan {
  ModelLoraInfo lora;
  std::vector<HfLayout> layouts;  // per layer
  bool fan_in_fan_out = false;
};

PeftPlan peft_plan(torch::nn::Module& model, const StateDictAdapter& adapter, const std::string& fn) {
  PeftPlan P;
  P.lora = booster::nn::lora_layers(model, fn);
  bool any_transposed = false, any_plain = false;
  for (const auto& layer : P.lora.layers) {
    P.layouts.push_back(hf_layout(adapter, layer.name, layer.full_out, layer.full_in));
    (P.layouts.back().transposed ? any_transposed : any_plain) = true;
  }
  if (any_transposed && any_plain)
    throw CheckpointError(fn + "some LoRA layers are stored transposed (Conv1D) and others not; PEFT's "
                               "fan_in_fan_out is one flag for all: target one kind of layer");
  P.fan_in_fan_out = any_transposed;
  return P;
}

void refuse_tensor_parallel(const ModelLoraInfo& L, const std::string& fn) {
  for (const auto& layer : L.layers)
    if (layer.tensor_parallel)
      throw std::invalid_argument(fn + "the LoRA layer " + layer.name + " is tensor-parallel (tp > 1), so this "
                                       "process holds a shard of its adapters; use Booster::save_lora_as_pretrained / "
                                       "load_lora, which go through the plugin's checkpoint IO");
}

// The model's parameters (named_parameters order) and their specs, as a plan over them needs.
std::pair<std::vector<TensorSpec>, std::vector<at::Tensor>> parameters_of(torch::nn::Module& model) {
  std::vector<TensorSpec> specs;
  std::vector<at::Tensor> tensors;
  for (const auto& item : model.named_parameters(true)) {
    specs.push_back({item.key(), item.value().scalar_type(), item.value().sizes().vec()});
    tensors.push_back(item.value());
  }
  return {std::move(specs), std::move(tensors)};
}

}  // namespace

std::shared_ptr<StateDictAdapter> lora_state_dict_adapter(torch::nn::Module& model,
                                                          const std::string& base_model_name_or_path,
                                                          const StateDictAdapter& adapter) {
  PeftPlan P = peft_plan(model, adapter, "booster::checkpoint::lora_state_dict_adapter: ");
  const ModelLoraInfo& L = P.lora;
  std::vector<AdapterRule> rules;
  for (size_t i = 0; i < L.layers.size(); ++i) {
    const std::string& name = L.layers[i].name;
    const HfLayout& h = P.layouts[i];
    // W_hf = W[row_perm][:, col_perm] (transposed for Conv1D, whose PEFT A / B keep nn.Linear's
    // layout) and W = B A, so B_hf = B[row_perm], A_hf = A[:, col_perm].
    rules.push_back(permuted_rule(name + ".lora_A.weight", kPrefix + h.hf_module + ".lora_A.weight", 1, h.col_perm));
    rules.push_back(permuted_rule(name + ".lora_B.weight", kPrefix + h.hf_module + ".lora_B.weight", 0, h.row_perm));
  }
  json c = {
      {"alora_invocation_tokens", nullptr}, {"alpha_pattern", json::object()}, {"arrow_config", nullptr},
      {"auto_mapping", nullptr}, {"base_model_name_or_path", base_model_name_or_path}, {"bias", "none"},
      {"corda_config", nullptr}, {"ensure_weight_tying", false}, {"eva_config", nullptr}, {"exclude_modules", nullptr},
      {"fan_in_fan_out", P.fan_in_fan_out}, {"inference_mode", true}, {"init_lora_weights", true},
      {"kasa_config", nullptr}, {"layer_replication", nullptr}, {"layers_pattern", nullptr},
      {"layers_to_transform", nullptr}, {"loftq_config", json::object()}, {"lora_alpha", json::parse(number_text(L.lora_alpha))},
      {"lora_bias", false}, {"lora_dropout", L.lora_dropout}, {"lora_ga_config", nullptr}, {"megatron_config", nullptr},
      {"megatron_core", "megatron.core"}, {"modules_to_save", nullptr}, {"monteclora_config", nullptr},
      {"peft_type", "LORA"}, {"peft_version", "0.21.2"}, {"qalora_group_size", 16}, {"r", L.r},
      {"rank_pattern", json::object()}, {"revision", nullptr}, {"target_modules", L.targets},
      {"target_parameters", nullptr}, {"task_type", "CAUSAL_LM"}, {"trainable_token_indices", nullptr},
      {"use_bdlora", nullptr}, {"use_dora", false}, {"use_qalora", false}, {"use_rslora", false},
      {"velora_config", nullptr}};
  AdapterFormat format;
  format.weights_name = "adapter_model";
  format.config_file = "adapter_config.json";
  format.partial = true;
  return std::make_shared<StateDictAdapter>("", std::move(c), std::vector<std::string>{}, std::move(rules),
                                            std::vector<std::string>{}, format);
}

void check_lora_adapter_config(torch::nn::Module& model, const std::string& dir, const StateDictAdapter& adapter) {
  const std::string fn = "booster::checkpoint::load_lora: ";
  PeftPlan P = peft_plan(model, adapter, fn);
  const ModelLoraInfo& L = P.lora;
  const std::string cpath = (std::filesystem::path(dir) / "adapter_config.json").string();
  std::ifstream f(cpath);
  if (!f) throw CheckpointError(fn + "cannot read " + cpath + " (is " + dir + " a PEFT adapter directory?)");
  json c;
  try {
    c = json::parse(f);
  } catch (const std::exception& e) {
    throw CheckpointError(fn + cpath + " is not JSON: " + e.what());
  }
  auto field = [&](const char* k) -> json { return c.contains(k) ? c[k] : json(); };
  auto mismatch = [&](const std::string& what, const std::string& file, const std::string& ours) {
    throw CheckpointError(fn + cpath + ": " + what + " is " + file + " in the file but " + ours +
                          " in the model's LoRA (enable_lora with the adapter's config)");
  };
  if (field("peft_type") != "LORA") mismatch("peft_type", field("peft_type").dump(), "\"LORA\"");
  if (!field("r").is_number() || field("r").get<double>() != static_cast<double>(L.r)) mismatch("r", field("r").dump(), std::to_string(L.r));
  if (!field("lora_alpha").is_number() || field("lora_alpha").get<double>() != L.lora_alpha)
    mismatch("lora_alpha", field("lora_alpha").dump(), number_text(L.lora_alpha));
  if (!field("bias").is_null() && field("bias") != "none") mismatch("bias", field("bias").dump(), "\"none\"");
  if (field("use_dora") == true) mismatch("use_dora", "true", "false");
  if (field("use_rslora") == true) mismatch("use_rslora", "true", "false (scaling = lora_alpha / r)");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    if (field(k).is_object() && !field(k).empty()) mismatch(k, field(k).dump(), "{} (one r and alpha for all layers)");
  std::vector<std::string> targets;
  if (field("target_modules").is_string()) {
    throw CheckpointError(fn + cpath + ": target_modules is a regular expression (" + field("target_modules").dump() +
                          "); only a list of module names is supported");
  } else if (field("target_modules").is_array()) {
    for (const auto& t : field("target_modules")) targets.push_back(t.get<std::string>());
  }
  std::sort(targets.begin(), targets.end());
  if (targets != L.targets) mismatch("target_modules", json(targets).dump(), json(L.targets).dump());
  const bool fan_in_fan_out = field("fan_in_fan_out") == true;
  if (fan_in_fan_out != P.fan_in_fan_out)
    mismatch("fan_in_fan_out", fan_in_fan_out ? "true" : "false", P.fan_in_fan_out ? "true (Conv1D)" : "false");
}

void save_lora_as_pretrained(torch::nn::Module& model, const std::string& dir, const std::string& base_model_name_or_path,
                             const StateDictAdapter& adapter) {
  const std::string fn = "booster::checkpoint::save_lora_as_pretrained: ";
  refuse_tensor_parallel(booster::nn::lora_layers(model, fn), fn);
  auto peft = lora_state_dict_adapter(model, base_model_name_or_path, adapter);
  const auto params = parameters_of(model);
  const auto& specs = params.first;
  const auto& tensors = params.second;
  AdaptedModel adapted = adapt_model(*peft, specs, "");
  AdaptedSave save = adapt_save(adapted.plan, [&](size_t j) { return tensors[j].detach().to(at::kCPU); });
  save_state_dict_streamed(dir, save.specs, SaveOptions{}, save.fetch, adapted.weights_name, adapted.extra_files);
}

void load_lora(torch::nn::Module& model, const std::string& dir, const StateDictAdapter& adapter) {
  const std::string fn = "booster::checkpoint::load_lora: ";
  refuse_tensor_parallel(booster::nn::lora_layers(model, fn), fn);
  check_lora_adapter_config(model, dir, adapter);
  auto peft = lora_state_dict_adapter(model, "", adapter);
  const auto params = parameters_of(model);
  const auto& specs = params.first;
  const auto& tensors = params.second;
  const auto plan = peft->plan(specs);
  StateDict file = load_state_dict(dir, peft->format().weights_name);
  std::map<std::string, at::Tensor> by_name(file.begin(), file.end());
  std::vector<std::string> missing, bad_shape;
  struct Pending {
    at::Tensor dst, src;
  };
  std::vector<Pending> copies;
  for (size_t j = 0; j < plan.size(); ++j) {
    if (plan[j].hf.empty()) continue;  // a base-model tensor
    const TensorSpec& h = plan[j].hf.at(0);
    auto it = by_name.find(h.name);
    if (it == by_name.end()) {
      missing.push_back(h.name);
      continue;
    }
    at::Tensor src = it->second;
    by_name.erase(it);
    if (src.sizes() != at::IntArrayRef(h.shape)) {
      std::ostringstream s;
      s << h.name << " (file " << src.sizes() << ", model " << at::IntArrayRef(h.shape) << ")";
      bad_shape.push_back(s.str());
      continue;
    }
    copies.push_back({tensors[j], from_hf(plan[j], {src})});
  }
  std::vector<std::string> unexpected;
  for (const auto& [k, v] : by_name) unexpected.push_back(k);
  if (!missing.empty() || !unexpected.empty() || !bad_shape.empty()) {
    std::string msg = fn + dir + " does not match the model's LoRA layers:";
    if (!missing.empty()) msg += " missing " + join_names(missing) + ";";
    if (!unexpected.empty()) msg += " unexpected " + join_names(unexpected) + ";";
    if (!bad_shape.empty()) msg += " wrong shape " + join_names(bad_shape) + ";";
    throw CheckpointError(msg);
  }
  torch::NoGradGuard no_grad;
  for (auto& p : copies) p.dst.copy_(p.src);
}

}  // namespace booster::checkpoint
