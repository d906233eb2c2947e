// environment.h — starting the distributed environment, ColossalAI-style:
// launch(), launch_from_torch(), launch_from_slurm(), launch_from_openmpi(), and from the standard
// command-line flags (--host --port --rank --world_size --backend).
//
// Each launch_* reads its variables (env_from_* can be called alone, e.g. in tests), rendezvous
// through c10d::TCPStore, sets the intra-op thread count, and makes the group the process's world
// (booster::dist::world()). Calling a launch twice throws.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "booster/dist/process_group.h"
#include "booster/export.h"

namespace booster::dist {

// Missing or malformed environment variables / flags. The message names each variable.
class BOOSTER_API EnvError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string host = "127.0.0.1";
  int port = 29500;
  std::string backend = "gloo";
  bool use_agent_store = false;  // torchrun's TORCHELASTIC_USE_AGENT_STORE=True
  int restart_count = 0;         // TORCHELASTIC_RESTART_COUNT
};

struct LaunchOptions {
  double timeout_s = 1800;   // collective + rendezvous timeout, seconds
  int threads_per_rank = 0;  // intra-op threads; 0 = max(1, hardware cores / local_world_size)
};

// torchrun / `booster run` contract: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT (LOCAL_WORLD_SIZE defaults to WORLD_SIZE, LOCAL_RANK to RANK when absent).
// Throws EnvError listing every missing required variable.
BOOSTER_API DistEnv env_from_torch();
// SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS), SLURM_LOCALID; SLURM_NTASKS_PER_NODE optional.
BOOSTER_API DistEnv env_from_slurm(const std::string& host, int port);
// OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK (+ _LOCAL_SIZE optional).
BOOSTER_API DistEnv env_from_openmpi(const std::string& host, int port);

// Parses and removes --host --port --rank --world_size --backend (also "--flag=value") from args.
// has_rank is false when --rank is absent (not an explicit launch; env then holds only the host,
// port and backend given). Throws EnvError on a bad value.
struct FlagsResult {
  bool has_rank = false;  // --rank given: an explicit launch
  DistEnv env;
};
BOOSTER_API FlagsResult parse_launch_flags(std::vector<std::string>& args);

BOOSTER_API std::shared_ptr<ProcessGroup> launch(int rank, int world_size, const std::string& host,
                                                 int port, const std::string& backend = "gloo",
                                                 const LaunchOptions& options = {});
BOOSTER_API std::shared_ptr<ProcessGroup> launch(const DistEnv& env, const LaunchOptions& options = {});
BOOSTER_API std::shared_ptr<ProcessGroup> launch_from_torch(const LaunchOptions& options = {});
BOOSTER_API std::shared_ptr<ProcessGroup> launch_from_slurm(const std::string& host, int port,
                                                            const LaunchOptions& options = {});
BOOSTER_API std::shared_ptr<ProcessGroup> launch_from_openmpi(const std::string& host, int port,
                                                              const LaunchOptions& options = {});
// Picks by what is present: explicit --rank flags, then RANK (torchrun / booster run), then
// OMPI_COMM_WORLD_RANK, then SLURM_PROCID, else a single process (rank 0 of 1).
// Removes the launch flags from args.
BOOSTER_API std::shared_ptr<ProcessGroup> launch_auto(std::vector<std::string>& args,
                                                      const LaunchOptions& options = {});

// The launched world group, or nullptr before launch.
BOOSTER_API std::shared_ptr<ProcessGroup> world();
// The environment used by the last launch (rank 0 of 1 before launch).
BOOSTER_API const DistEnv& current_env();

}  // namespace booster::dist
