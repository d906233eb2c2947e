// booster-ckpt — `booster ckpt inspect|convert|consolidate`: look into and convert HuggingFace-layout
// checkpoints (safetensors / pytorch_model.bin, sharded or not), and turn a sharded state checkpoint
// (booster-sharded-v1, checkpoint/sharded_state.h) into the gathered format. A separate executable
// because it links LibTorch; `booster ckpt ...` execs it so the launcher itself stays LibTorch-free.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "booster/checkpoint/sharded_state.h"
#include "booster/checkpoint/state_dict_adapter.h"
#include "booster/checkpoint/state_dict_io.h"

namespace fs = std::filesystem;
using namespace booster::checkpoint;

namespace {

std::string human_bytes(uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The files of a checkpoint: shards in order (an index lists them; else the single file).
std::vector<fs::path> checkpoint_files(const fs::path& path, std::string& format) {
  if (fs::is_regular_file(path)) {
    format = path.extension() == ".safetensors" ? "safetensors" : "bin";
    return {path};
  }
  if (!fs::is_directory(path)) throw CheckpointError("booster ckpt: " + path.string() + " does not exist");
  std::set<fs::path> files;
  for (const auto& e : fs::directory_iterator(path)) {
    std::string n = e.path().filename().string();
    bool st = n.size() > 12 && n.compare(n.size() - 12, 12, ".safetensors") == 0;
    bool bin = n.size() > 4 && n.compare(n.size() - 4, 4, ".bin") == 0;
    if (st || bin) {
      files.insert(e.path());
      format = st ? "safetensors" : "bin";
    }
  }
  if (files.empty()) throw CheckpointError("booster ckpt: no .safetensors or .bin files in " + path.string());
  return {files.begin(), files.end()};
}

// The bases of the sharded state checkpoints in directory `path` (<base>.sharded.json), sorted.
std::vector<std::string> sharded_bases(const fs::path& path) {
  std::set<std::string> bases;
  const std::string suffix = ".sharded.json";
  std::error_code ec;
  if (!fs::is_directory(path, ec)) return {};
  for (const auto& e : fs::directory_iterator(path, ec)) {
    std::string n = e.path().filename().string();
    if (n.size() > suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0)
      bases.insert(n.substr(0, n.size() - suffix.size()));
  }
  return {bases.begin(), bases.end()};
}

int inspect_sharded(const std::string& path, const std::string& base, bool all, size_t max_rows) {
  ShardedStateReader reader(path, base);
  std::cout << "format: booster-sharded-v1 (" << base << ".sharded.json)\n";
  std::cout << "world size: " << reader.world_size() << "\nfiles: " << reader.files().size() << "\n";
  for (const auto& f : reader.files())
    std::cout << "  " << fs::path(f).filename().string() << "  " << human_bytes(fs::file_size(f)) << "\n";
  uint64_t total = 0;
  size_t pieces = 0, partial = 0;
  std::map<std::string, size_t> dtypes;
  for (const auto& t : reader.tensors()) {
    total += static_cast<uint64_t>(t.covered) * c10::elementSize(t.dtype);
    pieces += t.pieces.size();
    if (t.covered != t.numel) ++partial;
    ++dtypes[safetensors_dtype(t.dtype)];
  }
  std::cout << "tensors: " << reader.tensors().size() << " in " << pieces << " pieces"
            << (partial ? " (" + std::to_string(partial) + " not fully covered)" : "") << "\n";
  std::cout << "total tensor bytes: " << total << " (" << human_bytes(total) << ")\ndtypes:";
  for (const auto& [d, n] : dtypes) std::cout << " " << d << " x" << n;
  std::cout << "\nextra files:";
  for (const auto& f : reader.extra_files()) std::cout << " " << f;
  std::cout << "\n";
  const auto& tensors = reader.tensors();
  size_t shown = all ? tensors.size() : std::min(tensors.size(), max_rows);
  for (size_t i = 0; i < shown; ++i) {
    const auto& t = tensors[i];
    std::cout << "  " << t.name << "  " << safetensors_dtype(t.dtype) << "  " << shape_str(t.shape) << "  pieces "
              << t.pieces.size() << " (ranks";
    std::set<int> ranks;
    for (const auto& p : t.pieces) ranks.insert(p.rank);
    for (int r : ranks) std::cout << " " << r;
    std::cout << ")" << (t.covered == t.numel ? "" : "  covered " + std::to_string(t.covered) + " of " + std::to_string(t.numel)) << "\n";
  }
  if (shown < tensors.size()) std::cout << "  ... " << tensors.size() - shown << " more (--all to list every tensor)\n";
  return 0;
}

int inspect(const std::string& path, bool all, size_t max_rows) {
  const std::vector<std::string> bases = sharded_bases(path);
  if (!bases.empty()) {
    for (size_t i = 0; i < bases.size(); ++i) {
      if (i) std::cout << "\n";
      inspect_sharded(path, bases[i], all, max_rows);
    }
    return 0;
  }
  std::string format;
  auto files = checkpoint_files(path, format);
  struct Row {
    std::string name, dtype, shape;
  };
  std::vector<Row> rows;
  std::map<std::string, size_t> dtypes;
  uint64_t total = 0;
  std::cout << "format: " << format << (files.size() > 1 ? " (sharded)" : "") << "\n";
  std::cout << "files: " << files.size() << "\n";
  for (const auto& f : files) {
    std::cout << "  " << f.filename().string() << "  " << human_bytes(fs::file_size(f)) << "\n";
    if (format == "safetensors") {
      auto h = read_safetensors_header(f.string());
      for (const auto& t : h.tensors) {
        rows.push_back({t.name, t.dtype, shape_str(t.shape)});
        ++dtypes[t.dtype];
        total += t.end - t.begin;
      }
    } else {
      for (const auto& [name, t] : read_bin(f.string())) {
        std::string dt = safetensors_dtype(t.scalar_type());
        rows.push_back({name, dt, shape_str(t.sizes().vec())});
        ++dtypes[dt];
        total += t.numel() * t.element_size();
      }
    }
  }
  std::cout << "tensors: " << rows.size() << "\ntotal tensor bytes: " << total << " (" << human_bytes(total) << ")\n";
  std::cout << "dtypes:";
  for (const auto& [d, n] : dtypes) std::cout << " " << d << " x" << n;
  std::cout << "\n";
  size_t shown = all ? rows.size() : std::min(rows.size(), max_rows);
  for (size_t i = 0; i < shown; ++i) std::cout << "  " << rows[i].name << "  " << rows[i].dtype << "  " << rows[i].shape << "\n";
  if (shown < rows.size()) std::cout << "  ... " << rows.size() - shown << " more (--all to list every tensor)\n";
  return 0;
}

// `convert --adapter`: the whole checkpoint is read (an offline tool), then written one tensor at a
// time through the adapter.
int convert_with_adapter(const std::string& path, const std::string& out, const std::string& to, int64_t shard_mb,
                         const std::string& name, const std::string& direction, const std::string& config_path) {
  nlohmann::json config;
  if (config_path.empty()) {
    config = read_config_json(path);
    if (config.empty())
      throw std::invalid_argument("booster ckpt convert: " + path + " has no config.json; give the model's "
                                  "HuggingFace config with --hf_config FILE");
  } else {
    std::ifstream in(config_path);
    if (!in) throw std::invalid_argument("booster ckpt convert: cannot read --hf_config " + config_path);
    try {
      config = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw std::invalid_argument("booster ckpt convert: --hf_config " + config_path + " is not JSON: " + e.what());
    }
  }
  std::shared_ptr<StateDictAdapter> adapter = make_state_dict_adapter(name, config);
  StateDict state = load_state_dict(path, "model");
  std::map<std::string, at::Tensor> by_name(state.begin(), state.end());
  std::vector<TensorSpec> specs;
  for (const auto& [n, t] : state) specs.push_back({n, t.scalar_type(), t.sizes().vec()});
  SaveOptions o;
  o.use_safetensors = to == "safetensors";
  o.shard = shard_mb > 0;
  if (shard_mb > 0) o.size_per_shard_mb = shard_mb;
  if (direction == "to_hf") {
    AdaptedModel adapted = adapt_model(*adapter, specs, "");
    AdaptedSave save = adapt_save(adapted.plan, [&](size_t j) { return by_name.at(adapted.plan[j].ours); });
    save_state_dict_streamed(out, save.specs, o, save.fetch, "model", adapted.extra_files);
    std::cout << "booster ckpt: wrote " << save.specs.size() << " tensors to " << out << " as "
              << adapter->architecture() << " (" << to << ", with config.json)\n";
    return 0;
  }
  std::vector<AdaptedTensor> plan = adapter->plan_from_hf(specs);
  std::vector<TensorSpec> ours;
  for (const auto& a : plan) ours.push_back({a.ours, a.hf.at(0).dtype, a.shape});
  save_state_dict_streamed(out, ours, o, [&](size_t j) {
    std::vector<at::Tensor> parts;
    for (const auto& h : plan[j].hf) parts.push_back(by_name.at(h.name));
    return from_hf(plan[j], parts).contiguous();
  });
  std::cout << "booster ckpt: wrote " << ours.size() << " tensors to " << out << " in the model's own layout (from "
            << adapter->architecture() << ")\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"booster ckpt: inspect, convert or consolidate checkpoints", "booster ckpt"};
  app.require_subcommand(1);
  std::string path, out, to = "safetensors", base = "model";
  bool all = false;
  size_t max_rows = 20;
  int64_t shard_mb = 0;
  auto* ins = app.add_subcommand("inspect", "Format, shards, tensor count, bytes, dtypes, and the tensors");
  ins->add_option("path", path, "checkpoint directory or file")->required();
  ins->add_flag("--all", all, "list every tensor");
  ins->add_option("--max", max_rows, "tensors to list without --all (default 20)");
  auto* conv = app.add_subcommand("convert", "Rewrite a checkpoint as safetensors or .bin, optionally sharded");
  conv->add_option("path", path, "checkpoint directory or file")->required();
  conv->add_option("out", out, "output directory (replaced atomically)")->required();
  conv->add_option("--to", to, "safetensors | bin")->check(CLI::IsMember({"safetensors", "bin"}))->required();
  conv->add_option("--size-per-shard-mb", shard_mb, "shard size in MiB (0 = one file)")->check(CLI::NonNegativeNumber);
  conv->add_option("--base", base, "file base name: model (default) or optimizer");
  std::string adapter_name, direction = "to_hf", hf_config_path;
  conv->add_option("--adapter", adapter_name,
                   "state-dict adapter (gpt2, llama, or one registered): rewrite the model tensors as that "
                   "HuggingFace architecture (--direction to_hf, default; writes config.json) or back "
                   "(from_hf)");
  conv->add_option("--direction", direction, "to_hf | from_hf (with --adapter)")
      ->check(CLI::IsMember({"to_hf", "from_hf"}));
  conv->add_option("--hf_config", hf_config_path,
                   "the HuggingFace config.json describing the model (default: <path>/config.json)");
  std::string sharded_base = "optimizer";
  auto* cons = app.add_subcommand("consolidate",
                                  "Rewrite a sharded state checkpoint (booster-sharded-v1) in the gathered format");
  cons->add_option("path", path, "sharded checkpoint directory (holds <base>.sharded.json)")->required();
  cons->add_option("out", out, "output directory (replaced atomically)")->required();
  cons->add_option("--size-per-shard-mb", shard_mb, "shard size in MiB (0 = one file)")->check(CLI::NonNegativeNumber);
  cons->add_option("--base", sharded_base, "file base name (default optimizer)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (ins->parsed()) return inspect(path, all, max_rows);
    if (cons->parsed()) {
      SaveOptions o;
      o.shard = shard_mb > 0;
      if (shard_mb > 0) o.size_per_shard_mb = shard_mb;
      size_t n = consolidate_sharded_state(path, out, o, sharded_base);
      std::cout << "booster ckpt: wrote " << n << " tensors to " << out << " in the gathered format\n";
      return 0;
    }
    if (!adapter_name.empty()) return convert_with_adapter(path, out, to, shard_mb, adapter_name, direction, hf_config_path);
    if (!hf_config_path.empty() || direction != "to_hf")
      throw std::invalid_argument("booster ckpt convert: --direction and --hf_config need --adapter NAME");
    StateDict state = load_state_dict(path, base);
    SaveOptions o;
    o.use_safetensors = to == "safetensors";
    o.shard = shard_mb > 0;
    if (shard_mb > 0) o.size_per_shard_mb = shard_mb;
    save_state_dict(out, state, o, base);
    std::cout << "booster ckpt: wrote " << state.size() << " tensors to " << out << " as " << to << "\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
