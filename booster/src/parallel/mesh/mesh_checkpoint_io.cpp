// mesh_checkpoint_io.cpp — MeshCheckpointIO's model part and the helpers shared with the
// optimizer part (see booster/parallel/mesh_checkpoint_io.h).
#include "booster/parallel/mesh_checkpoint_io.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/checkpoint/async_save.h"
#include "booster/checkpoint/flat_checkpoint_io.h"
#include "booster/core/flat_layout.h"
#include "booster/io/atomic_write.h"
#include "mesh_checkpoint_io_detail.h"

namespace booster::parallel {

using checkpoint::CheckpointError;
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// Shared helpers (mesh_checkpoint_io_detail.h)

namespace mesh_detail {

static int64_t product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}
int64_t Geometry::local_numel() const { return product(local); }
int64_t Geometry::full_numel() const { return product(full); }

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

Geometry geometry_of(const MeshModel& state, const std::string& name, const at::Tensor& tensor) {
  Geometry g;
  auto it = state.local_shape.find(name);
  g.local = it != state.local_shape.end() ? it->second : tensor.sizes().vec();
  g.full = g.local;
  g.spec = nn::tensor_parallel_spec(tensor);
  if (!g.spec) return g;
  const nn::TensorParallelSpec& s = *g.spec;
  const int64_t rank = static_cast<int64_t>(g.local.size());
  if (s.dim < 0 || s.dim >= rank || s.tp_size < 1 || g.local[s.dim] * s.tp_size != s.padded_size ||
      s.full_size > s.padded_size || s.full_size < 0)
    throw CheckpointError("booster: hybrid_parallel: the tensor-parallel spec of " + name + " (dim " +
                          std::to_string(s.dim) + ", full_size " + std::to_string(s.full_size) + ", padded_size " +
                          std::to_string(s.padded_size) + ", tp_size " + std::to_string(s.tp_size) +
                          ") does not fit its local shape " + shape_str(g.local));
  g.full[s.dim] = s.full_size;
  for (int64_t d = s.dim + 1; d < rank; ++d) g.inner *= g.local[d];
  g.local_block = g.local[s.dim] * g.inner;
  g.full_block = s.full_size * g.inner;
  g.first_row = static_cast<int64_t>(s.tp_rank) * g.local[s.dim];
  g.valid_rows = std::clamp<int64_t>(s.full_size - g.first_row, 0, g.local[s.dim]);
  return g;
}

std::vector<Run> runs(const Geometry& g, int64_t offset, int64_t length) {
  std::vector<Run> out;
  if (length <= 0) return out;
  if (!g.spec) return {{offset, offset, length}};
  auto push = [&](Run r) {
    if (!out.empty()) {
      Run& b = out.back();
      const bool both_padding = b.full < 0 && r.full < 0;
      const bool contiguous = b.full >= 0 && r.full >= 0 && b.full + b.length == r.full;
      if (b.local + b.length == r.local && (both_padding || contiguous)) {
        b.length += r.length;
        return;
      }
    }
    out.push_back(r);
  };
  const int64_t valid = g.valid_rows * g.inner, end = offset + length;
  for (int64_t pos = offset; pos < end;) {
    const int64_t block = pos / g.local_block, within = pos - block * g.local_block;
    if (within < valid) {
      const int64_t n = std::min(end - pos, valid - within);
      push({pos, block * g.full_block + g.first_row * g.inner + within, n});
      pos += n;
    } else {
      const int64_t n = std::min(end - pos, g.local_block - within);
      push({pos, -1, n});
      pos += n;
    }
  }
  return out;
}

std::vector<std::string> all_gather_strings(dist::ProcessGroup& group, const std::string& value) {
  const int n = group.size();
  if (n == 1) return {value};
  const auto lengths = group.all_gather_int64({static_cast<int64_t>(value.size())});
  int64_t longest = 0;
  for (const auto& l : lengths) longest = std::max(longest, l.at(0));
  std::vector<std::string> out(n);
  if (longest == 0) return out;
  at::Tensor mine = at::zeros({longest}, at::kByte);
  std::memcpy(mine.data_ptr(), value.data(), value.size());
  std::vector<at::Tensor> all;
  for (int r = 0; r < n; ++r) all.push_back(at::empty({longest}, at::kByte));
  group.allgather(all, mine).wait();
  for (int r = 0; r < n; ++r) out[r].assign(reinterpret_cast<const char*>(all[r].data_ptr()), lengths[r].at(0));
  return out;
}

}  // namespace mesh_detail

using namespace mesh_detail;

MeshCheckpointIO::MeshCheckpointIO(std::shared_ptr<dist::ProcessGroup> world, MeshTopology topo,
                                       std::shared_ptr<MeshModelRegistry> registry)
    : checkpoint::CheckpointIO(std::move(world)), topo_(std::move(topo)), registry_(std::move(registry)) {}

std::shared_ptr<MeshModel> MeshCheckpointIO::state_of(torch::nn::Module& model) const {
  auto state = registry_->find(model);
  if (!state)
    throw CheckpointError("booster: hybrid_parallel: the model given to save_model / load_model is not a model this "
                          "plugin boosted; pass the boosted model (its parameters are split by the plugin)");
  return state;
}

// ---------------------------------------------------------------------------------------------
// save_model

namespace {

std::string shard_file_name(const std::string& stem, const std::string& ext, size_t i, size_t n) {
  char suffix[64];
  std::snprintf(suffix, sizeof(suffix), "-%05zu-of-%05zu", i + 1, n);
  return stem + suffix + "." + ext;
}

// The all-gathered full tensor of a tp shard `local` (every rank of spec.group calls it, in the
// same order), padding dropped. bf16 / fp16 travel as float32 (exact both ways).
at::Tensor gather_full(const at::Tensor& local, const Geometry& g) {
  const nn::TensorParallelSpec& s = *g.spec;
  at::Tensor full;
  if (s.group && s.group->size() > 1) {
    const bool widen = local.scalar_type() == at::kBFloat16 || local.scalar_type() == at::kHalf;
    at::Tensor send = (widen ? local.to(at::kFloat) : local).contiguous();
    std::vector<at::Tensor> parts;
    for (int r = 0; r < s.group->size(); ++r) parts.push_back(at::empty_like(send));
    s.group->allgather(parts, send).wait();
    full = at::cat(parts, s.dim);
    if (widen) full = full.to(local.scalar_type());
  } else {
    full = local;
  }
  return full.size(s.dim) == s.full_size ? full : full.narrow(s.dim, 0, s.full_size).contiguous();
}

// zero_stage 3: every parameter's value on this rank (its tp shard), all-gathered over dp from the
// FlatParameters in full precision, keyed by the parameter's TensorImpl (its own tensor is a view of
// storage that is gathered only around forward and backward). Collective over the dp group. Holds
// this rank's whole (tp-shard) model while the save runs. Empty for the other stages.
std::map<const void*, at::Tensor> gathered_parameters(MeshModel& state) {
  std::map<const void*, at::Tensor> out;
  if (!state.sharded) return out;
  for (const checkpoint::FlatSource& src : state.sharded->checkpoint_sources()) {
    const at::Tensor full = src.gather_full();
    const FlatLayout& layout = src.flat->layout();
    const auto& params = src.flat->params();
    for (size_t j = 0; j < params.size(); ++j)
      out[params[j].second.unsafeGetTensorImpl()] =
          full.narrow(0, layout.offsets[j], layout.numels[j]).view(params[j].second.sizes());
  }
  return out;
}

// zero_stage 3: copies each parameter's loaded value (`loaded`, keyed by TensorImpl) into this
// rank's pieces of the FlatParameter shards, then lets the runtime refresh what it derives from them.
void scatter_into_shards(MeshModel& state, const std::map<const void*, at::Tensor>& loaded) {
  at::NoGradGuard no_grad;
  for (const checkpoint::FlatSource& src : state.sharded->checkpoint_sources()) {
    at::Tensor shard = src.shard();
    const FlatLayout& layout = src.flat->layout();
    const int rank = src.flat->group().rank();
    const auto& params = src.flat->params();
    for (size_t j = 0; j < params.size(); ++j) {
      const FlatLayout::Piece piece = layout.piece(j, rank);
      if (piece.length == 0) continue;
      const at::Tensor& value = loaded.at(params[j].second.unsafeGetTensorImpl());
      shard.narrow(0, piece.shard_offset, piece.length).copy_(value.reshape({-1}).narrow(0, piece.tensor_offset, piece.length));
    }
  }
  state.sharded->after_checkpoint_load();
}

std::string failure_message(const std::string& dir, const std::vector<std::pair<int, std::string>>& failures) {
  std::string msg = "booster: cannot save the model to '" + dir + "' (it is unchanged):";
  for (const auto& [r, e] : failures) msg += " rank " + std::to_string(r) + ": " + e + ";";
  msg.pop_back();
  return msg;
}

}  // namespace

void MeshCheckpointIO::save_model(torch::nn::Module& model, const std::string& path,
                                    const checkpoint::ModelSaveOptions& options) {
  // This save renames the per-stage files it wrote, so it cannot be staged (async_save.h).
  checkpoint::write_staged_now("hybrid_parallel's save_model renames the files it writes");
  std::shared_ptr<MeshModel> state = state_of(model);
  // The plan, identical on every rank: the tensors of the full model (ties written once), each
  // stage's tensors in registration order, each stage's files, the global file names.
  struct Item {
    std::string name;
    at::Tensor tensor;
    Geometry g;
  };
  std::vector<Item> items;
  std::vector<std::vector<size_t>> of_stage(topo_.pp);
  std::set<const void*> seen;
  const std::map<const void*, at::Tensor> gathered = gathered_parameters(*state);
  for (auto* list : {&state->named_parameters, &state->named_buffers})
    for (const auto& [name, t] : *list) {
      if (!seen.insert(t.unsafeGetTensorImpl()).second) continue;
      const int owner = state->owner_stage.count(name) ? state->owner_stage.at(name) : 0;
      of_stage.at(std::max(owner, 0)).push_back(items.size());
      auto g = gathered.find(t.unsafeGetTensorImpl());
      items.push_back({name, g != gathered.end() ? g->second : t.detach(), geometry_of(*state, name, t)});
    }
  // What is written: each item's tensor, or through an adapter the HuggingFace tensors it becomes.
  std::vector<checkpoint::TensorSpec> model_specs;
  for (const Item& item : items) model_specs.push_back({options.prefix + item.name, item.tensor.scalar_type(), item.g.full});
  checkpoint::AdaptedModel adapted;
  if (options.adapter) adapted = checkpoint::adapt_model(*options.adapter, model_specs, options.prefix);
  std::vector<std::vector<checkpoint::TensorSpec>> out_of_stage(topo_.pp);  // per stage, in write order
  for (int st = 0; st < topo_.pp; ++st)
    for (size_t i : of_stage[st]) {
      if (!options.adapter) out_of_stage[st].push_back(model_specs[i]);
      else
        for (const auto& h : adapted.plan[i].hf) out_of_stage[st].push_back(h);
    }
  checkpoint::SaveOptions so;
  so.shard = options.shard;
  so.size_per_shard_mb = options.size_per_shard_mb;
  so.use_safetensors = options.use_safetensors;
  if (so.shard && so.size_per_shard_mb <= 0)
    throw CheckpointError("booster: cannot save the model to '" + path + "': size_per_shard_mb must be positive, got " +
                          std::to_string(so.size_per_shard_mb));
  const int64_t max_mb = std::numeric_limits<int64_t>::max() >> 20;
  const int64_t limit = so.size_per_shard_mb > max_mb ? std::numeric_limits<int64_t>::max() : so.size_per_shard_mb << 20;
  auto bytes_of = [](const checkpoint::TensorSpec& t) {
    int64_t n = static_cast<int64_t>(c10::elementSize(t.dtype));
    for (int64_t d : t.shape) n *= d;
    return n;
  };
  std::vector<size_t> files_of_stage(topo_.pp, 0), first_file(topo_.pp, 0);
  std::vector<std::vector<size_t>> file_of_out(topo_.pp);
  size_t total_files = 0;
  int64_t total_bytes = 0;
  for (int s = 0; s < topo_.pp; ++s) {
    first_file[s] = total_files;
    file_of_out[s].assign(out_of_stage[s].size(), 0);
    // A stage with nothing to write has no file (a partial adapter format can leave a whole stage
    // out); stage 0 writes one (empty) file when no stage writes any.
    bool any_out = false;
    for (const auto& o : out_of_stage) any_out = any_out || !o.empty();
    if (out_of_stage[s].empty() && !(s == 0 && !any_out)) continue;
    std::vector<int64_t> bytes;
    for (const auto& t : out_of_stage[s]) bytes.push_back(bytes_of(t));
    for (int64_t b : bytes) total_bytes += b;
    std::vector<std::vector<size_t>> shards;
    if (so.shard) shards = checkpoint::split_into_shards(bytes, limit);
    if (shards.size() <= 1) {
      shards.assign(1, {});
      for (size_t k = 0; k < bytes.size(); ++k) shards[0].push_back(k);
    }
    for (size_t f = 0; f < shards.size(); ++f)
      for (size_t k : shards[f]) file_of_out[s][k] = total_files + f;
    files_of_stage[s] = shards.size();
    total_files += shards.size();
  }
  const std::string ext = so.use_safetensors ? "safetensors" : "bin";
  const std::string weights_name = options.adapter ? adapted.weights_name : "model";
  const std::string stem = so.use_safetensors || weights_name != "model" ? weights_name : "pytorch_model";
  auto global_name = [&](size_t f) { return total_files == 1 ? stem + "." + ext : shard_file_name(stem, ext, f, total_files); };
  std::string index_text;
  if (total_files > 1) {
    nlohmann::json index;
    index["metadata"] = nlohmann::json::object({{"total_size", total_bytes}});
    index["weight_map"] = nlohmann::json::object();
    for (int st = 0; st < topo_.pp; ++st)
      for (size_t k = 0; k < out_of_stage[st].size(); ++k)
        index["weight_map"][out_of_stage[st][k].name] = global_name(file_of_out[st][k]);
    try {
      index_text = index.dump(2, ' ', true) + "\n";  // as transformers writes it
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError("booster: cannot save the model to '" + path + "': a tensor name is not valid UTF-8: " + e.what());
    }
  }

  const int rank = world_->rank();
  const int s = topo_.pp_rank;
  const bool writer = topo_.dp_rank == 0 && topo_.tp_rank == 0;
  // This rank's part inside the temporary directory: the stage's writer streams its tensors into a
  // subdirectory (save_state_dict_streamed: the HF files for this stage alone), then moves the files
  // to their global names; its tp peers (dp = 0) take part in the gathers. Returns the error.
  auto write_part = [&](const std::string& tmp, const std::string& preset_error) -> std::string {
    const std::vector<size_t>& mine = of_stage[s];
    size_t gathered = 0;  // mine[0 .. gathered) went through their gathers
    auto gather_until = [&](size_t k) -> at::Tensor {  // the full tensor of mine[k]
      at::Tensor out;
      for (; gathered <= k && gathered < mine.size(); ++gathered) {
        const Item& item = items[mine[gathered]];
        out = item.g.spec ? gather_full(item.tensor, item.g) : item.tensor;
      }
      return out;
    };
    std::string error = preset_error;
    if (topo_.dp_rank != 0) return error;
    if (writer && error.empty() && files_of_stage[s] > 0) {
      try {
        struct stat st {};
        if (rank != 0 && (::stat(tmp.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)))
          throw CheckpointError("the temporary directory '" + tmp + "' that rank 0 created is not visible here (the "
                                "checkpoint directory must be on a file system every rank shares)");
        const std::string sub = tmp + "/.stage-" + std::to_string(s);
        std::function<at::Tensor(size_t)> fetch = [&](size_t k) -> at::Tensor {
          at::Tensor full = gather_until(k);
          return so.use_safetensors || !items[mine[k]].g.spec ? full : full.clone();
        };
        if (!options.adapter) {
          checkpoint::save_state_dict_streamed(sub, out_of_stage[s], so, fetch);
        } else {
          std::vector<checkpoint::AdaptedTensor> stage_plan;
          for (size_t i : mine) stage_plan.push_back(adapted.plan[i]);
          checkpoint::AdaptedSave save = checkpoint::adapt_save(stage_plan, fetch);
          checkpoint::save_state_dict_streamed(sub, save.specs, so, save.fetch, weights_name);
        }
        std::vector<std::string> names;
        for (const auto& e : fs::directory_iterator(sub)) {
          const std::string n = e.path().filename().string();
          if (n.size() < 11 || n.compare(n.size() - 11, 11, ".index.json") != 0) names.push_back(n);
        }
        std::sort(names.begin(), names.end());
        if (names.size() != files_of_stage[s])
          throw CheckpointError("stage " + std::to_string(s) + " wrote " + std::to_string(names.size()) +
                                " files, the plan has " + std::to_string(files_of_stage[s]));
        for (size_t f = 0; f < names.size(); ++f) fs::rename(sub + "/" + names[f], tmp + "/" + global_name(first_file[s] + f));
        fs::remove_all(sub);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    gather_until(mine.empty() ? 0 : mine.size() - 1);  // the gathers the writer did not reach (all, on its peers)
    if (rank == 0 && error.empty()) {
      try {
        if (!index_text.empty()) io::write_new_file(tmp + "/" + stem + "." + ext + ".index.json", index_text);
        for (const auto& [name, text] : adapted.extra_files) io::write_new_file(tmp + "/" + name, text);
      } catch (const std::exception& e) {
        error = e.what();
      }
    }
    return error;
  };
  // Everyone's outcome (one all-gather); the message naming every failed rank, or "".
  auto agree = [&](const std::string& error) {
    const std::vector<std::string> outcomes = all_gather_strings(*world_, error);
    std::vector<std::pair<int, std::string>> failures;
    for (int r = 0; r < static_cast<int>(outcomes.size()); ++r)
      if (!outcomes[r].empty()) failures.emplace_back(r, outcomes[r]);
    return failures.empty() ? std::string() : failure_message(path, failures);
  };

  try {
    if (rank == 0) {
      enum class Stage { before_fill, agreeing, agreed_failed, agreed_ok } stage = Stage::before_fill;
      try {
        io::atomic_write_directory(path, [&](const std::string& tmp) {
          stage = Stage::agreeing;
          world_->broadcast_string("T" + tmp, 0);
          const std::string verdict = agree(write_part(tmp, ""));
          if (!verdict.empty()) {
            stage = Stage::agreed_failed;
            throw CheckpointError(verdict);  // tmp is removed, path unchanged
          }
          stage = Stage::agreed_ok;
        });
      } catch (const std::exception& e) {
        if (stage == Stage::before_fill) {  // the others wait for the announcement
          const std::string msg = failure_message(path, {{0, e.what()}});
          world_->broadcast_string("E" + msg, 0);
          throw CheckpointError(msg);
        }
        if (stage == Stage::agreed_ok) {  // the others wait for the commit's outcome
          const std::string msg = failure_message(path, {{0, std::string("committing the directory failed: ") + e.what()}});
          world_->broadcast_string(msg, 0);
          throw CheckpointError(msg);
        }
        if (dynamic_cast<const CheckpointError*>(&e)) throw;
        throw CheckpointError(e.what());
      }
      world_->broadcast_string("", 0);  // committed
      return;
    }
    const std::string announced = world_->broadcast_string("", 0);
    if (!announced.empty() && announced[0] == 'E') throw CheckpointError(announced.substr(1));
    const bool ok = announced.size() > 1 && announced[0] == 'T';
    const std::string verdict = agree(write_part(ok ? announced.substr(1) : "", ok ? "" : "malformed message from rank 0"));
    if (!verdict.empty()) throw CheckpointError(verdict);
    const std::string committed = world_->broadcast_string("", 0);
    if (!committed.empty()) throw CheckpointError(committed);
  } catch (const dist::DistError& e) {
    throw CheckpointError("booster: cannot save the model to '" + path +
                          "': a collective of the save failed (the process group is unusable): " + e.what());
  }
}

// ---------------------------------------------------------------------------------------------
// load_model

void MeshCheckpointIO::load_model(torch::nn::Module& model, const std::string& path,
                                    const checkpoint::ModelLoadOptions& options) {
  std::shared_ptr<MeshModel> state = state_of(model);
  std::vector<LoadTarget> targets;
  std::set<const void*> seen;
  // zero_stage 3: the parameters load into host buffers, then into the shards (scatter_into_shards).
  std::map<const void*, at::Tensor> staged;
  if (state->sharded)
    for (const auto& [name, p] : state->named_parameters)
      staged[p.unsafeGetTensorImpl()] = at::zeros(p.sizes(), at::TensorOptions().dtype(p.scalar_type()));
  for (auto* list : {&state->named_parameters, &state->named_buffers})
    for (const auto& [name, tensor] : *list) {
      if (!seen.insert(tensor.unsafeGetTensorImpl()).second) continue;
      const Geometry g = geometry_of(*state, name, tensor);
      auto buffer = staged.find(tensor.unsafeGetTensorImpl());
      at::Tensor t = buffer != staged.end() ? buffer->second : tensor;
      LoadTarget target{name, g.full, t.scalar_type(), tensor.unsafeGetTensorImpl(), nullptr};
      const bool held = !state->held.count(name) || state->held.at(name);
      if (!held) {
        target.copy = [](const at::Tensor&) {};  // another stage's: checked, not kept
      } else if (!g.spec) {
        target.copy = [t](const at::Tensor& from_file) mutable { t.copy_(from_file); };
      } else {
        target.copy = [t, g](const at::Tensor& from_file) mutable {
          const int64_t d = g.spec->dim, rows = g.local[d];
          if (g.valid_rows > 0) t.narrow(d, 0, g.valid_rows).copy_(from_file.narrow(d, g.first_row, g.valid_rows));
          if (g.valid_rows < rows) t.narrow(d, g.valid_rows, rows - g.valid_rows).zero_();  // vocabulary padding
        };
      }
      targets.push_back(std::move(target));
    }
  load_targets(path, targets, options);
  if (state->sharded) scatter_into_shards(*state, staged);
}

}  // namespace booster::parallel
