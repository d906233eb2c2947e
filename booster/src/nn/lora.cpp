// lora.cpp — LoRA layers (booster/nn/lora.h); PEFT's files are checkpoint/peft_lora.h's.
#include "booster/nn/lora.h"

#include <torch/nn/functional/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/torch.h>

#include <algorithm>
#include <stdexcept>

#include "booster/dist/process_group.h"
#include "booster/nn/tensor_parallel.h"
#include "lora_impl.h"

namespace booster::nn {

namespace lora_detail {

at::Tensor LoraHook::operator()(torch::nn::Module& layer, const at::Tensor& x, const at::Tensor& y) const {
  if (&layer != owner)
    throw std::logic_error("booster::nn::LoRA: this layer is a clone of a LoRA layer, and clone() does not copy "
                           "the adapters; enable_lora on the clone's model instead (or merge_lora before cloning)");
  const at::ScalarType dtype = a->weight.scalar_type();
  at::Tensor lora;
  if (!group) {
    at::Tensor in = x;
    if (lora_dropout > 0 && layer.is_training()) in = torch::dropout(in, lora_dropout, /*train=*/true);
    lora = b->forward(a->forward(in.to(dtype)));
  } else if (!row_parallel) {
    // x is replicated: dropout from the global generator (the same mask on every tp rank); A's
    // output enters the tp region (f: its gradient is summed over the ranks' B rows).
    at::Tensor in = x;
    if (lora_dropout > 0 && layer.is_training()) in = torch::dropout(in, lora_dropout, /*train=*/true);
    lora = b->forward(copy_to_tensor_parallel_region(a->forward(in.to(dtype)), group));
    if (gather_output) lora = gather_from_tensor_parallel_region(lora, group);
  } else {
    // x is split along its last dim: A's partial products are summed over tp (g), B replicated.
    at::Tensor in = input_is_parallel ? x : scatter_to_tensor_parallel_region(x, group);
    if (lora_dropout > 0) in = tensor_parallel_dropout(in, lora_dropout, layer.is_training(), group);
    lora = b->forward(reduce_from_tensor_parallel_region(a->forward(in.to(dtype)), group));
  }
  return y + lora.to(y.scalar_type()) * scaling();
}

LinearForwardHook* hook_slot(torch::nn::Module& m) {
  if (auto* l = dynamic_cast<booster::nn::LinearImpl*>(&m)) return &l->forward_hook;
  if (auto* c = dynamic_cast<ColumnParallelLinearImpl*>(&m)) return &c->forward_hook;
  if (auto* r = dynamic_cast<RowParallelLinearImpl*>(&m)) return &r->forward_hook;
  return nullptr;
}

const LoraHook* lora_hook(torch::nn::Module& m) {
  LinearForwardHook* slot = hook_slot(m);
  return slot && *slot ? slot->target<LoraHook>() : nullptr;
}

at::Tensor& base_weight(torch::nn::Module& m) {
  if (auto* l = dynamic_cast<booster::nn::LinearImpl*>(&m)) return l->weight;
  if (auto* c = dynamic_cast<ColumnParallelLinearImpl*>(&m)) return c->weight;
  return dynamic_cast<RowParallelLinearImpl&>(m).weight;
}

std::string join(const std::vector<std::string>& v, size_t limit) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < limit; ++i) s += (i ? ", " : "") + v[i];
  if (v.size() > limit) s += ", ... (" + std::to_string(v.size()) + " in all)";
  return s;
}

}  // namespace lora_detail

using namespace lora_detail;

namespace {

bool matches(const std::string& name, const std::string& target) {
  if (name == target) return true;
  return name.size() > target.size() && name.compare(name.size() - target.size(), target.size(), target) == 0 &&
         name[name.size() - target.size() - 1] == '.';
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
                                         "LibTorch, so LoRA cannot be added to it: build it as booster::nn::Linear "
                                         "(torch::nn::Linear's options, names, init and forward, with a hook point)");
      if (!supported)
        throw std::invalid_argument(fn + "module " + name + " matches target \"" + t + "\" but is a " + item.value()->name() +
                                    ": LoRA applies to booster::nn::Linear / ColumnParallelLinear / RowParallelLinear only; "
                                    "narrow target_modules");
      if (lora_hook(*item.value())) throw std::invalid_argument(fn + "module " + name + " already has LoRA (call merge_lora first)");
      if (*hook_slot(*item.value()))
        throw std::invalid_argument(fn + "module " + name + " already has another forward_hook");
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
    LoraHook hook{config.r, config.lora_alpha, config.lora_dropout, m.target};
    if (auto* l = dynamic_cast<booster::nn::LinearImpl*>(m.module.get())) {  // dense: a column layer at tp = 1
      hook.full_out = l->options.out_features();
      hook.full_in = l->options.in_features();
    } else if (auto* c = dynamic_cast<ColumnParallelLinearImpl*>(m.module.get())) {
      hook.group = c->group;
      hook.gather_output = c->options.gather_output();
      hook.full_out = c->options.out_features();
      hook.full_in = c->options.in_features();
    } else {
      auto& r = dynamic_cast<RowParallelLinearImpl&>(*m.module);
      hook.group = r.group;
      hook.row_parallel = true;
      hook.input_is_parallel = r.options.input_is_parallel();
      hook.full_out = r.options.out_features();
      hook.full_in = r.options.in_features();
    }
    at::Tensor w = base_weight(*m.module);
    // The full A and B are drawn as at tp = 1 (same RNG draws on every rank), then split like the
    // base weight: B's rows for a column-parallel layer, A's columns for a row-parallel one.
    torch::nn::Linear a(torch::nn::LinearOptions(hook.full_in, config.r).bias(false));  // kaiming_uniform(a = sqrt(5))
    torch::nn::Linear b(torch::nn::LinearOptions(config.r, hook.full_out).bias(false));
    {
      torch::NoGradGuard no_grad;
      b->weight.zero_();
      if (hook.group) {
        const int T = hook.group->size(), rank = hook.group->rank();
        at::Tensor& split = hook.row_parallel ? a->weight : b->weight;
        const int64_t dim = hook.row_parallel ? 1 : 0;
        const int64_t full = split.size(dim);
        split.set_data(split.narrow(dim, rank * (full / T), full / T).clone().contiguous());
        register_tensor_parallel_spec(split, TensorParallelSpec{dim, full, full, T, rank, hook.group});
      }
    }
    a->to(w.device(), w.scalar_type());
    b->to(w.device(), w.scalar_type());
    m.module->register_module("lora_A", a);
    m.module->register_module("lora_B", b);
    hook.a = a.ptr();
    hook.b = b.ptr();
    hook.owner = m.module.get();
    *hook_slot(*m.module) = std::move(hook);
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

ModelLoraInfo lora_layers(torch::nn::Module& model, const std::string& error_prefix) {
  ModelLoraInfo L;
  for (const auto& item : model.named_modules("", true)) {
    torch::nn::Module& m = *item.value();
    const LoraHook* h = lora_hook(m);
    if (!h) continue;
    if (L.layers.empty()) {
      L.r = h->r;
      L.lora_alpha = h->lora_alpha;
      L.lora_dropout = h->lora_dropout;
    } else if (h->r != L.r || h->lora_alpha != L.lora_alpha || h->lora_dropout != L.lora_dropout) {
      throw std::invalid_argument(error_prefix + "the LoRA layers " + L.layers[0].name + " and " + item.key() +
                                  " have different r / lora_alpha / lora_dropout; PEFT's file holds one config");
    }
    LoraLayerInfo layer;
    layer.name = item.key();
    layer.module = &m;
    layer.target = h->target;
    layer.r = h->r;
    layer.lora_alpha = h->lora_alpha;
    layer.lora_dropout = h->lora_dropout;
    layer.lora_A = torch::nn::Linear(h->a);
    layer.lora_B = torch::nn::Linear(h->b);
    layer.tensor_parallel = h->group != nullptr;
    layer.row_parallel = h->row_parallel;
    layer.full_out = h->full_out;
    layer.full_in = h->full_in;
    L.targets.push_back(h->target);
    L.layers.push_back(std::move(layer));
  }
  if (L.layers.empty())
    throw std::invalid_argument(error_prefix + "the model has no LoRA layers: call booster::nn::enable_lora first");
  std::sort(L.targets.begin(), L.targets.end());
  L.targets.erase(std::unique(L.targets.begin(), L.targets.end()), L.targets.end());
  return L;
}

}  // namespace booster::nn
