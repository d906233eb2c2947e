// atomic_write.h — the one crash-safe writer of the SDK. Every file the SDK writes for later use
// (checkpoints, the effective config, scheduler state, an example's progress marker) goes through
// it, so a crash or SIGKILL at any moment leaves either the complete old content or the complete
// new content under the target name, never a mix or a truncated file.
//
// The protocol (the POSIX recipe for durable replacement): write into a fresh temporary next to the
// target (same directory, hence same file system), fsync it, rename it over the target, then fsync
// the parent directory so the rename itself survives a power loss. A directory cannot be renamed
// over a non-empty one, so directories are swapped with renameat2(RENAME_EXCHANGE) and the old one
// is removed afterwards. Temporaries are named `<target>.tmp-<pid>-<n>`; a crash can leave one
// behind (never under the target's name).
#pragma once

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "booster/export.h"

namespace booster::io {

class WriteInterceptor;  // below

// An I/O failure: the message names the path, the operation and the errno text.
class BOOSTER_API IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file opened for writing with write(2). By default it must not exist yet (O_EXCL: writers fill
// fresh temporaries); with `exclusive = false` an existing file is truncated (a format writer asked
// to write to a path of the caller's choosing). `sync_and_close()` fsyncs and closes, reporting late
// write errors; without it the destructor only closes (the caller is failing anyway).
class BOOSTER_API OutputFile {
 public:
  // Throws IoError when the file cannot be created (or exists, when exclusive).
  explicit OutputFile(std::string path, bool exclusive = true);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  // Writes all `size` bytes (retries short writes and EINTR). Throws IoError (errno text).
  void write(const void* data, size_t size);
  // A hint that about `bytes` will be written in all: a file being staged (WriteInterceptor below)
  // allocates its buffer at once instead of growing it; no effect on a real file.
  void reserve(size_t bytes) {
    if (staged_) buffer_.reserve(bytes);
  }
  // fsync + close. Throws IoError; afterwards write() must not be called.
  void sync_and_close();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  WriteInterceptor* staged_ = nullptr;
  bool exclusive_ = true;  // set: the bytes go to buffer_, handed over at sync_and_close
  std::string buffer_;
};

// Creates `path` (must not exist) holding `bytes`, fsynced. Throws IoError.
BOOSTER_API void write_new_file(const std::string& path, std::string_view bytes);

// fsync of a directory (makes renames and creations inside it durable). Throws IoError.
BOOSTER_API void fsync_directory(const std::string& path);

// Replaces the file `path` with `bytes` atomically (see the protocol above). Missing parent
// directories are created. A symlink at `path` is replaced by a regular file, as rename(2) does.
// Throws IoError when `path` is a directory, names no file (empty, trailing '/'), or any step fails;
// then the previous content of `path` is intact and the temporary is removed.
BOOSTER_API void atomic_write_file(const std::string& path, std::string_view bytes);

// Replaces the directory `dir` atomically with one that `fill(tmp)` populates: `fill` creates files
// inside the fresh, empty directory `tmp` (each fsynced, e.g. with write_new_file or OutputFile), then
// `tmp` is fsynced and exchanged with `dir` (renamed when `dir` does not exist yet; its parents are
// created). A symlink at `dir` is followed: the directory it points to is replaced. Where the file
// system lacks RENAME_EXCHANGE the old directory is first moved to `<dir>.old-<pid>-<n>` (a crash
// between the two renames leaves the complete old checkpoint there). Throws IoError when `dir` is
// not a usable name or exists as a non-directory, or when a step fails; exceptions from `fill`
// propagate unchanged. On any exception `tmp` is removed and `dir` is intact, except when only the
// final fsync of the parent failed: then the new directory is in place but may not be durable.
BOOSTER_API void atomic_write_directory(const std::string& dir, const std::function<void(const std::string& tmp)>& fill);

// The second half of atomic_write_directory for a directory (or file) `tmp` that is already
// complete and whose files are fsynced: fsyncs `tmp` (when a directory), puts it in place of
// `target` (exchanged with an existing directory, whose old content is then removed; renamed
// otherwise), and fsyncs the parent. Used by the asynchronous writer to commit a save
// (booster/checkpoint/async_save.h). Throws IoError; on failure before the rename `target` is intact.
BOOSTER_API void install_replacement(const std::string& tmp, const std::string& target);

// ---- Staging hook (asynchronous saves) --------------------------------------------------------------
// While a thread has a WriteInterceptor installed, the writers above hand their work to it instead
// of touching the file system: OutputFile buffers its bytes in memory and passes them on at
// sync_and_close(); write_new_file and atomic_write_file pass the bytes on; atomic_write_directory
// asks the interceptor for the directory `fill` should write into (no temporary, no rename: the
// interceptor's own commit provides the atomicity). fsync_directory is not intercepted (the
// redirected directories exist). Each hook returns false (or "") for a path it does not take, which
// is then written the normal way. The one
// implementation is booster/checkpoint/async_save.cpp (staging of asynchronous checkpoint saves).
// Per thread: another thread's writes are never intercepted.
class BOOSTER_API WriteInterceptor {
 public:
  virtual ~WriteInterceptor();
  // Takes (copies) the content of file `path`. `replace`: the file may exist (atomic_write_file,
  // OutputFile with exclusive = false). True when taken.
  virtual bool take_file(const std::string& path, std::string_view bytes, bool replace) = 0;
  // The same for a buffer the caller gives up (OutputFile's): may move it instead of copying.
  virtual bool take_buffer(const std::string& path, std::string&& bytes, bool replace) {
    return take_file(path, bytes, replace);
  }
  // Whether OutputFile(path) should buffer (its bytes then arrive through take_file).
  virtual bool takes(const std::string& path) = 0;
  // The directory atomic_write_directory(dir, fill) should give to fill (created), or "" to go the
  // normal way.
  virtual std::string redirect_directory(const std::string& dir) = 0;
};
// Installs `interceptor` for the calling thread (nullptr removes it); returns the previous one.
BOOSTER_API WriteInterceptor* set_thread_write_interceptor(WriteInterceptor* interceptor);
BOOSTER_API WriteInterceptor* thread_write_interceptor();

}  // namespace booster::io
