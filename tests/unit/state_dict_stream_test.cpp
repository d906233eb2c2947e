// state_dict_stream_test.cpp — save_state_dict_streamed (booster/checkpoint/state_dict_io.h): its
// files are byte-identical to save_state_dict's and to what the per-file writers (write_safetensors,
// write_bin) write for each shard's tensors (safetensors and .bin; one file, one shard, several
// shards, a tensor over the shard limit; mixed dtypes, 0-dim and 0-element tensors; extra files and
// another base); fetch is called once per tensor, in order; a fetched tensor unlike its spec, a
// throwing fetch, an I/O error and invalid arguments leave the previous checkpoint intact and stop
// fetching; the writer releases each fetched tensor as soon as it is written (safetensors) or its
// shard file is written (.bin), measured by counting live tensor buffers at every fetch.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "booster/checkpoint/state_dict_io.h"
#include "booster/io/atomic_write.h"
#include "common/state_dict_fixtures.h"
#include "common/test_util.h"

namespace {

namespace fs = std::filesystem;
namespace bt = booster::testing;
using booster::checkpoint::CheckpointError;
using booster::checkpoint::load_state_dict;
using booster::checkpoint::SaveOptions;
using booster::checkpoint::save_state_dict;
using booster::checkpoint::save_state_dict_streamed;
using booster::checkpoint::StateDict;
using booster::checkpoint::TensorSpec;
using namespace booster::testing::fixtures;
using booster::testing::list_dir;

std::vector<TensorSpec> specs_of(const StateDict& sd) {
  std::vector<TensorSpec> specs;
  for (const auto& [name, t] : sd) specs.push_back({name, t.scalar_type(), t.sizes().vec()});
  return specs;
}

SaveOptions options(bool safetensors, bool shard, int64_t mb = 1) {
  SaveOptions o;
  o.use_safetensors = safetensors;
  o.shard = shard;
  o.size_per_shard_mb = mb;
  return o;
}

std::string format_name(const SaveOptions& o) {
  return std::string(o.use_safetensors ? "safetensors" : "bin") +
         (o.shard ? " sharded at " + std::to_string(o.size_per_shard_mb) + " MiB" : " unsharded");
}

// A directory's files and their bytes.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& name : list_dir(dir)) out[name] = bt::read_file(dir + "/" + name);
  return out;
}

void expect_same_files(const std::string& expected_dir, const std::string& dir) {
  ASSERT_EQ(list_dir(expected_dir), list_dir(dir));
  for (const auto& [name, bytes] : snapshot(expected_dir))
    EXPECT_TRUE(bytes == bt::read_file(dir + "/" + name)) << name << " differs";
}


std::vector<size_t> iota(size_t n) {
  std::vector<size_t> v(n);
  std::iota(v.begin(), v.end(), size_t{0});
  return v;
}

// Tensors of 1 MiB (= the limit), 3 MiB (over it: a file of its own, numbered before the file of
// the tensors around it), 0.5 + 0.25 MiB, 0.5 MiB: with a 1 MiB limit the files are [t1], [t0],
// [t2, t3], [t4], so .bin must collect t0 while t1's file is written.
StateDict oversized() {
  const int64_t mib_floats = (1 << 20) / 4;
  StateDict sd;
  sd.emplace_back("t0.weight", at::full({mib_floats}, 0.5f));
  sd.emplace_back("t1.weight", at::arange(3 * mib_floats, at::kFloat).reshape({3, mib_floats}));
  sd.emplace_back("t2.weight", at::full({mib_floats / 2}, 2.5f, at::kBFloat16).to(at::kFloat));
  sd.emplace_back("t3.weight", at::full({mib_floats / 4}, 7, at::kLong).narrow(0, 0, mib_floats / 8));
  sd.emplace_back("t4.bias", at::full({mib_floats / 2}, 4.5f));
  return sd;
}

// Only 0-dim and 0-element tensors, of several dtypes.
StateDict degenerate() {
  StateDict sd;
  sd.emplace_back("scalar_f32", at::scalar_tensor(2.5, at::kFloat));
  sd.emplace_back("empty_bool", at::zeros({0}, at::kBool));
  sd.emplace_back("empty_bf16", at::zeros({3, 0}, at::kBFloat16));
  sd.emplace_back("scalar_i64", at::scalar_tensor(-7, at::kLong));
  sd.emplace_back("scalar_bool", at::scalar_tensor(1, at::kBool));
  return sd;
}

// What the per-file writers write for the tensors `dir`'s index (or its single file) assigns to each
// file, in state-dict order: the streamed save must assemble exactly these files.
void expect_files_are_per_file_writes(const std::string& dir, const StateDict& sd, const SaveOptions& o,
                                      const std::string& scratch) {
  const std::string ext = o.use_safetensors ? ".safetensors" : ".bin";
  const std::string stem = o.use_safetensors ? "model" : "pytorch_model";
  std::map<std::string, std::set<std::string>> names_by_file;
  const std::string index = dir + "/" + stem + ext + ".index.json";
  if (fs::exists(index)) {
    const nlohmann::json j = nlohmann::json::parse(bt::read_file(index));
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it)
      names_by_file[it.value().get<std::string>()].insert(it.key());
  } else {
    for (const auto& [name, t] : sd) names_by_file[stem + ext].insert(name);
    if (sd.empty()) names_by_file[stem + ext];
  }
  for (const auto& [file, names] : names_by_file) {
    StateDict part;
    for (const auto& kv : sd)
      if (names.count(kv.first)) part.push_back(kv);
    const std::string ref = scratch + "/ref-" + file;
    if (o.use_safetensors)
      booster::checkpoint::write_safetensors(ref, part);
    else
      booster::checkpoint::write_bin(ref, part);
    EXPECT_TRUE(bt::read_file(ref) == bt::read_file(dir + "/" + file)) << file;
  }
}



// A previous checkpoint in `dir` and the means to check that a failed save left it as it was.
class PreviousCheckpoint {
 public:
  PreviousCheckpoint(const bt::TempDir& tmp, const std::string& dir) : tmp_(tmp), dir_(dir) {
    save_state_dict(dir, all_dtypes(16), options(true, false), "model", {{"marker", "old"}});
    files_ = snapshot(dir);
  }
  void expect_intact() const {
    EXPECT_EQ(snapshot(dir_), files_);
    EXPECT_TRUE(leftovers(tmp_.path()).empty()) << leftovers(tmp_.path()).size() << " temporaries left";
  }

 private:
  const bt::TempDir& tmp_;
  std::string dir_;
  std::map<std::string, std::string> files_;
};

// ---- same bytes as save_state_dict and the per-file writers ---------------------------------------

TEST(StateDictStream, SameFilesAsSaveStateDictAndFetchesOnceInOrder) {
  const std::map<std::string, StateDict> cases = {
      {"mixed", all_dtypes(1024)},  // every dtype, views, a 0-dim and a 0-element tensor; 3 shards at 1 MiB
      {"oversized", oversized()},   // 4 shards, the first one out of order
      {"degenerate", degenerate()},
      {"empty", {}}};
  const std::map<std::string, size_t> sharded_files = {{"mixed", 3}, {"oversized", 4}, {"degenerate", 1}, {"empty", 1}};
  const std::map<std::string, std::string> extra = {{"config.json", "{\"a\": 1}"}};
  for (const auto& [case_name, sd] : cases) {
    for (bool safetensors : {true, false}) {
      for (const SaveOptions& o : {options(safetensors, false), options(safetensors, true, 1),
                                   options(safetensors, true, 64)}) {
        SCOPED_TRACE(case_name + ", " + format_name(o));
        bt::TempDir tmp;
        save_state_dict(tmp.file("plain"), sd, o, "model", extra);
        std::vector<size_t> calls;
        // Copies, not the caller's tensors: the bytes depend on the values only.
        save_state_dict_streamed(
            tmp.file("streamed"), specs_of(sd), o,
            [&](size_t i) {
              calls.push_back(i);
              return sd.at(i).second.clone();
            },
            "model", extra);
        EXPECT_EQ(calls, iota(sd.size()));
        expect_same_files(tmp.file("plain"), tmp.file("streamed"));
        const size_t files = o.shard && o.size_per_shard_mb == 1 ? sharded_files.at(case_name) : 1;
        const size_t index = files > 1 ? 1 : 0;
        EXPECT_EQ(list_dir(tmp.file("streamed")).size(), files + index + extra.size());
        expect_files_are_per_file_writes(tmp.file("streamed"), sd, o, tmp.path());
        expect_same(sd, load_state_dict(tmp.file("streamed")));
      }
    }
  }
}

TEST(StateDictStream, OtherBaseName) {
  const StateDict sd = all_dtypes(1024);
  for (bool safetensors : {true, false}) {
    SCOPED_TRACE(safetensors ? "safetensors" : "bin");
    bt::TempDir tmp;
    const SaveOptions o = options(safetensors, true, 1);
    save_state_dict(tmp.file("plain"), sd, o, "optimizer", {{"optimizer_groups.json", "[]"}});
    save_state_dict_streamed(
        tmp.file("streamed"), specs_of(sd), o, [&](size_t i) { return sd.at(i).second; }, "optimizer",
        {{"optimizer_groups.json", "[]"}});
    expect_same_files(tmp.file("plain"), tmp.file("streamed"));
    EXPECT_TRUE(fs::exists(tmp.file(safetensors ? "streamed/optimizer.safetensors.index.json"
                                                : "streamed/optimizer.bin.index.json")));
  }
}

// ---- errors: the previous checkpoint stays, fetching stops -----------------------------------------

// The fetch of tensor 10 ("transposed", float32 [64, 1024]: in the third of three 1 MiB shards, so
// two shard files are complete when it comes) returns something else than its spec.
TEST(StateDictStream, FetchedTensorUnlikeItsSpecIsAnErrorAndChangesNothing) {
  const StateDict sd = all_dtypes(1024);
  ASSERT_EQ(sd.at(10).first, "transposed");
  struct Case {
    std::string what;
    std::function<at::Tensor(const at::Tensor&)> wrong;
    std::vector<std::string> fragments;
  };
  const std::vector<Case> cases = {
      {"dtype", [](const at::Tensor& t) { return t.to(at::kBFloat16); },
       {"'transposed'", "BFloat16 [64, 1024]", "spec says Float [64, 1024]", "fetch(10)"}},
      {"shape", [](const at::Tensor& t) { return t.t(); }, {"'transposed'", "Float [1024, 64]", "Float [64, 1024]"}},
      {"both", [](const at::Tensor& t) { return t.reshape({-1}).to(at::kLong); },
       {"'transposed'", "Long [65536]", "Float [64, 1024]"}},
      {"undefined", [](const at::Tensor&) { return at::Tensor(); }, {"'transposed'", "undefined", "Float [64, 1024]"}},
  };
  for (bool safetensors : {true, false}) {
    for (bool shard : {false, true}) {
      for (const Case& c : cases) {
        const SaveOptions o = options(safetensors, shard, 1);
        SCOPED_TRACE(c.what + ", " + format_name(o));
        bt::TempDir tmp;
        const std::string dir = tmp.file("ckpt");
        const PreviousCheckpoint previous(tmp, dir);
        std::vector<size_t> calls;
        auto fetch = [&](size_t i) {
          calls.push_back(i);
          return i == 10 ? c.wrong(sd.at(i).second) : sd.at(i).second;
        };
        try {
          save_state_dict_streamed(dir, specs_of(sd), o, fetch, "model", {{"marker", "new"}});
          ADD_FAILURE() << "no error";
        } catch (const std::invalid_argument& e) {
          for (const auto& f : c.fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
        }
        EXPECT_EQ(calls, iota(11));  // nothing fetched after the error
        previous.expect_intact();
      }
    }
  }
}

struct FetchFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(StateDictStream, ThrowingFetchPropagatesAndChangesNothing) {
  const StateDict sd = all_dtypes(1024);
  for (bool safetensors : {true, false}) {
    for (bool shard : {false, true}) {
      for (size_t fail_at : {size_t{0}, size_t{4}, size_t{10}, sd.size() - 1}) {
        const SaveOptions o = options(safetensors, shard, 1);
        SCOPED_TRACE(format_name(o) + ", fetch " + std::to_string(fail_at) + " throws");
        bt::TempDir tmp;
        const std::string dir = tmp.file("ckpt");
        const PreviousCheckpoint previous(tmp, dir);
        std::vector<size_t> calls;
        auto fetch = [&](size_t i) {
          calls.push_back(i);
          if (i == fail_at) throw FetchFailed("gather failed at " + std::to_string(i));
          return sd.at(i).second;
        };
        EXPECT_THROW(save_state_dict_streamed(dir, specs_of(sd), o, fetch), FetchFailed);
        EXPECT_EQ(calls, iota(fail_at + 1));
        previous.expect_intact();
      }
      // An io::IoError of the caller's is the caller's: not turned into a CheckpointError.
      bt::TempDir tmp;
      const std::string dir = tmp.file("ckpt");
      const PreviousCheckpoint previous(tmp, dir);
      auto fetch = [&](size_t i) -> at::Tensor {
        if (i == 5) throw booster::io::IoError("the caller's own I/O error");
        return sd.at(i).second;
      };
      try {
        save_state_dict_streamed(dir, specs_of(sd), options(safetensors, shard), fetch);
        ADD_FAILURE() << "no error";
      } catch (const CheckpointError& e) {
        ADD_FAILURE() << "fetch's IoError became a CheckpointError: " << e.what();
      } catch (const booster::io::IoError& e) {
        EXPECT_STREQ(e.what(), "the caller's own I/O error");
      }
      previous.expect_intact();
    }
  }
}

TEST(StateDictStream, IoErrorIsCheckpointErrorAndChangesNothing) {
  // EFBIG past a 1 MiB file size limit while writing tensor data (sharded: [a], [c], [a2], the
  // second file fails).
  const StateDict big = {{"a", at::ones({150 * 1024}, at::kFloat)},
                         {"a2", at::ones({150 * 1024}, at::kFloat)},
                         {"c", at::ones({384 * 1024}, at::kFloat)}};
  for (bool safetensors : {true, false}) {
    for (bool shard : {false, true}) {
      const SaveOptions o = options(safetensors, shard, 1);
      SCOPED_TRACE(format_name(o));
      bt::TempDir tmp;
      const std::string dir = tmp.file("ckpt");
      const PreviousCheckpoint previous(tmp, dir);
      std::vector<size_t> calls;
      std::string message;
      {
        FileSizeLimit limit(1 << 20);
        try {
          save_state_dict_streamed(dir, specs_of(big), o, [&](size_t i) {
            calls.push_back(i);
            return big.at(i).second;
          });
        } catch (const CheckpointError& e) {
          message = e.what();
        }
      }
      EXPECT_NE(message.find(std::strerror(EFBIG)), std::string::npos) << message;
      ASSERT_FALSE(calls.empty());
      EXPECT_EQ(calls, iota(calls.size()));
      // Unsharded safetensors fails while writing a2's data (tensor 1); sharded safetensors on c's
      // file (tensor 2); .bin when the file holding c is written (tensor 2: its own file, or the
      // single file after the last fetch).
      EXPECT_EQ(calls.size(), safetensors && !shard ? 2u : 3u);
      previous.expect_intact();
    }
  }
  // The target's parent is a regular file: an error before the first fetch.
  bt::TempDir tmp;
  bt::write_file(tmp.file("plain_file"), "x");
  size_t fetched = 0;
  EXPECT_THROW(save_state_dict_streamed(tmp.file("plain_file/ckpt"), specs_of(big), options(true, true),
                                        [&](size_t i) {
                                          ++fetched;
                                          return big.at(i).second;
                                        }),
               CheckpointError);
  EXPECT_EQ(fetched, 0u);
  EXPECT_EQ(bt::read_file(tmp.file("plain_file")), "x");
}

TEST(StateDictStream, InvalidArgumentsFailBeforeAnyFetch) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  const PreviousCheckpoint previous(tmp, dir);
  const std::vector<TensorSpec> good = {{"a", at::kFloat, {2, 3}}, {"b", at::kBool, {}}};
  size_t fetched = 0;
  auto fetch = [&](size_t) -> at::Tensor {
    ++fetched;
    return at::ones({2, 3});
  };
  auto expect_invalid = [&](const std::vector<TensorSpec>& specs, const SaveOptions& o, const std::string& fragment,
                            const std::string& base = "model", const std::map<std::string, std::string>& extra = {}) {
    SCOPED_TRACE(fragment);
    try {
      save_state_dict_streamed(dir, specs, o, fetch, base, extra);
      ADD_FAILURE() << "no error";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  for (bool safetensors : {true, false}) {
    SCOPED_TRACE(safetensors ? "safetensors" : "bin");
    const SaveOptions o = options(safetensors, true, 1);
    expect_invalid({{"a", at::kFloat, {2}}, {"b", at::kFloat, {1}}, {"a", at::kLong, {3}}}, o,
                   "duplicate tensor name 'a'");
    expect_invalid({{"u", at::ScalarType::Undefined, {2}}}, o, "'u' has no dtype");
    expect_invalid({{"n", at::kFloat, {2, -1}}}, o, "'n' has a negative dimension: [2, -1]");
    expect_invalid({{"huge", at::kDouble, {int64_t{1} << 40, int64_t{1} << 30}}}, o, "over int64 bytes");
    expect_invalid(good, o, "invalid base name", "../model");
    expect_invalid(good, o, "is not a plain file name", "model", {{"sub/x.json", "{}"}});
    expect_invalid(good, options(safetensors, true, 0), "size_per_shard_mb must be positive");
    const std::string single = safetensors ? "model.safetensors" : "pytorch_model.bin";
    expect_invalid(good, options(safetensors, false), "collides", "model", {{single, "x"}});
  }
  // What safetensors cannot store is a CheckpointError, also before anything is fetched.
  for (const std::vector<TensorSpec>& specs :
       {std::vector<TensorSpec>{{"a", at::kFloat, {2, 3}}, {"c", at::kComplexFloat, {4}}},
        std::vector<TensorSpec>{{"__metadata__", at::kFloat, {1}}},
        std::vector<TensorSpec>{{std::string("bad\xff", 4), at::kFloat, {1}}}}) {
    EXPECT_THROW(save_state_dict_streamed(dir, specs, options(true, false), fetch), CheckpointError);
  }
  EXPECT_EQ(fetched, 0u);
  previous.expect_intact();
}

// ---- memory: what the writer keeps of the fetched tensors --------------------------------------------

// 16 pieces of 256 KiB whose buffers count themselves: `live` is the number of pieces not yet freed
// (by anyone: the writer, LibTorch's pickler, a copy in a container).
class CountedPieces {
 public:
  static constexpr int kPieces = 16;
  static constexpr int64_t kFloats = 64 * 1024;

  std::vector<TensorSpec> specs() const {
    std::vector<TensorSpec> out;
    for (int i = 0; i < kPieces; ++i) out.push_back({"layers." + std::to_string(i) + ".weight", at::kFloat, {kFloats}});
    return out;
  }
  // Called by fetch(i): records how many earlier pieces are still alive, then makes piece i.
  at::Tensor make(size_t i) {
    alive_at_fetch.push_back(live);
    auto* p = static_cast<float*>(std::malloc(kFloats * sizeof(float)));
    std::fill(p, p + kFloats, static_cast<float>(i));
    ++live;
    int* counter = &live;
    return at::from_blob(
        p, {kFloats},
        [counter](void* q) {
          std::free(q);
          --*counter;
        },
        at::kFloat);
  }
  int live = 0;
  std::vector<int> alive_at_fetch;
};

TEST(StateDictStream, ReleasesFetchedTensorsOnceWritten) {
  // Safetensors: nothing of piece i is alive when piece i + 1 is fetched. .bin: the pieces already
  // fetched for the file being filled (4 per 1 MiB shard file; all of them without sharding).
  for (bool safetensors : {true, false}) {
    for (bool shard : {false, true}) {
      const SaveOptions o = options(safetensors, shard, 1);
      SCOPED_TRACE(format_name(o));
      bt::TempDir tmp;
      CountedPieces pieces;
      save_state_dict_streamed(tmp.file("ckpt"), pieces.specs(), o, [&](size_t i) { return pieces.make(i); });
      std::vector<int> expected;
      for (int i = 0; i < CountedPieces::kPieces; ++i) expected.push_back(safetensors ? 0 : shard ? i % 4 : i);
      EXPECT_EQ(pieces.alive_at_fetch, expected);
      EXPECT_EQ(pieces.live, 0) << "fetched tensors still alive after the save";
      EXPECT_EQ(list_dir(tmp.file("ckpt")).size(), shard ? 5u : 1u);  // 4 files + index, or 1 file
      const StateDict back = load_state_dict(tmp.file("ckpt"));
      ASSERT_EQ(back.size(), static_cast<size_t>(CountedPieces::kPieces));
      for (const auto& [name, t] : back) {
        const int i = std::stoi(name.substr(7));
        EXPECT_TRUE(t.eq(static_cast<float>(i)).all().item<bool>()) << name;
      }
    }
  }
}

}  // namespace
