// torch_unpickler_test.cpp — read_bin's restricted unpickler (src/checkpoint/torch_unpickler.cpp)
// against files Python's torch 2.11 writes (tests/unit/checkpoint_interop.py write_pickles): a
// model.state_dict() OrderedDict, a one-tensor dict (SETITEM), every dtype, views sharing one
// storage, nested dicts with non-tensor values, a sharded checkpoint with a tensor alone in its
// shard — all bit-exact to the bytes Python reports; and hostile or broken archives, each a
// CheckpointError naming the file and the problem, with nothing executed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "booster/checkpoint/state_dict_io.h"
#include "booster/checkpoint/torch_pickle.h"
#include "common/state_dict_fixtures.h"
#include "common/test_util.h"

namespace bt = booster::testing;
using booster::checkpoint::CheckpointError;
using booster::checkpoint::read_bin;
using booster::checkpoint::StateDict;
using namespace booster::testing::fixtures;
using ::testing::HasSubstr;

namespace {

const std::string kUnpicklerInterop = std::string(BOOSTER_SOURCE_DIR) + "/tests/unit/checkpoint_interop.py";

// Written once per test binary run.
struct Files {
  bt::TempDir dir;
  nlohmann::json expected;
  std::string marker;
  Files() {
    marker = dir.file("MARKER");
    auto r = bt::run_process({BOOSTER_PYTHON, kUnpicklerInterop, "write_pickles", dir.path(), marker}, {}, 300);
    if (r.exit_code != 0) throw std::runtime_error("write_pickles failed: " + r.output);
    expected = nlohmann::json::parse(bt::read_file(dir.file("expected.json")));
  }
  std::string file(const std::string& name) const { return dir.file(name); }
};
const Files& files() {
  static Files f;
  return f;
}

void expect_equal(const std::string& name, const StateDict& sd) {
  static const std::map<std::string, at::ScalarType> dtype = {
      {"float64", at::kDouble}, {"float32", at::kFloat},       {"float16", at::kHalf},
      {"bfloat16", at::kBFloat16}, {"int64", at::kLong},       {"int32", at::kInt},
      {"int16", at::kShort},    {"int8", at::kChar},           {"uint8", at::kByte},
      {"bool", at::kBool},      {"complex64", at::kComplexFloat}, {"complex128", at::kComplexDouble}};
  const auto& e = files().expected[name];
  ASSERT_EQ(names_of(sd), e["order"].get<std::vector<std::string>>()) << name;
  for (const auto& [n, t] : sd) {
    const auto& d = e["tensors"][n];
    EXPECT_EQ(t.scalar_type(), dtype.at(d["dtype"].get<std::string>())) << name << " " << n;
    EXPECT_EQ(t.sizes().vec(), d["shape"].get<std::vector<int64_t>>()) << name << " " << n;
    EXPECT_TRUE(raw_bytes(t) == from_hex(d["hex"].get<std::string>())) << name << " " << n;
  }
}

std::string error_of(const std::string& name) {
  try {
    read_bin(files().file(name));
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(TorchUnpickler, ReadsWhatTorchSaveWritesForStateDictsBitExactly) {
  for (const char* name : {"state_dict.bin", "single.bin", "dtypes.bin", "views.bin", "nested.bin"}) {
    SCOPED_TRACE(name);
    expect_equal(name, read_bin(files().file(name)));
  }
  // The views share one storage as in Python; their values are the viewed elements.
  StateDict views = read_bin(files().file("views.bin"));
  EXPECT_EQ(views[1].second.storage().unsafeGetStorageImpl(), views[0].second.storage().unsafeGetStorageImpl());
  EXPECT_FALSE(views[2].second.requires_grad());
}

TEST(TorchUnpickler, AShardedCheckpointWithATensorAloneInItsShardLoads) {
  StateDict sd = booster::checkpoint::load_state_dict(files().file("alone"));
  std::map<std::string, at::Tensor> by_name(sd.begin(), sd.end());
  ASSERT_EQ(by_name.size(), 3u);
  const auto& e = files().expected["alone"]["tensors"];
  for (const auto& [n, t] : by_name) EXPECT_TRUE(raw_bytes(t) == from_hex(e[n]["hex"].get<std::string>())) << n;
}

TEST(TorchUnpickler, HostileGlobalsAreRefusedByNameAndNothingRuns) {
  EXPECT_THAT(error_of("evil_global.bin"), HasSubstr("refuses global 'posix.system'"));
  EXPECT_THAT(error_of("evil_stack_global.bin"), HasSubstr("refuses global 'builtins.eval'"));
  EXPECT_THAT(error_of("evil_global.bin"), HasSubstr("evil_global.bin"));
  EXPECT_FALSE(std::filesystem::exists(files().marker)) << "a refused global ran";
}

TEST(TorchUnpickler, BrokenArchivesAreClearErrors) {
  EXPECT_THAT(error_of("truncated.bin"), HasSubstr("truncated"));
  EXPECT_THAT(error_of("missing_storage.bin"), HasSubstr("storage record 'data/0' is missing"));
  EXPECT_THAT(error_of("short_storage.bin"), HasSubstr("storage record 'data/0' has 20 bytes, the pickle says 6 elements"));
  EXPECT_THAT(error_of("deep.bin"), HasSubstr("nested deeper than 1000"));
  EXPECT_THAT(error_of("outside.bin"), HasSubstr("outside its storage of 4 elements"));
  EXPECT_THAT(error_of("legacy.bin"), HasSubstr("legacy format"));
  EXPECT_THAT(error_of("list.bin"), HasSubstr("holds a list, expected a dict"));
  EXPECT_THAT(error_of("nope.bin"), HasSubstr("cannot open"));
  // Random bytes that are not a zip archive.
  bt::TempDir tmp;
  {
    std::ofstream f(tmp.file("junk.bin"), std::ios::binary);
    f << "PK\x03\x04 not really a zip";
  }
  try {
    read_bin(tmp.file("junk.bin"));
    ADD_FAILURE() << "junk accepted";
  } catch (const CheckpointError& e) {
    EXPECT_THAT(e.what(), HasSubstr("junk.bin"));
  }
}
