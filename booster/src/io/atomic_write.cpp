// atomic_write.cpp — the crash-safe writer (see booster/io/atomic_write.h).
#include "booster/io/atomic_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>

#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

namespace booster::io {
namespace {

namespace fs = std::filesystem;

std::string errno_text(int err) {
  char buf[256];
  return std::string(strerror_r(err, buf, sizeof(buf)));  // GNU strerror_r: returns the message
}

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int err) {
  throw IoError(what + " '" + path + "': " + errno_text(err));
}

std::atomic<uint64_t> g_temp_counter{0};

// `<target>.<kind>-<pid>-<n>`: unique per process and call.
std::string sibling_name(const std::string& target, const char* kind) {
  return target + "." + kind + "-" + std::to_string(::getpid()) + "-" + std::to_string(g_temp_counter++);
}

void remove_tree_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

int rename_exchange(const std::string& a, const std::string& b) {
  long rc = ::syscall(SYS_renameat2, AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE);
  return rc == 0 ? 0 : errno;
}

std::string parent_of(const fs::path& target) {
  const fs::path parent = target.parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

void create_parents(const std::string& parent) {
  std::error_code ec;
  fs::create_directories(parent, ec);
  if (ec) throw IoError("cannot create directory '" + parent + "': " + ec.message());
}

}  // namespace

// ---- OutputFile --------------------------------------------------------------------------------------

OutputFile::OutputFile(std::string path, bool exclusive) : path_(std::move(path)) {
  if (WriteInterceptor* w = thread_write_interceptor(); w && w->takes(path_)) {
    staged_ = w;
    exclusive_ = exclusive;
    return;
  }
  int fd;
  do {
    fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (exclusive ? O_EXCL : O_TRUNC), 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) throw_errno("cannot create", path_, errno);
  fd_ = fd;
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(const void* data, size_t size) {
  if (staged_) {
    buffer_.append(static_cast<const char*>(data), size);
    return;
  }
  if (fd_ < 0) throw IoError("cannot write '" + path_ + "': the file is already closed");
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, std::min<size_t>(size, size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("cannot write", path_, errno);
    }
    if (n == 0) throw IoError("cannot write '" + path_ + "': no progress");
    p += n;
    size -= static_cast<size_t>(n);
  }
}

void OutputFile::sync_and_close() {
  if (staged_) {
    WriteInterceptor* w = staged_;
    staged_ = nullptr;
    std::string bytes = std::move(buffer_);
    buffer_.clear();
    if (!w->take_buffer(path_, std::move(bytes), !exclusive_)) throw IoError("cannot stage '" + path_ + "' for an asynchronous save");
    return;
  }
  if (fd_ < 0) throw IoError("cannot sync '" + path_ + "': the file is already closed");
  // EINVAL/EROFS: a special file (e.g. /dev/null in a test) that has nothing to sync.
  if (::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS) throw_errno("cannot fsync", path_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR) throw_errno("cannot close", path_, errno);
}

void write_new_file(const std::string& path, std::string_view bytes) {
  if (WriteInterceptor* w = thread_write_interceptor(); w && w->take_file(path, bytes, /*replace=*/false)) return;
  OutputFile file(path);
  file.write(bytes.data(), bytes.size());
  file.sync_and_close();
}

void fsync_directory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_errno("cannot open directory", path, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL) throw_errno("cannot fsync directory", path, err);
}

// ---- one file -------------------------------------------------------------------------------------

void atomic_write_file(const std::string& path, std::string_view bytes) {
  const fs::path target(path);
  if (path.empty() || path.back() == '/' || target.filename() == "." || target.filename() == "..")
    throw IoError("cannot write '" + path + "': not a file name");
  if (WriteInterceptor* w = thread_write_interceptor(); w && w->take_file(path, bytes, /*replace=*/true)) return;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw IoError("cannot write file '" + path + "': a directory of that name exists");
  const std::string parent = parent_of(target);
  create_parents(parent);

  const std::string tmp = sibling_name(path, "tmp");
  try {
    write_new_file(tmp, bytes);
    if (::rename(tmp.c_str(), path.c_str()) != 0) throw_errno("cannot rename '" + tmp + "' to", path, errno);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(parent);  // the new content is in place; this makes the rename durable
}

// ---- one directory --------------------------------------------------------------------------------

void atomic_write_directory(const std::string& dir_in, const std::function<void(const std::string&)>& fill) {
  std::string dir = dir_in;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const fs::path target(dir);
  const std::string leaf = target.filename().string();
  if (dir.empty() || leaf.empty() || leaf == "." || leaf == "..")
    throw IoError("cannot write directory '" + dir_in + "': not a usable directory name");

  struct stat st {};
  bool exists = false;
  if (::lstat(dir.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {  // replace the directory the symlink points to, not the symlink
      std::error_code ec;
      const fs::path real = fs::canonical(target, ec);
      if (ec) throw IoError("cannot resolve symlink '" + dir + "': " + ec.message());
      return atomic_write_directory(real.string(), fill);
    }
    if (!S_ISDIR(st.st_mode)) throw IoError("cannot write directory '" + dir + "': it exists and is not a directory");
    exists = true;
  } else if (errno != ENOENT) {
    throw_errno("cannot stat", dir, errno);
  }
  if (WriteInterceptor* w = thread_write_interceptor()) {
    const std::string into = w->redirect_directory(dir);
    if (!into.empty()) {
      fill(into);
      return;
    }
  }
  const std::string parent = parent_of(target);
  if (!exists) create_parents(parent);

  const std::string tmp = sibling_name(dir, "tmp");
  if (::mkdir(tmp.c_str(), 0755) != 0) throw_errno("cannot create temporary directory", tmp, errno);
  try {
    fill(tmp);
    fsync_directory(tmp);
    bool swapped = false;  // true: the old directory is now at `tmp`
    if (exists) {
      const int err = rename_exchange(tmp, dir);
      if (err == 0) {
        swapped = true;
      } else if (err == EINVAL || err == ENOSYS || err == ENOTSUP || err == EOPNOTSUPP) {
        const std::string old = sibling_name(dir, "old");
        if (::rename(dir.c_str(), old.c_str()) != 0) throw_errno("cannot rename", dir, errno);
        if (::rename(tmp.c_str(), dir.c_str()) != 0) {
          const int e = errno;
          ::rename(old.c_str(), dir.c_str());
          throw_errno("cannot rename '" + tmp + "' to", dir, e);
        }
        fsync_directory(parent);
        remove_tree_quietly(old);
        return;
      } else {
        throw_errno("cannot replace", dir, err);
      }
    } else if (::rename(tmp.c_str(), dir.c_str()) != 0) {
      int err = errno;
      if (err != ENOTEMPTY && err != EEXIST) throw_errno("cannot rename '" + tmp + "' to", dir, err);
      err = rename_exchange(tmp, dir);  // someone created it meanwhile: swap with theirs
      if (err != 0) throw_errno("cannot replace", dir, err);
      swapped = true;
    }
    try {
      fsync_directory(parent);
    } catch (...) {
      if (swapped) remove_tree_quietly(tmp);
      throw;  // the new directory is in place but its rename may not be durable
    }
    if (swapped) remove_tree_quietly(tmp);
  } catch (...) {
    remove_tree_quietly(tmp);
    throw;
  }
}

void install_replacement(const std::string& tmp, const std::string& target) {
  struct stat st {};
  if (::stat(tmp.c_str(), &st) != 0) throw_errno("cannot install", tmp, errno);
  const std::string parent = parent_of(fs::path(target));
  if (!S_ISDIR(st.st_mode)) {
    if (::rename(tmp.c_str(), target.c_str()) != 0) throw_errno("cannot rename '" + tmp + "' to", target, errno);
    fsync_directory(parent);
    return;
  }
  fsync_directory(tmp);
  struct stat tst {};
  const bool exists = ::stat(target.c_str(), &tst) == 0;
  if (exists && !S_ISDIR(tst.st_mode)) throw IoError("cannot install directory '" + target + "': a file of that name exists");
  if (!exists) {
    create_parents(parent);
    if (::rename(tmp.c_str(), target.c_str()) != 0) throw_errno("cannot rename '" + tmp + "' to", target, errno);
    fsync_directory(parent);
    return;
  }
  int err = rename_exchange(tmp, target);
  if (err == 0) {
    fsync_directory(parent);
    remove_tree_quietly(tmp);  // the old directory
    return;
  }
  if (err != EINVAL && err != ENOSYS && err != ENOTSUP && err != EOPNOTSUPP) throw_errno("cannot replace", target, err);
  const std::string old = sibling_name(target, "old");
  if (::rename(target.c_str(), old.c_str()) != 0) throw_errno("cannot rename", target, errno);
  if (::rename(tmp.c_str(), target.c_str()) != 0) {
    const int e = errno;
    ::rename(old.c_str(), target.c_str());
    throw_errno("cannot rename '" + tmp + "' to", target, e);
  }
  fsync_directory(parent);
  remove_tree_quietly(old);
}

// ---- staging hook ---------------------------------------------------------------------------------

WriteInterceptor::~WriteInterceptor() = default;

namespace {
thread_local WriteInterceptor* t_interceptor = nullptr;
}

WriteInterceptor* set_thread_write_interceptor(WriteInterceptor* interceptor) {
  WriteInterceptor* previous = t_interceptor;
  t_interceptor = interceptor;
  return previous;
}
WriteInterceptor* thread_write_interceptor() { return t_interceptor; }

}  // namespace booster::io
