// checkpoint_io.cpp — the default CheckpointIO: model, optimizer (by parameter name) and LR scheduler.
#include "booster/checkpoint/checkpoint_io.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "booster/dist/process_group.h"
#include "booster/io/atomic_write.h"
#include "booster/logging.h"
#include "booster/lr_scheduler.h"
#include "booster/wrappers/optimizer_registry.h"
#include "booster/wrappers/optimizer_state.h"
#include "booster/wrappers/optimizer_wrapper.h"

namespace booster::checkpoint {

using json = nlohmann::json;
namespace fs = std::filesystem;

CheckpointIO::CheckpointIO(std::shared_ptr<dist::ProcessGroup> world) : world_(std::move(world)) {}
CheckpointIO::~CheckpointIO() = default;
bool CheckpointIO::is_writer() const { return !world_ || world_->rank() == 0; }
void CheckpointIO::barrier() const {
  if (world_ && world_->size() > 1) world_->barrier();
}

namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError("booster: cannot read " + path + " (missing or unreadable)");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string shape_str(at::IntArrayRef s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

// Runs `write` on rank 0, then tells every rank whether it worked (so no rank continues alone).
template <class F>
void write_on_rank0(const std::shared_ptr<dist::ProcessGroup>& world, F&& write) {
  std::string error;
  if (!world || world->rank() == 0) {
    try {
      write();
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (world && world->size() > 1) error = world->broadcast_string(error, 0);
  if (!error.empty()) throw CheckpointError(error);
}

// ---------------------------------------------------------------------------------------------
// Dtype conversion on load (the rule is load_model's, checkpoint_io.h).

std::string dtype_str(at::ScalarType t) { return c10::toString(t); }

// Whether a checkpoint tensor of dtype `from` loads into a tensor of dtype `to`: torch.can_cast.
bool loadable_as(at::ScalarType from, at::ScalarType to) { return from == to || c10::canCast(from, to); }

// A floating -> integer pair, which load_model converts only for whole numbers in range.
bool float_into_integer(at::ScalarType from, at::ScalarType to) {
  return at::isFloatingType(from) && at::isIntegralType(to, /*includeBool=*/false);
}

// "" when every value of the floating tensor `t` is a whole number that the integer dtype `to` holds;
// else the first value that is not ("2.75 is not a whole number").
std::string whole_number_problem(const at::Tensor& t, at::ScalarType to) {
  at::Tensor d = t.to(at::kDouble).reshape({-1});
  const int bits = 8 * static_cast<int>(c10::elementSize(to));
  const bool is_unsigned = to == at::kByte;
  const double lo = is_unsigned ? 0.0 : -std::ldexp(1.0, bits - 1);
  const double hi = std::ldexp(1.0, is_unsigned ? bits : bits - 1);  // exclusive
  at::Tensor bad = d.isfinite().logical_not() | d.ne(d.trunc()) | d.lt(lo) | d.ge(hi);
  at::Tensor where = bad.nonzero();
  if (where.numel() == 0) return "";
  double v = d[where[0][0]].item<double>();
  std::ostringstream os;
  os << v << (std::isfinite(v) && v == std::trunc(v) ? " is out of " + dtype_str(to) + "'s range" : " is not a whole number");
  return os.str();
}

// "dtype Float in the checkpoint, Long in the model (refused: ...)" for a pair that does not load;
// `what` names the receiving side ("the model", "the optimizer"); `detail` the offending value.
std::string refused_dtype(at::ScalarType from, at::ScalarType to, const std::string& what,
                          const std::string& detail = "") {
  std::string why = at::isComplexType(from) ? "the imaginary part would be dropped"
                    : to == at::kBool       ? "values would collapse to true/false"
                                            : "floating-point values would be truncated";
  if (!detail.empty()) why += ": " + detail;
  return "dtype " + dtype_str(from) + " in the checkpoint, " + dtype_str(to) + " in " + what + " (refused: " + why +
         "; give " + what + "'s tensor a dtype that holds these values, or convert the checkpoint)";
}

// Counts tensors converted per (checkpoint dtype, receiving dtype) pair; report() logs one line.
class ConversionLog {
 public:
  void add(at::ScalarType from, at::ScalarType to) {
    if (from != to) ++counts_[{from, to}];
  }
  // Rank 0, when anything was converted: "booster: <call> <path>: converted 8 tensors BFloat16 ->
  // Float (the model's dtype)".
  void report(const std::string& call, const std::string& path, const std::string& noun,
              const std::string& whose) const {
    if (counts_.empty()) return;
    std::string line = "booster: " + call + " " + path + ": converted";
    std::set<at::ScalarType> targets;
    bool first = true;
    for (const auto& [pair, n] : counts_) {
      line += std::string(first ? " " : ", ") + std::to_string(n) + " " + noun + (n == 1 ? "" : "s") + " " +
              dtype_str(pair.first) + " -> " + dtype_str(pair.second);
      targets.insert(pair.second);
      first = false;
    }
    log::info(line + " (" + whose + (targets.size() == 1 ? " dtype)" : " dtypes)"));
  }

 private:
  std::map<std::pair<at::ScalarType, at::ScalarType>, int64_t> counts_;
};

// ---------------------------------------------------------------------------------------------
// Optimizer type name and options (per parameter group) as JSON, from the optimizer registry
// (wrappers/optimizer_registry.h); its lookup errors become CheckpointError.

std::string optimizer_type(torch::optim::Optimizer& o) {
  try {
    return optimizer_type_info(o).name();
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(std::string("booster: cannot checkpoint the optimizer: ") + e.what());
  }
}

json options_to_json(const torch::optim::Optimizer& opt, torch::optim::OptimizerOptions& o) {
  try {
    return optimizer_type_info(opt).options_to_json(o);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(std::string("booster: cannot checkpoint the optimizer's options: ") + e.what());
  }
}

void options_from_json(const torch::optim::Optimizer& opt, torch::optim::OptimizerOptions& o, const json& j) {
  try {
    optimizer_type_info(opt).options_from_json(j, o);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(std::string("booster: cannot restore the optimizer's options: ") + e.what());
  }
}

// The dtype the wrapped optimizer keeps each parameter's state in (aligned with the wrapper's
// parameters()): the dtype of the tensor it updates for that parameter, read from its param groups.
// A group holding one tensor per parameter (the parameters or their master copies) gives each its
// own; a group holding fewer tensors of one dtype (a sharded wrapper's master slice) gives that dtype
// to all its parameters. Undefined where neither applies (the state then keeps its dtype and the
// wrapper's load_param_states converts it).
std::vector<at::ScalarType> optimizer_state_dtypes(OptimizerWrapper& wrapper) {
  std::vector<at::ScalarType> out;
  auto& groups = wrapper.optimizer().param_groups();
  const auto& sizes = wrapper.param_group_sizes();
  for (size_t g = 0; g < sizes.size(); ++g) {
    const auto& held = g < groups.size() ? groups[g].params() : std::vector<at::Tensor>{};
    at::ScalarType common = held.empty() ? at::ScalarType::Undefined : held.front().scalar_type();
    for (const auto& t : held)
      if (t.scalar_type() != common) common = at::ScalarType::Undefined;
    for (size_t j = 0; j < sizes[g]; ++j) out.push_back(held.size() == sizes[g] ? held[j].scalar_type() : common);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Model

void CheckpointIO::save_model(torch::nn::Module& model, const std::string& path, const ModelSaveOptions& options) {
  StateDict state;
  for (const auto& item : model.named_parameters(true)) state.emplace_back(options.prefix + item.key(), item.value().detach());
  for (const auto& item : model.named_buffers(true)) state.emplace_back(options.prefix + item.key(), item.value().detach());
  SaveOptions so;
  so.shard = options.shard;
  so.size_per_shard_mb = options.size_per_shard_mb;
  so.use_safetensors = options.use_safetensors;
  write_on_rank0(world_, [&] { save_state_dict(path, state, so, "model"); });
}

void CheckpointIO::load_model(torch::nn::Module& model, const std::string& path, bool strict) {
  std::vector<LoadTarget> targets;
  auto add = [&](const std::string& name, at::Tensor t) {
    targets.push_back({name, t.sizes().vec(), t.scalar_type(), t.storage().unsafeGetStorageImpl(),
                       [t](const at::Tensor& from_file) mutable { t.copy_(from_file); }});
  };
  for (const auto& item : model.named_parameters(true)) add(item.key(), item.value());
  for (const auto& item : model.named_buffers(true)) add(item.key(), item.value());
  load_targets(path, targets, strict);
}

void CheckpointIO::load_targets(const std::string& path, const std::vector<LoadTarget>& expected, bool strict) {
  // Validate against the files' headers (no tensor data for safetensors), then copy shard by shard:
  // peak memory is about one shard on top of the model.
  const std::vector<CheckpointTensorInfo> infos = list_checkpoint_tensors(path, "model");
  std::map<std::string, const CheckpointTensorInfo*> file;
  for (const auto& info : infos) file[info.name] = &info;

  std::vector<std::string> missing, mismatched;
  std::set<std::string> used;
  std::set<const void*> storages_loaded;
  std::map<std::string, at::ScalarType> whole_numbers;  // floating -> integer: checked on the values below
  for (const auto& t : expected) {
    const std::string& name = t.name;
    auto it = file.find(name);
    if (it == file.end()) continue;
    used.insert(name);
    storages_loaded.insert(t.storage_key);
    const CheckpointTensorInfo& info = *it->second;
    if (at::IntArrayRef(t.shape) != at::IntArrayRef(info.shape))
      mismatched.push_back(name + ": shape " + shape_str(info.shape) + " in the checkpoint, " + shape_str(t.shape) +
                           " in the model");
    else if (float_into_integer(info.dtype, t.dtype))
      whole_numbers[name] = t.dtype;
    else if (!loadable_as(info.dtype, t.dtype))
      mismatched.push_back(name + ": " + refused_dtype(info.dtype, t.dtype, "the model"));
  }
  // Reads only the floating tensors bound for integer ones (one shard at a time).
  if (!whole_numbers.empty())
    for_each_checkpoint_shard(path, "model", [&](const StateDict& shard) {
      for (const auto& [name, tensor] : shard) {
        auto it = whole_numbers.find(name);
        if (it == whole_numbers.end()) continue;
        std::string problem = whole_number_problem(tensor, it->second);
        if (!problem.empty())
          mismatched.push_back(name + ": " + refused_dtype(tensor.scalar_type(), it->second, "the model", problem));
      }
    });
  for (const auto& t : expected) {
    // A tied tensor written once (HF) is restored through the name that was written.
    if (!file.count(t.name) && !storages_loaded.count(t.storage_key)) missing.push_back(t.name);
  }
  std::vector<std::string> unexpected;
  for (const auto& info : infos)
    if (!used.count(info.name)) unexpected.push_back(info.name);

  std::string report;
  auto add = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    report += std::string("\n  ") + what + " (" + std::to_string(names.size()) + "):";
    for (size_t i = 0; i < names.size() && i < 20; ++i) report += " " + names[i] + (i + 1 < names.size() ? "," : "");
    if (names.size() > 20) report += " ...";
  };
  add("shape/dtype mismatches", mismatched);
  if (strict) {
    add("missing keys", missing);
    add("unexpected keys", unexpected);
  }
  if (!report.empty())
    throw CheckpointError("booster: cannot load " + path + " into the model (nothing was changed):" + report +
                          (strict ? "\n  (load_model with strict = false loads the matching keys only)" : ""));

  std::map<std::string, const LoadTarget*> targets;
  for (const auto& t : expected) targets.emplace(t.name, &t);
  torch::NoGradGuard no_grad;
  ConversionLog conversions;
  for_each_checkpoint_shard(path, "model", [&](const StateDict& shard) {
    for (const auto& [name, tensor] : shard) {
      auto it = targets.find(name);
      if (it == targets.end()) continue;
      const LoadTarget& target = *it->second;
      bool dtype_ok = whole_numbers.count(name) ? float_into_integer(tensor.scalar_type(), target.dtype)
                                                : loadable_as(tensor.scalar_type(), target.dtype);
      if (tensor.sizes() != at::IntArrayRef(target.shape) || !dtype_ok)
        throw CheckpointError("booster: " + path + ": " + name + " changed on disk while loading (the file now holds " +
                              dtype_str(tensor.scalar_type()) + " " + shape_str(tensor.sizes()) + ", the model " +
                              dtype_str(target.dtype) + " " + shape_str(target.shape) +
                              "); load again once the checkpoint is no longer being written");
      target.copy(tensor);  // casts element by element into the model's dtype
      conversions.add(tensor.scalar_type(), target.dtype);
    }
  });
  conversions.report("load_model", path, "tensor", "the model's");
}

// ---------------------------------------------------------------------------------------------
// Optimizer

void CheckpointIO::save_optimizer(OptimizerWrapper& wrapper, const std::string& path, const SaveOptions& options) {
  const auto& names = wrapper.parameter_names();
  if (names.empty())
    throw CheckpointError("booster: save_optimizer needs the optimizer returned by Booster::boost (it knows the "
                          "parameter names)");
  auto& opt = wrapper.optimizer();
  std::string type = optimizer_type(opt);
  // Full-shape state by parameter (a sharded wrapper gathers its slices here: collective).
  std::vector<ParamOptimState> states = wrapper.gather_param_states();
  StateDict tensors;
  json groups = json::array(), scalars = json::object();
  size_t i = 0;
  const auto& sizes = wrapper.param_group_sizes();
  for (size_t g = 0; g < sizes.size(); ++g) {
    json jg;
    jg["options"] = options_to_json(opt, opt.param_groups()[g].options());
    jg["params"] = json::array();
    for (size_t j = 0; j < sizes[g]; ++j, ++i) {
      const std::string& name = names.at(i);
      jg["params"].push_back(name);
      for (auto& [k, t] : states[i].tensors) tensors.emplace_back(name + "." + k, t.detach());
      for (auto& [k, v] : states[i].scalars) scalars[name][k] = v;
    }
    groups.push_back(jg);
  }
  json doc = {{"format", "booster-optimizer-v1"}, {"optimizer", type}, {"param_groups", groups}, {"scalars", scalars}};
  auto ws = wrapper.state_dict();
  doc["wrapper"]["skipped_steps"] = ws.skipped_steps;
  if (ws.scaler)
    doc["wrapper"]["loss_scaler"] = {{"scale", ws.scaler->scale},
                                     {"growth_step", ws.scaler->growth_step},
                                     {"hysteresis_step", ws.scaler->hysteresis_step}};
  write_on_rank0(world_, [&] {
    save_state_dict(path, tensors, options, "optimizer", {{"optimizer_groups.json", doc.dump(2)}});
  });
}

void CheckpointIO::load_optimizer(OptimizerWrapper& wrapper, const std::string& path) {
  const auto& names = wrapper.parameter_names();
  if (names.empty())
    throw CheckpointError("booster: load_optimizer needs the optimizer returned by Booster::boost");
  std::string groups_file = (fs::path(path) / "optimizer_groups.json").string();
  json doc;
  try {
    doc = json::parse(read_text(groups_file));
  } catch (const json::exception& e) {
    throw CheckpointError("booster: " + groups_file + ": invalid JSON: " + e.what());
  }
  auto& opt = wrapper.optimizer();
  std::string type = optimizer_type(opt);
  try {
    if (doc.at("format") != "booster-optimizer-v1")
      throw CheckpointError("booster: " + groups_file + ": unknown format " + doc.at("format").dump());
    if (doc.at("optimizer") != type)
      throw CheckpointError("booster: " + path + " holds " + doc.at("optimizer").get<std::string>() +
                            " state but the optimizer is " + type + "; build the same optimizer type");
    const json& groups = doc.at("param_groups");
    const auto& sizes = wrapper.param_group_sizes();
    if (groups.size() != sizes.size())
      throw CheckpointError("booster: " + path + " has " + std::to_string(groups.size()) + " parameter groups, the "
                            "optimizer " + std::to_string(sizes.size()));
    size_t i = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      const json& params = groups[g].at("params");
      if (params.size() != sizes[g])
        throw CheckpointError("booster: " + path + ": parameter group " + std::to_string(g) + " has " +
                              std::to_string(params.size()) + " parameters, the optimizer's " + std::to_string(sizes[g]));
      for (size_t j = 0; j < sizes[g]; ++j, ++i)
        if (params[j] != names.at(i))
          throw CheckpointError("booster: " + path + ": parameter group " + std::to_string(g) + " position " +
                                std::to_string(j) + " is " + params[j].dump() + " in the checkpoint but " + names.at(i) +
                                " in the optimizer");
    }
  } catch (const json::exception& e) {
    throw CheckpointError("booster: " + groups_file + ": malformed: " + e.what());
  }
  StateDict loaded;
  bool has_tensors = fs::exists(fs::path(path) / "optimizer.safetensors") ||
                     fs::exists(fs::path(path) / "optimizer.safetensors.index.json") ||
                     fs::exists(fs::path(path) / "optimizer.bin") || fs::exists(fs::path(path) / "optimizer.bin.index.json");
  if (has_tensors) loaded = load_state_dict(path, "optimizer");
  std::map<std::string, at::Tensor> by_name(loaded.begin(), loaded.end());
  loaded.clear();  // by_name holds the tensors; a converted one replaces its original there

  // Build every new state first (validating shapes and dtypes, converting), then swap in: nothing
  // changes on error.
  std::vector<at::Tensor> params = wrapper.parameters();
  const std::vector<at::ScalarType> state_dtypes = optimizer_state_dtypes(wrapper);
  std::vector<ParamOptimState> new_states(params.size());
  std::set<std::string> used;
  ConversionLog conversions;
  const json& scalars = doc.value("scalars", json::object());
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = names.at(i);
    const at::Tensor& p = params[i];
    const at::ScalarType dtype = state_dtypes.at(i);
    ParamOptimState& s = new_states[i];
    std::string prefix = name + ".";
    for (auto it = by_name.lower_bound(prefix); it != by_name.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      std::string key = it->first.substr(prefix.size());
      if (key.find('.') != std::string::npos) continue;  // belongs to a longer parameter name
      if (it->second.sizes() != p.sizes())
        throw CheckpointError("booster: " + path + ": " + it->first + " has shape " + shape_str(it->second.sizes()) +
                              " but parameter " + name + " has " + shape_str(p.sizes()));
      if (dtype != at::ScalarType::Undefined && it->second.scalar_type() != dtype) {
        if (!loadable_as(it->second.scalar_type(), dtype))
          throw CheckpointError("booster: " + path + ": " + it->first + ": " +
                                refused_dtype(it->second.scalar_type(), dtype, "the optimizer"));
        conversions.add(it->second.scalar_type(), dtype);
        it->second = it->second.to(dtype);
      }
      s.tensors[key] = it->second;
      used.insert(it->first);
    }
    if (scalars.contains(name))
      for (auto& [k, v] : scalars.at(name).items()) s.scalars[k] = v.get<int64_t>();
  }
  for (auto& [k, v] : by_name)
    if (!used.count(k))
      throw CheckpointError("booster: " + path + ": optimizer state " + k + " matches no parameter of the optimizer");
  OptimizerWrapperState ws;
  if (doc.contains("wrapper")) {
    const json& w = doc["wrapper"];
    ws.skipped_steps = w.value("skipped_steps", 0);
    if (w.contains("loss_scaler")) {
      const json& l = w["loss_scaler"];
      ws.scaler = mixed_precision::ScalerState{l.at("scale").get<double>(), l.at("growth_step").get<int64_t>(),
                                               l.at("hysteresis_step").get<int64_t>()};
    }
  }
  if (ws.scaler.has_value() != static_cast<bool>(wrapper.options().scaler))
    throw CheckpointError(std::string("booster: ") + path +
                          (ws.scaler ? " has loss-scaler state but this optimizer has no loss scaler"
                                     : " has no loss-scaler state but this optimizer uses a loss scaler") +
                          " (saved with another mixed_precision setting?)");
  // Commit.
  wrapper.load_param_states(new_states);
  const json& groups = doc.at("param_groups");
  for (size_t g = 0; g < groups.size(); ++g) options_from_json(opt, opt.param_groups()[g].options(), groups[g].at("options"));
  wrapper.load_state_dict(ws);
  conversions.report("load_optimizer", path, "state tensor", "the optimizer's");
}

// ---------------------------------------------------------------------------------------------
// LR scheduler

void CheckpointIO::save_lr_scheduler(LRScheduler& scheduler, const std::string& path) {
  std::string text = scheduler.to_json();
  write_on_rank0(world_, [&] { io::atomic_write_file(path, text); });
}

void CheckpointIO::load_lr_scheduler(LRScheduler& scheduler, const std::string& path) {
  scheduler.load_state_dict(LRScheduler::from_json(read_text(path)));
}

}  // namespace booster::checkpoint
