// optimizer_checkpoint.cpp — CheckpointIO's optimizer part: state keyed by parameter name, saved
// gathered (rank 0 writes full tensors) or sharded (every rank writes its pieces), and loaded from
// either into any wrapper by the ranges it keeps (checkpoint_io.h, docs/checkpoint-format.md).
#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/checkpoint/sharded_state.h"
#include "booster/dist/process_group.h"
#include "booster/optim/optimizer_registry.h"
#include "booster/optim/optimizer_state.h"
#include "booster/checkpoint/checkpointable_optimizer.h"
#include "checkpoint_io_detail.h"

namespace booster::checkpoint {

using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace io_detail;

CheckpointableOptimizer::~CheckpointableOptimizer() = default;

namespace {

const char* const kGroupsFile = "optimizer_groups.json";

// ---------------------------------------------------------------------------------------------
// Optimizer type name and options (per parameter group) as JSON, from the optimizer registry
// (optim/optimizer_registry.h); its lookup errors become CheckpointError.

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
// wrapper's load_state_ranges converts it).
std::vector<at::ScalarType> optimizer_state_dtypes(CheckpointableOptimizer& wrapper) {
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

const std::vector<std::string>& checked_names(CheckpointableOptimizer& wrapper, const char* call) {
  const auto& names = wrapper.parameter_names();
  if (names.empty())
    throw CheckpointError(std::string("booster: ") + call +
                          " needs the optimizer returned by Booster::boost (it knows the parameter names)");
  return names;
}

// optimizer_groups.json: type, groups (options, parameter names), scalars by name, wrapper state.
json groups_document(CheckpointableOptimizer& wrapper, const std::vector<std::map<std::string, int64_t>>& scalars_by_param) {
  auto& opt = wrapper.optimizer();
  const auto& names = wrapper.parameter_names();
  json groups = json::array(), scalars = json::object();
  size_t i = 0;
  const auto& sizes = wrapper.param_group_sizes();
  for (size_t g = 0; g < sizes.size(); ++g) {
    json jg;
    jg["options"] = options_to_json(opt, opt.param_groups()[g].options());
    jg["params"] = json::array();
    for (size_t j = 0; j < sizes[g]; ++j, ++i) {
      jg["params"].push_back(names.at(i));
      for (const auto& [k, v] : scalars_by_param.at(i)) scalars[names[i]][k] = v;
    }
    groups.push_back(jg);
  }
  json doc = {{"format", "booster-optimizer-v1"},
              {"optimizer", optimizer_type(opt)},
              {"param_groups", groups},
              {"scalars", scalars}};
  auto ws = wrapper.state_dict();
  doc["wrapper"]["skipped_steps"] = ws.skipped_steps;
  if (ws.scaler)
    doc["wrapper"]["loss_scaler"] = {{"scale", ws.scaler->scale},
                                     {"growth_step", ws.scaler->growth_step},
                                     {"hysteresis_step", ws.scaler->hysteresis_step}};
  return doc;
}

// Reads <path>/optimizer_groups.json and checks it against the wrapper: format, optimizer type,
// groups and the parameter names in each.
json read_groups_document(CheckpointableOptimizer& wrapper, const std::string& path) {
  const auto& names = wrapper.parameter_names();
  std::string groups_file = (fs::path(path) / kGroupsFile).string();
  json doc;
  try {
    doc = json::parse(read_text(groups_file));
  } catch (const json::exception& e) {
    throw CheckpointError("booster: " + groups_file + ": invalid JSON: " + e.what());
  }
  std::string type = optimizer_type(wrapper.optimizer());
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
    for (const auto& g : groups) g.at("options");
  } catch (const json::exception& e) {
    throw CheckpointError("booster: " + groups_file + ": malformed: " + e.what());
  }
  return doc;
}


// A stored state tensor as the checkpoint's headers / index describe it.
struct StoredTensor {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::ScalarType::Undefined;
};

}  // namespace

// The wrapper state ("wrapper" in optimizer_groups.json), checked against the wrapper's scaler.
OptimizerWrapperState CheckpointIO::wrapper_state(CheckpointableOptimizer& wrapper, const json& doc, const std::string& path) {
  OptimizerWrapperState ws;
  try {
    if (doc.contains("wrapper")) {
      const json& w = doc["wrapper"];
      ws.skipped_steps = w.value("skipped_steps", 0);
      if (w.contains("loss_scaler")) {
        const json& l = w["loss_scaler"];
        ws.scaler = mixed_precision::ScalerState{l.at("scale").get<double>(), l.at("growth_step").get<int64_t>(),
                                                 l.at("hysteresis_step").get<int64_t>()};
      }
    }
  } catch (const json::exception& e) {
    throw CheckpointError("booster: " + (fs::path(path) / kGroupsFile).string() + ": malformed: " + e.what());
  }
  if (ws.scaler.has_value() != wrapper.has_loss_scaler())
    throw CheckpointError(std::string("booster: ") + path +
                          (ws.scaler ? " has loss-scaler state but this optimizer has no loss scaler"
                                     : " has no loss-scaler state but this optimizer uses a loss scaler") +
                          " (saved with another mixed_precision setting?)");
  return ws;
}

// ---------------------------------------------------------------------------------------------
// Save

void CheckpointIO::save_optimizer(CheckpointableOptimizer& wrapper, const std::string& path,
                                  const OptimizerSaveOptions& options) {
  checked_names(wrapper, "save_optimizer");
  optimizer_type(wrapper.optimizer());  // an unregistered type: CheckpointError on every rank, before any collective
  OptimizerFormat format = options.format;
  if (format == OptimizerFormat::kSharded && !options.use_safetensors)
    throw CheckpointError("booster: save_optimizer: the sharded optimizer format is safetensors only, and "
                          "use_safetensors = false asks for .bin files; use OptimizerFormat::kGathered for .bin");
  if (format == OptimizerFormat::kAuto)
    format = wrapper.state_is_sharded() && options.use_safetensors ? OptimizerFormat::kSharded
                                                                   : OptimizerFormat::kGathered;

  if (format == OptimizerFormat::kSharded) {
    // Every rank's pieces of the flattened tensors (views of its state: nothing gathered or copied).
    std::vector<StatePiece> pieces = wrapper.local_state_pieces();
    json doc = groups_document(wrapper, wrapper.local_state_scalars());
    save_sharded_state(path, pieces, world_.get(), "optimizer", {{kGroupsFile, doc.dump(2)}});
    return;
  }
  // Full-shape state by parameter (a sharded wrapper gathers its slices here: collective).
  std::vector<ParamOptimState> states = wrapper.gather_param_states();
  const auto& names = wrapper.parameter_names();
  StateDict tensors;
  std::vector<std::map<std::string, int64_t>> scalars(states.size());
  for (size_t i = 0; i < states.size(); ++i) {
    for (auto& [k, t] : states[i].tensors) tensors.emplace_back(names.at(i) + "." + k, t.detach());
    scalars[i] = states[i].scalars;
  }
  json doc = groups_document(wrapper, scalars);
  write_on_rank0(world_, [&] { save_state_dict(path, tensors, options, "optimizer", {{kGroupsFile, doc.dump(2)}}); });
}

// ---------------------------------------------------------------------------------------------
// Load

void CheckpointIO::load_optimizer(CheckpointableOptimizer& wrapper, const std::string& path) {
  const auto& names = checked_names(wrapper, "load_optimizer");
  const json doc = read_groups_document(wrapper, path);
  auto& opt = wrapper.optimizer();

  // The stored tensors and how to read elements [offset, offset + length) of one, flattened.
  std::map<std::string, StoredTensor> stored;
  std::function<at::Tensor(const std::string&, int64_t, int64_t)> read_named;
  std::unique_ptr<ShardedStateReader> reader;
  std::map<std::string, at::Tensor> loaded;
  if (ShardedStateReader::exists(path, "optimizer")) {
    // Validates the index and the header of every rank file.
    reader = std::make_unique<ShardedStateReader>(path, "optimizer");
    const std::string index = (fs::path(path) / "optimizer.sharded.json").string();
    for (const auto& t : reader->tensors()) {
      if (t.covered != t.numel)
        throw CheckpointError("booster: " + index + ": optimizer state " + t.name + " is incomplete: its pieces hold " +
                              std::to_string(t.covered) + " of its " + std::to_string(t.numel) +
                              " elements (a rank saved no piece of the rest)");
      stored[t.name] = {t.shape, t.dtype};
    }
    read_named = [&](const std::string& name, int64_t offset, int64_t length) {
      return reader->read_range(name, offset, length);
    };
  } else {
    bool has_tensors = fs::exists(fs::path(path) / "optimizer.safetensors") ||
                       fs::exists(fs::path(path) / "optimizer.safetensors.index.json") ||
                       fs::exists(fs::path(path) / "optimizer.bin") || fs::exists(fs::path(path) / "optimizer.bin.index.json");
    if (has_tensors)
      for (auto& [name, t] : load_state_dict(path, "optimizer")) loaded[name] = t;
    for (const auto& [name, t] : loaded) stored[name] = {t.sizes().vec(), t.scalar_type()};
    read_named = [&](const std::string& name, int64_t offset, int64_t length) {
      return loaded.at(name).reshape({-1}).narrow(0, offset, length);
    };
  }

  // Validate every stored tensor against its parameter (shape, dtype) before anything changes.
  std::vector<at::Tensor> params = wrapper.parameters();
  const std::vector<at::ScalarType> state_dtypes = optimizer_state_dtypes(wrapper);
  std::vector<ParamStateSource> sources(params.size());
  std::set<std::string> used;
  ConversionLog conversions;
  const json& scalars = doc.value("scalars", json::object());
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string& name = names.at(i);
    const at::Tensor& p = params[i];
    const at::ScalarType dtype = state_dtypes.at(i);
    std::string prefix = name + ".";
    for (auto it = stored.lower_bound(prefix); it != stored.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
      std::string key = it->first.substr(prefix.size());
      if (key.find('.') != std::string::npos) continue;  // belongs to a longer parameter name
      const StoredTensor& t = it->second;
      if (at::IntArrayRef(t.shape) != p.sizes())
        throw CheckpointError("booster: " + path + ": " + it->first + " has shape " + shape_str(t.shape) +
                              " but parameter " + name + " has " + shape_str(p.sizes()));
      if (dtype != at::ScalarType::Undefined && t.dtype != dtype) {
        if (!loadable_as(t.dtype, dtype))
          throw CheckpointError("booster: " + path + ": " + it->first + ": " +
                                refused_dtype(t.dtype, dtype, "the optimizer"));
        conversions.add(t.dtype, dtype);
      }
      sources[i].tensor_keys.push_back(key);
      used.insert(it->first);
    }
    try {
      if (scalars.contains(name))
        for (auto& [k, v] : scalars.at(name).items()) sources[i].scalars[k] = v.get<int64_t>();
    } catch (const json::exception& e) {
      throw CheckpointError("booster: " + (fs::path(path) / kGroupsFile).string() + ": malformed scalars of " + name +
                            ": " + e.what());
    }
  }
  for (const auto& [k, v] : stored)
    if (!used.count(k))
      throw CheckpointError("booster: " + path + ": optimizer state " + k + " matches no parameter of the optimizer");
  const OptimizerWrapperState ws = wrapper_state(wrapper, doc, path);
  const json& groups = doc.at("param_groups");
  for (size_t g = 0; g < groups.size(); ++g) {  // on copies: a malformed group fails here, before any change
    auto copy = opt.param_groups()[g].options().clone();
    options_from_json(opt, *copy, groups[g].at("options"));
  }

  // Commit: the wrapper reads the ranges it keeps (converted to its dtype), builds its new state and
  // swaps it in only when everything was read.
  wrapper.load_state_ranges(sources, [&](size_t i, const std::string& key, int64_t offset, int64_t length) {
    at::Tensor t = read_named(names[i] + "." + key, offset, length);
    const at::ScalarType dtype = state_dtypes[i];
    return dtype != at::ScalarType::Undefined && t.scalar_type() != dtype ? t.to(dtype) : t;
  });
  for (size_t g = 0; g < groups.size(); ++g) options_from_json(opt, opt.param_groups()[g].options(), groups[g].at("options"));
  wrapper.load_state_dict(ws);
  conversions.report("load_optimizer", path, "state tensor", "the optimizer's");
}

}  // namespace booster::checkpoint
