// booster-ckpt — `booster ckpt inspect|convert`: look into and convert HuggingFace-layout
// checkpoints (safetensors / pytorch_model.bin, sharded or not). A separate executable because it
// links LibTorch; `booster ckpt ...` execs it so the launcher itself stays LibTorch-free.
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <map>
#include <set>

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

int inspect(const std::string& path, bool all, size_t max_rows) {
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"booster ckpt: inspect or convert HuggingFace-layout checkpoints", "booster ckpt"};
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
  CLI11_PARSE(app, argc, argv);
  try {
    if (ins->parsed()) return inspect(path, all, max_rows);
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
