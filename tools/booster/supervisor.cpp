// supervisor.cpp — `booster run`'s process supervision (see supervisor.h for the contract).
//
// One thread, one poll() loop over: a signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP, all blocked) and
// the read ends of every rank's stdout/stderr pipes. Ranks are started with fork + execve: the
// launcher never loads LibTorch or OpenMP and has no other threads, so forking is safe, and the
// child only makes async-signal-safe calls before execve.
#include "supervisor.h"

#include "hostfile.h"
#include "process_util.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern char** environ;

namespace booster::cli {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxLine = size_t{1} << 20;   // longer lines are split
constexpr size_t kReadChunk = 64 * 1024;        // per read() from a rank's pipe
constexpr auto kGiveUpAfterKill = std::chrono::seconds(3);

// One of a rank's output pipes: complete lines go to `out_fd` with the rank's prefix.
struct Stream {
  int fd = -1;       // read end, non-blocking; -1 once closed
  int out_fd = -1;   // STDOUT_FILENO or STDERR_FILENO
  std::string buf;   // bytes after the last newline
};

struct Rank {
  int local_rank = 0;
  int global_rank = 0;
  std::string prefix;     // "[rank R]: " ("" for a node started through ssh: its lines carry ranks)
  std::string label;      // "rank R", or "node K (HOST)" in --hostfile mode
  std::vector<std::string> argv;  // the program and its arguments
  int stdin_write = -1;   // --hostfile mode: write end of the node's stdin pipe, closed to stop it
  pid_t pid = -1;         // also its process-group id
  bool exited = false;    // reaped
  bool group_gone = false;
  Stream out, err;
};

class Launcher {
 public:
  explicit Launcher(const RunOptions& o) : opts_(o) {}

  int run() {
    std::string error;
    std::string program = resolve_program(nodes() ? node_argv(0)[0] : opts_.command[0], &error);
    if (program.empty()) {
      log_error(error);
      return kRunCannotExec;
    }
    try {
      master_port_ = nodes() ? opts_.master_port : resolve_master_port(opts_);
    } catch (const std::exception& e) {
      log_error(e.what());
      return kRunUsageError;
    }
    if (!setup_signals()) return kRunRankFailed;
    // Orphaned helpers of the ranks are re-parented to us (and reaped), not to init.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull_ < 0) {
      log_error(std::string("cannot open /dev/null: ") + std::strerror(errno));
      return kRunRankFailed;
    }
    // torchrun's elastic restarts: a failed attempt (a rank failed; not a signal to the launcher)
    // is followed by a new one with every rank (every node) started afresh, up to max_restarts
    // times. A launcher given --restart_count runs one attempt: another launcher restarts it.
    for (restart_ = std::max(0, opts_.restart_count);; ++restart_) {
      run_attempt(program);
      if (exit_code_ != kRunRankFailed || restart_ >= opts_.max_restarts || opts_.restart_count >= 0) break;
      if (!opts_.master_port_given) {
        try {
          // A new rendezvous: a free port here; on other hosts, the next port.
          master_port_ = nodes() ? opts_.master_port + restart_ + 1 : resolve_master_port(opts_);
        } catch (const std::exception& e) {
          log_error(e.what());
          break;
        }
      }
      log_error(std::string("restarting all ") + (nodes() ? "nodes" : "ranks") + " (restart " +
                std::to_string(restart_ + 1) + " of " + std::to_string(opts_.max_restarts) + ", MASTER_PORT " +
                std::to_string(master_port_) + ")");
    }
    ::close(signal_fd_);
    ::close(devnull_);
    return exit_code_;
  }

 private:
  // One attempt: starts every local rank and supervises them until all are gone.
  void run_attempt(const std::string& program) {
    ranks_.clear();
    stopping_ = killed_ = false;
    exit_code_ = kRunOk;
    const int children = nodes() ? static_cast<int>(opts_.node_hosts.size()) : opts_.nproc_per_node;
    ranks_.resize(static_cast<size_t>(children));
    for (int i = 0; i < children; ++i) {
      Rank& r = ranks_[static_cast<size_t>(i)];
      r.local_rank = i;
      r.global_rank = opts_.node_rank * opts_.nproc_per_node + i;
      if (nodes()) {
        r.label = "node " + std::to_string(i) + " (" + opts_.node_hosts.at(static_cast<size_t>(i)) + ")";
        r.argv = node_argv(i);
      } else {
        r.label = "rank " + std::to_string(r.global_rank);
        r.prefix = "[" + r.label + "]: ";
        r.argv = opts_.command;
      }
      r.out.out_fd = STDOUT_FILENO;
      r.err.out_fd = STDERR_FILENO;
    }
    int spawned = 0;
    for (Rank& r : ranks_) {
      int code = spawn(r, program);
      if (code != kRunOk) {
        begin_stop(SIGTERM, code);
        break;
      }
      ++spawned;
    }
    // Ranks never started count as exited.
    for (size_t i = static_cast<size_t>(spawned); i < ranks_.size(); ++i) {
      if (ranks_[i].pid < 0) {
        ranks_[i].exited = true;
        ranks_[i].group_gone = true;
      }
    }
    loop();
    for (Rank& r : ranks_) {
      drain(r, r.out);
      drain(r, r.err);
      close_stream(r, r.out);
      close_stream(r, r.err);
    }
    close_node_stdins();
  }

  bool nodes() const { return !opts_.node_hosts.empty(); }

  // --hostfile mode: the command that starts node `node` of this attempt.
  std::vector<std::string> node_argv(int node) const {
    return node_command(opts_, opts_.node_hosts, node, master_port_, opts_.launcher_path, opts_.cwd,
                        opts_.node_environment, restart_);
  }

  // --hostfile mode: end of file on every node's stdin, so each remote launcher stops its ranks
  // (--stop_on_stdin_eof) even if its ssh process outlived our signals.
  void close_node_stdins() {
    for (Rank& r : ranks_) {
      if (r.stdin_write >= 0) ::close(r.stdin_write);
      r.stdin_write = -1;
    }
  }

  bool setup_signals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
    if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0) {
      log_error(std::string("sigprocmask: ") + std::strerror(errno));
      return false;
    }
    signal_fd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signal_fd_ < 0) {
      log_error(std::string("signalfd: ") + std::strerror(errno));
      return false;
    }
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    ::sigaction(SIGPIPE, &ign, nullptr);  // a closed stdout must not kill the launcher
    return true;
  }

  std::vector<std::string> rank_environment(const Rank& r) const {
    const char* overridden[] = {"RANK",        "LOCAL_RANK",  "WORLD_SIZE",
                                "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                                "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS"};
    std::vector<std::string> env;
    bool has_omp = false;
    for (char** e = environ; *e; ++e) {
      std::string kv(*e);
      std::string key = kv.substr(0, kv.find('='));
      if (key == "OMP_NUM_THREADS") has_omp = true;
      if (std::find(std::begin(overridden), std::end(overridden), key) != std::end(overridden)) continue;
      env.push_back(std::move(kv));
    }
    env.push_back("RANK=" + std::to_string(r.global_rank));
    env.push_back("LOCAL_RANK=" + std::to_string(r.local_rank));
    env.push_back("WORLD_SIZE=" + std::to_string(opts_.nnodes * opts_.nproc_per_node));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(opts_.nproc_per_node));
    env.push_back("GROUP_RANK=" + std::to_string(opts_.node_rank));
    env.push_back("MASTER_ADDR=" + opts_.master_addr);
    env.push_back("MASTER_PORT=" + std::to_string(master_port_));
    env.push_back("TORCHELASTIC_RESTART_COUNT=" + std::to_string(restart_));
    env.push_back("TORCHELASTIC_MAX_RESTARTS=" + std::to_string(opts_.max_restarts));
    if (!has_omp) env.push_back("OMP_NUM_THREADS=1");
    return env;
  }

  // Starts rank `r`; returns kRunOk, kRunCannotExec (execve failed) or kRunRankFailed.
  int spawn(Rank& r, const std::string& program) {
    std::vector<std::string> env;
    if (nodes())
      for (char** e = environ; *e; ++e) env.emplace_back(*e);
    else
      env = rank_environment(r);
    std::vector<char*> envp, argv;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> args = r.argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    // A node's stdin is a pipe we hold open: ssh forwards its end of file to the remote launcher.
    int in[2] = {-1, -1};
    if (nodes() && ::pipe2(in, O_CLOEXEC) != 0) return fail_errno("pipe");
    const int stdin_fd = nodes() ? in[0] : devnull_;

    int out[2], err[2], exec_err[2];
    auto close_stdin = [&] {
      if (in[0] >= 0) close_pair(in);
    };
    if (::pipe2(out, O_CLOEXEC) != 0) {
      close_stdin();
      return fail_errno("pipe");
    }
    if (::pipe2(err, O_CLOEXEC) != 0) {
      close_stdin();
      close_pair(out);
      return fail_errno("pipe");
    }
    if (::pipe2(exec_err, O_CLOEXEC) != 0) {
      close_stdin();
      close_pair(out);
      close_pair(err);
      return fail_errno("pipe");
    }
    sigset_t empty;
    sigemptyset(&empty);
    const pid_t launcher_pid = ::getpid();
    const char* path = program.c_str();

    pid_t pid = ::fork();
    if (pid < 0) {
      close_stdin();
      close_pair(out);
      close_pair(err);
      close_pair(exec_err);
      return fail_errno("fork");
    }
    if (pid == 0) {
      // Child: async-signal-safe calls only.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
      if (::getppid() != launcher_pid) _exit(127);  // the launcher died before prctl
      ::dup2(stdin_fd, STDIN_FILENO);
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      ::sigaction(SIGPIPE, &dfl, nullptr);
      ::sigprocmask(SIG_SETMASK, &empty, nullptr);
      ::execve(path, argv.data(), envp.data());
      int e = errno;
      ssize_t ignored = ::write(exec_err[1], &e, sizeof(e));
      (void)ignored;
      _exit(127);
    }
    ::setpgid(pid, pid);  // also in the parent, so the group exists before we ever signal it
    if (nodes()) {
      ::close(in[0]);
      r.stdin_write = in[1];
    }
    ::close(out[1]);
    ::close(err[1]);
    ::close(exec_err[1]);
    r.pid = pid;
    r.out.fd = out[0];
    r.err.fd = err[0];
    ::fcntl(out[0], F_SETFL, ::fcntl(out[0], F_GETFL) | O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, ::fcntl(err[0], F_GETFL) | O_NONBLOCK);

    int child_errno = 0;
    ssize_t n;
    do {
      n = ::read(exec_err[0], &child_errno, sizeof(child_errno));
    } while (n < 0 && errno == EINTR);
    ::close(exec_err[0]);
    if (n == static_cast<ssize_t>(sizeof(child_errno))) {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      r.exited = true;
      r.group_gone = true;
      log_error("cannot execute '" + r.argv[0] + "' for " + r.label +
                ": " + std::strerror(child_errno));
      return kRunCannotExec;
    }
    return kRunOk;
  }

  int fail_errno(const char* what) {
    log_error(std::string(what) + " failed: " + std::strerror(errno));
    return kRunRankFailed;
  }

  static void close_pair(int p[2]) {
    ::close(p[0]);
    ::close(p[1]);
  }

  // Sends `sig` to every rank's process group that still exists.
  void signal_groups(int sig) {
    for (Rank& r : ranks_) {
      if (r.pid <= 0 || r.group_gone) continue;
      if (::kill(-r.pid, sig) != 0 && errno == ESRCH) {
        if (r.exited)
          r.group_gone = true;
        else
          ::kill(r.pid, sig);  // not reaped yet, so the pid is still ours
      }
    }
  }

  bool any_group_alive() {
    bool alive = false;
    for (Rank& r : ranks_) {
      if (r.pid <= 0 || r.group_gone) continue;
      if (::kill(-r.pid, 0) == 0 || errno == EPERM) {
        alive = true;
      } else if (r.exited) {
        r.group_gone = true;
      } else {
        alive = true;
      }
    }
    return alive;
  }

  // Starts stopping the job (no-op if already stopping): `sig` to every group, SIGKILL later.
  void begin_stop(int sig, int exit_code) {
    if (stopping_) return;
    stopping_ = true;
    exit_code_ = exit_code;
    signal_groups(sig);
    close_node_stdins();
    kill_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(opts_.kill_grace_seconds));
  }

  void kill_all() {
    if (killed_) return;
    killed_ = true;
    signal_groups(SIGKILL);
    give_up_at_ = Clock::now() + kGiveUpAfterKill;
  }

  void on_signal(int sig) {
    if (sig == SIGCHLD) return;  // reaped at the top of the loop
    if (!stopping_) {
      log_error("received " + signal_name(sig) + "; forwarding it to the ranks");
      begin_stop(sig, 128 + sig);
    } else if (!killed_) {
      log_error("received " + signal_name(sig) + " again; killing the ranks");
      kill_all();
    }
  }

  void reap() {
    while (true) {
      int status = 0;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid < 0 && errno == EINTR) continue;
      if (pid <= 0) return;
      auto it = std::find_if(ranks_.begin(), ranks_.end(), [&](const Rank& r) { return r.pid == pid; });
      if (it == ranks_.end()) continue;  // an orphaned helper re-parented to us
      Rank& r = *it;
      r.exited = true;
      bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !stopping_) {
        drain(r, r.out);  // its last words come before our message
        drain(r, r.err);
        std::string what = WIFEXITED(status)
                               ? "exited with code " + std::to_string(WEXITSTATUS(status))
                               : "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                                     signal_name(WTERMSIG(status)) + ")";
        log_error(r.label + " (pid " + std::to_string(pid) + ") " + what +
                  (ranks_.size() == 1 ? "; stopping the job"
                                      : nodes() ? "; stopping the other nodes" : "; stopping the other ranks"));
        begin_stop(SIGTERM, kRunRankFailed);
      }
    }
  }

  bool all_exited() const {
    return std::all_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.exited; });
  }

  void loop() {
    bool cleanup_started = false;
    while (true) {
      reap();
      bool done = all_exited();
      if (done) {
        if (!cleanup_started) {
          cleanup_started = true;
          // Every rank is gone; stop whatever they left behind in their process groups.
          if (any_group_alive()) begin_stop(SIGTERM, exit_code_);
        }
        if (!any_group_alive()) return;
      }
      auto now = Clock::now();
      if (stopping_ && !killed_ && now >= kill_at_) kill_all();
      if (killed_ && now >= give_up_at_) {
        if (!done) log_error("some ranks did not exit after SIGKILL; giving up on them");
        return;
      }

      int timeout_ms = -1;
      auto until = [&](Clock::time_point t) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
        int v = static_cast<int>(std::max<long long>(0, std::min<long long>(ms, 60000)));
        timeout_ms = timeout_ms < 0 ? v : std::min(timeout_ms, v);
      };
      if (stopping_ && !killed_) until(kill_at_);
      if (killed_) until(give_up_at_);
      if (done) until(now + std::chrono::milliseconds(20));  // poll for the groups to empty

      std::vector<pollfd> fds;
      std::vector<std::pair<Rank*, Stream*>> owners;
      fds.push_back({signal_fd_, POLLIN, 0});
      owners.push_back({nullptr, nullptr});
      const bool watch_stdin = opts_.stop_on_stdin_eof && !stdin_closed_;
      if (watch_stdin) {
        fds.push_back({STDIN_FILENO, POLLIN, 0});
        owners.push_back({nullptr, nullptr});
      }
      for (Rank& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          owners.push_back({&r, s});
        }
      }
      int n = ::poll(fds.data(), fds.size(), timeout_ms);
      if (n < 0) {
        if (errno == EINTR) continue;
        log_error(std::string("poll failed: ") + std::strerror(errno));
        begin_stop(SIGTERM, kRunRankFailed);
        kill_all();
        continue;
      }
      if (fds[0].revents & POLLIN) {
        signalfd_siginfo info;
        while (::read(signal_fd_, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
          on_signal(static_cast<int>(info.ssi_signo));
        }
      }
      if (watch_stdin && (fds[1].revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL))) on_stdin();
      for (size_t i = watch_stdin ? 2 : 1; i < fds.size(); ++i) {
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) read_once(*owners[i].first, *owners[i].second);
      }
    }
  }

  // --stop_on_stdin_eof: input is read and dropped; end of file (or a read error) stops the ranks.
  void on_stdin() {
    char chunk[4096];
    const ssize_t n = ::read(STDIN_FILENO, chunk, sizeof(chunk));
    if (n > 0 || (n < 0 && (errno == EINTR || errno == EAGAIN))) return;
    stdin_closed_ = true;
    if (stopping_) return;
    log_error("stdin was closed (the launcher that started this node through --hostfile is gone); "
              "stopping the ranks");
    begin_stop(SIGTERM, kRunRankFailed);
  }

  // Emits the complete lines in s.buf (and, if `flush`, the rest as a last line).
  void emit(const Rank& r, Stream& s, bool flush) {
    std::string out;
    size_t start = 0;
    while (true) {
      size_t nl = s.buf.find('\n', start);
      if (nl == std::string::npos) break;
      out += r.prefix;
      out.append(s.buf, start, nl - start + 1);
      start = nl + 1;
    }
    if (start < s.buf.size() && (flush || s.buf.size() - start >= kMaxLine)) {
      out += r.prefix;
      out.append(s.buf, start, std::string::npos);
      out += '\n';
      start = s.buf.size();
    }
    s.buf.erase(0, start);
    if (!out.empty()) write_all(s.out_fd, out.data(), out.size());
  }

  // One read(); returns false when the stream is closed or would block.
  bool read_once(const Rank& r, Stream& s) {
    if (s.fd < 0) return false;
    char chunk[kReadChunk];
    ssize_t n = ::read(s.fd, chunk, sizeof(chunk));
    if (n > 0) {
      s.buf.append(chunk, static_cast<size_t>(n));
      emit(r, s, false);
      return true;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) return errno == EINTR;
    close_stream(r, s);  // EOF or error
    return false;
  }

  // Reads whatever is already in the pipe.
  void drain(const Rank& r, Stream& s) {
    while (read_once(r, s)) {
    }
  }

  void close_stream(const Rank& r, Stream& s) {
    if (s.fd >= 0) {
      ::close(s.fd);
      s.fd = -1;
    }
    emit(r, s, true);
  }

  const RunOptions& opts_;
  int master_port_ = 0;  // resolve_master_port(opts_)
  int restart_ = 0;      // attempts restarted so far (TORCHELASTIC_RESTART_COUNT)
  std::vector<Rank> ranks_;
  int signal_fd_ = -1;
  int devnull_ = -1;
  bool stopping_ = false;
  bool stdin_closed_ = false;  // --stop_on_stdin_eof saw end of file
  bool killed_ = false;
  int exit_code_ = kRunOk;
  Clock::time_point kill_at_{};
  Clock::time_point give_up_at_{};
};

}  // namespace

int run_launcher(const RunOptions& options) {
  std::string problem = validate_run_options(options);
  if (!problem.empty()) {
    log_error(problem);
    return kRunUsageError;
  }
  ensure_standard_fds();
  Launcher launcher(options);
  return launcher.run();
}

}  // namespace booster::cli
