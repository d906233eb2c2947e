// state_dict_adapter.cpp — rule matching, planning, the streamed-save wrapper and the registry of
// state_dict_adapter.h.
#include "booster/checkpoint/state_dict_adapter.h"

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>

namespace booster::checkpoint {

namespace {

const std::string kIndex = "{i}";

size_t count_indices(const std::string& pattern) {
  size_t n = 0;
  for (size_t at = pattern.find(kIndex); at != std::string::npos; at = pattern.find(kIndex, at + kIndex.size())) ++n;
  return n;
}

// Whether `name` fits `pattern`; the decimal indices matched by its "{i}"s go into `indices`.
bool match(const std::string& pattern, const std::string& name, std::vector<std::string>* indices) {
  std::vector<std::string> found;
  size_t p = 0, n = 0;
  while (p < pattern.size()) {
    if (pattern.compare(p, kIndex.size(), kIndex) == 0) {
      size_t end = n;
      while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
      if (end == n) return false;
      found.push_back(name.substr(n, end - n));
      n = end;
      p += kIndex.size();
      continue;
    }
    if (n >= name.size() || name[n] != pattern[p]) return false;
    ++n;
    ++p;
  }
  if (n != name.size()) return false;
  if (indices) *indices = std::move(found);
  return true;
}

std::string substitute(const std::string& pattern, const std::vector<std::string>& indices) {
  std::string out;
  size_t k = 0, p = 0;
  while (p < pattern.size()) {
    if (pattern.compare(p, kIndex.size(), kIndex) == 0 && k < indices.size()) {
      out += indices[k++];
      p += kIndex.size();
    } else {
      out += pattern[p++];
    }
  }
  return out;
}

std::string shape_text(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::vector<at::Tensor> apply_to_hf(const AdapterRule& rule, const at::Tensor& t) {
  if (!rule.to_hf) return {t};
  return rule.to_hf(t);
}

at::Tensor apply_from_hf(const AdapterRule& rule, const std::vector<at::Tensor>& parts) {
  if (!rule.from_hf) return parts.at(0);
  return rule.from_hf(parts);
}

}  // namespace

AdapterRule AdapterRule::rename(std::string ours, std::string hf) { return {std::move(ours), {std::move(hf)}, {}, {}}; }

AdapterRule AdapterRule::transposed(std::string ours, std::string hf) {
  return {std::move(ours), {std::move(hf)},
          [](const at::Tensor& t) { return std::vector<at::Tensor>{t.t()}; },
          [](const std::vector<at::Tensor>& p) { return p.at(0).t(); }};
}

StateDictAdapter::StateDictAdapter(std::string architecture, nlohmann::json config, std::vector<std::string> size_keys,
                                   std::vector<AdapterRule> rules, std::vector<std::string> ignore_on_load,
                                   AdapterFormat format)
    : architecture_(std::move(architecture)),
      config_(std::move(config)),
      size_keys_(std::move(size_keys)),
      rules_(std::move(rules)),
      ignore_on_load_(std::move(ignore_on_load)),
      format_(std::move(format)) {
  if (!config_.is_object()) throw std::invalid_argument("booster: StateDictAdapter: the config must be a JSON object");
  if (format_.weights_name.empty() || format_.weights_name.find('/') != std::string::npos)
    throw std::invalid_argument("booster: StateDictAdapter: format.weights_name '" + format_.weights_name +
                                "' must be a non-empty file name stem without '/'");
  if (format_.config_file.empty() || format_.config_file.find('/') != std::string::npos || format_.config_file == "." ||
      format_.config_file == "..")
    throw std::invalid_argument("booster: StateDictAdapter: format.config_file '" + format_.config_file +
                                "' must be a plain file name");
  for (const auto& r : rules_) {
    if (r.ours.empty() || r.hf.empty())
      throw std::invalid_argument("booster: StateDictAdapter: a rule needs the model's name and at least one "
                                  "HuggingFace name (rule '" + r.ours + "')");
    if (static_cast<bool>(r.to_hf) != static_cast<bool>(r.from_hf))
      throw std::invalid_argument("booster: StateDictAdapter: rule '" + r.ours +
                                  "' has only one of to_hf / from_hf; give both (they are inverses)");
    if (r.hf.size() > 1 && !r.to_hf)
      throw std::invalid_argument("booster: StateDictAdapter: rule '" + r.ours + "' stores the tensor as " +
                                  std::to_string(r.hf.size()) + " HuggingFace tensors but has no to_hf to split it");
    for (const auto& h : r.hf)
      if (count_indices(h) != count_indices(r.ours))
        throw std::invalid_argument("booster: StateDictAdapter: rule '" + r.ours + "' -> '" + h +
                                    "': both names need the same number of {i} indices");
  }
}

std::shared_ptr<StateDictAdapter> StateDictAdapter::with_format(AdapterFormat format) const {
  return std::make_shared<StateDictAdapter>(architecture_, config_, size_keys_, rules_, ignore_on_load_, std::move(format));
}

std::string StateDictAdapter::config_json_text() const {
  nlohmann::json doc = config_;
  if (!architecture_.empty()) doc["architectures"] = nlohmann::json::array({architecture_});
  return doc.dump(2, ' ', true) + "\n";
}

std::vector<AdaptedTensor> StateDictAdapter::plan_from_hf(const std::vector<TensorSpec>& hf_tensors) const {
  std::vector<AdaptedTensor> out;
  std::map<std::string, size_t> group;  // the model's name -> index in out
  std::vector<std::string> uncovered, incomplete;
  for (const auto& spec : hf_tensors) {
    if (ignored_on_load(spec.name)) continue;
    const AdapterRule* rule = nullptr;
    size_t part = 0;
    std::vector<std::string> indices;
    for (const auto& r : rules_) {
      for (size_t k = 0; k < r.hf.size() && !rule; ++k)
        if (match(r.hf[k], spec.name, &indices)) {
          rule = &r;
          part = k;
        }
      if (rule) break;
    }
    if (!rule) {
      uncovered.push_back(spec.name);
      continue;
    }
    const std::string ours = substitute(rule->ours, indices);
    auto [it, fresh] = group.emplace(ours, out.size());
    if (fresh) out.push_back({ours, {}, std::vector<TensorSpec>(rule->hf.size()), rule});
    out[it->second].hf[part] = spec;
  }
  std::vector<AdaptedTensor> complete;
  for (auto& a : out) {
    bool whole = true;
    for (const auto& h : a.hf) whole = whole && !h.name.empty();
    if (!whole) {
      incomplete.push_back(a.ours);
      continue;
    }
    try {
      std::vector<at::Tensor> parts;
      for (const auto& h : a.hf) parts.push_back(at::empty(h.shape, at::TensorOptions().dtype(h.dtype).device(at::kMeta)));
      a.shape = apply_from_hf(*a.rule, parts).sizes().vec();
    } catch (const std::exception& e) {
      incomplete.push_back(a.ours + " (" + e.what() + ")");
      continue;
    }
    complete.push_back(std::move(a));
  }
  if (uncovered.empty() && incomplete.empty()) return complete;
  std::string msg = "booster: the " + architecture_ + " state-dict adapter does not fit this checkpoint:";
  for (const auto& n : uncovered) msg += "\n  no rule for " + n;
  for (const auto& n : incomplete) msg += "\n  " + n + ": a HuggingFace part is missing or does not fit";
  throw CheckpointError(msg);
}

void StateDictAdapter::check_covers(const std::vector<std::string>& model_names) const {
  if (format_.partial) return;  // a partial format leaves the tensors no rule covers out
  std::vector<std::string> uncovered;
  for (const auto& name : model_names) {
    bool covered = false;
    for (const auto& r : rules_) covered = covered || match(r.ours, name, nullptr);
    if (!covered) uncovered.push_back(name);
  }
  if (uncovered.empty()) return;
  std::string msg = "booster: the " + architecture_ + " state-dict adapter has no rule for " +
                    std::to_string(uncovered.size()) + " of the model's tensors:";
  for (size_t i = 0; i < uncovered.size() && i < 20; ++i) msg += " " + uncovered[i] + (i + 1 < uncovered.size() ? "," : "");
  if (uncovered.size() > 20) msg += " ...";
  msg += " (add a rule for each, or use the adapter of this model's architecture)";
  throw CheckpointError(msg);
}

bool StateDictAdapter::ignored_on_load(const std::string& hf_name) const {
  for (const auto& p : ignore_on_load_)
    if (match(p, hf_name, nullptr)) return true;
  return false;
}

std::vector<AdaptedTensor> StateDictAdapter::plan(const std::vector<TensorSpec>& model_tensors) const {
  std::vector<AdaptedTensor> out;
  std::vector<std::string> uncovered, broken, duplicate;
  std::map<std::string, std::string> writer;  // HF name -> the model tensor writing it
  for (const auto& spec : model_tensors) {
    const AdapterRule* rule = nullptr;
    std::vector<std::string> indices;
    for (const auto& r : rules_)
      if (match(r.ours, spec.name, &indices)) {
        rule = &r;
        break;
      }
    if (!rule) {
      if (format_.partial)
        out.push_back(AdaptedTensor{spec.name, spec.shape, {}, nullptr});
      else
        uncovered.push_back(spec.name);
      continue;
    }
    AdaptedTensor a{spec.name, spec.shape, {}, rule};
    try {
      at::Tensor meta = at::empty(spec.shape, at::TensorOptions().dtype(spec.dtype).device(at::kMeta));
      std::vector<at::Tensor> parts = apply_to_hf(*rule, meta);
      if (parts.size() != rule->hf.size())
        throw std::runtime_error("to_hf gives " + std::to_string(parts.size()) + " tensors for " +
                                 std::to_string(rule->hf.size()) + " HuggingFace names");
      at::Tensor back = apply_from_hf(*rule, parts);
      if (back.sizes() != at::IntArrayRef(spec.shape))
        throw std::runtime_error("from_hf(to_hf(x)) has shape " + shape_text(back.sizes()) + ", x " +
                                 shape_text(spec.shape));
      for (size_t k = 0; k < parts.size(); ++k)
        a.hf.push_back({substitute(rule->hf[k], indices), spec.dtype, parts[k].sizes().vec()});
    } catch (const std::exception& e) {
      broken.push_back(spec.name + " " + shape_text(spec.shape) + " (rule '" + rule->ours + "'): " + e.what());
      continue;
    }
    for (const auto& h : a.hf) {
      auto [it, fresh] = writer.emplace(h.name, spec.name);
      if (!fresh) duplicate.push_back(h.name + " (from " + it->second + " and " + spec.name + ")");
    }
    out.push_back(std::move(a));
  }
  if (uncovered.empty() && broken.empty() && duplicate.empty()) return out;
  std::string msg = "booster: the " + architecture_ + " state-dict adapter does not fit this model:";
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    msg += std::string("\n  ") + what + " (" + std::to_string(names.size()) + "):";
    for (size_t i = 0; i < names.size() && i < 20; ++i) msg += " " + names[i] + (i + 1 < names.size() ? "," : "");
    if (names.size() > 20) msg += " ...";
  };
  list("tensors no rule covers", uncovered);
  list("transforms that do not fit the tensor", broken);
  list("HuggingFace names written twice", duplicate);
  msg += "\n  (add a rule for each, or use the adapter of this model's architecture)";
  throw CheckpointError(msg);
}

std::string StateDictAdapter::size_summary() const {
  std::string out;
  for (const auto& key : size_keys_)
    if (config_.contains(key)) out += (out.empty() ? "" : ", ") + key + " = " + config_[key].dump();
  return out;
}

void StateDictAdapter::check_config(const nlohmann::json& file, const std::string& path) const {
  if (file.is_null() || (file.is_object() && file.empty())) return;
  auto arch = [](const nlohmann::json& c) {
    std::string a = c.contains("architectures") && c["architectures"].is_array() && !c["architectures"].empty() &&
                            c["architectures"][0].is_string()
                        ? c["architectures"][0].get<std::string>()
                        : std::string("?");
    std::string t = c.contains("model_type") && c["model_type"].is_string() ? c["model_type"].get<std::string>() : "?";
    return a + " (model_type " + t + ")";
  };
  const std::string ours = architecture_ + " (model_type " +
                           (config_.contains("model_type") ? config_["model_type"].get<std::string>() : "?") + ")";
  if (config_.contains("model_type") && (!file.contains("model_type") || file["model_type"] != config_["model_type"]))
    throw CheckpointError("booster: " + path + "/config.json describes " + arch(file) + ", but the model is " + ours +
                          "; load a checkpoint of this architecture, or use the adapter of the checkpoint's");
  std::vector<std::string> diffs;
  for (const auto& key : size_keys_) {
    // A field one side does not state takes transformers' default there: not compared.
    if (!config_.contains(key) || !file.contains(key)) continue;
    const nlohmann::json& mine = config_[key];
    const nlohmann::json& theirs = file[key];
    if (mine == theirs) continue;
    if (mine.is_number() && theirs.is_number() && mine.get<double>() == theirs.get<double>()) continue;
    diffs.push_back(key + " = " + theirs.dump() + " in the checkpoint, " + mine.dump() + " in the model");
  }
  if (diffs.empty()) return;
  std::string msg = "booster: " + path + "/config.json (" + arch(file) + ") does not match the model (" + ours + "):";
  for (const auto& d : diffs) msg += "\n  " + d;
  msg += "\n  (build the model from the checkpoint's config.json, or load a checkpoint of the model's size)";
  throw CheckpointError(msg);
}

std::vector<at::Tensor> to_hf(const AdaptedTensor& tensor, const at::Tensor& full) {
  if (full.sizes() != at::IntArrayRef(tensor.shape))
    throw CheckpointError("booster: adapter: " + tensor.ours + " has shape " + shape_text(full.sizes()) +
                          ", the plan " + shape_text(tensor.shape));
  std::vector<at::Tensor> parts = apply_to_hf(*tensor.rule, full);
  if (parts.size() != tensor.hf.size())
    throw CheckpointError("booster: adapter: " + tensor.ours + ": to_hf gave " + std::to_string(parts.size()) +
                          " tensors, the plan has " + std::to_string(tensor.hf.size()));
  for (size_t k = 0; k < parts.size(); ++k) {
    if (parts[k].sizes() != at::IntArrayRef(tensor.hf[k].shape))
      throw CheckpointError("booster: adapter: " + tensor.ours + " -> " + tensor.hf[k].name + " has shape " +
                            shape_text(parts[k].sizes()) + ", the plan " + shape_text(tensor.hf[k].shape));
    parts[k] = parts[k].contiguous();
  }
  return parts;
}

at::Tensor from_hf(const AdaptedTensor& tensor, const std::vector<at::Tensor>& parts) {
  at::Tensor full = apply_from_hf(*tensor.rule, parts);
  if (full.sizes() != at::IntArrayRef(tensor.shape))
    throw CheckpointError("booster: adapter: " + tensor.ours + " from " + tensor.hf.at(0).name + " has shape " +
                          shape_text(full.sizes()) + ", the model " + shape_text(tensor.shape));
  return full;
}

AdaptedSave adapt_save(const std::vector<AdaptedTensor>& plan, std::function<at::Tensor(size_t j)> fetch_ours) {
  AdaptedSave out;
  auto source = std::make_shared<std::vector<std::pair<size_t, size_t>>>();  // HF i -> (model j, part k)
  for (size_t j = 0; j < plan.size(); ++j)
    for (size_t k = 0; k < plan[j].hf.size(); ++k) {
      out.specs.push_back(plan[j].hf[k]);
      source->emplace_back(j, k);
    }
  struct Pending {
    size_t j = SIZE_MAX;
    std::vector<at::Tensor> parts;
  };
  auto pending = std::make_shared<Pending>();
  auto tensors = std::make_shared<const std::vector<AdaptedTensor>>(plan);
  out.fetch = [tensors, source, pending, fetch = std::move(fetch_ours)](size_t i) -> at::Tensor {
    const auto [j, k] = source->at(i);
    if (pending->j != j) {
      pending->parts.clear();
      pending->parts = to_hf((*tensors)[j], fetch(j));
      pending->j = j;
    }
    at::Tensor t = std::move(pending->parts.at(k));
    pending->parts[k] = at::Tensor();
    return t;
  };
  return out;
}

AdaptedModel adapt_model(const StateDictAdapter& adapter, const std::vector<TensorSpec>& tensors,
                         const std::string& prefix) {
  if (!prefix.empty())
    throw CheckpointError("booster: save_model: a prefix ('" + prefix + "') cannot be combined with the " +
                          adapter.architecture() + " adapter (HuggingFace names have none); drop one of them");
  AdaptedModel out;
  out.plan = adapter.plan(tensors);
  out.weights_name = adapter.format().weights_name;
  out.extra_files[adapter.format().config_file] = adapter.config_json_text();
  return out;
}

nlohmann::json read_config_json(const std::string& path, const std::string& name) {
  const std::string file = path + "/" + name;
  if (!std::filesystem::is_regular_file(file)) return nlohmann::json::object();
  std::ifstream in(file, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(ss.str());
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("booster: " + file + " is not valid JSON: " + e.what());
  }
  if (!doc.is_object()) throw CheckpointError("booster: " + file + " is not a JSON object");
  return doc;
}

// ---------------------------------------------------------------------------------------------
// Registry

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, StateDictAdapterFactory>& registry() {
  static std::map<std::string, StateDictAdapterFactory> r;
  return r;
}
}  // namespace

void register_builtin_state_dict_adapters(std::map<std::string, StateDictAdapterFactory>& into);  // hf_adapters.cpp

namespace {
std::map<std::string, StateDictAdapterFactory>& populated() {
  static bool once = [] {
    register_builtin_state_dict_adapters(registry());
    return true;
  }();
  (void)once;
  return registry();
}
}  // namespace

void register_state_dict_adapter(const std::string& name, StateDictAdapterFactory factory) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (name.empty()) throw std::invalid_argument("booster: register_state_dict_adapter: the name is empty");
  if (!factory) throw std::invalid_argument("booster: register_state_dict_adapter('" + name + "'): no factory");
  if (!populated().emplace(name, std::move(factory)).second)
    throw std::invalid_argument("booster: register_state_dict_adapter: '" + name + "' is already registered");
}

std::shared_ptr<StateDictAdapter> make_state_dict_adapter(const std::string& name, const nlohmann::json& hf_config) {
  StateDictAdapterFactory factory;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    auto& r = populated();
    auto it = r.find(name);
    if (it == r.end()) {
      std::string known;
      for (const auto& [n, f] : r) known += (known.empty() ? "" : ", ") + n;
      throw CheckpointError("booster: no state-dict adapter named '" + name + "' (registered: " + known + ")");
    }
    factory = it->second;
  }
  return factory(hf_config);
}

std::vector<std::string> state_dict_adapter_names() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> names;
  for (const auto& [n, f] : populated()) names.push_back(n);
  return names;
}

}  // namespace booster::checkpoint
