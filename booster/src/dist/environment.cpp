// environment.cpp — launch(), launch_from_torch/slurm/openmpi(), launch flags, the process's world.
#include "booster/dist/environment.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "booster/logging.h"

namespace booster::dist {

namespace {

std::mutex g_mutex;
std::shared_ptr<ProcessGroup> g_world;
DistEnv g_env;

// Reads the named variables; collects every missing one so the error lists them all.
struct EnvReader {
  std::vector<std::string> missing;
  std::vector<std::string> bad;

  std::string str(const char* name, bool required, const std::string& fallback = "") {
    const char* v = std::getenv(name);
    if (v && *v) return v;
    if (required) missing.push_back(name);
    return fallback;
  }
  int num(const char* name, bool required, int fallback = 0) {
    std::string s = str(name, required);
    if (s.empty()) return fallback;
    try {
      size_t pos = 0;
      long v = std::stol(s, &pos);
      if (pos != s.size() || v < INT_MIN || v > INT_MAX) throw std::invalid_argument(s);
      return static_cast<int>(v);
    } catch (const std::exception&) {
      bad.push_back(std::string(name) + "='" + s + "' (expected an integer)");
      return fallback;
    }
  }
  void check(const std::string& launcher) const {
    if (missing.empty() && bad.empty()) return;
    std::string msg = "booster: " + launcher + ":";
    if (!missing.empty()) {
      msg += " missing environment variable(s)";
      for (const auto& m : missing) msg += " " + m;
      msg += ";";
    }
    for (const auto& b : bad) msg += " bad value " + b + ";";
    msg += " start the job with the matching launcher, or call booster::dist::launch(rank, world_size, host, port)";
    throw EnvError(msg);
  }
};

void validate(const DistEnv& env, const std::string& launcher) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size)
    throw EnvError("booster: " + launcher + ": rank " + std::to_string(env.rank) + " is outside [0, world_size=" +
                   std::to_string(env.world_size) + ")");
  if (env.port < 1 || env.port > 65535)
    throw EnvError("booster: " + launcher + ": port " + std::to_string(env.port) + " is outside [1, 65535]");
  if (env.local_world_size < 1 || env.local_rank < 0 || env.local_rank >= env.local_world_size)
    throw EnvError("booster: " + launcher + ": local_rank " + std::to_string(env.local_rank) +
                   " is outside [0, local_world_size=" + std::to_string(env.local_world_size) + ")");
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Environment parsers

DistEnv env_from_torch() {
  EnvReader r;
  DistEnv env;
  env.rank = r.num("RANK", true);
  env.world_size = r.num("WORLD_SIZE", true, 1);
  env.host = r.str("MASTER_ADDR", true);
  env.port = r.num("MASTER_PORT", true, 29500);
  env.local_rank = r.num("LOCAL_RANK", false, env.rank);
  env.local_world_size = r.num("LOCAL_WORLD_SIZE", false, env.world_size);
  env.use_agent_store = r.str("TORCHELASTIC_USE_AGENT_STORE", false) == "True";
  env.restart_count = r.num("TORCHELASTIC_RESTART_COUNT", false, 0);
  r.check("launch_from_torch");
  validate(env, "launch_from_torch");
  return env;
}

DistEnv env_from_slurm(const std::string& host, int port) {
  EnvReader r;
  DistEnv env;
  env.rank = r.num("SLURM_PROCID", true);
  const char* ntasks = std::getenv("SLURM_NTASKS");
  env.world_size = (ntasks && *ntasks) ? r.num("SLURM_NTASKS", true, 1) : r.num("SLURM_NPROCS", false, -1);
  if (env.world_size == -1) r.missing.push_back("SLURM_NTASKS (or SLURM_NPROCS)");
  env.local_rank = r.num("SLURM_LOCALID", true);
  // SLURM_NTASKS_PER_NODE may be "4" or "4(x2)"; take the leading number.
  std::string per_node = r.str("SLURM_NTASKS_PER_NODE", false);
  env.local_world_size = env.world_size;
  if (!per_node.empty()) {
    char* end = nullptr;
    long v = std::strtol(per_node.c_str(), &end, 10);
    if (end == per_node.c_str() || v < 1 || v > INT_MAX || (*end != '\0' && *end != '('))
      r.bad.push_back("SLURM_NTASKS_PER_NODE='" + per_node + "' (expected a count like 4 or 4(x2))");
    else
      env.local_world_size = static_cast<int>(v);
  }
  env.host = host;
  env.port = port;
  r.check("launch_from_slurm");
  validate(env, "launch_from_slurm");
  return env;
}

DistEnv env_from_openmpi(const std::string& host, int port) {
  EnvReader r;
  DistEnv env;
  env.rank = r.num("OMPI_COMM_WORLD_RANK", true);
  env.world_size = r.num("OMPI_COMM_WORLD_SIZE", true, 1);
  env.local_rank = r.num("OMPI_COMM_WORLD_LOCAL_RANK", true);
  env.local_world_size = r.num("OMPI_COMM_WORLD_LOCAL_SIZE", false, env.world_size);
  env.host = host;
  env.port = port;
  r.check("launch_from_openmpi");
  validate(env, "launch_from_openmpi");
  return env;
}

FlagsResult parse_launch_flags(std::vector<std::string>& args) {
  FlagsResult result;
  std::vector<std::string> rest;
  bool has_world = false;
  auto to_int = [](const std::string& flag, const std::string& v) {
    try {
      size_t pos = 0;
      int x = std::stoi(v, &pos);
      if (pos != v.size()) throw std::invalid_argument(v);
      return x;
    } catch (const std::exception&) {
      throw EnvError("booster: " + flag + " expects an integer, got '" + v + "'");
    }
  };
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i], value;
    std::string flag = a;
    auto eq = a.find('=');
    if (a.rfind("--", 0) == 0 && eq != std::string::npos) {
      flag = a.substr(0, eq);
      value = a.substr(eq + 1);
    }
    static const std::vector<std::string> known{"--host", "--port", "--rank", "--world_size", "--backend"};
    if (std::find(known.begin(), known.end(), flag) == known.end()) {
      rest.push_back(a);
      continue;
    }
    if (eq == std::string::npos) {
      if (i + 1 >= args.size()) throw EnvError("booster: " + flag + " needs a value");
      value = args[++i];
    }
    if (flag == "--host") result.env.host = value;
    else if (flag == "--port") result.env.port = to_int(flag, value);
    else if (flag == "--rank") { result.env.rank = to_int(flag, value); result.has_rank = true; }
    else if (flag == "--world_size") { result.env.world_size = to_int(flag, value); has_world = true; }
    else if (flag == "--backend") result.env.backend = value;
  }
  if (result.has_rank != has_world)
    throw EnvError("booster: --rank and --world_size must be given together");
  if (result.has_rank) {
    result.env.local_rank = result.env.rank;
    result.env.local_world_size = result.env.world_size;
    validate(result.env, "command-line flags");
  }
  args = rest;
  return result;
}

// ---------------------------------------------------------------------------------------------
// Launch

std::shared_ptr<ProcessGroup> launch(const DistEnv& env, const LaunchOptions& options) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_world) throw EnvError("booster: the distributed environment is already launched (launch once per process)");
  validate(env, "launch");
  int threads = options.threads_per_rank;
  if (threads <= 0) {
    int cores = static_cast<int>(std::thread::hardware_concurrency());
    threads = std::max(1, cores / std::max(1, env.local_world_size));
  }
  at::set_num_threads(threads);
  log::set_rank(env.rank);
  RendezvousOptions ro;
  ro.host = env.host;
  ro.port = env.port;
  ro.rank = env.rank;
  ro.world_size = env.world_size;
  ro.backend = env.backend;
  ro.timeout_s = options.timeout_s;
  ro.use_agent_store = env.use_agent_store;
  ro.restart_count = env.restart_count;
  g_world = ProcessGroup::rendezvous(ro);
  g_env = env;
  return g_world;
}

std::shared_ptr<ProcessGroup> launch(int rank, int world_size, const std::string& host, int port,
                                     const std::string& backend, const LaunchOptions& options) {
  DistEnv env;
  env.rank = rank;
  env.world_size = world_size;
  env.local_rank = rank;
  env.local_world_size = world_size;
  env.host = host;
  env.port = port;
  env.backend = backend;
  return launch(env, options);
}

std::shared_ptr<ProcessGroup> launch_from_torch(const LaunchOptions& options) {
  return launch(env_from_torch(), options);
}
std::shared_ptr<ProcessGroup> launch_from_slurm(const std::string& host, int port, const LaunchOptions& options) {
  return launch(env_from_slurm(host, port), options);
}
std::shared_ptr<ProcessGroup> launch_from_openmpi(const std::string& host, int port, const LaunchOptions& options) {
  return launch(env_from_openmpi(host, port), options);
}

std::shared_ptr<ProcessGroup> launch_auto(std::vector<std::string>& args, const LaunchOptions& options) {
  FlagsResult flags = parse_launch_flags(args);
  if (flags.has_rank) return launch(flags.env, options);
  if (std::getenv("RANK")) {
    DistEnv env = env_from_torch();
    env.backend = flags.env.backend;
    return launch(env, options);
  }
  if (std::getenv("OMPI_COMM_WORLD_RANK")) return launch_from_openmpi(flags.env.host, flags.env.port, options);
  if (std::getenv("SLURM_PROCID")) return launch_from_slurm(flags.env.host, flags.env.port, options);
  DistEnv single;
  single.backend = flags.env.backend;
  return launch(single, options);
}

std::shared_ptr<ProcessGroup> world() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_world;
}

const DistEnv& current_env() { return g_env; }

}  // namespace booster::dist
