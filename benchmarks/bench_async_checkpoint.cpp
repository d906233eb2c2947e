// bench_async_checkpoint — how long a checkpoint save blocks the training loop, asynchronous
// (booster/checkpoint/async_save.h) against blocking, through CheckpointManager (one-commit sets).
// The driver is benchmarks/drivers/async_checkpoint.py.
//
//   bench_async_checkpoint --dir DIR --case gpt|big --reps 3 [--tensors 16 --tensor_kb 65536] --out r.json
//
// Cases:
//  - gpt: the GPT example's model (examples/gpt, the sizes of examples/configs/gpt_ddp.toml:
//    4 layers, C 256, n_ctx 128) and its AdamW state after real training steps (batch 16 x 128
//    random bytes); a set holds model/ (safetensors) + optimizer/ (exp_avg, exp_avg_sq, step) +
//    trainer_state.json, what the examples' checkpoints hold. Between two saves the loop trains
//    `steps` steps, so the values change under the background writer.
//  - big: a state dict of `tensors` float32 tensors of `tensor_kb` KiB (default 16 x 64 MiB =
//    1 GiB), saved sharded at 256 MiB.
// Per mode (blocking, async), `reps` saves: blocked_s = the time save() took on the training
// thread; for async also done_s = from save() returning until the set was committed (the
// background writer). Before each save the previous one is waited for (not timed), so blocked_s
// is the staging cost, not waiting for a busy writer. Limit: memcpy_s, one clone of the same bytes
// (staging copies every byte once, so it cannot be faster). Correctness: after the last async save
// the loop changes the parameters; the committed files must hold the values of save time (checked
// against a snapshot; exit 3 otherwise), and the async set's model file must equal the blocking
// one's byte for byte for the same values (checked in the big case, where values do not change).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "bench_common.h"
#include "booster/checkpoint/async_save.h"
#include "booster/checkpoint/checkpoint_manager.h"
#include "booster/checkpoint/state_dict_io.h"
#include "booster/nn/tensor_parallel.h"
#include "gpt/model.h"

using namespace booster::bench;
namespace ckpt = booster::checkpoint;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::string nums(const std::vector<double>& v) {
  std::vector<std::string> s;
  for (double x : v) s.push_back(json_num(x));
  return json_arr(s);
}

int run(const Args& a) {
  at::set_num_threads(static_cast<int>(a.integer("threads", 1)));
  const std::string dir = a.str("dir", "");
  if (dir.empty()) throw std::invalid_argument("--dir is required");
  const std::string which = a.str("case", "gpt");
  const int reps = static_cast<int>(a.integer("reps", 3));
  const int steps = static_cast<int>(a.integer("steps", 2));
  torch::manual_seed(1234);

  // The state and how the loop changes it.
  ckpt::StateDict model_state;
  std::function<ckpt::StateDict()> optimizer_state = [] { return ckpt::StateDict{}; };
  std::function<void()> train_step = [] {};
  std::shared_ptr<gpt::GPTImpl> net;
  std::shared_ptr<torch::optim::AdamW> adamw;
  if (which == "gpt") {
    gpt::GPTConfig cfg;
    cfg.n_ctx = 128;
    net = std::make_shared<gpt::GPTImpl>(cfg);  // one process: the default context, tp = 1
    adamw = std::make_shared<torch::optim::AdamW>(net->parameters(), torch::optim::AdamWOptions(3e-3));
    train_step = [&] {
      auto idx = torch::randint(0, 256, {16, 129}, torch::kLong);
      auto logits = net->forward(idx.narrow(1, 0, 128));
      auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, 256}), idx.narrow(1, 1, 128).reshape({-1}));
      adamw->zero_grad();
      loss.backward();
      adamw->step();
    };
    train_step();
    for (const auto& p : net->named_parameters()) model_state.emplace_back(p.key(), p.value().detach());
    for (const auto& b : net->named_buffers()) model_state.emplace_back(b.key(), b.value());
    optimizer_state = [&] {
      ckpt::StateDict out;
      for (const auto& p : net->named_parameters()) {
        auto it = adamw->state().find(p.value().unsafeGetTensorImpl());
        if (it == adamw->state().end()) continue;
        auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
        out.emplace_back(p.key() + ".exp_avg", s.exp_avg());
        out.emplace_back(p.key() + ".exp_avg_sq", s.exp_avg_sq());
        out.emplace_back(p.key() + ".step", torch::tensor(s.step()));
      }
      return out;
    };
  } else if (which == "big") {
    const int64_t count = a.integer("tensors", 16), kb = a.integer("tensor_kb", 64 << 10);
    for (int64_t i = 0; i < count; ++i)
      model_state.emplace_back("layers." + std::to_string(i) + ".weight", torch::rand({kb * 1024 / 4 / 1024, 1024}));
  } else {
    throw std::invalid_argument("--case must be gpt or big, got " + which);
  }
  int64_t bytes = 0;
  for (auto& [n, t] : model_state) bytes += t.nbytes();
  for (auto& [n, t] : optimizer_state()) bytes += t.nbytes();

  auto fill = [&](const std::string& d) {
    ckpt::SaveOptions so;
    so.shard = true;
    so.size_per_shard_mb = 256;
    ckpt::save_state_dict(d + "/model", model_state, so);
    if (which == "gpt") ckpt::save_state_dict(d + "/optimizer", optimizer_state(), so, "optimizer");
    ckpt::TrainerState ts;
    ckpt::save_trainer_state(d, ts, nullptr);
  };

  std::vector<std::pair<std::string, std::string>> out{{"case", json_str(which)}, {"bytes", json_int(bytes)}};
  // The limit: one copy of every byte.
  std::vector<double> memcpy_s;
  for (int r = 0; r < reps; ++r) {
    double t0 = now_s();
    int64_t sink = 0;
    for (auto& [n, t] : model_state) sink += t.clone().numel();
    for (auto& [n, t] : optimizer_state()) sink += t.clone().numel();
    memcpy_s.push_back(now_s() - t0);
    if (sink < 0) return 4;
  }
  std::vector<double> step_s;
  for (int r = 0; r < 3 && which == "gpt"; ++r) {
    double t0 = now_s();
    train_step();
    step_s.push_back(now_s() - t0);
  }
  out.emplace_back("memcpy_s", nums(memcpy_s));
  out.emplace_back("step_s", nums(step_s));

  for (const std::string mode : {"sync", "async"}) {
    const std::string root = dir + "/" + mode;
    fs::remove_all(root);
    ckpt::CheckpointManager m(root, nullptr, /*keep_last_n=*/2);
    m.set_async(mode == "async");
    std::vector<double> blocked, done;
    int64_t steps_during = 0;
    at::Tensor snapshot;
    for (int r = 0; r < reps; ++r) {
      m.wait();  // not timed: the writer is idle before each save
      for (int s = 0; s < steps; ++s) train_step();
      snapshot = model_state.front().second.clone();
      double t0 = now_s();
      m.save(r + 1, fill);
      const double t1 = now_s();
      blocked.push_back(t1 - t0);
      // Training continues while the writer works (gpt); big: nothing to train.
      while (which == "gpt" && ckpt::async_save_in_flight()) {
        train_step();
        ++steps_during;
      }
      m.wait();
      done.push_back(now_s() - t1);
    }
    // Files of the last save hold the values of save time.
    ckpt::StateDict loaded = ckpt::load_state_dict(root + "/" + ckpt::CheckpointManager::step_name(reps) + "/model");
    if (!at::equal(loaded.front().second, snapshot)) {
      std::cerr << "bench_async_checkpoint: " << mode << ": the committed " << loaded.front().first
                << " differs from its value at save time\n";
      return 3;
    }
    out.emplace_back(mode, json_obj({{"blocked_s", nums(blocked)}, {"done_s", nums(done)},
                                     {"steps_during_write", json_int(steps_during)}}));
  }
  if (which == "big") {
    for (const auto& e : fs::directory_iterator(dir + "/sync/" + ckpt::CheckpointManager::step_name(reps) + "/model")) {
      const std::string other = dir + "/async/" + ckpt::CheckpointManager::step_name(reps) + "/model/" +
                                e.path().filename().string();
      if (slurp(e.path().string()) != slurp(other)) {
        std::cerr << "bench_async_checkpoint: " << other << " differs from the blocking save's\n";
        return 3;
      }
    }
  }
  if (a.has("out")) write_file(a.str("out", ""), json_obj(out));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return booster::bench::guarded_main("bench_async_checkpoint", [&] { return run(Args(argc, argv)); });
}
