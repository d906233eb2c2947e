// process_util.h — small POSIX helpers of `booster run`'s supervisor: writing to a pipe, the
// launcher's error lines, signal names, standard descriptors and the PATH lookup of the program.
#pragma once

#include <cstddef>
#include <string>

namespace booster::cli {

// Writes everything (retrying EINTR, waiting on EAGAIN); drops the data if the fd is broken
// (e.g. EPIPE: SIGPIPE is ignored in the launcher).
void write_all(int fd, const char* data, size_t n);

// Writes "booster run: MESSAGE\n" to stderr in one write.
void log_error(const std::string& message);

// "SIGTERM" for SIGTERM, ...; "signal N" for a signal without a name here.
std::string signal_name(int sig);

// Makes sure fds 0, 1, 2 are open, so pipes created later never land on them.
void ensure_standard_fds();

// PATH lookup like execvp, done up front so a missing program is one clear error.
// Returns the path to execve, or "" with *error set.
std::string resolve_program(const std::string& program, std::string* error);

}  // namespace booster::cli
