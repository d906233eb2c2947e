// process_util.cpp — small POSIX helpers of `booster run` (see process_util.h).
#include "process_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace booster::cli {

// Writes everything (retrying EINTR, waiting on EAGAIN); drops the data if the fd is broken
// (e.g. EPIPE: SIGPIPE is ignored in the launcher).
void write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, 1000);
        continue;
      }
      return;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
}

void log_error(const std::string& message) {
  std::string line = "booster run: " + message + "\n";
  write_all(STDERR_FILENO, line.data(), line.size());
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "signal " + std::to_string(sig);
  }
}

// Makes sure fds 0, 1, 2 are open, so pipes created later never land on them.
void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) == -1 && errno == EBADF) {
      int n = ::open("/dev/null", O_RDWR);
      if (n >= 0 && n != fd) {
        ::dup2(n, fd);
        ::close(n);
      }
    }
  }
}

// PATH lookup like execvp, done up front so a missing program is one clear error.
// Returns the path to execve, or "" with *error set.
std::string resolve_program(const std::string& program, std::string* error) {
  auto check = [&](const std::string& path) -> int {  // 0 if executable regular file, else errno
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return errno;
    if (S_ISDIR(st.st_mode)) return EISDIR;
    if (::access(path.c_str(), X_OK) != 0) return errno;
    return 0;
  };
  if (program.find('/') != std::string::npos) {
    int e = check(program);
    if (e != 0) {
      *error = "cannot execute '" + program + "': " + std::strerror(e);
      return "";
    }
    return program;
  }
  const char* env_path = std::getenv("PATH");
  std::string path_list = env_path ? env_path : "/usr/local/bin:/usr/bin:/bin";
  int first_error = 0;
  size_t start = 0;
  while (true) {
    size_t colon = path_list.find(':', start);
    std::string dir = path_list.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + program;
    int e = check(candidate);
    if (e == 0) return candidate;
    if (e != ENOENT && e != ENOTDIR && first_error == 0) first_error = e;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (first_error != 0)
    *error = "cannot execute '" + program + "' (found in PATH): " + std::strerror(first_error);
  else
    *error = "cannot execute '" + program + "': not found in PATH";
  return "";
}

}  // namespace booster::cli
