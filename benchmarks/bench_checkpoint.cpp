// bench_checkpoint — save and load time of our checkpoint writer/reader
// (booster/checkpoint/state_dict_io.h: save_state_dict / load_state_dict, sharded) for one state
// dict, in safetensors and in .bin (torch pickle zip). The driver (benchmarks/drivers/checkpoint.py)
// compares the times with `dd` writing/reading the same number of bytes (the disk and page-cache
// limit, with and without fsync) and with Python torch.save / torch.load of the same dict
// (benchmarks/peers/torch_checkpoint.py).
//
//   bench_checkpoint --dir DIR --tensors 16 --tensor_mb 64 --shard_mb 256 --formats safetensors,bin
//                    --out results.json
//
// The dict is `tensors` float32 tensors of `tensor_mb` MiB each ("layers.<i>.weight", [rows, 1024]),
// filled from torch::rand with a fixed seed. Each format is saved to DIR/<format>, then loaded back.
// Correctness: every loaded tensor must equal the saved one (names, shapes, bytes); the program also
// writes a checksum per tensor (int64 sum of its 32-bit words, plus its first and last word), which
// the Python peer recomputes after torch.load of our .bin checkpoint and of its own file.
// Our save includes the fsyncs of its atomic write (files and directory), so its fair limit is
// `dd conv=fsync`. Loads read a file just written: warm page cache (dropping caches needs root).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <iostream>

#include "bench_common.h"
#include "booster/checkpoint/state_dict_io.h"

using namespace booster::bench;
namespace ckpt = booster::checkpoint;

namespace {

// Exact fingerprint of a float32 tensor's bytes: [sum of int32 words, first word, last word].
std::vector<int64_t> checksum(const at::Tensor& t) {
  at::Tensor words = t.contiguous().view(at::kInt).view({-1});
  return {words.sum(at::kLong).item<int64_t>(), words[0].item<int64_t>(), words[-1].item<int64_t>()};
}

int run(const Args& a) {
  at::set_num_threads(static_cast<int>(a.integer("threads", 1)));
  std::string dir = a.str("dir", "");
  if (dir.empty()) throw std::invalid_argument("--dir is required");
  int64_t count = a.integer("tensors", 16), tensor_mb = a.integer("tensor_mb", 64);
  int64_t tensor_kb = a.integer("tensor_kb", tensor_mb * 1024);  // smoke mode uses KiB sizes
  int64_t cols = 1024, rows = tensor_kb * 1024 / 4 / cols;

  at::manual_seed(1234);
  ckpt::StateDict state;
  for (int64_t i = 0; i < count; ++i)
    state.emplace_back("layers." + std::to_string(i) + ".weight", at::rand({rows, cols}));
  int64_t total_bytes = count * rows * cols * 4;

  std::vector<std::string> checksums;
  for (auto& [name, t] : state) {
    auto c = checksum(t);
    checksums.push_back(json_obj({{"name", json_str(name)},
                                  {"sum", json_int(c[0])},
                                  {"first", json_int(c[1])},
                                  {"last", json_int(c[2])}}));
  }

  std::vector<std::pair<std::string, std::string>> out{{"total_bytes", json_int(total_bytes)}};
  std::stringstream formats(a.str("formats", "safetensors,bin"));
  std::string format;
  while (std::getline(formats, format, ',')) {
    ckpt::SaveOptions so;
    so.shard = true;
    so.size_per_shard_mb = a.integer("shard_mb", 256);
    so.use_safetensors = format == "safetensors";
    if (format != "safetensors" && format != "bin") throw std::invalid_argument("unknown format " + format);
    std::string path = dir + "/" + format;

    double t0 = now_s();
    ckpt::save_state_dict(path, state, so, "model");
    double t_save = now_s() - t0;
    t0 = now_s();
    ckpt::StateDict loaded = ckpt::load_state_dict(path, "model");
    double t_load = now_s() - t0;

    // Correctness: same names in the same order, same shapes and bytes.
    if (loaded.size() != state.size()) {
      std::cerr << "bench_checkpoint: " << format << ": loaded " << loaded.size() << " tensors, saved "
                << state.size() << "\n";
      return 3;
    }
    for (size_t i = 0; i < state.size(); ++i) {
      if (loaded[i].first != state[i].first || !at::equal(loaded[i].second, state[i].second)) {
        std::cerr << "bench_checkpoint: " << format << ": tensor " << state[i].first
                  << " differs after save + load\n";
        return 3;
      }
    }
    out.emplace_back(format, json_obj({{"save_s", json_num(t_save)}, {"load_s", json_num(t_load)}}));
  }
  out.emplace_back("checksums", json_arr(checksums));
  if (a.has("out")) write_file(a.str("out", ""), json_obj(out));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return booster::bench::guarded_main("bench_checkpoint", [&] { return run(Args(argc, argv)); });
}
