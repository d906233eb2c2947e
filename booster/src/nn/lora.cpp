// lora.cpp — LoRA layers and PEFT's adapter files (booster/nn/lora.h).
#include "booster/nn/lora.h"

#include <torch/nn/functional/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>

#include "booster/checkpoint/state_dict_io.h"
#include "booster/nn/tensor_parallel.h"

namespace booster::nn {

namespace {

using booster::checkpoint::CheckpointError;
using json = nlohmann::json;

// The hook a LoRA layer carries (LinearForwardHook): found again with std::function::target.
struct LoraHook {
  int64_t r = 0;
  double lora_alpha = 0;
  double lora_dropout = 0;
  std::string target;  // the target_modules entry that matched this layer
  // The layer's lora_A / lora_B sub-modules, held here so that a forward does not look them up.
  std::shared_ptr<torch::nn::LinearImpl> a, b;
  const torch::nn::Module* owner = nullptr;  // the layer they belong to (a clone of it is another)
  double scaling() const { return lora_alpha / static_cast<double>(r); }
  at::Tensor operator()(torch::nn::Module& layer, const at::Tensor& x, const at::Tensor& y) const {
    if (&layer != owner)
      throw std::logic_error("booster::nn::LoRA: this layer is a clone of a LoRA layer, and clone() does not copy "
                             "the adapters; enable_lora on the clone's model instead (or merge_lora before cloning)");
    at::Tensor in = x;
    if (lora_dropout > 0 && layer.is_training()) in = torch::dropout(in, lora_dropout, /*train=*/true);
    return y + b->forward(a->forward(in.to(a->weight.scalar_type()))).to(y.scalar_type()) * scaling();
  }
};

LinearForwardHook* hook_slot(torch::nn::Module& m) {
  if (auto* c = dynamic_cast<ColumnParallelLinearImpl*>(&m)) return &c->forward_hook;
  if (auto* r = dynamic_cast<RowParallelLinearImpl*>(&m)) return &r->forward_hook;
  return nullptr;
}

const LoraHook* lora_hook(torch::nn::Module& m) {
  LinearForwardHook* slot = hook_slot(m);
  return slot && *slot ? slot->target<LoraHook>() : nullptr;
}

at::Tensor& base_weight(torch::nn::Module& m) {
  if (auto* c = dynamic_cast<ColumnParallelLinearImpl*>(&m)) return c->weight;
  return dynamic_cast<RowParallelLinearImpl&>(m).weight;
}

bool tp_sharded(torch::nn::Module& m) {
  if (auto* c = dynamic_cast<ColumnParallelLinearImpl*>(&m)) return c->group != nullptr;
  return dynamic_cast<RowParallelLinearImpl&>(m).group != nullptr;
}

bool matches(const std::string& name, const std::string& target) {
  if (name == target) return true;
  return name.size() > target.size() && name.compare(name.size() - target.size(), target.size(), target) == 0 &&
         name[name.size() - target.size() - 1] == '.';
}

std::string join(const std::vector<std::string>& v, size_t limit = 12) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < limit; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > limit) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

struct LoraLayer {
  std::string name;
  torch::nn::Module* module;
  const LoraHook* hook;
  torch::nn::Linear a{nullptr}, b{nullptr};
};

// How the adapter stores one LoRA layer's base weight: its HF module name and whether the HF tensor
// is W with its rows / columns permuted (row_perm / col_perm: HF index -> our index) or W transposed.
struct HfLayout {
  std::string hf_module;
  at::Tensor row_perm, col_perm;  // int64
  bool transposed = false;
};

HfLayout hf_layout(const booster::checkpoint::StateDictAdapter& adapter, const std::string& module, const at::Tensor& w) {
  const std::string wname = module.empty() ? "weight" : module + ".weight";
  booster::checkpoint::TensorSpec spec{wname, at::kDouble, w.sizes().vec()};
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
  const int64_t out = w.size(0), in = w.size(1);
  auto opts = at::TensorOptions().dtype(at::kDouble);
  at::Tensor rows = at::arange(out, opts).unsqueeze(1).expand({out, in}).contiguous();
  at::Tensor cols = at::arange(in, opts).unsqueeze(0).expand({out, in}).contiguous();
  at::Tensor hr = booster::checkpoint::to_hf(t, rows).at(0), hc = booster::checkpoint::to_hf(t, cols).at(0);
  auto fail = [&] {
    throw CheckpointError("save_lora_as_pretrained / load_lora: the adapter's rule for " + wname + " (stored as " + hf +
                          ") is neither a permutation of rows / columns nor a transpose, so it has no LoRA "
                          "equivalent: target other modules");
  };
  // hr / hc in our [out, in] orientation: each row of hr constant (a row permutation) and each column
  // of hc constant (a column permutation).
  auto is_permutation = [&](const at::Tensor& r, const at::Tensor& c) {
    return r.sizes() == w.sizes() && r.eq(r.select(1, 0).unsqueeze(1)).all().item<bool>() &&
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

}  // namespace

LoraReport enable_lora(torch::nn::Module& model, const LoraConfig& config) {
  const std::string fn = "booster::nn::enable_lora: ";
  if (config.r <= 0)
    throw std::invalid_argument(fn + "r = " + std::to_string(config.r) + " must be >= 1 (the adapters' rank; PEFT's default is 8)");
  if (!(config.lora_alpha > 0))
    throw std::invalid_argument(fn + "lora_alpha = " + std::to_string(config.lora_alpha) +
                                " must be > 0 (scaling = lora_alpha / r; PEFT's default is 8)");
  if (!(config.lora_dropout >= 0 && config.lora_dropout < 1))
    throw std::invalid_argument(fn + "lora_dropout = " + std::to_string(config.lora_dropout) + " must be in [0, 1)");
  if (config.bias != "none")
    throw std::invalid_argument(fn + "bias = \"" + config.bias + "\" is not supported: only \"none\" (PEFT's default)");
  if (config.target_modules.empty())
    throw std::invalid_argument(fn + "target_modules is empty: name the layers to adapt (suffixes of module names, "
                                     "e.g. {\"q_proj\", \"v_proj\"})");

  struct Match {
    std::string name, target;
    std::shared_ptr<torch::nn::Module> module;
  };
  std::vector<Match> found;
  std::vector<std::string> all_names, layer_names;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    all_names.push_back(name);
    const bool supported = hook_slot(*item.value()) != nullptr;
    if (supported || dynamic_cast<torch::nn::LinearImpl*>(item.value().get())) layer_names.push_back(name);
    for (const auto& t : config.target_modules) {
      if (!matches(name, t)) continue;
      if (dynamic_cast<torch::nn::LinearImpl*>(item.value().get()))
        throw std::invalid_argument(fn + "module " + name + " is a torch::nn::Linear, whose forward has no hook point in "
                                         "LibTorch, so LoRA cannot be added to it: build it as "
                                         "booster::nn::ColumnParallelLinear (identical to torch::nn::Linear at tp = 1)");
      if (!supported)
        throw std::invalid_argument(fn + "module " + name + " matches target \"" + t + "\" but is a " + item.value()->name() +
                                    ": LoRA applies to booster::nn::ColumnParallelLinear / RowParallelLinear only; "
                                    "narrow target_modules");
      if (lora_hook(*item.value())) throw std::invalid_argument(fn + "module " + name + " already has LoRA (call merge_lora first)");
      if (*hook_slot(*item.value()))
        throw std::invalid_argument(fn + "module " + name + " already has another forward_hook");
      if (tp_sharded(*item.value()))
        throw std::invalid_argument(fn + "module " + name + " is tensor-parallel (tp > 1): LoRA supports tp = 1 only for now");
      found.push_back({name, t, item.value()});
      break;
    }
  }
  if (found.empty()) {
    const auto& names = layer_names.empty() ? all_names : layer_names;
    throw std::invalid_argument(fn + "target_modules {" + join(config.target_modules) +
                                "} match no module (a target matches a module whose dotted name is it or ends with "
                                "\".<target>\"); the model's linear layers are: " +
                                (names.empty() ? std::string("(none)") : join(names)));
  }
  // Freeze the base model.
  for (auto& p : model.parameters()) p.set_requires_grad(false);
  LoraReport report;
  for (auto& m : found) {
    at::Tensor w = base_weight(*m.module);
    const int64_t out = w.size(0), in = w.size(1);
    torch::nn::Linear a(torch::nn::LinearOptions(in, config.r).bias(false));  // kaiming_uniform(a = sqrt(5))
    torch::nn::Linear b(torch::nn::LinearOptions(config.r, out).bias(false));
    {
      torch::NoGradGuard no_grad;
      b->weight.zero_();
    }
    a->to(w.device(), w.scalar_type());
    b->to(w.device(), w.scalar_type());
    m.module->register_module("lora_A", a);
    m.module->register_module("lora_B", b);
    *hook_slot(*m.module) = LoraHook{config.r, config.lora_alpha, config.lora_dropout, m.target, a.ptr(), b.ptr(), m.module.get()};
    report.modules.push_back(m.name);
    report.trainable_parameters += a->weight.numel() + b->weight.numel();
  }
  for (auto& p : model.parameters()) report.total_parameters += p.numel();
  return report;
}

std::vector<std::string> lora_modules(torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_modules("", true))
    if (lora_hook(*item.value())) names.push_back(item.key());
  return names;
}

std::vector<std::string> merge_lora(torch::nn::Module& model) {
  std::vector<std::string> merged;
  for (const auto& item : model.named_modules("", true)) {
    torch::nn::Module& m = *item.value();
    const LoraHook* h = lora_hook(m);
    if (!h) continue;
    auto children = m.named_children();
    auto a = std::dynamic_pointer_cast<torch::nn::LinearImpl>(children["lora_A"]);
    auto b = std::dynamic_pointer_cast<torch::nn::LinearImpl>(children["lora_B"]);
    {
      torch::NoGradGuard no_grad;
      at::Tensor& w = base_weight(m);
      at::Tensor delta = at::matmul(b->weight.to(at::kFloat), a->weight.to(at::kFloat)) * h->scaling();
      w.add_(delta.to(w.scalar_type()));
    }
    *hook_slot(m) = nullptr;
    m.unregister_module("lora_A");
    m.unregister_module("lora_B");
    merged.push_back(item.key());
  }
  return merged;
}

namespace {

struct ModelLora {
  std::vector<LoraLayer> layers;
  int64_t r = 0;
  double alpha = 0, dropout = 0;
  std::vector<std::string> targets;  // sorted, unique
};

ModelLora model_lora(torch::nn::Module& model, const std::string& fn) {
  ModelLora L;
  for (const auto& item : model.named_modules("", true)) {
    torch::nn::Module& m = *item.value();
    const LoraHook* h = lora_hook(m);
    if (!h) continue;
    auto children = m.named_children();
    LoraLayer layer{item.key(), &m, h, torch::nn::Linear(std::dynamic_pointer_cast<torch::nn::LinearImpl>(children["lora_A"])),
                    torch::nn::Linear(std::dynamic_pointer_cast<torch::nn::LinearImpl>(children["lora_B"]))};
    if (L.layers.empty()) {
      L.r = h->r;
      L.alpha = h->lora_alpha;
      L.dropout = h->lora_dropout;
    } else if (h->r != L.r || h->lora_alpha != L.alpha || h->lora_dropout != L.dropout) {
      throw std::invalid_argument(fn + "the LoRA layers " + L.layers[0].name + " and " + item.key() +
                                  " have different r / lora_alpha / lora_dropout; PEFT's file holds one config");
    }
    L.targets.push_back(h->target);
    L.layers.push_back(std::move(layer));
  }
  if (L.layers.empty())
    throw std::invalid_argument(fn + "the model has no LoRA layers: call booster::nn::enable_lora first");
  std::sort(L.targets.begin(), L.targets.end());
  L.targets.erase(std::unique(L.targets.begin(), L.targets.end()), L.targets.end());
  return L;
}

const char* kPrefix = "base_model.model.";

}  // namespace

void save_lora_as_pretrained(torch::nn::Module& model, const std::string& dir, const std::string& base_model_name_or_path,
                             const booster::checkpoint::StateDictAdapter& adapter) {
  ModelLora L = model_lora(model, "booster::nn::save_lora_as_pretrained: ");
  booster::checkpoint::StateDict state;
  bool any_transposed = false, any_plain = false;
  for (auto& layer : L.layers) {
    HfLayout h = hf_layout(adapter, layer.name, base_weight(*layer.module));
    at::Tensor a = layer.a->weight.detach().to(at::kCPU), b = layer.b->weight.detach().to(at::kCPU);
    (h.transposed ? any_transposed : any_plain) = true;
    // W_hf = W[row_perm][:, col_perm] (transposed for Conv1D, whose PEFT A / B keep nn.Linear's
    // layout) and W = B A, so B_hf = B[row_perm], A_hf = A[:, col_perm].
    b = b.index_select(0, h.row_perm);
    a = a.index_select(1, h.col_perm);
    state.emplace_back(kPrefix + h.hf_module + ".lora_A.weight", a.contiguous());
    state.emplace_back(kPrefix + h.hf_module + ".lora_B.weight", b.contiguous());
  }
  if (any_transposed && any_plain)
    throw CheckpointError("booster::nn::save_lora_as_pretrained: some LoRA layers are stored transposed (Conv1D) and "
                          "others not; PEFT's fan_in_fan_out is one flag for all: target one kind of layer");
  json c = {
      {"alora_invocation_tokens", nullptr}, {"alpha_pattern", json::object()}, {"arrow_config", nullptr},
      {"auto_mapping", nullptr}, {"base_model_name_or_path", base_model_name_or_path}, {"bias", "none"},
      {"corda_config", nullptr}, {"ensure_weight_tying", false}, {"eva_config", nullptr}, {"exclude_modules", nullptr},
      {"fan_in_fan_out", any_transposed}, {"inference_mode", true}, {"init_lora_weights", true},
      {"kasa_config", nullptr}, {"layer_replication", nullptr}, {"layers_pattern", nullptr},
      {"layers_to_transform", nullptr}, {"loftq_config", json::object()}, {"lora_alpha", json::parse(number_text(L.alpha))},
      {"lora_bias", false}, {"lora_dropout", L.dropout}, {"lora_ga_config", nullptr}, {"megatron_config", nullptr},
      {"megatron_core", "megatron.core"}, {"modules_to_save", nullptr}, {"monteclora_config", nullptr},
      {"peft_type", "LORA"}, {"peft_version", "0.21.2"}, {"qalora_group_size", 16}, {"r", L.r},
      {"rank_pattern", json::object()}, {"revision", nullptr}, {"target_modules", L.targets},
      {"target_parameters", nullptr}, {"task_type", "CAUSAL_LM"}, {"trainable_token_indices", nullptr},
      {"use_bdlora", nullptr}, {"use_dora", false}, {"use_qalora", false}, {"use_rslora", false},
      {"velora_config", nullptr}};
  booster::checkpoint::save_state_dict(dir, state, booster::checkpoint::SaveOptions{}, "adapter_model",
                                       {{"adapter_config.json", c.dump(2) + "\n"}});
}

void load_lora(torch::nn::Module& model, const std::string& dir, const booster::checkpoint::StateDictAdapter& adapter) {
  const std::string fn = "booster::nn::load_lora: ";
  ModelLora L = model_lora(model, fn);
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
  if (!field("lora_alpha").is_number() || field("lora_alpha").get<double>() != L.alpha)
    mismatch("lora_alpha", field("lora_alpha").dump(), number_text(L.alpha));
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

  booster::checkpoint::StateDict file = booster::checkpoint::load_state_dict(dir, "adapter_model");
  std::map<std::string, at::Tensor> by_name(file.begin(), file.end());
  std::vector<std::string> missing, bad_shape;
  const bool fan_in_fan_out = field("fan_in_fan_out") == true;
  struct Pending {
    at::Tensor dst, src;
  };
  std::vector<Pending> copies;
  for (auto& layer : L.layers) {
    HfLayout h = hf_layout(adapter, layer.name, base_weight(*layer.module));
    if (h.transposed != fan_in_fan_out)
      mismatch("fan_in_fan_out", fan_in_fan_out ? "true" : "false", h.transposed ? "true (Conv1D)" : "false");
    for (bool is_a : {true, false}) {
      const std::string key = kPrefix + h.hf_module + (is_a ? ".lora_A.weight" : ".lora_B.weight");
      auto it = by_name.find(key);
      at::Tensor dst = is_a ? layer.a->weight : layer.b->weight;
      if (it == by_name.end()) {
        missing.push_back(key);
        continue;
      }
      at::Tensor src = it->second;
      by_name.erase(it);
      if (src.sizes() != dst.sizes()) {
        std::ostringstream s;
        s << key << " (file " << src.sizes() << ", model " << dst.sizes() << ")";
        bad_shape.push_back(s.str());
        continue;
      }
      {
        // Inverse of the save: ours[row_perm] = hf (B's rows), ours[:, col_perm] = hf (A's columns).
        at::Tensor ours = at::empty_like(src);
        if (is_a)
          ours.index_copy_(1, h.col_perm, src);
        else
          ours.index_copy_(0, h.row_perm, src);
        src = ours;
      }
      copies.push_back({dst, src});
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [k, v] : by_name) unexpected.push_back(k);
  if (!missing.empty() || !unexpected.empty() || !bad_shape.empty()) {
    std::string msg = fn + dir + " does not match the model's LoRA layers:";
    if (!missing.empty()) msg += " missing " + join(missing) + ";";
    if (!unexpected.empty()) msg += " unexpected " + join(unexpected) + ";";
    if (!bad_shape.empty()) msg += " wrong shape " + join(bad_shape) + ";";
    throw CheckpointError(msg);
  }
  torch::NoGradGuard no_grad;
  for (auto& p : copies) p.dst.copy_(p.src);
}

}  // namespace booster::nn
