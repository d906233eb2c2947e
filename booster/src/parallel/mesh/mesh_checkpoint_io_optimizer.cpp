// mesh_checkpoint_io_optimizer.cpp — MeshCheckpointIO's optimizer part: the sharded format
// keyed by full parameter name, saved from tp shards / ZeRO slices / pipeline stages, and loaded
// from either format by the full-coordinate ranges each rank keeps (see booster/parallel/mesh_checkpoint_io.h).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "booster/checkpoint/sharded_state.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/optim/optimizer_registry.h"
#include "booster/wrappers/zero_optimizer.h"
#include "booster/parallel/mesh_checkpoint_io.h"
#include "mesh_checkpoint_io_detail.h"

namespace booster::parallel {

using checkpoint::CheckpointError;
using json = nlohmann::json;
namespace fs = std::filesystem;
using namespace mesh_detail;

namespace {

const char* const kGroupsFile = "optimizer_groups.json";

const OptimizerTypeInfo& opt_info(torch::optim::Optimizer& o) {
  try {
    return optimizer_type_info(o);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(std::string("booster: cannot checkpoint the optimizer: ") + e.what());
  }
}

// "<param>.<key>" -> (param, key); state keys have no dot.
std::pair<std::string, std::string> split_state_name(const std::string& name) {
  const size_t dot = name.rfind('.');
  if (dot == std::string::npos) return {"", name};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

}  // namespace

std::shared_ptr<MeshModel> MeshCheckpointIO::state_of(checkpoint::CheckpointableOptimizer& optimizer) const {
  const auto params = optimizer.parameters();
  std::shared_ptr<MeshModel> state;
  if (!params.empty()) {
    state = registry_->find_by_parameter(params.front());
  } else {  // a stage whose optimizer holds nothing: the plugin's only model
    for (const auto& [m, weak] : registry_->states)
      if (auto s = weak.lock()) state = state ? nullptr : s;
  }
  if (!state)
    throw CheckpointError("booster: hybrid_parallel: the optimizer given to save_optimizer / load_optimizer is not one "
                          "this plugin boosted with a model; pass the optimizer returned by Booster::boost");
  if (optimizer.parameter_names().size() != params.size() || (params.size() > 0 && optimizer.parameter_names().empty()))
    throw CheckpointError("booster: hybrid_parallel: the optimizer has no parameter names (not made by Booster::boost)");
  return state;
}

// ---------------------------------------------------------------------------------------------
// save_optimizer

void MeshCheckpointIO::save_optimizer(checkpoint::CheckpointableOptimizer& wrapper, const std::string& path,
                                        const checkpoint::OptimizerSaveOptions& options) {
  using checkpoint::OptimizerFormat;
  if (options.format == OptimizerFormat::kGathered || !options.use_safetensors)
    throw CheckpointError(std::string("booster: hybrid_parallel: save_optimizer writes the sharded optimizer format "
                                      "(safetensors) only; ") +
                          (options.format == OptimizerFormat::kGathered ? "OptimizerFormat::kGathered"
                                                                        : "use_safetensors = false") +
                          " asks for gathered files. Save with the default format and turn the directory into the "
                          "gathered format with `booster ckpt consolidate DIR OUT` (it loads into every plugin "
                          "either way)");
  std::shared_ptr<MeshModel> state = state_of(wrapper);
  auto& opt = wrapper.optimizer();
  const std::string type = opt_info(opt).name();  // every rank, before any collective
  const auto& names = wrapper.parameter_names();
  const auto params = wrapper.parameters();
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < names.size(); ++i) index_of[names[i]] = i;
  std::vector<Geometry> geometry;
  for (size_t i = 0; i < params.size(); ++i) geometry.push_back(geometry_of(*state, names[i], params[i]));
  // Whether this rank writes parameter i's state (dp aside): tp-replicated ones on tp rank 0, shared
  // ones on their owner stage.
  auto writes = [&](size_t i) {
    if (topo_.tp_rank != 0 && !geometry[i].spec) return false;
    auto it = state->owner_stage.find(names[i]);
    return it == state->owner_stage.end() || it->second == topo_.pp_rank;
  };
  // Pieces of the local tensor (offset in local flat coordinates) -> pieces of the full tensor.
  std::vector<checkpoint::StatePiece> pieces;
  auto translate = [&](size_t i, const std::string& name, int64_t offset, const at::Tensor& values) {
    const Geometry& g = geometry[i];
    bool any = false;
    for (const Run& r : runs(g, offset, values.numel())) {
      if (r.full < 0) continue;
      pieces.push_back({name, g.full, r.full, values.narrow(0, r.local - offset, r.length)});
      any = true;
    }
    if (!any) pieces.push_back({name, g.full, 0, values.narrow(0, 0, 0)});  // lists the tensor
  };
  std::vector<std::map<std::string, int64_t>> scalars;
  // State sharded over dp (zero_stage 1 and 2's slices, zero_stage 3's FlatParameter shards): every
  // dp rank writes its pieces.
  if (dynamic_cast<ZeroOptimizer*>(&wrapper) || wrapper.state_is_sharded()) {
    for (checkpoint::StatePiece& p : wrapper.local_state_pieces()) {
      auto it = index_of.find(split_state_name(p.name).first);
      if (it == index_of.end())
        throw CheckpointError("booster: hybrid_parallel: optimizer state " + p.name + " matches no parameter");
      if (writes(it->second)) translate(it->second, p.name, p.offset, p.values.reshape({-1}));
    }
    if (topo_.dp_rank == 0) scalars = wrapper.local_state_scalars();
  } else if (topo_.dp_rank == 0) {  // replicated over dp: dp rank 0 writes
    std::vector<ParamOptimState> states = wrapper.gather_param_states();  // local (this rank's shards)
    for (size_t i = 0; i < states.size(); ++i) {
      if (!writes(i)) continue;
      for (const auto& [key, t] : states[i].tensors) translate(i, names[i] + "." + key, 0, t.detach().reshape({-1}));
    }
    scalars = wrapper.local_state_scalars();
  }

  // optimizer_groups.json: every stage's names per group and scalars (from its dp 0, tp 0 rank),
  // all-gathered, merged by rank 0 in the model's registration order.
  std::string mine;
  if (topo_.dp_rank == 0 && topo_.tp_rank == 0) {
    json part = {{"groups", json::array()}, {"scalars", json::object()}};
    size_t i = 0;
    for (size_t g = 0; g < wrapper.param_group_sizes().size(); ++g) {
      json list = json::array();
      for (size_t j = 0; j < wrapper.param_group_sizes()[g]; ++j, ++i) {
        auto it = state->owner_stage.find(names[i]);
        if (it != state->owner_stage.end() && it->second != topo_.pp_rank) continue;
        list.push_back(names[i]);
        if (i < scalars.size())
          for (const auto& [k, v] : scalars[i]) part["scalars"][names[i]][k] = v;
      }
      part["groups"].push_back(list);
    }
    mine = part.dump();
  }
  std::string doc_text;
  try {
    const std::vector<std::string> parts = all_gather_strings(*world_, mine);
    if (world_->rank() == 0) {
      std::map<std::string, size_t> order;
      for (const auto& [name, p] : state->named_parameters) order.emplace(name, order.size());
      const size_t num_groups = wrapper.param_group_sizes().size();
      std::vector<std::vector<std::string>> groups(num_groups);
      json scalars_json = json::object();
      for (const std::string& text : parts) {
        if (text.empty()) continue;
        const json part = json::parse(text);
        for (size_t g = 0; g < num_groups && g < part["groups"].size(); ++g)
          for (const auto& n : part["groups"][g]) groups[g].push_back(n.get<std::string>());
        for (const auto& [n, v] : part["scalars"].items()) scalars_json[n] = v;
      }
      json jgroups = json::array();
      for (size_t g = 0; g < num_groups; ++g) {
        auto& list = groups[g];
        std::sort(list.begin(), list.end(), [&](const std::string& a, const std::string& b) {
          return order.count(a) && order.count(b) ? order.at(a) < order.at(b) : a < b;
        });
        list.erase(std::unique(list.begin(), list.end()), list.end());
        jgroups.push_back({{"options", opt_info(opt).options_to_json(opt.param_groups()[g].options())}, {"params", list}});
      }
      json doc = {{"format", "booster-optimizer-v1"}, {"optimizer", type}, {"param_groups", jgroups},
                  {"scalars", scalars_json}};
      const OptimizerWrapperState ws = wrapper.state_dict();
      doc["wrapper"]["skipped_steps"] = ws.skipped_steps;
      if (ws.scaler)
        doc["wrapper"]["loss_scaler"] = {{"scale", ws.scaler->scale},
                                         {"growth_step", ws.scaler->growth_step},
                                         {"hysteresis_step", ws.scaler->hysteresis_step}};
      doc_text = doc.dump(2);
    }
  } catch (const dist::DistError& e) {
    throw CheckpointError("booster: cannot save the optimizer to '" + path + "': a collective failed: " + e.what());
  }
  // Rank 0's json problems (none expected) surface inside save_sharded_state's agreement.
  checkpoint::save_sharded_state(path, pieces, world_.get(), "optimizer", {{kGroupsFile, doc_text}});
}

// ---------------------------------------------------------------------------------------------
// load_optimizer

void MeshCheckpointIO::load_optimizer(checkpoint::CheckpointableOptimizer& wrapper, const std::string& path) {
  std::shared_ptr<MeshModel> state = state_of(wrapper);
  auto& opt = wrapper.optimizer();
  const OptimizerTypeInfo& info = opt_info(opt);
  const auto& names = wrapper.parameter_names();
  const auto params = wrapper.parameters();
  const auto& sizes = wrapper.param_group_sizes();
  const std::string groups_file = (fs::path(path) / kGroupsFile).string();
  auto fail = [&](const std::string& what) { throw CheckpointError("booster: cannot load the optimizer from " + path + ": " + what); };

  // optimizer_groups.json: type, groups (every name one of the model's, each of ours in our group).
  json doc;
  std::ifstream in(groups_file);
  if (!in) fail(groups_file + " is missing or unreadable");
  try {
    doc = json::parse(in);
  } catch (const json::exception& e) {
    fail(groups_file + ": invalid JSON: " + e.what());
  }
  std::map<std::string, int64_t> group_of;  // checkpoint: parameter name -> group
  try {
    if (doc.at("format") != "booster-optimizer-v1") fail(groups_file + ": unknown format " + doc.at("format").dump());
    if (doc.at("optimizer") != info.name())
      fail("it holds " + doc.at("optimizer").get<std::string>() + " state but the optimizer is " + info.name() +
           "; build the same optimizer type");
    const json& groups = doc.at("param_groups");
    if (groups.size() != sizes.size())
      fail("it has " + std::to_string(groups.size()) + " parameter groups, the optimizer " + std::to_string(sizes.size()));
    std::set<std::string> model_names;
    for (const auto& [n, p] : state->named_parameters) model_names.insert(n);
    for (size_t g = 0; g < groups.size(); ++g)
      for (const auto& n : groups[g].at("params")) {
        const std::string name = n.get<std::string>();
        if (!model_names.count(name)) fail("parameter group " + std::to_string(g) + " lists " + name + ", which the model does not have");
        if (!group_of.emplace(name, static_cast<int64_t>(g)).second) fail(name + " is listed in two parameter groups");
      }
    for (size_t g = 0; g < groups.size(); ++g) {  // on copies: a malformed group fails before any change
      auto copy = opt.param_groups()[g].options().clone();
      info.options_from_json(groups[g].at("options"), *copy);
    }
  } catch (const json::exception& e) {
    fail(groups_file + ": malformed: " + e.what());
  }
  const OptimizerWrapperState ws = wrapper_state(wrapper, doc, path);
  {
    size_t i = 0;
    for (size_t g = 0; g < sizes.size(); ++g)
      for (size_t j = 0; j < sizes[g]; ++j, ++i) {
        auto it = group_of.find(names[i]);
        if (it == group_of.end()) fail("parameter " + names[i] + " of the optimizer is not in the checkpoint's groups");
        if (it->second != static_cast<int64_t>(g))
          fail("parameter " + names[i] + " is in group " + std::to_string(it->second) + " in the checkpoint, group " +
               std::to_string(g) + " in the optimizer");
      }
  }

  // The stored tensors (either format), checked against the FULL shapes of our parameters.
  struct Stored {
    std::vector<int64_t> shape;
    at::ScalarType dtype;
    int64_t numel, covered;
  };
  std::map<std::string, Stored> stored;
  std::unique_ptr<checkpoint::ShardedStateReader> reader;
  if (checkpoint::ShardedStateReader::exists(path, "optimizer")) {
    reader = std::make_unique<checkpoint::ShardedStateReader>(path, "optimizer");
    for (const auto& t : reader->tensors()) stored[t.name] = {t.shape, t.dtype, t.numel, t.covered};
  } else {
    const bool has_tensors = fs::exists(fs::path(path) / "optimizer.safetensors") ||
                             fs::exists(fs::path(path) / "optimizer.safetensors.index.json") ||
                             fs::exists(fs::path(path) / "optimizer.bin") ||
                             fs::exists(fs::path(path) / "optimizer.bin.index.json");
    if (has_tensors)
      for (const auto& t : checkpoint::list_checkpoint_tensors(path, "optimizer")) {
        int64_t n = 1;
        for (int64_t d : t.shape) n *= d;
        stored[t.name] = {t.shape, t.dtype, n, n};
      }
  }
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < names.size(); ++i) index_of[names[i]] = i;
  // The dtype the optimizer keeps each parameter's state in (its master copy or ZeRO slice).
  std::vector<at::ScalarType> state_dtype(params.size(), at::ScalarType::Undefined);
  if (auto* zero = dynamic_cast<ZeroOptimizer*>(&wrapper)) {
    for (size_t g = 0; g < zero->num_groups(); ++g)
      for (size_t idx : zero->layout_parameters(g)) state_dtype[idx] = zero->master_slice(g).scalar_type();
  } else {
    const auto& masters = wrapper.master_parameters();
    for (size_t i = 0; i < params.size(); ++i)
      state_dtype[i] = i < masters.size() ? masters[i].scalar_type() : params[i].scalar_type();
  }
  std::vector<Geometry> geometry;
  for (size_t i = 0; i < params.size(); ++i) geometry.push_back(geometry_of(*state, names[i], params[i]));
  std::vector<ParamStateSource> sources(params.size());
  std::set<std::string> needed;
  for (const auto& [name, t] : stored) {
    const auto [param, key] = split_state_name(name);
    if (!group_of.count(param)) fail("optimizer state " + name + " matches no parameter of the checkpoint's groups");
    auto it = index_of.find(param);
    if (it == index_of.end()) continue;  // another stage's
    const size_t i = it->second;
    if (at::IntArrayRef(t.shape) != at::IntArrayRef(geometry[i].full))
      fail(name + " has shape " + shape_str(t.shape) + " but parameter " + param + " has " + shape_str(geometry[i].full) +
           " (its full shape)");
    const at::ScalarType to = state_dtype[i];
    if (to != at::ScalarType::Undefined && t.dtype != to && !c10::canCast(t.dtype, to))
      fail(name + ": dtype " + c10::toString(t.dtype) + " in the checkpoint cannot be converted to the optimizer's " +
           c10::toString(to));
    if (t.covered != t.numel)
      fail("optimizer state " + name + " is incomplete: its pieces hold " + std::to_string(t.covered) + " of its " +
           std::to_string(t.numel) + " elements");
    sources[i].tensor_keys.push_back(key);
    needed.insert(name);
  }
  try {
    const json& scalars = doc.value("scalars", json::object());
    for (size_t i = 0; i < params.size(); ++i)
      if (scalars.contains(names[i]))
        for (auto& [k, v] : scalars.at(names[i]).items()) sources[i].scalars[k] = v.get<int64_t>();
  } catch (const json::exception& e) {
    fail(groups_file + ": malformed scalars: " + e.what());
  }

  // A gathered checkpoint: only our parameters' tensors are kept (one file at a time).
  std::map<std::string, at::Tensor> loaded;
  if (!reader && !needed.empty())
    checkpoint::for_each_checkpoint_shard(path, "optimizer", [&](const checkpoint::StateDict& shard) {
      for (const auto& [name, t] : shard)
        if (needed.count(name)) loaded[name] = t.reshape({-1});
    });
  auto read_full = [&](const std::string& name, int64_t offset, int64_t length) -> at::Tensor {
    if (reader) return reader->read_range(name, offset, length);
    return loaded.at(name).narrow(0, offset, length);
  };
  // Local flat ranges of our shard -> the full tensor's runs (padding stays zero).
  const StateRangeReader read = [&](size_t i, const std::string& key, int64_t offset, int64_t length) {
    const std::string name = names[i] + "." + key;
    at::Tensor out = at::zeros({length}, at::TensorOptions().dtype(stored.at(name).dtype));
    for (const Run& r : runs(geometry[i], offset, length))
      if (r.full >= 0) out.narrow(0, r.local - offset, r.length).copy_(read_full(name, r.full, r.length));
    return out;
  };
  try {
    wrapper.load_state_ranges(sources, read);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  const json& groups = doc.at("param_groups");
  for (size_t g = 0; g < groups.size(); ++g) info.options_from_json(groups[g].at("options"), opt.param_groups()[g].options());
  wrapper.load_state_dict(ws);
}

}  // namespace booster::parallel
