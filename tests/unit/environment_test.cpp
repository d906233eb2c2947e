// environment_test.cpp — env_from_torch/slurm/openmpi, parse_launch_flags, ProcessGroup rendezvous and collectives.

#include "booster/dist/environment.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "booster/device.h"
#include "booster/dist/process_group.h"
#include "common/test_util.h"
#include "common/tensor_test_util.h"

using booster::dist::DistError;
using booster::dist::DistEnv;
using booster::dist::EnvError;
using booster::dist::ProcessGroup;
using booster::dist::ReduceOp;
using booster::dist::RendezvousOptions;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::ThrowsMessage;

namespace {

using booster::testing::values_of;

// Every variable a launcher reads; each test starts with all of them unset.
const std::vector<std::string> kLaunchVars{
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS",
    "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};

// Saves the launch variables, unsets them, and restores them on destruction.
class ScopedLaunchEnv {
 public:
  ScopedLaunchEnv() {
    for (const auto& name : kLaunchVars) {
      const char* v = std::getenv(name.c_str());
      saved_.emplace_back(name, v ? std::optional<std::string>(v) : std::nullopt);
      ::unsetenv(name.c_str());
    }
  }
  ScopedLaunchEnv(const ScopedLaunchEnv&) = delete;
  ScopedLaunchEnv& operator=(const ScopedLaunchEnv&) = delete;
  ~ScopedLaunchEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) ::setenv(name.c_str(), value->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }
  void set(const std::string& name, const std::string& value) { ::setenv(name.c_str(), value.c_str(), 1); }
  void unset(const std::string& name) { ::unsetenv(name.c_str()); }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

void set_torch_env(ScopedLaunchEnv& env, const std::string& rank, const std::string& world) {
  env.set("RANK", rank);
  env.set("WORLD_SIZE", world);
  env.set("MASTER_ADDR", "10.1.2.3");
  env.set("MASTER_PORT", "29512");
}

std::vector<std::string> parse(std::vector<std::string> args, booster::dist::FlagsResult* out = nullptr) {
  auto r = booster::dist::parse_launch_flags(args);
  if (out) *out = r;
  return args;
}

std::shared_ptr<ProcessGroup> world1() {
  static auto w = ProcessGroup::rendezvous(RendezvousOptions{});
  return w;
}

}  // namespace

// ---- env_from_torch

TEST(Environment, TorchReadsAllVariables) {
  ScopedLaunchEnv env;
  set_torch_env(env, "3", "8");
  env.set("LOCAL_RANK", "1");
  env.set("LOCAL_WORLD_SIZE", "2");
  env.set("TORCHELASTIC_RESTART_COUNT", "2");
  DistEnv e = booster::dist::env_from_torch();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.host, "10.1.2.3");
  EXPECT_EQ(e.port, 29512);
  EXPECT_EQ(e.backend, "gloo");
  EXPECT_FALSE(e.use_agent_store);
  EXPECT_EQ(e.restart_count, 2);
}

TEST(Environment, TorchLocalDefaultsAndAgentStore) {
  ScopedLaunchEnv env;
  set_torch_env(env, "2", "4");
  DistEnv e = booster::dist::env_from_torch();
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_FALSE(e.use_agent_store);
  EXPECT_EQ(e.restart_count, 0);

  env.set("TORCHELASTIC_USE_AGENT_STORE", "True");
  EXPECT_TRUE(booster::dist::env_from_torch().use_agent_store);
  env.set("TORCHELASTIC_USE_AGENT_STORE", "False");
  EXPECT_FALSE(booster::dist::env_from_torch().use_agent_store);
}

TEST(Environment, TorchMissingVariablesAreAllNamed) {
  ScopedLaunchEnv env;
  EXPECT_THAT([] { booster::dist::env_from_torch(); },
              ThrowsMessage<EnvError>(AllOf(HasSubstr("launch_from_torch"),
                                            HasSubstr("missing environment variable(s) RANK WORLD_SIZE MASTER_ADDR "
                                                      "MASTER_PORT"),
                                            HasSubstr("start the job with the matching launcher"),
                                            HasSubstr("booster::dist::launch(rank, world_size, host, port)"))));
  env.set("RANK", "0");
  env.set("MASTER_PORT", "29500");
  EXPECT_THAT([] { booster::dist::env_from_torch(); },
              ThrowsMessage<EnvError>(AllOf(HasSubstr("missing environment variable(s) WORLD_SIZE MASTER_ADDR;"),
                                            Not(HasSubstr(" RANK")), Not(HasSubstr("MASTER_PORT")))));
  // An empty value counts as missing.
  set_torch_env(env, "0", "1");
  env.set("MASTER_ADDR", "");
  EXPECT_THAT([] { booster::dist::env_from_torch(); },
              ThrowsMessage<EnvError>(HasSubstr("missing environment variable(s) MASTER_ADDR;")));
}

TEST(Environment, TorchNonIntegerNamesVariableAndValue) {
  ScopedLaunchEnv env;
  set_torch_env(env, "1", "two");
  env.set("LOCAL_RANK", "1x");
  EXPECT_THAT([] { booster::dist::env_from_torch(); },
              ThrowsMessage<EnvError>(AllOf(HasSubstr("bad value WORLD_SIZE='two' (expected an integer)"),
                                            HasSubstr("bad value LOCAL_RANK='1x' (expected an integer)"),
                                            HasSubstr("start the job with the matching launcher"))));
}

TEST(Environment, TorchRankOutsideWorld) {
  ScopedLaunchEnv env;
  set_torch_env(env, "4", "4");
  EXPECT_THAT([] { booster::dist::env_from_torch(); },
              ThrowsMessage<EnvError>(AllOf(HasSubstr("launch_from_torch"),
                                            HasSubstr("rank 4 is outside [0, world_size=4)"))));
  set_torch_env(env, "-1", "4");
  EXPECT_THAT([] { booster::dist::env_from_torch(); },
              ThrowsMessage<EnvError>(HasSubstr("rank -1 is outside [0, world_size=4)")));
  set_torch_env(env, "0", "2");
  env.set("LOCAL_RANK", "2");
  env.set("LOCAL_WORLD_SIZE", "2");
  EXPECT_THAT([] { booster::dist::env_from_torch(); },
              ThrowsMessage<EnvError>(HasSubstr("local_rank 2 is outside [0, local_world_size=2)")));
  env.unset("LOCAL_RANK");
  env.unset("LOCAL_WORLD_SIZE");
  env.set("MASTER_PORT", "70000");
  EXPECT_THAT([] { booster::dist::env_from_torch(); },
              ThrowsMessage<EnvError>(HasSubstr("port 70000 is outside [1, 65535]")));
}

// ---- env_from_slurm / env_from_openmpi

TEST(Environment, SlurmReadsVariables) {
  ScopedLaunchEnv env;
  env.set("SLURM_PROCID", "5");
  env.set("SLURM_NTASKS", "8");
  env.set("SLURM_LOCALID", "1");
  env.set("SLURM_NTASKS_PER_NODE", "4(x2)");
  DistEnv e = booster::dist::env_from_slurm("node01", 1234);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.host, "node01");
  EXPECT_EQ(e.port, 1234);

  // SLURM_NPROCS instead of SLURM_NTASKS; without SLURM_NTASKS_PER_NODE the node holds the world.
  env.unset("SLURM_NTASKS");
  env.unset("SLURM_NTASKS_PER_NODE");
  env.set("SLURM_NPROCS", "6");
  e = booster::dist::env_from_slurm("h", 29500);
  EXPECT_EQ(e.world_size, 6);
  EXPECT_EQ(e.local_world_size, 6);
  env.set("SLURM_NTASKS_PER_NODE", "3");
  EXPECT_EQ(booster::dist::env_from_slurm("h", 29500).local_world_size, 3);
}

TEST(Environment, SlurmMissingVariables) {
  ScopedLaunchEnv env;
  EXPECT_THAT([] { booster::dist::env_from_slurm("h", 29500); },
              ThrowsMessage<EnvError>(AllOf(HasSubstr("launch_from_slurm"), HasSubstr("SLURM_PROCID"),
                                            HasSubstr("SLURM_NTASKS (or SLURM_NPROCS)"), HasSubstr("SLURM_LOCALID"),
                                            HasSubstr("start the job with the matching launcher"))));
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_LOCALID", "0");
  EXPECT_THAT([] { booster::dist::env_from_slurm("h", 29500); },
              ThrowsMessage<EnvError>(AllOf(HasSubstr("missing environment variable(s) SLURM_NTASKS (or "
                                                      "SLURM_NPROCS);"),
                                            Not(HasSubstr("SLURM_PROCID")))));
  env.set("SLURM_NTASKS", "x");
  EXPECT_THAT([] { booster::dist::env_from_slurm("h", 29500); },
              ThrowsMessage<EnvError>(HasSubstr("bad value SLURM_NTASKS='x' (expected an integer)")));
  env.set("SLURM_NTASKS", "2");
  env.set("SLURM_PROCID", "2");
  EXPECT_THAT([] { booster::dist::env_from_slurm("h", 29500); },
              ThrowsMessage<EnvError>(HasSubstr("rank 2 is outside [0, world_size=2)")));
}

TEST(Environment, OpenMpiReadsVariables) {
  ScopedLaunchEnv env;
  env.set("OMPI_COMM_WORLD_RANK", "3");
  env.set("OMPI_COMM_WORLD_SIZE", "4");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "2");
  DistEnv e = booster::dist::env_from_openmpi("master", 4321);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.host, "master");
  EXPECT_EQ(e.port, 4321);
  env.unset("OMPI_COMM_WORLD_LOCAL_SIZE");
  EXPECT_EQ(booster::dist::env_from_openmpi("master", 4321).local_world_size, 4);
}

TEST(Environment, OpenMpiMissingVariables) {
  ScopedLaunchEnv env;
  EXPECT_THAT([] { booster::dist::env_from_openmpi("h", 29500); },
              ThrowsMessage<EnvError>(AllOf(HasSubstr("launch_from_openmpi"),
                                            HasSubstr("missing environment variable(s) OMPI_COMM_WORLD_RANK "
                                                      "OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_LOCAL_RANK;"),
                                            HasSubstr("start the job with the matching launcher"))));
  env.set("OMPI_COMM_WORLD_RANK", "0");
  env.set("OMPI_COMM_WORLD_SIZE", "1");
  EXPECT_THAT([] { booster::dist::env_from_openmpi("h", 29500); },
              ThrowsMessage<EnvError>(HasSubstr("missing environment variable(s) OMPI_COMM_WORLD_LOCAL_RANK;")));
}

// ---- parse_launch_flags

TEST(Environment, LaunchFlagsSeparateValues) {
  booster::dist::FlagsResult r;
  auto rest = parse({"train", "--rank", "1", "--epochs", "3", "--world_size", "2", "--host", "h", "--port", "1234",
                     "--backend", "gloo", "--set", "plugin.x=1"},
                    &r);
  EXPECT_THAT(rest, ElementsAre("train", "--epochs", "3", "--set", "plugin.x=1"));
  EXPECT_TRUE(r.has_rank);
  EXPECT_EQ(r.env.rank, 1);
  EXPECT_EQ(r.env.world_size, 2);
  EXPECT_EQ(r.env.local_rank, 1);
  EXPECT_EQ(r.env.local_world_size, 2);
  EXPECT_EQ(r.env.host, "h");
  EXPECT_EQ(r.env.port, 1234);
  EXPECT_EQ(r.env.backend, "gloo");
}

TEST(Environment, LaunchFlagsEqualsForm) {
  booster::dist::FlagsResult r;
  auto rest = parse(
      {"--rank=1", "x", "--world_size=3", "--port=29999", "--host=10.0.0.1", "--hostname=keep", "--lr=0.1"}, &r);
  EXPECT_THAT(rest, ElementsAre("x", "--hostname=keep", "--lr=0.1"));
  EXPECT_TRUE(r.has_rank);
  EXPECT_EQ(r.env.rank, 1);
  EXPECT_EQ(r.env.world_size, 3);
  EXPECT_EQ(r.env.port, 29999);
  EXPECT_EQ(r.env.host, "10.0.0.1");
}

TEST(Environment, LaunchFlagsWithoutRank) {
  booster::dist::FlagsResult r;
  auto rest = parse({"--host", "h2", "a", "--port", "4000", "b"}, &r);
  EXPECT_THAT(rest, ElementsAre("a", "b"));
  EXPECT_FALSE(r.has_rank);
  EXPECT_EQ(r.env.host, "h2");
  EXPECT_EQ(r.env.port, 4000);
  EXPECT_EQ(r.env.rank, 0);
  EXPECT_EQ(r.env.world_size, 1);
  EXPECT_THAT(parse({}), ElementsAre());
}

TEST(Environment, LaunchFlagsErrors) {
  EXPECT_THAT([] { parse({"--rank", "1"}); },
              ThrowsMessage<EnvError>(HasSubstr("--rank and --world_size must be given together")));
  EXPECT_THAT([] { parse({"--world_size", "2"}); },
              ThrowsMessage<EnvError>(HasSubstr("--rank and --world_size must be given together")));
  EXPECT_THAT([] { parse({"--rank", "one", "--world_size", "2"}); },
              ThrowsMessage<EnvError>(HasSubstr("--rank expects an integer, got 'one'")));
  EXPECT_THAT([] { parse({"--port=12ab"}); },
              ThrowsMessage<EnvError>(HasSubstr("--port expects an integer, got '12ab'")));
  EXPECT_THAT([] { parse({"--port", "99999999999"}); },
              ThrowsMessage<EnvError>(HasSubstr("--port expects an integer, got '99999999999'")));
  EXPECT_THAT([] { parse({"--rank", "0", "--world_size"}); },
              ThrowsMessage<EnvError>(HasSubstr("--world_size needs a value")));
  EXPECT_THAT([] { parse({"--rank", "2", "--world_size", "2"}); },
              ThrowsMessage<EnvError>(AllOf(HasSubstr("command-line flags"),
                                            HasSubstr("rank 2 is outside [0, world_size=2)"))));
  EXPECT_THAT([] { parse({"--rank", "0", "--world_size", "1", "--port", "0"}); },
              ThrowsMessage<EnvError>(HasSubstr("port 0 is outside [1, 65535]")));
}

// ---- ProcessGroup on a world of one

TEST(Environment, WorldOfOneCollectives) {
  auto pg = world1();
  EXPECT_EQ(pg->rank(), 0);
  EXPECT_EQ(pg->size(), 1);
  EXPECT_EQ(pg->backend(), "gloo");
  EXPECT_DOUBLE_EQ(pg->timeout_s(), 1800);

  at::Tensor t = at::arange(1, 5, at::kFloat);
  pg->allreduce(t).wait();
  EXPECT_THAT(values_of(t), ElementsAre(1, 2, 3, 4));
  auto w = pg->allreduce(t, ReduceOp::AVG);
  w.wait();
  EXPECT_TRUE(w.is_completed());
  w.wait();  // a second wait is a no-op (does not divide again)
  EXPECT_THAT(values_of(t), ElementsAre(1, 2, 3, 4));
  for (ReduceOp op : {ReduceOp::MAX, ReduceOp::MIN, ReduceOp::PRODUCT}) {
    pg->allreduce(t, op).wait();
    EXPECT_THAT(values_of(t), ElementsAre(1, 2, 3, 4));
  }
  std::vector<at::Tensor> one{at::full({3}, 7, at::kLong)};
  pg->allreduce(one, ReduceOp::SUM).wait();
  EXPECT_THAT(values_of(one[0]), ElementsAre(7, 7, 7));
  std::vector<at::Tensor> none;
  EXPECT_TRUE(pg->allreduce(none).is_completed());

  at::Tensor b = at::tensor({5.5, -1.0}, at::kDouble);
  pg->broadcast(b, 0).wait();
  EXPECT_THAT(values_of(b), ElementsAre(5.5, -1.0));

  at::Tensor in = at::tensor({1.f, 2.f, 3.f});
  at::Tensor gathered = at::zeros({3}, at::kFloat);
  pg->all_gather_into_tensor(gathered, in).wait();
  EXPECT_TRUE(at::equal(gathered, in));
  std::vector<at::Tensor> outs{at::zeros({3}, at::kFloat)};
  pg->allgather(outs, in).wait();
  EXPECT_TRUE(at::equal(outs[0], in));

  at::Tensor scattered = at::zeros({3}, at::kFloat);
  pg->reduce_scatter_tensor(scattered, in, ReduceOp::AVG).wait();
  EXPECT_TRUE(at::equal(scattered, in));

  pg->barrier();
  EXPECT_EQ(pg->all_gather_int64({3, -4}), (std::vector<std::vector<int64_t>>{{3, -4}}));
  EXPECT_DOUBLE_EQ(pg->allreduce_scalar(2.5, ReduceOp::MAX), 2.5);
  EXPECT_EQ(pg->broadcast_string(std::string("a\0b", 3), 0), std::string("a\0b", 3));
  EXPECT_EQ(pg->broadcast_string("", 0), "");
}

// ProcessGroup::allreduce(std::vector) reduces each tensor on its own (process_group.h), not the
// tensors of the vector into each other as c10d's Gloo backend would (its several-devices meaning).
TEST(Environment, AllreduceOfSeveralTensorsReducesEachAlone) {
  auto pg = world1();
  std::vector<at::Tensor> many{at::ones({3}, at::kDouble), at::full({3}, 7, at::kDouble)};
  pg->allreduce(many, ReduceOp::SUM).wait();
  EXPECT_THAT(values_of(many[0]), ElementsAre(1, 1, 1));
  EXPECT_THAT(values_of(many[1]), ElementsAre(7, 7, 7));
}

TEST(Environment, WorldOfOneBFloat16) {
  auto pg = world1();
  at::Tensor t = at::tensor({1.5f, -2.25f, 3.0f}).to(at::kBFloat16);
  pg->allreduce(t, ReduceOp::AVG).wait();
  EXPECT_EQ(t.scalar_type(), at::kBFloat16);
  EXPECT_THAT(values_of(t), ElementsAre(1.5, -2.25, 3.0));
  pg->broadcast(t, 0).wait();
  EXPECT_THAT(values_of(t), ElementsAre(1.5, -2.25, 3.0));
  at::Tensor g = at::zeros({3}, at::kBFloat16);
  pg->all_gather_into_tensor(g, t).wait();
  EXPECT_THAT(values_of(g), ElementsAre(1.5, -2.25, 3.0));
  at::Tensor s = at::zeros({3}, at::kBFloat16);
  pg->reduce_scatter_tensor(s, t).wait();
  EXPECT_EQ(s.scalar_type(), at::kBFloat16);
  EXPECT_THAT(values_of(s), ElementsAre(1.5, -2.25, 3.0));
}

TEST(Environment, CollectiveArgumentErrors) {
  auto pg = world1();
  at::Tensor in = at::ones({4}, at::kFloat);
  at::Tensor small = at::zeros({3}, at::kFloat);
  EXPECT_THAT([&] { pg->all_gather_into_tensor(small, in); },
              ThrowsMessage<DistError>(AllOf(HasSubstr("all_gather_into_tensor needs an output of numel 4"),
                                             HasSubstr("got numel 3"))));
  at::Tensor wrong_dtype = at::zeros({4}, at::kDouble);
  EXPECT_THAT([&] { pg->all_gather_into_tensor(wrong_dtype, in); },
              ThrowsMessage<DistError>(HasSubstr("the input's dtype")));
  EXPECT_THAT([&] { pg->reduce_scatter_tensor(small, in); },
              ThrowsMessage<DistError>(AllOf(HasSubstr("reduce_scatter_tensor needs an input of numel 3"),
                                             HasSubstr("got numel 4"))));
  at::Tensor nc = at::ones({2, 3}, at::kFloat).t();
  ASSERT_FALSE(nc.is_contiguous());
  EXPECT_THAT([&] { pg->allreduce(nc); },
              ThrowsMessage<DistError>(AllOf(HasSubstr("allreduce: tensor must be contiguous"),
                                             HasSubstr("call .contiguous()"))));
  EXPECT_THAT([&] { pg->broadcast(nc, 0); },
              ThrowsMessage<DistError>(HasSubstr("broadcast: tensor must be contiguous")));
  at::Tensor undefined;
  EXPECT_THAT([&] { pg->allreduce(undefined); }, ThrowsMessage<DistError>(HasSubstr("tensor is undefined")));
  EXPECT_THAT([&] { pg->broadcast(in, 1); }, ThrowsMessage<DistError>(HasSubstr("broadcast root 1 outside [0, 1)")));
  EXPECT_THAT([&] { pg->broadcast(in, -1); }, ThrowsMessage<DistError>(HasSubstr("broadcast root -1 outside [0, 1)")));
  std::vector<at::Tensor> two{at::zeros({4}), at::zeros({4})};
  EXPECT_THAT([&] { pg->allgather(two, in); },
              ThrowsMessage<DistError>(HasSubstr("allgather needs 1 output tensors, got 2")));
  std::vector<at::Tensor> mismatched{at::zeros({5})};
  EXPECT_THAT([&] { pg->allgather(mismatched, in); },
              ThrowsMessage<DistError>(HasSubstr("allgather outputs must match the input's numel and dtype")));
}

TEST(Environment, RendezvousArgumentErrors) {
  auto with = [](auto change) {
    RendezvousOptions o;
    change(o);
    return o;
  };
  EXPECT_THAT([&] { ProcessGroup::rendezvous(with([](RendezvousOptions& o) { o.rank = 1; })); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("rank 1 is outside [0, 1)")));
  EXPECT_THAT([&] { ProcessGroup::rendezvous(with([](RendezvousOptions& o) { o.world_size = 0; })); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("world_size must be >= 1, got 0")));
  EXPECT_THAT([&] { ProcessGroup::rendezvous(with([](RendezvousOptions& o) { o.backend = "mpi"; })); },
              ThrowsMessage<std::invalid_argument>(
                  AllOf(HasSubstr("unknown backend 'mpi'"), HasSubstr("use \"gloo\" or \"nccl\""))));
  if (booster::cuda_device_count() == 0) {
    // Without a GPU: CUDA support is missing (a build without the toolkit) or NCCL finds no GPU.
    EXPECT_THAT([&] { ProcessGroup::rendezvous(with([](RendezvousOptions& o) { o.backend = "nccl"; })); },
                ThrowsMessage<DistError>(AllOf(HasSubstr("backend \"nccl\""),
                                               ::testing::AnyOf(HasSubstr("needs CUDA support"), HasSubstr("GPU")))));
  }
  EXPECT_THAT([&] { ProcessGroup::rendezvous(with([](RendezvousOptions& o) { o.timeout_s = 0; })); },
              ThrowsMessage<std::invalid_argument>(HasSubstr("timeout_s must be > 0")));
}

TEST(Environment, RendezvousTimeoutNamesAddress) {
  // Rank 1 of 2 with nobody serving the store: fails within the timeout, naming host:port.
  RendezvousOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.port = booster::testing::free_port();
  o.timeout_s = 0.5;
  EXPECT_THAT([&] { ProcessGroup::rendezvous(o); },
              ThrowsMessage<DistError>(AllOf(HasSubstr("rendezvous at 127.0.0.1:" + std::to_string(o.port)),
                                             HasSubstr("as rank 1 of 2"), HasSubstr("failed within 0.5"),
                                             HasSubstr("check MASTER_ADDR/MASTER_PORT"))));
}

// Two ranks in one process (one thread each) exercise the emulations with real data movement.
TEST(Environment, TwoRanksInOneProcessEmulatedCollectives) {
  const int port = booster::testing::free_port();
  std::vector<std::vector<double>> results(2);
  std::vector<std::string> errors(2);
  auto run = [&](int rank) {
    try {
      RendezvousOptions o;
      o.rank = rank;
      o.world_size = 2;
      o.port = port;
      o.timeout_s = 60;
      auto pg = ProcessGroup::rendezvous(o);
      std::vector<double>& out = results[rank];
      const float r = static_cast<float>(rank);
      // AVG allreduce: (1 + 3) / 2, (2 + 4) / 2.
      at::Tensor a = at::tensor({1.f + 2 * r, 2.f + 2 * r});
      pg->allreduce(a, ReduceOp::AVG).wait();
      for (double v : values_of(a)) out.push_back(v);
      // bf16 SUM allreduce stays bf16.
      at::Tensor h = at::full({2}, 0.5 + r, at::kBFloat16);
      pg->allreduce(h).wait();
      if (h.scalar_type() != at::kBFloat16) throw std::runtime_error("bf16 allreduce changed dtype");
      for (double v : values_of(h)) out.push_back(v);
      // all_gather_into_tensor: [rank0's, rank1's].
      at::Tensor g = at::zeros({4}, at::kFloat);
      pg->all_gather_into_tensor(g, at::full({2}, 10 + r)).wait();
      for (double v : values_of(g)) out.push_back(v);
      // reduce_scatter_tensor SUM: input [r, r+1, r+2, r+3] -> sum [1, 3, 5, 7]; rank 0 gets [1, 3], rank 1 [5, 7].
      at::Tensor s = at::zeros({2}, at::kFloat);
      pg->reduce_scatter_tensor(s, at::arange(4, at::kFloat) + r).wait();
      for (double v : values_of(s)) out.push_back(v);
      // broadcast from rank 1.
      at::Tensor b = at::full({1}, 100 + r);
      pg->broadcast(b, 1).wait();
      out.push_back(values_of(b)[0]);
      out.push_back(pg->allreduce_scalar(rank == 0 ? 3.0 : 8.0, ReduceOp::MAX));
      out.push_back(static_cast<double>(pg->broadcast_string(rank == 0 ? "from zero" : "", 0).size()));
      pg->barrier();
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread t0(run, 0), t1(run, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_THAT(results[0], ElementsAre(2, 3, 2, 2, 10, 10, 11, 11, 1, 3, 101, 8, 9));
  EXPECT_THAT(results[1], ElementsAre(2, 3, 2, 2, 10, 10, 11, 11, 5, 7, 101, 8, 9));
}
