// checkpoint_manager.cpp — one-commit checkpoint directories and the trainer state (see
// checkpoint_manager.h for the protocol).
#include "booster/checkpoint/checkpoint_manager.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <system_error>

#include "booster/checkpoint/safetensors.h"
#include "booster/dist/process_group.h"
#include "booster/io/atomic_write.h"
#include "booster/logging.h"
#include "checkpoint_io_detail.h"

namespace booster::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStepPrefix = "step_";
constexpr const char* kTmpPrefix = ".tmp-";
constexpr const char* kTrashPrefix = ".trash-";

// The step of a directory name "step_<digits>", or -1.
int64_t step_of(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0) return -1;
  const std::string digits = name.substr(std::strlen(kStepPrefix));
  if (digits.empty() || digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) return -1;
  return std::stoll(digits);
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0)
    throw io::IoError("booster: cannot rename " + from.string() + " to " + to.string() + ": " + std::strerror(errno));
}

void remove_all_or_throw(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
  if (ec) throw io::IoError("booster: cannot remove " + p.string() + ": " + ec.message());
}

// Every rank's error text ("" = success) -> one message naming the failing ranks, "" when none failed.
std::string agree_on_errors(const std::shared_ptr<dist::ProcessGroup>& world, const std::string& error) {
  if (!world || world->size() == 1) return error;
  const double failed = world->allreduce_scalar(error.empty() ? 0.0 : 1.0, dist::ReduceOp::MAX);
  if (failed == 0) return "";
  std::string message;
  for (int r = 0; r < world->size(); ++r) {
    const std::string e = world->broadcast_string(error, r);
    if (!e.empty()) message += (message.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + e;
  }
  return message;
}

}  // namespace

CheckpointManager::CheckpointManager(std::string root, std::shared_ptr<dist::ProcessGroup> world, int keep_last_n)
    : root_(std::move(root)), world_(std::move(world)), keep_last_n_(keep_last_n) {
  if (root_.empty()) throw std::invalid_argument("booster: CheckpointManager needs a root directory, got an empty path");
  if (keep_last_n_ < 0)
    throw std::invalid_argument("booster: keep_last_n must be >= 0 (0 keeps every checkpoint), got " +
                                std::to_string(keep_last_n_));
}

CheckpointManager::~CheckpointManager() {
  if (use_async_) wait_async_save_noexcept();
}

void CheckpointManager::set_async(bool use_async, const AsyncSavePolicy& policy) {
  check_async_policy(policy);
  use_async_ = use_async;
  async_policy_ = policy;
}

void CheckpointManager::wait() { wait_async_save(world_.get()); }

std::string CheckpointManager::step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s%09lld", kStepPrefix, static_cast<long long>(step));
  return buf;
}

namespace {
std::vector<int64_t> steps_in(const std::string& root_dir) {
  std::vector<int64_t> out;
  std::error_code ec;
  if (!fs::is_directory(root_dir, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root_dir, ec)) {
    const int64_t s = step_of(entry.path().filename().string());
    if (s >= 0 && entry.is_directory(ec)) out.push_back(s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Step 4 (rank 0): commit `tmp` as step_<S>, point `latest` at it, prune.
void commit_set(const std::string& root_, const std::string& tmp, int64_t step, int keep_last_n_) {
  const fs::path root(root_);
  const std::string name = CheckpointManager::step_name(step);
  const std::string dir = (root / name).string();
  const int pid = static_cast<int>(::getpid());
  io::fsync_directory(tmp);
  std::error_code ec;
  if (fs::exists(dir, ec)) rename_or_throw(dir, root / (kTrashPrefix + name + "-" + std::to_string(pid)));
  rename_or_throw(tmp, dir);
  io::fsync_directory(root_);
  io::atomic_write_file((root / "latest").string(), name + "\n");
  if (keep_last_n_ > 0) {
    std::vector<int64_t> all = steps_in(root_);
    std::vector<int64_t> prune;
    for (size_t i = 0; i + static_cast<size_t>(keep_last_n_) < all.size(); ++i)
      if (all[i] != step) prune.push_back(all[i]);
    for (int64_t s : prune) {
      const fs::path trash = root / (kTrashPrefix + CheckpointManager::step_name(s) + "-" + std::to_string(pid));
      rename_or_throw(root / CheckpointManager::step_name(s), trash);
    }
    if (!prune.empty()) io::fsync_directory(root_);
    for (const auto& entry : fs::directory_iterator(root))
      if (entry.path().filename().string().rfind(kTrashPrefix, 0) == 0) remove_all_or_throw(entry.path());
  } else {
    const fs::path trash = root / (kTrashPrefix + name + "-" + std::to_string(pid));
    if (fs::exists(trash, ec)) remove_all_or_throw(trash);
  }
}
}  // namespace

std::vector<int64_t> CheckpointManager::steps() const { return steps_in(root_); }

std::optional<std::string> CheckpointManager::latest() const {
  const fs::path root(root_);
  std::error_code ec;
  if (fs::is_regular_file(root / "latest", ec)) {
    try {
      std::string name = io_detail::read_text((root / "latest").string());
      while (!name.empty() && (name.back() == '\n' || name.back() == '\r' || name.back() == ' ')) name.pop_back();
      if (step_of(name) >= 0 && fs::is_directory(root / name, ec)) return (root / name).string();
    } catch (const std::exception&) {
      // unreadable pointer: fall back to the directories themselves
    }
  }
  const std::vector<int64_t> all = steps();
  if (all.empty()) return std::nullopt;
  return (root / step_name(all.back())).string();
}

std::string CheckpointManager::save(int64_t step, const std::function<void(const std::string& dir)>& fill) {
  if (step < 0) throw std::invalid_argument("booster: checkpoint step must be >= 0, got " + std::to_string(step));
  const fs::path root(root_);
  const std::string name = step_name(step);
  const bool leader = !world_ || world_->rank() == 0;
  std::unique_ptr<StagedSave> staged;
  if (use_async_ && !begin_async_save(world_.get(), async_policy_, (root / name).string())) return "";
  // 1. A fresh temporary directory (rank 0), its name shared.
  std::string tmp;
  io_detail::write_on_rank0(world_, [&] {
    fs::create_directories(root);
    for (const auto& entry : fs::directory_iterator(root)) {
      const std::string n = entry.path().filename().string();
      if (n.rfind(kTmpPrefix, 0) == 0 || n.rfind(kTrashPrefix, 0) == 0) remove_all_or_throw(entry.path());
    }
    tmp = (root / (kTmpPrefix + name + "-" + std::to_string(::getpid()))).string();
    fs::create_directory(tmp);
  });
  if (world_ && world_->size() > 1) tmp = world_->broadcast_string(tmp, 0);
  // 2-3. Every rank fills it; all agree on the outcome.
  std::string error;
  try {
    if (use_async_) {
      staged = std::make_unique<StagedSave>(tmp, "", async_policy_, (root / name).string());
      staged->run([&] { fill(tmp); });
    } else {
      fill(tmp);
    }
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "exception without message";
  }
  error = agree_on_errors(world_, error);
  if (!error.empty()) {
    if (leader) {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    throw CheckpointError("booster: checkpoint " + name + " in " + root_ + " was not saved (nothing committed): " + error);
  }
  // 4. Commit, point `latest` at it, prune (asynchronous: rank 0's background writer, once every
  // rank's part is durable).
  const std::string dir = (root / name).string();
  if (staged) {
    staged->submit(
        world_.get(), [root = root_, tmp, step, keep = keep_last_n_] { commit_set(root, tmp, step, keep); },
        [tmp] {
          std::error_code ec;
          fs::remove_all(tmp, ec);
        });
    return dir;
  }
  wait_async_save(world_.get());  // an asynchronous save that fill started must be complete first
  io_detail::write_on_rank0(world_, [&] { commit_set(root_, tmp, step, keep_last_n_); });
  return dir;
}

// ---------------------------------------------------------------------------------------------
// Trainer state

namespace {

std::string rng_file(const std::string& dir, int rank) {
  return (fs::path(dir) / ("rng_state_rank" + std::to_string(rank) + ".bin")).string();
}

}  // namespace

void save_trainer_state(const std::string& dir, const TrainerState& state,
                        const std::shared_ptr<dist::ProcessGroup>& world) {
  const int rank = world ? world->rank() : 0;
  std::string error;
  try {
    at::Tensor rng;
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      rng = gen.get_state();
    }
    io::write_new_file(rng_file(dir, rank),
                       std::string_view(static_cast<const char*>(rng.data_ptr()), static_cast<size_t>(rng.nbytes())));
  } catch (const std::exception& e) {
    error = e.what();
  }
  error = agree_on_errors(world, error);
  if (!error.empty()) throw CheckpointError("booster: saving the generator states into " + dir + " failed: " + error);
  // Every rank's sums, in rank order (one broadcast per rank).
  nlohmann::json mine = nlohmann::json::object();
  for (const auto& [k, v] : state.sums) mine[k] = v;
  nlohmann::json sums = nlohmann::json::array();
  const int size = world ? world->size() : 1;
  for (int r = 0; r < size; ++r)
    sums.push_back(nlohmann::json::parse(size > 1 ? world->broadcast_string(mine.dump(), r) : mine.dump()));
  io_detail::write_on_rank0(world, [&] {
    nlohmann::json j;
    j["epoch"] = state.epoch;
    j["step_in_epoch"] = state.step_in_epoch;
    j["global_step"] = state.global_step;
    j["world_size"] = size;
    j["sums"] = sums;
    j["config"] = state.config;
    io::write_new_file((fs::path(dir) / "trainer_state.json").string(), j.dump(2) + "\n");
  });
}

TrainerState load_trainer_state(const std::string& dir, const std::shared_ptr<dist::ProcessGroup>& world) {
  const std::string path = (fs::path(dir) / "trainer_state.json").string();
  const std::string text = io_detail::read_text(path);
  TrainerState state;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    state.epoch = j.at("epoch").get<int64_t>();
    state.step_in_epoch = j.at("step_in_epoch").get<int64_t>();
    state.global_step = j.at("global_step").get<int64_t>();
    state.world_size = j.at("world_size").get<int>();
    const nlohmann::json& sums = j.at("sums");
    if (!sums.is_array()) throw std::invalid_argument("sums is not a list with one object per rank");
    const size_t rank = world ? static_cast<size_t>(world->rank()) : 0;
    if (rank < sums.size())
      for (const auto& [k, v] : sums.at(rank).items()) state.sums.emplace_back(k, v.get<double>());
    state.config = j.value("config", std::string());
    if (state.epoch < 0 || state.step_in_epoch < 0 || state.global_step < 0)
      throw std::invalid_argument("a negative epoch or step");
  } catch (const std::exception& e) {
    throw CheckpointError("booster: " + path + " is not a trainer state (" + e.what() +
                          "); it needs integers epoch, step_in_epoch, global_step, world_size and a list sums");
  }
  const int rank = world ? world->rank() : 0;
  const std::string file = rng_file(dir, rank);
  std::error_code ec;
  if (!fs::exists(file, ec)) return state;
  const std::string bytes = io_detail::read_text(file);
  at::Tensor rng;
  {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
    if (static_cast<size_t>(rng.nbytes()) != bytes.size())
      throw CheckpointError("booster: " + file + " holds " + std::to_string(bytes.size()) + " bytes, LibTorch's CPU "
                            "generator state is " + std::to_string(rng.nbytes()) + " (not a generator state file)");
    std::memcpy(rng.data_ptr(), bytes.data(), bytes.size());
    gen.set_state(rng);
  }
  state.generator_restored = true;
  return state;
}

}  // namespace booster::checkpoint
