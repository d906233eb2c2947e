// checkpoint_io.cpp — the default CheckpointIO: model and LR scheduler, and the helpers the
// optimizer part (optimizer_checkpoint.cpp) shares (checkpoint_io_detail.h).
#include "booster/checkpoint/checkpoint_io.h"

#include "booster/checkpoint/state_dict_adapter.h"

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "booster/dist/process_group.h"
#include "booster/io/atomic_write.h"
#include "booster/logging.h"
#include "booster/lr_scheduler.h"
#include "checkpoint_io_detail.h"

namespace booster::checkpoint {

CheckpointIO::CheckpointIO(std::shared_ptr<dist::ProcessGroup> world) : world_(std::move(world)) {}
CheckpointIO::~CheckpointIO() = default;
bool CheckpointIO::is_writer() const { return !world_ || world_->rank() == 0; }
void CheckpointIO::barrier() const {
  if (world_ && world_->size() > 1) world_->barrier();
}

// ---------------------------------------------------------------------------------------------
// Helpers shared with the optimizer part (checkpoint_io_detail.h)

namespace io_detail {

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

void write_on_rank0(const std::shared_ptr<dist::ProcessGroup>& world, const std::function<void()>& write) {
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

std::string dtype_str(at::ScalarType t) { return c10::toString(t); }

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

std::string refused_dtype(at::ScalarType from, at::ScalarType to, const std::string& what,
                          const std::string& detail) {
  std::string why = at::isComplexType(from) ? "the imaginary part would be dropped"
                    : to == at::kBool       ? "values would collapse to true/false"
                                            : "floating-point values would be truncated";
  if (!detail.empty()) why += ": " + detail;
  return "dtype " + dtype_str(from) + " in the checkpoint, " + dtype_str(to) + " in " + what + " (refused: " + why +
         "; give " + what + "'s tensor a dtype that holds these values, or convert the checkpoint)";
}

void ConversionLog::report(const std::string& call, const std::string& path, const std::string& noun,
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

}  // namespace io_detail

using namespace io_detail;

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
  if (!options.adapter) {
    write_on_rank0(world_, [&] { save_state_dict(path, state, so, "model"); });
    return;
  }
  // Ties (the same tensor under two names) are written once, under the first name, as HF does.
  StateDict distinct;
  std::set<const void*> seen;
  for (auto& [name, t] : state)
    if (seen.insert(t.unsafeGetTensorImpl()).second) distinct.emplace_back(name, t);
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : distinct) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  AdaptedModel adapted = adapt_model(*options.adapter, specs, options.prefix);
  write_on_rank0(world_, [&] {
    AdaptedSave save = adapt_save(adapted.plan, [&](size_t j) { return distinct[j].second; });
    save_state_dict_streamed(path, save.specs, so, save.fetch, adapted.weights_name, adapted.extra_files);
  });
}

void CheckpointIO::load_model(torch::nn::Module& model, const std::string& path, const ModelLoadOptions& options) {
  std::vector<LoadTarget> targets;
  std::set<const void*> seen;
  auto add = [&](const std::string& name, at::Tensor t) {
    if (options.adapter && !seen.insert(t.unsafeGetTensorImpl()).second) return;  // a tie: loaded once
    targets.push_back({name, t.sizes().vec(), t.scalar_type(), t.storage().unsafeGetStorageImpl(),
                       [t](const at::Tensor& from_file) mutable { t.copy_(from_file); }});
  };
  for (const auto& item : model.named_parameters(true)) add(item.key(), item.value());
  for (const auto& item : model.named_buffers(true)) add(item.key(), item.value());
  load_targets(path, targets, options);
}

std::vector<CheckpointIO::LoadTarget> CheckpointIO::adapted_targets(const StateDictAdapter& adapter,
                                                                   const std::vector<LoadTarget>& model_targets) {
  std::vector<TensorSpec> specs;
  for (const auto& t : model_targets) specs.push_back({t.name, t.dtype, t.shape});
  auto plan = std::make_shared<std::vector<AdaptedTensor>>(adapter.plan(specs));
  std::vector<LoadTarget> out;
  for (size_t j = 0; j < plan->size(); ++j) {
    const AdaptedTensor& a = (*plan)[j];
    const LoadTarget& model = model_targets[j];
    if (a.hf.empty()) continue;  // not part of a partial format
    if (a.hf.size() == 1) {
      out.push_back({a.hf[0].name, a.hf[0].shape, model.dtype, model.storage_key,
                     [plan, j, copy = model.copy](const at::Tensor& from_file) { copy(from_hf((*plan)[j], {from_file})); }});
      continue;
    }
    // Stored split: the parts are kept until the last one is read, then assembled and copied.
    auto parts = std::make_shared<std::vector<at::Tensor>>(a.hf.size());
    for (size_t k = 0; k < a.hf.size(); ++k)
      out.push_back({a.hf[k].name, a.hf[k].shape, model.dtype, &(*parts)[k],
                     [plan, j, k, parts, copy = model.copy](const at::Tensor& from_file) {
                       (*parts)[k] = from_file;
                       for (const auto& p : *parts)
                         if (!p.defined()) return;
                       copy(from_hf((*plan)[j], *parts));
                       for (auto& p : *parts) p = at::Tensor();
                     }});
  }
  return out;
}

void CheckpointIO::load_targets(const std::string& path, const std::vector<LoadTarget>& model_targets,
                                const ModelLoadOptions& options) {
  const bool strict = options.strict;
  // Through an adapter: the targets become the HuggingFace tensors (adapted_targets).
  std::vector<LoadTarget> hf_targets;
  if (options.adapter) {
    options.adapter->check_config(read_config_json(path, options.adapter->format().config_file), path);
    hf_targets = adapted_targets(*options.adapter, model_targets);
  }
  const std::vector<LoadTarget>& expected = options.adapter ? hf_targets : model_targets;
  const std::string weights_name = options.adapter ? options.adapter->format().weights_name : "model";
  // Validate against the files' headers (no tensor data for safetensors), then copy shard by shard:
  // peak memory is about one shard on top of the model.
  const std::vector<CheckpointTensorInfo> infos = list_checkpoint_tensors(path, weights_name);
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
    for_each_checkpoint_shard(path, weights_name, [&](const StateDict& shard) {
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
    if (!used.count(info.name) && !(options.adapter && options.adapter->ignored_on_load(info.name)))
      unexpected.push_back(info.name);

  std::string report;
  auto add = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    report += std::string("\n  ") + what + " (" + std::to_string(names.size()) + "):";
    for (size_t i = 0; i < names.size() && i < 20; ++i) report += " " + names[i] + (i + 1 < names.size() ? "," : "");
    if (names.size() > 20) report += " ...";
  };
  add("shape/dtype mismatches", mismatched);
  if (options.adapter && !mismatched.empty())
    report += "\n  (the model is " + options.adapter->architecture() + " with " + options.adapter->size_summary() +
              ", as in its config.json; the checkpoint's tensors are of another size)";
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
  for_each_checkpoint_shard(path, weights_name, [&](const StateDict& shard) {
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
// LR scheduler

void CheckpointIO::save_lr_scheduler(LRScheduler& scheduler, const std::string& path) {
  std::string text = scheduler.to_json();
  write_on_rank0(world_, [&] { io::atomic_write_file(path, text); });
}

void CheckpointIO::load_lr_scheduler(LRScheduler& scheduler, const std::string& path) {
  scheduler.load_state_dict(LRScheduler::from_json(read_text(path)));
}

}  // namespace booster::checkpoint
