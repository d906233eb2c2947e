// optimizer_checkpoint_test.cpp — CheckpointIO's sharded optimizer format (checkpoint_io.h,
// OptimizerWrapper::local_state_pieces / load_state_ranges): the base wrapper's sharded save and
// load continue exactly like the uninterrupted run (world of one, and 2 thread ranks where rank 0
// writes the replicated state and rank 1 an empty file); the format switch (kAuto, kGathered,
// kSharded, .bin refused); ZeroOptimizer on 2 thread ranks saves its slices without gathering and
// 3 thread ranks (ZeRO-1) and a single process (the base wrapper) load them by ranges; validation
// before any change (shapes, incomplete pieces); dtype conversion of the ranges read.
//
// Inside rank threads nothing uses torch's global RNG: models are built on the main thread and
// trained on batches from seeded generators (NetTrainer), state values come from formulas.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <map>
#include <set>

#include "booster/checkpoint/checkpoint_io.h"
#include "booster/checkpoint/sharded_state.h"
#include "booster/dist/process_group.h"
#include "booster/logging.h"
#include "booster/wrappers/optimizer_wrapper.h"
#include "booster/wrappers/zero_optimizer.h"
#include "common/small_net.h"
#include "common/test_util.h"
#include "common/thread_ranks.h"
#include "common/tensor_test_util.h"

using namespace booster;
using namespace booster::checkpoint;
using booster::testing::Net;
using booster::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

namespace {

using booster::testing::list_dir;

using booster::testing::world_of_one;

namespace fs = std::filesystem;

const OptimizerSaveOptions kSharded{SaveOptions{}, OptimizerFormat::kSharded};
const OptimizerSaveOptions kGathered{SaveOptions{}, OptimizerFormat::kGathered};

std::shared_ptr<torch::optim::Optimizer> make_opt(const std::string& kind, std::vector<torch::Tensor> p) {
  using namespace torch::optim;
  if (kind == "sgd") return std::make_shared<SGD>(p, SGDOptions(0.05).momentum(0.9).nesterov(true));
  if (kind == "adam") return std::make_shared<Adam>(p, AdamOptions(1e-2).amsgrad(true));
  if (kind == "adamw") return std::make_shared<AdamW>(p, AdamWOptions(1e-2).weight_decay(0.1));
  if (kind == "rmsprop") return std::make_shared<RMSprop>(p, RMSpropOptions(1e-3).momentum(0.5).centered(true));
  return std::make_shared<Adagrad>(p, AdagradOptions(0.1));
}

// A Net (seed 3) and its optimizer; wrap() (any thread) makes the named wrapper.
struct ResumeTrainer : booster::testing::NetTrainer {
  explicit ResumeTrainer(const std::string& kind, at::ScalarType dtype = at::kFloat) {
    torch::manual_seed(3);
    net = Net();
    net->to(dtype);
    opt = make_opt(kind, net->parameters());
  }
};

std::string rank_file(int r, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "optimizer-rank-%05d-of-%05d.safetensors", r, n);
  return buf;
}

void expect_same_parameters(Net& a, Net& b, const std::string& what) {
  auto p = a->parameters(), q = b->parameters();
  ASSERT_EQ(p.size(), q.size());
  for (size_t i = 0; i < p.size(); ++i) EXPECT_TRUE(torch::equal(p[i], q[i])) << what << " param " << i;
}

// Full-shape AdamW state for the Net's parameters from formulas: exp_avg, exp_avg_sq, step 4.
std::vector<ParamOptimState> formula_states(const std::vector<at::Tensor>& params) {
  std::vector<ParamOptimState> out(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    auto base = at::arange(params[i].numel(), at::kFloat).view(params[i].sizes());
    out[i].tensors["exp_avg"] = base * 0.01 + static_cast<double>(i);
    out[i].tensors["exp_avg_sq"] = base * base * 1e-3 + 0.5;
    out[i].scalars["step"] = 4;
  }
  return out;
}

void expect_states_equal(const std::vector<ParamOptimState>& got, const std::vector<ParamOptimState>& want,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].scalars, want[i].scalars) << what << " param " << i;
    ASSERT_EQ(got[i].tensors.size(), want[i].tensors.size()) << what << " param " << i;
    for (const auto& [k, t] : want[i].tensors)
      EXPECT_TRUE(torch::equal(got[i].tensor(k), t)) << what << " param " << i << " " << k;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The base (replicated) wrapper

class ShardedOptimizerCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardedOptimizerCheckpoint, SaveLoadContinueEqualsUninterrupted) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  ResumeTrainer full(GetParam()), first(GetParam()), resumed(GetParam());
  for (auto* t : {&full, &first, &resumed}) t->wrap();
  full.steps(5, 0);
  first.steps(3, 0);
  io.save_model(*first.net, dir.file("model"), {});
  io.save_optimizer(*first.wrapper, dir.file("opt"), kSharded);
  EXPECT_EQ(list_dir(dir.file("opt")),
            (std::set<std::string>{"optimizer.sharded.json", "optimizer_groups.json", rank_file(0, 1)}));
  io.load_model(*resumed.net, dir.file("model"));
  io.load_optimizer(*resumed.wrapper, dir.file("opt"));
  resumed.steps(2, 3);
  expect_same_parameters(full.net, resumed.net, GetParam());
}

INSTANTIATE_TEST_SUITE_P(CheckpointIO, ShardedOptimizerCheckpoint,
                         ::testing::Values("sgd", "adam", "adamw", "rmsprop", "adagrad"));

TEST(OptimizerCheckpoint, FormatSwitch) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  ResumeTrainer t("adamw");
  t.wrap();
  t.steps(2, 0);
  // kAuto: the base wrapper's state is replicated, so gathered (HF-like, one file).
  EXPECT_FALSE(t.wrapper->state_is_sharded());
  io.save_optimizer(*t.wrapper, dir.file("auto"), {});
  EXPECT_EQ(list_dir(dir.file("auto")), (std::set<std::string>{"optimizer.safetensors", "optimizer_groups.json"}));
  // A plain SaveOptions converts (format kAuto).
  SaveOptions bin;
  bin.use_safetensors = false;
  io.save_optimizer(*t.wrapper, dir.file("bin"), bin);
  EXPECT_EQ(list_dir(dir.file("bin")), (std::set<std::string>{"optimizer.bin", "optimizer_groups.json"}));
  EXPECT_THAT([&] { io.save_optimizer(*t.wrapper, dir.file("x"), OptimizerSaveOptions{bin, OptimizerFormat::kSharded}); },
              ThrowsMessage<CheckpointError>(HasSubstr("the sharded optimizer format is safetensors only")));
  EXPECT_FALSE(fs::exists(dir.file("x")));
  // Sharded and gathered hold the same state: either loads to the same optimizer state.
  io.save_optimizer(*t.wrapper, dir.file("sharded"), kSharded);
  ShardedStateReader reader(dir.file("sharded"));
  EXPECT_EQ(reader.tensors().size(), 8u);
  for (const auto& [name, tensor] : load_state_dict(dir.file("auto"), "optimizer"))
    EXPECT_TRUE(torch::equal(reader.read_full(name), tensor)) << name;
  EXPECT_EQ(reader.read_extra_file("optimizer_groups.json"),
            booster::testing::read_file(dir.file("auto/optimizer_groups.json")));
  // Saving into a directory that holds the other format replaces it whole.
  io.save_optimizer(*t.wrapper, dir.file("auto"), kSharded);
  EXPECT_FALSE(fs::exists(dir.file("auto/optimizer.safetensors")));
  io.save_optimizer(*t.wrapper, dir.file("auto"), kGathered);
  EXPECT_FALSE(ShardedStateReader::exists(dir.file("auto")));
}

// Two thread ranks with replicated state (DDP): rank 0 saves everything, rank 1 an empty file; every
// rank loads, and a single process continues like the uninterrupted run.
TEST(OptimizerCheckpoint, ReplicatedStateIsSavedByRankZeroOnly) {
  TempDir dir;
  const std::string ckpt = dir.file("opt");
  std::vector<std::unique_ptr<ResumeTrainer>> ranks, loaders;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<ResumeTrainer>("adamw"));
    loaders.push_back(std::make_unique<ResumeTrainer>("adamw"));
  }
  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<dist::ProcessGroup>& group) {
    OptimizerWrapperOptions o;
    o.group = group;
    ResumeTrainer& t = *ranks[group->rank()];
    t.wrap(o);
    t.steps(3, 0);
    CheckpointIO io(group);
    io.save_optimizer(*t.wrapper, ckpt, kSharded);
    ResumeTrainer& l = *loaders[group->rank()];
    l.wrap(o);
    io.load_optimizer(*l.wrapper, ckpt);
    expect_states_equal(l.wrapper->gather_param_states(), t.wrapper->gather_param_states(),
                        "rank " + std::to_string(group->rank()));
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  ShardedStateReader reader(ckpt);
  EXPECT_EQ(reader.world_size(), 2);
  for (const auto& t : reader.tensors()) {
    ASSERT_EQ(t.pieces.size(), 1u) << t.name;
    EXPECT_EQ(t.pieces[0].rank, 0) << t.name;
  }
  EXPECT_LT(fs::file_size(fs::path(ckpt) / rank_file(1, 2)), 1024u);  // a header only

  ResumeTrainer full("adamw"), resumed("adamw");
  full.wrap();
  resumed.wrap();
  full.steps(5, 0);
  resumed.steps(3, 0);  // the model as the ranks had it; the optimizer state comes from the checkpoint
  resumed.opt->state().clear();
  CheckpointIO io(world_of_one());
  io.load_optimizer(*resumed.wrapper, ckpt);
  resumed.steps(2, 3);
  expect_same_parameters(full.net, resumed.net, "2 thread ranks -> 1 process");
}

// ---------------------------------------------------------------------------------------------
// ZeroOptimizer: slices saved without gathering, loaded at other world sizes by ranges

namespace {

// The Net's parameters with names (53 elements: a.weight 30, a.bias 5, b.weight 15, b.bias 3).
std::vector<std::pair<std::string, at::Tensor>> named(Net& net) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& item : net->named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

std::unique_ptr<ZeroOptimizer> make_zero(ResumeTrainer& t, const std::shared_ptr<dist::ProcessGroup>& group, int stage) {
  OptimizerWrapperOptions o;
  o.group = group;
  ZeroOptions zo;
  zo.stage = stage;
  auto named_params = named(t.net);
  auto z = std::make_unique<ZeroOptimizer>(t.opt, nullptr, o, zo, named_params);
  std::vector<std::string> names;
  for (auto& [n, p] : named_params) names.push_back(n);
  z->set_parameter_names(names);
  return z;
}

}  // namespace

TEST(OptimizerCheckpoint, ZeroSlicesSaveWithoutGatheringAndLoadAtOtherWorldSizes) {
  TempDir dir;
  const std::string ckpt = dir.file("zero2");
  std::vector<std::unique_ptr<ResumeTrainer>> two, three;
  for (int r = 0; r < 2; ++r) two.push_back(std::make_unique<ResumeTrainer>("adamw"));
  for (int r = 0; r < 3; ++r) three.push_back(std::make_unique<ResumeTrainer>("adamw"));
  const std::vector<ParamOptimState> want = formula_states(two[0]->net->parameters());

  auto errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<dist::ProcessGroup>& group) {
    auto z = make_zero(*two[group->rank()], group, 2);
    EXPECT_TRUE(z->state_is_sharded());
    z->load_param_states(want);
    // Each rank's pieces: the parameters' parts in its 27-element slice, views of the slice's state.
    auto pieces = z->local_state_pieces();
    int64_t held = 0;
    for (const auto& p : pieces) held += p.values.numel();
    EXPECT_EQ(held, group->rank() == 0 ? 2 * 27 : 2 * 26);  // no padding saved
    CheckpointIO io(group);
    io.save_optimizer(*z, ckpt, {});  // kAuto: sharded
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(list_dir(ckpt), (std::set<std::string>{"optimizer.sharded.json", "optimizer_groups.json",
                                                   rank_file(0, 2), rank_file(1, 2)}));
  ShardedStateReader reader(ckpt);
  ASSERT_EQ(reader.tensors().size(), 8u);
  // a.bias (elements 30..34 of the flat layout) lies in rank 1's slice [27, 54): all of it on rank 1;
  // a.weight (0..29) is split at 27.
  const ShardedTensorInfo* bias = reader.find("a.bias.exp_avg");
  ASSERT_NE(bias, nullptr);
  ASSERT_EQ(bias->pieces.size(), 1u);
  EXPECT_EQ(bias->pieces[0].rank, 1);
  const ShardedTensorInfo* weight = reader.find("a.weight.exp_avg_sq");
  ASSERT_NE(weight, nullptr);
  ASSERT_EQ(weight->pieces.size(), 2u);
  EXPECT_EQ(weight->pieces[1].offset, 27);
  EXPECT_THAT(reader.read_extra_file("optimizer_groups.json"), HasSubstr("\"step\": 4"));

  // ZeRO-1 on 3 ranks reads its 18-element slices; the gathered state equals what was saved.
  errors = booster::testing::run_thread_ranks(3, [&](const std::shared_ptr<dist::ProcessGroup>& group) {
    auto z = make_zero(*three[group->rank()], group, 1);
    CheckpointIO io(group);
    io.load_optimizer(*z, ckpt);
    expect_states_equal(z->gather_param_states(), want, "3 ranks, rank " + std::to_string(group->rank()));
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  // The base wrapper (DDP) in one process reads the whole tensors.
  ResumeTrainer ddp("adamw");
  ddp.wrap();
  CheckpointIO(world_of_one()).load_optimizer(*ddp.wrapper, ckpt);
  expect_states_equal(ddp.wrapper->gather_param_states(), want, "1 process");
  // The gathered format (consolidated) loads into ZeRO on 2 ranks the same way.
  consolidate_sharded_state(ckpt, dir.file("gathered"));
  std::vector<std::unique_ptr<ResumeTrainer>> again;
  for (int r = 0; r < 2; ++r) again.push_back(std::make_unique<ResumeTrainer>("adamw"));
  errors = booster::testing::run_thread_ranks(2, [&](const std::shared_ptr<dist::ProcessGroup>& group) {
    auto z = make_zero(*again[group->rank()], group, 2);
    CheckpointIO(group).load_optimizer(*z, dir.file("gathered"));
    expect_states_equal(z->gather_param_states(), want, "consolidated, rank " + std::to_string(group->rank()));
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

// ---------------------------------------------------------------------------------------------
// Validation before any change, dtype conversion

TEST(OptimizerCheckpoint, ShardedLoadValidatesBeforeChangingAnything) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  ResumeTrainer saved("adamw");
  saved.wrap();
  saved.steps(2, 0);
  io.save_optimizer(*saved.wrapper, dir.file("opt"), kSharded);

  // Same names, another shape: the error names the tensor and both shapes; nothing changes.
  struct WideImpl : torch::nn::Module {
    WideImpl() {
      a = register_module("a", torch::nn::Linear(6, 7));
      b = register_module("b", torch::nn::Linear(7, 3));
    }
    torch::nn::Linear a{nullptr}, b{nullptr};
  };
  torch::manual_seed(5);
  auto wide = std::make_shared<WideImpl>();
  auto opt = make_opt("adamw", wide->parameters());
  OptimizerWrapper wrapper(opt, nullptr);
  std::vector<std::string> names;
  for (auto& item : wide->named_parameters()) names.push_back(item.key());
  wrapper.set_parameter_names(names);
  EXPECT_THAT([&] { io.load_optimizer(wrapper, dir.file("opt")); },
              ThrowsMessage<CheckpointError>(HasSubstr("a.weight.exp_avg has shape [5, 6] but parameter a.weight has [7, 6]")));
  EXPECT_TRUE(opt->state().empty());

  // Pieces that do not cover a tensor (written by hand): refused naming the index and the tensor.
  ShardedStateReader reader(dir.file("opt"));
  std::vector<StatePiece> pieces;
  for (const auto& t : reader.tensors()) {
    at::Tensor full = reader.read_range(t.name, 0, t.numel);
    pieces.push_back({t.name, t.shape, 0, t.name == "b.bias.exp_avg" ? full.narrow(0, 0, 2) : full});
  }
  save_sharded_state(dir.file("partial"), pieces, nullptr, "optimizer",
                     {{"optimizer_groups.json", reader.read_extra_file("optimizer_groups.json")}});
  ResumeTrainer other("adamw");
  other.wrap();
  other.steps(1, 7);
  auto before = other.wrapper->gather_param_states();
  EXPECT_THAT([&] { io.load_optimizer(*other.wrapper, dir.file("partial")); },
              ThrowsMessage<CheckpointError>(AllOf(HasSubstr("partial/optimizer.sharded.json"),
                                                   HasSubstr("b.bias.exp_avg is incomplete: its pieces hold 2 of its 3"))));
  expect_states_equal(other.wrapper->gather_param_states(), before, "unchanged");
}

TEST(OptimizerCheckpoint, ShardedBf16StateLoadsIntoFp32ConvertedAndLogged) {
  TempDir dir;
  CheckpointIO io(world_of_one());
  ResumeTrainer bf16("adamw", at::kBFloat16);
  OptimizerWrapperOptions no_master;
  no_master.master_weights = false;
  bf16.wrap(no_master);
  bf16.steps(2, 0);
  io.save_optimizer(*bf16.wrapper, dir.file("opt"), kSharded);
  ResumeTrainer fp32("adamw");
  fp32.wrap();
  booster::log::set_rank(0);
  booster::log::set_level("info");
  ::testing::internal::CaptureStdout();
  io.load_optimizer(*fp32.wrapper, dir.file("opt"));
  std::string log = ::testing::internal::GetCapturedStdout();
  EXPECT_THAT(log, HasSubstr("converted 8 state tensors BFloat16 -> Float (the optimizer's dtype)"));
  auto got = fp32.wrapper->gather_param_states(), saved = bf16.wrapper->gather_param_states();
  for (size_t i = 0; i < got.size(); ++i)
    for (const auto& [k, t] : saved[i].tensors) {
      EXPECT_EQ(got[i].tensor(k).scalar_type(), at::kFloat);
      EXPECT_TRUE(torch::equal(got[i].tensor(k), t.to(at::kFloat))) << i << " " << k;
    }
}
