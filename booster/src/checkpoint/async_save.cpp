// async_save.cpp — staging of a save's files in host memory and the one background writer per
// process (see booster/checkpoint/async_save.h for the protocol).
#include "booster/checkpoint/async_save.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>

#include "booster/checkpoint/safetensors.h"  // CheckpointError
#include "booster/dist/process_group.h"
#include "booster/io/atomic_write.h"
#include "booster/logging.h"

namespace booster::checkpoint {

namespace fs = std::filesystem;

namespace async_detail {
// One staged file.
struct StagedFile {
  std::string path;
  std::string bytes;
  bool replace = false;
};
}  // namespace async_detail
using async_detail::StagedFile;

namespace {

std::string strip_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

std::string mib_text(int64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

// Every rank's error text ("" = success) -> one message naming the failing ranks, "" when none.
std::string agree(dist::ProcessGroup* world, const std::string& error) {
  if (!world || world->size() == 1) return error;
  if (world->allreduce_scalar(error.empty() ? 0.0 : 1.0, dist::ReduceOp::MAX) == 0) return "";
  std::string message;
  for (int r = 0; r < world->size(); ++r) {
    const std::string e = world->broadcast_string(error, r);
    if (!e.empty()) message += (message.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + e;
  }
  return message;
}

// Writes one file (no interceptor on this thread while it does).
void write_file(const StagedFile& f) {
  io::WriteInterceptor* saved = io::set_thread_write_interceptor(nullptr);
  try {
    std::error_code ec;
    const fs::path parent = fs::path(f.path).parent_path();
    if (!parent.empty()) fs::create_directories(parent, ec);
    if (ec) throw io::IoError("cannot create directory '" + parent.string() + "': " + ec.message());
    if (f.replace)
      io::atomic_write_file(f.path, f.bytes);
    else
      io::write_new_file(f.path, f.bytes);
  } catch (...) {
    io::set_thread_write_interceptor(saved);
    throw;
  }
  io::set_thread_write_interceptor(saved);
}

// The background writer of the calling (training) thread: at most one job. Per thread, so that
// ranks run as threads of one process (tests) each have their own; a process has one training thread.
struct Writer {
  std::mutex mutex;
  std::thread thread;
  std::atomic<bool> running{false};
  std::string error;  // of the finished job, until reported
  std::string what;   // the job's description
};

Writer& writer() {
  thread_local Writer* w = new Writer();  // never destroyed: a job may outlive the thread's exit
  return *w;
}

// Joins the finished or running job; returns (and clears) its error.
std::string join_local() {
  Writer& w = writer();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.thread.joinable()) w.thread.join();
  std::string e = std::move(w.error);
  w.error.clear();
  return e;
}

}  // namespace

// ---- staging ---------------------------------------------------------------------------------------

class StagedSave::Impl : public io::WriteInterceptor {
 public:
  Impl(std::string set_dir, std::string target, const AsyncSavePolicy& policy, std::string what)
      : set_dir_(strip_slashes(std::move(set_dir))),
        target_(target.empty() ? std::string() : strip_slashes(std::move(target))),
        limit_(policy.max_host_mib * (int64_t{1} << 20)),
        timeout_s_(policy.commit_timeout_s),
        what_(std::move(what)) {}

  // Where `path` goes, or nullopt when it is not part of this save.
  std::optional<std::string> map(const std::string& path_in) const {
    const std::string path = strip_slashes(path_in);
    auto under = [&](const std::string& base) {
      return !base.empty() && (path == base || (path.size() > base.size() && path.compare(0, base.size(), base) == 0 &&
                                                path[base.size()] == '/'));
    };
    if (under(set_dir_)) return path;
    if (under(target_)) return set_dir_ + path.substr(target_.size());
    return std::nullopt;
  }

  bool takes(const std::string& path) override { return map(path).has_value(); }

  bool take_file(const std::string& path, std::string_view bytes, bool replace) override {
    if (!map(path)) return false;
    return take_buffer(path, std::string(bytes), replace);  // the copy that later training steps cannot change
  }

  bool take_buffer(const std::string& path, std::string&& bytes, bool replace) override {
    const std::optional<std::string> where = map(path);
    if (!where) return false;
    const int64_t size = static_cast<int64_t>(bytes.size());
    StagedFile f{*where, std::move(bytes), replace};
    dirs_.insert(fs::path(*where).parent_path().string());
    ++files_;
    if (!blocking_ && bytes_ + size > limit_)
      go_blocking("it needs more host memory than max_host_mib allows (" + mib_text(bytes_ + size) + " so far, limit " +
                  mib_text(limit_) + "); raise checkpoint_async_max_mib / AsyncSavePolicy::max_host_mib to keep it "
                  "asynchronous");
    if (blocking_) {
      write_file(f);
      return true;
    }
    bytes_ += size;
    staged_.push_back(std::move(f));
    return true;
  }

  void go_blocking(const std::string& why) {
    if (blocking_) return;
    log::warn_all("booster: the asynchronous save of " + what_ + " is written blocking: " + why);
    blocking_ = true;
    for (const StagedFile& s : staged_) write_file(s);
    staged_.clear();
  }

  std::string redirect_directory(const std::string& dir) override {
    const std::optional<std::string> where = map(dir);
    if (!where) return "";
    std::error_code ec;
    fs::create_directories(*where, ec);
    if (ec) throw io::IoError("cannot create directory '" + *where + "': " + ec.message());
    dirs_.insert(*where);
    return *where;
  }

  // The background part of this rank; returns its error ("" = done).
  std::string write_all() {
    try {
      for (const StagedFile& f : staged_) write_file(f);
      staged_.clear();
      staged_.shrink_to_fit();
      std::error_code ec;
      for (const std::string& d : dirs_)
        if (!d.empty() && fs::is_directory(d, ec)) io::fsync_directory(d);
      return "";
    } catch (const std::exception& e) {
      return std::string(e.what()).empty() ? "exception without message" : e.what();
    }
  }

  std::string set_dir_, target_;
  int64_t limit_;
  double timeout_s_;
  std::string what_;
  std::vector<StagedFile> staged_;
  std::set<std::string> dirs_;
  int64_t bytes_ = 0, files_ = 0, pinned_bytes_ = 0;
  bool blocking_ = false;
};

StagedSave::StagedSave(std::string set_dir, std::string target, const AsyncSavePolicy& policy, std::string what)
    : impl_(std::make_shared<Impl>(std::move(set_dir), std::move(target), policy, std::move(what))) {}
StagedSave::~StagedSave() = default;

int64_t StagedSave::staged_bytes() const { return impl_->bytes_; }
int64_t StagedSave::staged_files() const { return impl_->files_; }
bool StagedSave::fell_back_to_blocking() const { return impl_->blocking_; }
int64_t StagedSave::pinned_bytes() const { return impl_->pinned_bytes_; }

at::Tensor host_copy_for_write(const at::Tensor& t) {
  if (t.device().is_cpu()) return t.contiguous();
  if (t.is_cuda()) {
    at::Tensor pinned;
    try {
      pinned = at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(true));
    } catch (const c10::Error& e) {
      static std::once_flag once;
      std::call_once(once, [&] {
        log::warn("booster: checkpoint writers copy GPU tensors through pageable host memory: pinned memory could "
                  "not be allocated (" + std::string(e.what_without_backtrace()) + ")");
      });
    }
    if (pinned.defined()) {
      pinned.copy_(t);  // synchronous: the bytes are read right after
      const int64_t n = static_cast<int64_t>(pinned.numel()) * static_cast<int64_t>(pinned.element_size());
      if (auto* staged = dynamic_cast<StagedSave::Impl*>(io::thread_write_interceptor())) staged->pinned_bytes_ += n;
      return pinned;
    }
  }
  return t.to(at::kCPU).contiguous();
}

void StagedSave::run(const std::function<void()>& save) {
  io::WriteInterceptor* previous = io::set_thread_write_interceptor(impl_.get());
  try {
    save();
  } catch (...) {
    io::set_thread_write_interceptor(previous);
    throw;
  }
  io::set_thread_write_interceptor(previous);
}

void StagedSave::submit(dist::ProcessGroup* world, std::function<void()> commit, std::function<void()> abandon) {
  const int rank = world ? world->rank() : 0;
  const int size = world ? world->size() : 1;
  log::info("booster: asynchronous save of " + impl_->what_ + ": " + std::to_string(impl_->files_) + " files, " +
            mib_text(impl_->bytes_) + " of host buffers on rank 0 (limit " + mib_text(impl_->limit_) +
            " per rank" +
            (impl_->pinned_bytes_ > 0 ? "; " + mib_text(impl_->pinned_bytes_) + " copied from the GPU through pinned memory"
                                      : std::string()) +
            "); the training loop continues while the background writer writes them");
  Writer& w = writer();
  std::lock_guard<std::mutex> lock(w.mutex);
  if (w.thread.joinable()) w.thread.join();  // begin_async_save waited already; never two at once
  w.what = impl_->what_;
  w.running = true;
  std::shared_ptr<Impl> job = impl_;
  // Test hook: a slow disk (the tests use it to have a save in flight for a while); read here, on
  // the calling thread, so that the test's setting at submit time is what counts.
  const char* delay = std::getenv("BOOSTER_ASYNC_SAVE_DELAY_MS");
  const int64_t delay_ms = delay ? std::atoll(delay) : 0;
  w.thread = std::thread([&w, job, rank, size, delay_ms, commit = std::move(commit), abandon = std::move(abandon)] {
    const std::string marker = job->set_dir_ + ".rank" + std::to_string(rank);
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    std::string error = job->write_all();
    try {
      if (error.empty())
        io::write_new_file(marker + ".done", "");
      else
        io::write_new_file(marker + ".error", error);
    } catch (const std::exception& e) {
      if (error.empty()) error = e.what();
    }
    if (rank == 0) {
      // Every rank's marker, or the timeout.
      std::vector<std::string> outcome(size);
      std::vector<bool> seen(size, false);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(job->timeout_s_);
      int missing = size;
      while (missing > 0) {
        for (int r = 0; r < size; ++r) {
          if (seen[r]) continue;
          const std::string m = job->set_dir_ + ".rank" + std::to_string(r);
          std::error_code ec;
          if (fs::exists(m + ".done", ec)) {
            seen[r] = true;
            --missing;
          } else if (fs::exists(m + ".error", ec)) {
            std::string text;
            if (FILE* f = std::fopen((m + ".error").c_str(), "rb")) {
              char buf[4096];
              size_t n;
              while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
              std::fclose(f);
            }
            outcome[r] = text.empty() ? "failed" : text;
            seen[r] = true;
            --missing;
          }
        }
        if (missing == 0 || std::chrono::steady_clock::now() > deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      std::string failures;
      for (int r = 0; r < size; ++r) {
        std::string e = !seen[r] ? "its part was not written within commit_timeout_s = " +
                                       std::to_string(static_cast<int64_t>(job->timeout_s_)) + " s (rank stopped?)"
                                 : outcome[r];
        if (r == 0 && !error.empty()) e = error;
        if (!e.empty()) failures += (failures.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + e;
      }
      try {
        if (failures.empty()) {
          commit();
        } else if (abandon) {
          abandon();
        }
      } catch (const std::exception& e) {
        failures += (failures.empty() ? "" : "; ") + std::string("commit: ") + e.what();
      }
      for (int r = 0; r < size; ++r) {
        std::error_code ec;
        fs::remove(job->set_dir_ + ".rank" + std::to_string(r) + ".done", ec);
        fs::remove(job->set_dir_ + ".rank" + std::to_string(r) + ".error", ec);
      }
      error = failures;
    }
    w.error = error;  // read only after join
    w.running = false;
  });
}

void write_staged_now(const std::string& why) {
  if (auto* staged = dynamic_cast<StagedSave::Impl*>(io::thread_write_interceptor())) staged->go_blocking(why);
}

// ---- sync points ------------------------------------------------------------------------------------

void check_async_policy(const AsyncSavePolicy& policy) {
  if (policy.max_host_mib < 1)
    throw std::invalid_argument("booster: AsyncSavePolicy::max_host_mib (checkpoint_async_max_mib) must be >= 1 MiB, got " +
                                std::to_string(policy.max_host_mib) + "; use a blocking save (use_async = false) instead");
  if (!(policy.commit_timeout_s > 0))
    throw std::invalid_argument("booster: AsyncSavePolicy::commit_timeout_s must be > 0 seconds, got " +
                                std::to_string(policy.commit_timeout_s));
}

bool async_save_in_flight() { return writer().running.load(); }

void wait_async_save(dist::ProcessGroup* world) {
  const std::string what = [] {
    Writer& w = writer();
    std::lock_guard<std::mutex> lock(w.mutex);
    return w.what;
  }();
  const std::string error = agree(world, join_local());
  if (!error.empty())
    throw CheckpointError("booster: the asynchronous save of " + what +
                          " failed and was not committed (the previous checkpoint is intact): " + error);
}

std::string wait_async_save_noexcept() noexcept {
  try {
    const std::string what = writer().what;
    const std::string error = join_local();
    if (!error.empty())
      log::error_all("booster: the asynchronous save of " + what + " failed and was not committed: " + error);
    return error;
  } catch (...) {
    return "unknown error while waiting for the asynchronous save";
  }
}

bool begin_async_save(dist::ProcessGroup* world, const AsyncSavePolicy& policy, const std::string& what) {
  check_async_policy(policy);
  const bool mine = async_save_in_flight();
  const bool any = world && world->size() > 1 ? world->allreduce_scalar(mine ? 1.0 : 0.0, dist::ReduceOp::MAX) > 0 : mine;
  if (any && policy.skip_if_busy) {
    log::warn_all("booster: skipped the save of " + what + ": the previous asynchronous save (" + writer().what +
                  ") is still being written (skip_if_busy; set it to false to wait instead)");
    return false;
  }
  wait_async_save(world);
  return true;
}

bool async_save(dist::ProcessGroup* world, const std::string& target_in, const AsyncSavePolicy& policy,
                const std::function<void()>& save) {
  if (io::thread_write_interceptor()) {  // part of an outer async save
    save();
    return true;
  }
  const std::string target = strip_slashes(target_in);
  if (target.empty()) throw std::invalid_argument("booster: an asynchronous save needs a target path, got an empty one");
  if (!begin_async_save(world, policy, target)) return false;
  const int rank = world ? world->rank() : 0;
  std::string set_dir = target + ".async-" + std::to_string(::getpid());
  if (world && world->size() > 1) set_dir = world->broadcast_string(set_dir, 0);
  std::string error;
  if (rank == 0) {
    try {
      std::error_code ec;
      fs::remove_all(set_dir, ec);  // a leftover of an earlier crash
      if (ec) throw io::IoError("cannot remove '" + set_dir + "': " + ec.message());
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  error = agree(world, error);
  if (!error.empty()) throw CheckpointError("booster: the asynchronous save of " + target + " could not start: " + error);
  StagedSave staged(set_dir, target, policy, target);
  try {
    staged.run(save);
  } catch (...) {
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(set_dir, ec);
    }
    throw;
  }
  staged.submit(
      world,
      [set_dir, target] {
        std::error_code ec;
        if (fs::exists(set_dir, ec)) io::install_replacement(set_dir, target);
      },
      [set_dir] {
        std::error_code ec;
        fs::remove_all(set_dir, ec);
      });
  return true;
}

}  // namespace booster::checkpoint
