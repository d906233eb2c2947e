// sharded_state_test.cpp — booster/checkpoint/sharded_state.h: the sharded (DCP-like) state format.
// Saves by 2, 3 and 4 thread ranks (tests/common/thread_ranks.h) with ZeRO-like padded ranges (the
// last rank holds fewer elements, tensors smaller than the world, several pieces per rank, empty and
// scalar tensors, f32/bf16/i64/f64) read back at ranges crossing piece boundaries and at the ranges
// of other world sizes; failures on one rank (at validation, at writing, rank 0 before writing) make
// every rank throw naming that rank and leave the directory as it was; overlapping pieces; uncovered
// ranges; corrupt or missing files named; read_safetensors_range; and `booster ckpt consolidate` /
// `inspect` producing the gathered optimizer format that load_state_dict reads.
//
// Values come from formulas (arange), never from torch's global RNG (rank threads share it).
#include <gtest/gtest.h>
#include <gmock/gmock.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "booster/checkpoint/sharded_state.h"
#include "booster/checkpoint/state_dict_io.h"
#include "common/test_util.h"
#include "common/thread_ranks.h"

namespace {

namespace fs = std::filesystem;
namespace bt = booster::testing;
using booster::checkpoint::CheckpointError;
using booster::checkpoint::consolidate_sharded_state;
using booster::checkpoint::load_state_dict;
using booster::checkpoint::read_safetensors_header;
using booster::checkpoint::read_safetensors_range;
using booster::checkpoint::save_sharded_state;
using booster::checkpoint::SaveOptions;
using booster::checkpoint::ShardedStateReader;
using booster::checkpoint::StatePiece;
using booster::checkpoint::write_safetensors;
using booster::dist::ProcessGroup;
using ::testing::AllOf;
using ::testing::HasSubstr;

// One logical tensor of the test state: its full value is a formula of (seed, dtype, shape).
struct Spec {
  std::string name;
  std::vector<int64_t> shape;
  at::ScalarType dtype;
  double seed;
};

at::Tensor full_value(const Spec& s) {
  int64_t numel = 1;
  for (int64_t d : s.shape) numel *= d;
  at::Tensor flat = at::arange(numel, at::kDouble);
  if (at::isFloatingType(s.dtype))
    flat = flat * 0.25 - s.seed;  // bf16 holds these exactly for small values; f32 too
  else
    flat = flat * 3 + s.seed;
  return flat.to(s.dtype).reshape(s.shape);
}

// ZeRO's layout: chunk = ceil(numel / world); rank r holds [r * chunk, min(numel, (r + 1) * chunk)),
// empty (offset clamped to numel) when that starts beyond the tensor.
std::pair<int64_t, int64_t> zero_range(int64_t numel, int world, int rank) {
  const int64_t chunk = (numel + world - 1) / world;
  const int64_t begin = std::min(numel, rank * chunk);
  const int64_t end = std::min(numel, begin + chunk);
  return {begin, end};
}

StatePiece piece_of(const Spec& s, int64_t begin, int64_t end) {
  at::Tensor flat = full_value(s).reshape({-1});
  return StatePiece{s.name, s.shape, begin, flat.slice(0, begin, end)};
}

// The test state: uneven ZeRO ranges, a tensor smaller than the world, a scalar, an empty tensor,
// and "striped" held as several pieces per rank (element i by rank (i / 2) % world).
std::vector<Spec> test_specs(double seed) {
  return {{"l1.weight.exp_avg", {31, 7}, at::kFloat, seed},
          {"l1.weight.exp_avg_sq", {31, 7}, at::kBFloat16, seed + 1},
          {"l1.bias.exp_avg", {3}, at::kFloat, seed + 2},
          {"counts", {5}, at::kLong, seed + 3},
          {"scalar", {}, at::kFloat, seed + 4},
          {"empty", {0, 4}, at::kFloat, seed + 5},
          {"striped", {10}, at::kDouble, seed + 6}};
}

std::vector<StatePiece> pieces_for(const std::vector<Spec>& specs, int world, int rank) {
  std::vector<StatePiece> out;
  for (const Spec& s : specs) {
    int64_t numel = full_value(s).numel();
    if (s.name == "striped") {
      for (int64_t i = 0; i < numel; i += 2)
        if ((i / 2) % world == rank) out.push_back(piece_of(s, i, std::min(numel, i + 2)));
      continue;
    }
    auto [b, e] = zero_range(numel, world, rank);
    out.push_back(piece_of(s, b, e));
  }
  return out;
}

// Runs save_sharded_state on `world` thread ranks; returns each rank's CheckpointError message ("" =
// returned normally). Any other exception fails the test.
std::vector<std::string> save_on_ranks(int world, const std::string& dir,
                                       const std::function<std::vector<StatePiece>(int rank)>& make,
                                       const std::function<std::map<std::string, std::string>(int rank)>& extras = {},
                                       const std::function<std::string(int rank)>& dir_of = {}) {
  std::vector<std::string> messages(world);
  auto errors = bt::run_thread_ranks(world, [&](const std::shared_ptr<ProcessGroup>& g) {
    const int r = g->rank();
    std::vector<StatePiece> pieces = make(r);
    try {
      save_sharded_state(dir_of ? dir_of(r) : dir, pieces, g.get(), "optimizer",
                         extras ? extras(r) : std::map<std::string, std::string>{});
    } catch (const CheckpointError& e) {
      messages[r] = e.what();
      if (messages[r].empty()) messages[r] = "(empty message)";
    }
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return messages;
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::string rank_file(int rank, int world) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "optimizer-rank-%05d-of-%05d.safetensors", rank, world);
  return buf;
}

void expect_reads_back(const ShardedStateReader& reader, const std::vector<Spec>& specs) {
  ASSERT_EQ(reader.tensors().size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    const Spec& s = specs[i];
    const auto& info = reader.tensors()[i];
    EXPECT_EQ(info.name, s.name);  // save order
    EXPECT_EQ(info.dtype, s.dtype) << s.name;
    EXPECT_EQ(info.shape, s.shape) << s.name;
    const at::Tensor expected = full_value(s);
    EXPECT_EQ(info.numel, expected.numel());
    EXPECT_EQ(info.covered, info.numel) << s.name;
    at::Tensor got = reader.read_full(s.name);
    EXPECT_EQ(got.scalar_type(), s.dtype);
    EXPECT_EQ(got.sizes(), expected.sizes()) << s.name;
    EXPECT_TRUE(at::equal(got, expected)) << s.name;
  }
}

// Every range [a, b) of small tensors, and for larger ones every range starting or ending within one
// element of a piece boundary, equals the slice of the full tensor.
void expect_ranges(const ShardedStateReader& reader, const Spec& s, int64_t* checked) {
  const at::Tensor flat = full_value(s).reshape({-1});
  const int64_t n = flat.numel();
  const auto* info = reader.find(s.name);
  ASSERT_NE(info, nullptr);
  std::set<int64_t> points{0, n};
  for (const auto& p : info->pieces)
    for (int64_t d = -1; d <= 1; ++d) {
      points.insert(std::clamp<int64_t>(p.offset + d, 0, n));
      points.insert(std::clamp<int64_t>(p.offset + p.length + d, 0, n));
    }
  for (int64_t i = 0; i <= n; i += n <= 40 ? 1 : 13) points.insert(i);
  for (int64_t a : points)
    for (int64_t b : points) {
      if (b < a) continue;
      at::Tensor got = reader.read_range(s.name, a, b - a);
      ASSERT_EQ(got.dim(), 1);
      ASSERT_EQ(got.numel(), b - a);
      ASSERT_TRUE(at::equal(got, flat.slice(0, a, b))) << s.name << " [" << a << ", " << b << ")";
      ++*checked;
    }
}

// ---------------------------------------------------------------------------------------------

TEST(ShardedState, RoundTripOnTwoThreeAndFourRanks) {
  for (int world : {2, 3, 4}) {
    SCOPED_TRACE("world " + std::to_string(world));
    bt::TempDir tmp;
    const std::string dir = tmp.file("ckpt");
    const auto specs = test_specs(1.5);
    auto messages = save_on_ranks(
        world, dir, [&](int r) { return pieces_for(specs, world, r); },
        // only rank 0's extra files count
        [&](int r) { return std::map<std::string, std::string>{{"optimizer_groups.json", "{\"rank\": " + std::to_string(r) + "}"}}; });
    for (int r = 0; r < world; ++r) ASSERT_EQ(messages[r], "") << "rank " << r;

    std::set<std::string> expected_files{"optimizer.sharded.json", "optimizer_groups.json"};
    for (int r = 0; r < world; ++r) expected_files.insert(rank_file(r, world));
    EXPECT_EQ(names_in(dir), expected_files);
    EXPECT_EQ(names_in(tmp.path()), std::set<std::string>{"ckpt"});  // no temporary left

    auto index = nlohmann::json::parse(bt::read_file(dir + "/optimizer.sharded.json"));
    EXPECT_EQ(index["format"], "booster-sharded-v1");
    EXPECT_EQ(index["world_size"], world);
    EXPECT_EQ(index["extra_files"], nlohmann::json::array({"optimizer_groups.json"}));

    ASSERT_TRUE(ShardedStateReader::exists(dir));
    ShardedStateReader reader(dir);
    EXPECT_EQ(reader.world_size(), world);
    expect_reads_back(reader, specs);
    EXPECT_EQ(reader.read_extra_file("optimizer_groups.json"), "{\"rank\": 0}");

    // The layout: ZeRO's uneven ranges (last rank shorter), "counts" (5 elements) held by fewer
    // ranks than the world when world = 4 (chunk 2: ranks 0-2), "striped" in 2-element pieces.
    const auto* w = reader.find("l1.weight.exp_avg");
    ASSERT_NE(w, nullptr);
    ASSERT_EQ(w->pieces.size(), static_cast<size_t>(world));
    const int64_t chunk = (217 + world - 1) / world;  // 217 = 31 * 7: no world divides it
    EXPECT_EQ(w->pieces.front().length, chunk);
    EXPECT_EQ(w->pieces.back().length, 217 - (world - 1) * chunk);
    EXPECT_LT(w->pieces.back().length, chunk);
    EXPECT_EQ(reader.find("striped")->pieces.size(), 5u);
    EXPECT_EQ(reader.find("empty")->pieces.size(), 0u);
    EXPECT_EQ(reader.find("scalar")->pieces.size(), 1u);
    if (world == 4) EXPECT_EQ(reader.find("counts")->pieces.size(), 3u);

    int64_t checked = 0;
    for (const Spec& s : specs) expect_ranges(reader, s, &checked);
    EXPECT_GT(checked, 600);  // 653, 803, 971 ranges for worlds 2, 3, 4

    // A reader at another world size reads its own ZeRO ranges and gets the same tensor back.
    for (int other : {1, 2, 3, 5, 7}) {
      for (const Spec& s : specs) {
        const at::Tensor flat = full_value(s).reshape({-1});
        std::vector<at::Tensor> parts;
        for (int r = 0; r < other; ++r) {
          auto [b, e] = zero_range(flat.numel(), other, r);
          parts.push_back(reader.read_range(s.name, b, e - b));
        }
        EXPECT_TRUE(at::equal(at::cat(parts), flat)) << s.name << " read by " << other << " ranks";
      }
    }
  }
}

TEST(ShardedState, SingleProcessWithoutGroup) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  const auto specs = test_specs(-3);
  save_sharded_state(dir, pieces_for(specs, 1, 0), nullptr, "optimizer", {{"optimizer_groups.json", "{}"}});
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"optimizer.sharded.json", "optimizer_groups.json", rank_file(0, 1)}));
  ShardedStateReader reader(dir);
  EXPECT_EQ(reader.world_size(), 1);
  expect_reads_back(reader, specs);
  // list() in list_checkpoint_tensors' shape.
  auto list = reader.list();
  ASSERT_EQ(list.size(), specs.size());
  EXPECT_EQ(list[1].name, "l1.weight.exp_avg_sq");
  EXPECT_EQ(list[1].dtype, at::kBFloat16);
  EXPECT_EQ(list[1].shape, (std::vector<int64_t>{31, 7}));
  // Another base in the same kind of directory.
  EXPECT_FALSE(ShardedStateReader::exists(dir, "model"));
  EXPECT_FALSE(ShardedStateReader::exists(tmp.file("nope")));
}

TEST(ShardedState, FailedWriteOnOneRankLeavesPreviousCheckpoint) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  const int world = 4;
  const auto v1 = test_specs(1);
  auto ok = save_on_ranks(world, dir, [&](int r) { return pieces_for(v1, world, r); },
                          [](int) { return std::map<std::string, std::string>{{"optimizer_groups.json", "v1"}}; });
  for (int r = 0; r < world; ++r) ASSERT_EQ(ok[r], "");
  const std::string index_v1 = bt::read_file(dir + "/optimizer.sharded.json");

  // The failing rank's piece passes validation (1-D, float, in range) but cannot be written (it has
  // no data): the failure comes after the temporary directory exists and the other ranks wrote.
  const auto v2 = test_specs(2);
  for (int failing : {2, 0}) {
    SCOPED_TRACE("failing rank " + std::to_string(failing));
    auto failed = save_on_ranks(
        world, dir,
        [&](int r) {
          auto p = pieces_for(v2, world, r);
          if (r == failing)
            p.push_back({"ghost", {8}, 0, at::empty({8}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta))});
          return p;
        },
        [](int) { return std::map<std::string, std::string>{{"optimizer_groups.json", "v2"}}; });
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      EXPECT_THAT(failed[r], HasSubstr("cannot save sharded state to '" + dir + "' (it is unchanged): rank " +
                                       std::to_string(failing) + ": "));
      EXPECT_THAT(failed[r], HasSubstr("tensor 'ghost@0' is on the meta device"));
      EXPECT_THAT(failed[r], ::testing::Not(HasSubstr("rank 1: ")));
      EXPECT_EQ(failed[r], failed[0]);  // the same message everywhere
    }
    // The previous checkpoint is intact and no temporary is left.
    EXPECT_EQ(bt::read_file(dir + "/optimizer.sharded.json"), index_v1);
    EXPECT_EQ(names_in(tmp.path()), std::set<std::string>{"ckpt"});
    ShardedStateReader reader(dir);
    expect_reads_back(reader, v1);
    EXPECT_EQ(reader.read_extra_file("optimizer_groups.json"), "v1");
  }

  // A good save on 3 ranks then replaces the whole directory (the 4-rank files are gone).
  auto again = save_on_ranks(3, dir, [&](int r) { return pieces_for(v2, 3, r); },
                             [](int) { return std::map<std::string, std::string>{{"optimizer_groups.json", "v2"}}; });
  for (int r = 0; r < 3; ++r) ASSERT_EQ(again[r], "");
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"optimizer.sharded.json", "optimizer_groups.json", rank_file(0, 3),
                                                  rank_file(1, 3), rank_file(2, 3)}));
  ShardedStateReader reader(dir);
  expect_reads_back(reader, v2);
  EXPECT_EQ(reader.read_extra_file("optimizer_groups.json"), "v2");
}

TEST(ShardedState, RankZeroFailingBeforeWritingFailsEveryRank) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  bt::write_file(dir, "a file where the directory should go");
  const auto specs = test_specs(0);
  auto failed = save_on_ranks(3, dir, [&](int r) { return pieces_for(specs, 3, r); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(failed[r], HasSubstr("cannot save sharded state to '" + dir + "'")) << r;
    EXPECT_THAT(failed[r], HasSubstr("rank 0: ")) << r;
    EXPECT_EQ(failed[r], failed[0]);
  }
  EXPECT_EQ(bt::read_file(dir), "a file where the directory should go");
  EXPECT_EQ(names_in(tmp.path()), std::set<std::string>{"ckpt"});
}

TEST(ShardedState, InvalidPiecesAreReportedOnEveryRankBeforeWriting) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  const auto specs = test_specs(0);
  struct Case {
    std::string what;
    std::function<void(std::vector<StatePiece>&)> spoil;
    std::vector<std::string> expected;
  };
  const std::vector<Case> cases = {
      {"range beyond the tensor",
       [](auto& p) { p.push_back({"t", {4}, 3, at::zeros({2})}); },
       {"rank 1: ", "'t'", "[3, 3 + 2) are outside the tensor's 4 elements"}},
      {"2-D values", [](auto& p) { p.push_back({"t", {4}, 0, at::zeros({2, 2})}); }, {"rank 1: ", "must be 1-D"}},
      {"negative offset", [](auto& p) { p.push_back({"t", {4}, -1, at::zeros({1})}); }, {"rank 1: ", "outside"}},
      {"undefined values", [](auto& p) { p.push_back({"t", {4}, 0, at::Tensor()}); }, {"rank 1: ", "undefined"}},
      {"empty name", [](auto& p) { p.push_back({"", {4}, 0, at::zeros({1})}); }, {"rank 1: ", "empty name"}},
      {"unsupported dtype",
       [](auto& p) { p.push_back({"c", {2}, 0, at::zeros({2}, at::kComplexFloat)}); },
       {"rank 1: ", "unsupported dtype"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto failed = save_on_ranks(3, dir, [&](int r) {
      auto p = pieces_for(specs, 3, r);
      if (r == 1) c.spoil(p);
      return p;
    });
    for (int r = 0; r < 3; ++r) {
      for (const auto& s : c.expected) EXPECT_THAT(failed[r], HasSubstr(s)) << "rank " << r;
      EXPECT_THAT(failed[r], ::testing::Not(HasSubstr("rank 0: ")));
    }
    EXPECT_FALSE(fs::exists(dir));
  }
  // Rank 0's own arguments: an extra file that collides with a generated name, a bad base.
  auto collide = save_on_ranks(2, dir, [&](int r) { return pieces_for(specs, 2, r); },
                               [](int) { return std::map<std::string, std::string>{{"optimizer.sharded.json", "x"}}; });
  for (int r = 0; r < 2; ++r) EXPECT_THAT(collide[r], HasSubstr("rank 0: extra file 'optimizer.sharded.json' collides"));
  // Ranks that disagree on the directory.
  auto split = save_on_ranks(
      2, dir, [&](int r) { return pieces_for(specs, 2, r); }, {},
      [&](int r) { return r == 0 ? dir : dir + "-other"; });
  for (int r = 0; r < 2; ++r) EXPECT_THAT(split[r], HasSubstr("rank 1: called with dir")) << r;
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_FALSE(fs::exists(dir + "-other"));
}

TEST(ShardedState, OverlappingOrInconsistentPiecesAreRejected) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  auto t = [](int64_t b, int64_t e) { return StatePiece{"t", {30}, b, at::arange(b, e, at::kFloat)}; };
  auto overlap = save_on_ranks(3, dir, [&](int r) {
    if (r == 0) return std::vector<StatePiece>{t(0, 10)};
    if (r == 1) return std::vector<StatePiece>{t(10, 20)};
    return std::vector<StatePiece>{t(15, 25)};
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_THAT(overlap[r], HasSubstr("tensor 't': rank 1's piece [10, 20) overlaps rank 2's piece [15, 25)")) << r;
    EXPECT_EQ(overlap[r], overlap[0]);
  }
  // The same range from two replicas is an overlap too (save replicated state from one replica).
  auto replicated = save_on_ranks(2, dir, [&](int) { return std::vector<StatePiece>{t(0, 30)}; });
  for (int r = 0; r < 2; ++r) EXPECT_THAT(replicated[r], HasSubstr("rank 0's piece [0, 30) overlaps rank 1's piece [0, 30)"));
  // Overlap within one rank's own pieces.
  auto own = save_on_ranks(2, dir, [&](int r) {
    return r == 1 ? std::vector<StatePiece>{t(0, 5), t(4, 6)} : std::vector<StatePiece>{};
  });
  for (int r = 0; r < 2; ++r) EXPECT_THAT(own[r], HasSubstr("rank 1's piece [0, 5) overlaps rank 1's piece [4, 6)"));
  // Pieces of one name with different dtypes or shapes.
  auto dtypes = save_on_ranks(2, dir, [&](int r) {
    return std::vector<StatePiece>{{"u", {4}, 2 * r, at::zeros({2}, r == 0 ? at::kFloat : at::kBFloat16)}};
  });
  for (int r = 0; r < 2; ++r) EXPECT_THAT(dtypes[r], HasSubstr("tensor 'u': rank 0 holds it as F32 [4], rank 1 as BF16 [4]"));
  auto shapes = save_on_ranks(2, dir, [&](int r) {
    return std::vector<StatePiece>{{"u", r == 0 ? std::vector<int64_t>{4} : std::vector<int64_t>{2, 2}, 2 * r, at::zeros({2})}};
  });
  for (int r = 0; r < 2; ++r) EXPECT_THAT(shapes[r], HasSubstr("rank 0 holds it as F32 [4], rank 1 as F32 [2, 2]"));
  EXPECT_FALSE(fs::exists(dir));
}

TEST(ShardedState, UncoveredRangesAreErrors) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  at::Tensor full = at::arange(20, at::kFloat);
  save_sharded_state(dir,
                     {{"t", {4, 5}, 0, full.slice(0, 0, 5)}, {"t", {4, 5}, 10, full.slice(0, 10, 20)},
                      {"none", {6}, 0, at::zeros({0})}},
                     nullptr);
  ShardedStateReader reader(dir);
  EXPECT_EQ(reader.find("t")->covered, 15);
  EXPECT_EQ(reader.find("none")->covered, 0);
  EXPECT_TRUE(at::equal(reader.read_range("t", 0, 5), full.slice(0, 0, 5)));
  EXPECT_TRUE(at::equal(reader.read_range("t", 12, 8), full.slice(0, 12, 20)));
  EXPECT_EQ(reader.read_range("t", 7, 0).numel(), 0);  // an empty range needs no piece
  auto message = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message([&] { reader.read_range("t", 3, 4); }),
              HasSubstr("tensor 't': elements [5, 7) (of the requested [3, 7)) are not in the checkpoint"));
  EXPECT_THAT(message([&] { reader.read_full("t"); }), HasSubstr("elements [5, 10) (of the requested [0, 20))"));
  EXPECT_THAT(message([&] { reader.read_full("none"); }), HasSubstr("tensor 'none': elements [0, 6)"));
  EXPECT_THAT(message([&] { reader.read_range("t", 15, 10); }), HasSubstr("outside its 20 elements"));
  EXPECT_THAT(message([&] { reader.read_range("t", -1, 2); }), HasSubstr("outside its 20 elements"));
  EXPECT_THAT(message([&] { reader.read_range("nope", 0, 1); }), HasSubstr("no tensor named 'nope'"));
  EXPECT_THAT(message([&] { reader.read_extra_file("optimizer_groups.json"); }),
              HasSubstr("is not one of the checkpoint's extra files (none)"));
  EXPECT_THAT(message([&] { consolidate_sharded_state(dir, tmp.file("out")); }), HasSubstr("tensor 't'"));
  EXPECT_FALSE(fs::exists(tmp.file("out")));
}

TEST(ShardedState, CorruptOrMissingFilesAreNamed) {
  bt::TempDir tmp;
  const std::string good = tmp.file("good");
  const auto specs = test_specs(0);
  for (const auto& m : save_on_ranks(2, good, [&](int r) { return pieces_for(specs, 2, r); })) ASSERT_EQ(m, "");
  const std::string other = tmp.file("other");  // a second save: same layout, another save_id
  for (const auto& m : save_on_ranks(2, other, [&](int r) { return pieces_for(specs, 2, r); })) ASSERT_EQ(m, "");

  int n = 0;
  auto variant = [&](const std::function<void(const std::string& dir)>& spoil) {
    const std::string dir = tmp.file("v" + std::to_string(n++));
    fs::copy(good, dir, fs::copy_options::recursive);
    spoil(dir);
    try {
      ShardedStateReader reader(dir);
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string index = "/optimizer.sharded.json";
  EXPECT_THAT(variant([&](const std::string& d) { bt::write_file(d + index, "{not json"); }),
              AllOf(HasSubstr("v0" + index), HasSubstr("is not valid JSON")));
  EXPECT_THAT(variant([&](const std::string& d) { fs::remove(d + index); }),
              AllOf(HasSubstr("v1" + index), HasSubstr("cannot open")));
  auto edit = [&](const std::function<void(nlohmann::json&)>& f) {
    return [&, f](const std::string& d) {
      auto j = nlohmann::json::parse(bt::read_file(d + index));
      f(j);
      bt::write_file(d + index, j.dump());
    };
  };
  EXPECT_THAT(variant(edit([](auto& j) { j["format"] = "booster-sharded-v9"; })), HasSubstr("unknown format"));
  EXPECT_THAT(variant(edit([](auto& j) { j["files"][1] = "../escape.safetensors"; })),
              HasSubstr("files[1] is not a plain file name"));
  EXPECT_THAT(variant(edit([](auto& j) { j["tensors"][0]["pieces"][0]["length"] = 1000; })),
              HasSubstr("tensor 'l1.weight.exp_avg' piece 0: range [0, 0 + 1000) is empty or outside"));
  EXPECT_THAT(variant(edit([](auto& j) { j["tensors"][0]["pieces"][1]["offset"] = 100; })),
              HasSubstr("overlap"));
  EXPECT_THAT(variant(edit([](auto& j) { j["tensors"][0]["dtype"] = "BF16"; })),
              AllOf(HasSubstr(rank_file(0, 2)), HasSubstr("entry 'l1.weight.exp_avg@0' is F32 [109]")));
  EXPECT_THAT(variant(edit([](auto& j) { j["tensors"][0]["pieces"][1]["entry"] = "nope"; })),
              AllOf(HasSubstr(rank_file(1, 2)), HasSubstr("has no entry 'nope'")));
  // A missing, truncated or foreign rank file is named.
  EXPECT_THAT(variant([&](const std::string& d) { fs::remove(d + "/" + rank_file(1, 2)); }),
              AllOf(HasSubstr("/" + rank_file(1, 2)), HasSubstr("cannot open")));
  EXPECT_THAT(variant([&](const std::string& d) { fs::resize_file(d + "/" + rank_file(1, 2), 100); }),
              HasSubstr("/" + rank_file(1, 2)));
  EXPECT_THAT(variant([&](const std::string& d) {
                fs::copy_file(other + "/" + rank_file(0, 2), d + "/" + rank_file(0, 2),
                              fs::copy_options::overwrite_existing);
              }),
              AllOf(HasSubstr("/" + rank_file(0, 2)), HasSubstr("belongs to another save")));
  EXPECT_EQ(variant([](const std::string&) {}), "no error");

  // A rank file replaced after the reader read its header: read_range notices the size change.
  ShardedStateReader reader(good);
  fs::resize_file(good + "/" + rank_file(1, 2), fs::file_size(good + "/" + rank_file(1, 2)) - 4);
  try {
    reader.read_full("l1.weight.exp_avg");
    ADD_FAILURE() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr(rank_file(1, 2)), HasSubstr("the file changed since its header was read")));
  }
}

TEST(ShardedState, SafetensorsRangeRead) {
  bt::TempDir tmp;
  const std::string path = tmp.file("t.safetensors");
  at::Tensor a = at::arange(10, at::kFloat), b = at::arange(6, at::kLong).reshape({2, 3});
  at::Tensor c = at::tensor({1, 0, 1}, at::kInt).to(at::kBool);
  write_safetensors(path, {{"a", a}, {"b", b}, {"c", c}});
  auto h = read_safetensors_header(path);
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_TRUE(at::equal(read_safetensors_range(path, h, h.tensors[0], 3, 4), a.slice(0, 3, 7)));
  EXPECT_TRUE(at::equal(read_safetensors_range(path, h, h.tensors[1], 1, 5), b.reshape({-1}).slice(0, 1, 6)));
  EXPECT_TRUE(at::equal(read_safetensors_range(path, h, h.tensors[2], 0, 3), c));
  EXPECT_EQ(read_safetensors_range(path, h, h.tensors[0], 10, 0).numel(), 0);
  at::Tensor buffer = at::zeros({8}, at::kFloat);
  read_safetensors_range(path, h, h.tensors[0], 0, 4, buffer.narrow(0, 2, 4));
  EXPECT_TRUE(at::equal(buffer, at::tensor({0.f, 0.f, 0.f, 1.f, 2.f, 3.f, 0.f, 0.f})));
  auto message = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const CheckpointError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message([&] { read_safetensors_range(path, h, h.tensors[0], 8, 3); }),
              AllOf(HasSubstr(path), HasSubstr("tensor 'a': elements [8, 11) are outside its 10 elements")));
  EXPECT_THAT(message([&] { read_safetensors_range(path, h, h.tensors[0], -1, 1); }), HasSubstr("outside"));
  EXPECT_THAT(message([&] { read_safetensors_range(path, h, h.tensors[0], 0, 2, at::zeros({2}, at::kDouble)); }),
              HasSubstr("needs a contiguous CPU output of dtype Float and 2 elements"));
  // A BOOL byte that is not 0/1 is refused as load_safetensors refuses it.
  {
    std::string bytes = bt::read_file(path);
    bytes[h.data_start + h.tensors[2].begin + 1] = 7;
    bt::write_file(path, bytes);
  }
  EXPECT_THAT(message([&] { read_safetensors_range(path, h, h.tensors[2], 1, 2); }), HasSubstr("BOOL element 1 is 7"));
  EXPECT_THAT(message([&] { read_safetensors_range(tmp.file("missing"), h, h.tensors[0], 0, 1); }),
              AllOf(HasSubstr("missing"), HasSubstr("cannot open")));
}

TEST(ShardedState, ConsolidateWritesTheGatheredOptimizerFormat) {
  bt::TempDir tmp;
  const std::string in = tmp.file("sharded"), out = tmp.file("gathered");
  const auto specs = test_specs(0.5);
  const std::string groups = "{\"format\": \"booster-optimizer-v1\", \"optimizer\": \"AdamW\"}\n";
  auto msgs = save_on_ranks(3, in, [&](int r) { return pieces_for(specs, 3, r); },
                            [&](int) { return std::map<std::string, std::string>{{"optimizer_groups.json", groups}}; });
  for (const auto& m : msgs) ASSERT_EQ(m, "");

  auto r = bt::run_process({BOOSTER_CLI_PATH, "ckpt", "consolidate", in, out});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("wrote 7 tensors"));
  EXPECT_EQ(names_in(out), (std::set<std::string>{"optimizer.safetensors", "optimizer_groups.json"}));
  EXPECT_EQ(bt::read_file(out + "/optimizer_groups.json"), groups);
  auto loaded = load_state_dict(out, "optimizer");
  std::map<std::string, at::Tensor> state(loaded.begin(), loaded.end());
  ASSERT_EQ(state.size(), specs.size());
  for (const Spec& s : specs) {
    ASSERT_TRUE(state.count(s.name)) << s.name;
    const at::Tensor& t = state[s.name];
    EXPECT_EQ(t.scalar_type(), s.dtype) << s.name;
    EXPECT_EQ(t.sizes(), full_value(s).sizes()) << s.name;
    EXPECT_TRUE(at::equal(t, full_value(s))) << s.name;
  }

  auto ins = bt::run_process({BOOSTER_CLI_PATH, "ckpt", "inspect", in});
  ASSERT_EQ(ins.exit_code, 0) << ins.output;
  EXPECT_THAT(ins.output, HasSubstr("format: booster-sharded-v1 (optimizer.sharded.json)"));
  EXPECT_THAT(ins.output, HasSubstr("world size: 3"));
  EXPECT_THAT(ins.output, HasSubstr("tensors: 7 in "));
  EXPECT_THAT(ins.output, HasSubstr("l1.weight.exp_avg  F32  [31, 7]  pieces 3 (ranks 0 1 2)"));
  EXPECT_THAT(ins.output, HasSubstr("extra files: optimizer_groups.json"));

  auto bad = bt::run_process({BOOSTER_CLI_PATH, "ckpt", "consolidate", tmp.file("nope"), tmp.file("x")});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_THAT(bad.output, HasSubstr("nope/optimizer.sharded.json"));

  // Big state, sharded by size like the gathered save: 2 x 1.25 MiB with 1 MiB shards.
  const std::string big = tmp.file("big"), big_out = tmp.file("big_out");
  const std::vector<Spec> big_specs{{"p0.exp_avg", {640, 512}, at::kFloat, 0}, {"p1.exp_avg", {640, 512}, at::kFloat, 9}};
  for (const auto& m : save_on_ranks(2, big, [&](int r) { return pieces_for(big_specs, 2, r); })) ASSERT_EQ(m, "");
  auto c = bt::run_process({BOOSTER_CLI_PATH, "ckpt", "consolidate", big, big_out, "--size-per-shard-mb", "1"});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_TRUE(fs::exists(big_out + "/optimizer.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(big_out + "/optimizer-00002-of-00002.safetensors"));
  auto big_state = load_state_dict(big_out, "optimizer");
  ASSERT_EQ(big_state.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_TRUE(at::equal(big_state[i].second, full_value(big_specs[i])));
  // The library function does the same.
  SaveOptions o;
  o.shard = true;
  o.size_per_shard_mb = 1;
  EXPECT_EQ(consolidate_sharded_state(big, tmp.file("lib_out"), o), 2u);
  EXPECT_TRUE(fs::exists(tmp.file("lib_out") + "/optimizer-00001-of-00002.safetensors"));
}

}  // namespace
