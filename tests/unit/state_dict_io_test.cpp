// state_dict_io_test.cpp — booster/checkpoint/state_dict_io.h: huggingface_hub's shard split rule,
// bit-exact round trips of every dtype (safetensors and .bin, sharded and not), the HF file layout
// and index text, tied tensors, interop with Python torch 2.11 both ways (its torch.load with weights_only=True)
// (tests/unit/checkpoint_interop.py), every index rejection, replacing a checkpoint, failed saves
// leaving the old one intact, and SIGKILL at many points of a save loop (the test binary re-runs
// itself as the saving child: StateDictIO.DISABLED_KillChildSaveLoop with BOOSTER_CKPT_KILL_CHILD).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "booster/checkpoint/state_dict_io.h"
#include "common/state_dict_fixtures.h"
#include "common/test_util.h"

#ifndef BOOSTER_PYTHON
#define BOOSTER_PYTHON "/usr/bin/python3"
#endif

namespace {

namespace fs = std::filesystem;
namespace bt = booster::testing;
using booster::checkpoint::CheckpointError;
using booster::checkpoint::load_state_dict;
using booster::checkpoint::read_bin;
using booster::checkpoint::SaveOptions;
using booster::checkpoint::save_state_dict;
using booster::checkpoint::split_into_shards;
using booster::checkpoint::StateDict;
using booster::checkpoint::write_bin;
using Shards = std::vector<std::vector<size_t>>;
using namespace booster::testing::fixtures;
using booster::testing::list_dir;

const std::string kInterop = std::string(BOOSTER_SOURCE_DIR) + "/tests/unit/checkpoint_interop.py";

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(bt::read_file(path)); }

bt::ProcessResult run_python(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {BOOSTER_PYTHON, kInterop};
  argv.insert(argv.end(), args.begin(), args.end());
  return bt::run_process(argv, {}, 300);
}

// ---- shard split ------------------------------------------------------------------------------

TEST(StateDictIO, SplitFollowsHuggingFaceRule) {
  // Equal to the limit still fits; one byte more starts a new shard.
  EXPECT_EQ(split_into_shards({4, 4, 4}, 8), (Shards{{0, 1}, {2}}));
  EXPECT_EQ(split_into_shards({5, 5}, 10), (Shards{{0, 1}}));
  EXPECT_EQ(split_into_shards({8}, 8), (Shards{{0}}));
  EXPECT_EQ(split_into_shards({8, 1}, 8), (Shards{{0}, {1}}));
  EXPECT_EQ(split_into_shards({1, 8}, 8), (Shards{{0}, {1}}));
  EXPECT_EQ(split_into_shards({7, 1, 1}, 8), (Shards{{0, 1}, {2}}));
  // huggingface_hub's docstring example: [6, 6, 2, 6, 2, 2] GB with a 10 GB limit.
  EXPECT_EQ(split_into_shards({6, 6, 2, 6, 2, 2}, 10), (Shards{{0}, {1, 2}, {3, 4, 5}}));
  // A tensor over the limit is its own shard, appended at once: the shard being filled goes on
  // collecting the tensors on both sides of it and comes after it.
  EXPECT_EQ(split_into_shards({2, 20, 3}, 10), (Shards{{1}, {0, 2}}));
  EXPECT_EQ(split_into_shards({3, 20, 30, 4, 5}, 10), (Shards{{1}, {2}, {0, 3}, {4}}));
  EXPECT_EQ(split_into_shards({11}, 10), (Shards{{0}}));
  EXPECT_EQ(split_into_shards({10, 11, 10}, 10), (Shards{{1}, {0}, {2}}));
  // Empty tensors and empty input.
  EXPECT_EQ(split_into_shards({0, 0, 10, 0}, 10), (Shards{{0, 1, 2, 3}}));
  EXPECT_EQ(split_into_shards({}, 10), Shards{});
  // No overflow near the int64 limit.
  const int64_t big = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(split_into_shards({big - 1, big - 1}, big), (Shards{{0}, {1}}));
}

TEST(StateDictIO, SplitRejectsNonPositiveLimit) {
  EXPECT_THROW(split_into_shards({1}, 0), std::invalid_argument);
  EXPECT_THROW(split_into_shards({1}, -5), std::invalid_argument);
  bt::TempDir tmp;
  SaveOptions opt;
  opt.shard = true;
  opt.size_per_shard_mb = 0;
  EXPECT_THROW(save_state_dict(tmp.file("c"), all_dtypes(2), opt), std::invalid_argument);
  EXPECT_FALSE(fs::exists(tmp.file("c")));
}

// ---- round trips and layout -------------------------------------------------------------------

TEST(StateDictIO, RoundTripAllDtypesBothFormats) {
  const StateDict sd = all_dtypes(1024);  // ~1.9 MiB: several 1 MiB shards
  for (bool safetensors : {true, false}) {
    for (bool shard : {false, true}) {
      SCOPED_TRACE(std::string(safetensors ? "safetensors" : "bin") + (shard ? " sharded" : " unsharded"));
      bt::TempDir tmp;
      SaveOptions opt;
      opt.use_safetensors = safetensors;
      opt.shard = shard;
      opt.size_per_shard_mb = 1;
      const std::string dir = tmp.file("ckpt");
      save_state_dict(dir, sd, opt);
      const std::set<std::string> files = list_dir(dir);
      const std::string stem = safetensors ? "model" : "pytorch_model";
      const std::string ext = safetensors ? ".safetensors" : ".bin";
      if (shard) {
        EXPECT_TRUE(files.count(stem + ext + ".index.json"));
        EXPECT_FALSE(files.count(stem + ext));
        EXPECT_GE(files.size(), 3u);
      } else {
        EXPECT_EQ(files, std::set<std::string>{stem + ext});
      }
      const StateDict back = load_state_dict(dir);
      expect_same(sd, back);
      if (!shard) {
        EXPECT_EQ(names_of(sd), names_of(back));  // file order = insertion order
      }
      // Owning, contiguous tensors.
      for (const auto& [n, t] : back) EXPECT_TRUE(t.is_contiguous()) << n;
    }
  }
}

// Tensors of 1 MiB (= the limit), 3 MiB (> the limit), 0.5 + 0.5 MiB and 0.25 MiB with a 1 MiB
// limit, plus a tied alias: the huggingface_hub split is [t1], [t0], [t2, t3], [t4].
StateDict crafted() {
  const int64_t mib_floats = (1 << 20) / 4;
  StateDict sd;
  sd.emplace_back("t0.weight", at::full({mib_floats}, 0.5f));
  sd.emplace_back("t1.weight", at::full({3, mib_floats}, 1.5f));
  sd.emplace_back("t2.weight", at::full({mib_floats / 2}, 2.5f));
  sd.emplace_back("t3.weight", at::full({mib_floats / 4, 2}, 3.5, at::kFloat));
  sd.emplace_back("tied.weight", sd[0].second);  // same storage, offset, shape: written once
  sd.emplace_back("t4.bias", at::full({mib_floats / 4}, 4.5f));
  return sd;
}

TEST(StateDictIO, ShardLayoutAndIndexMatchHuggingFace) {
  for (bool safetensors : {true, false}) {
    SCOPED_TRACE(safetensors ? "safetensors" : "bin");
    bt::TempDir tmp;
    SaveOptions opt;
    opt.use_safetensors = safetensors;
    opt.shard = true;
    opt.size_per_shard_mb = 1;
    const StateDict sd = crafted();
    const std::string dir = tmp.file("ckpt");
    save_state_dict(dir, sd, opt);
    const std::string stem = safetensors ? "model" : "pytorch_model";
    const std::string ext = safetensors ? ".safetensors" : ".bin";
    auto shard = [&](int i) { return stem + "-0000" + std::to_string(i) + "-of-00004" + ext; };
    EXPECT_EQ(list_dir(dir), (std::set<std::string>{shard(1), shard(2), shard(3), shard(4), stem + ext + ".index.json"}));

    const nlohmann::json index = read_json(dir + "/" + stem + ext + ".index.json");
    const nlohmann::json expected = {
        {"metadata", {{"total_size", (1 << 20) * 5 + (1 << 18)}}},
        {"weight_map",
         {{"t0.weight", shard(2)}, {"t1.weight", shard(1)}, {"t2.weight", shard(3)}, {"t3.weight", shard(3)},
          {"t4.bias", shard(4)}}}};
    EXPECT_EQ(index, expected) << index.dump(2);
    EXPECT_TRUE(index["metadata"]["total_size"].is_number_integer());

    // Each shard holds exactly its tensors, in state-dict order.
    const std::vector<std::vector<std::string>> per_shard = {
        {"t1.weight"}, {"t0.weight"}, {"t2.weight", "t3.weight"}, {"t4.bias"}};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(names_of(load_state_dict(dir + "/" + shard(i + 1))), per_shard[i]) << i;

    // Loading: shards in file-name order, the tied alias not stored (the model loader restores it).
    const StateDict back = load_state_dict(dir);
    EXPECT_EQ(names_of(back), (std::vector<std::string>{"t1.weight", "t0.weight", "t2.weight", "t3.weight", "t4.bias"}));
    StateDict untied = sd;
    untied.erase(untied.begin() + 4);
    expect_same(untied, back);
  }
}

TEST(StateDictIO, IndexTextIsWhatTransformersWrites) {
  bt::TempDir tmp;
  StateDict sd = crafted();
  sd.emplace_back("zeta \"quoted\"\\name", at::ones({3}));
  sd.emplace_back("unicode.\xc3\xa9t\xc3\xa9.\xf0\x9f\x98\x80", at::ones({3}));  // é, an emoji
  SaveOptions opt;
  opt.shard = true;
  opt.size_per_shard_mb = 1;
  std::vector<std::string> indexes = {"check_index"};
  for (bool safetensors : {true, false}) {
    opt.use_safetensors = safetensors;
    const std::string dir = tmp.file(safetensors ? "st" : "bin");
    save_state_dict(dir, sd, opt);
    const std::string index = dir + (safetensors ? "/model.safetensors.index.json" : "/pytorch_model.bin.index.json");
    indexes.push_back(index);
    EXPECT_NE(bt::read_file(index).find("\\ud83d\\ude00"), std::string::npos);  // ensure_ascii, as json.dumps
    const StateDict back = load_state_dict(dir);
    EXPECT_EQ(back.size(), sd.size() - 1);
  }
  const auto r = run_python(indexes);
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(StateDictIO, SingleShardHasNoIndexAndEmptyStateDictWorks) {
  bt::TempDir tmp;
  SaveOptions opt;
  opt.shard = true;
  opt.size_per_shard_mb = 64;
  save_state_dict(tmp.file("a"), all_dtypes(4), opt);
  EXPECT_EQ(list_dir(tmp.file("a")), std::set<std::string>{"model.safetensors"});
  for (bool safetensors : {true, false}) {
    opt.use_safetensors = safetensors;
    const std::string dir = tmp.file(safetensors ? "empty_st" : "empty_bin");
    save_state_dict(dir, {}, opt);
    EXPECT_EQ(list_dir(dir).size(), 1u);
    EXPECT_TRUE(load_state_dict(dir).empty());
  }
}

TEST(StateDictIO, TiedTensorsWrittenOnceUnderFirstName) {
  bt::TempDir tmp;
  at::Tensor w = at::arange(12, at::kFloat).reshape({3, 4});
  StateDict sd;
  sd.emplace_back("embed.weight", w);
  sd.emplace_back("lm_head.weight", w);                   // tied: same storage, offset, shape
  sd.emplace_back("other_view", w.view({4, 3}));          // same storage, other shape: a separate tensor
  sd.emplace_back("row", w[1]);                           // same storage, other offset
  sd.emplace_back("alias_again", w.view({3, 4}));         // a new TensorImpl with identical geometry: tied
  for (bool safetensors : {true, false}) {
    SaveOptions opt;
    opt.use_safetensors = safetensors;
    const std::string dir = tmp.file(safetensors ? "st" : "bin");
    save_state_dict(dir, sd, opt);
    const StateDict back = load_state_dict(dir);
    EXPECT_EQ(names_of(back), (std::vector<std::string>{"embed.weight", "other_view", "row"}));
    expect_same({sd[0], sd[2], sd[3]}, back);
  }
}

TEST(StateDictIO, OtherBaseNameAndFilePaths) {
  bt::TempDir tmp;
  const StateDict sd = all_dtypes(1024);
  SaveOptions opt;
  opt.shard = true;
  opt.size_per_shard_mb = 1;
  save_state_dict(tmp.file("st"), sd, opt, "optimizer");
  EXPECT_TRUE(fs::exists(tmp.file("st/optimizer.safetensors.index.json")));
  EXPECT_TRUE(fs::exists(tmp.file("st/optimizer-00001-of-00003.safetensors")));
  expect_same(sd, load_state_dict(tmp.file("st"), "optimizer"));
  EXPECT_THROW(load_state_dict(tmp.file("st")), CheckpointError);  // no model.* there
  // An index given as a file path.
  expect_same(sd, load_state_dict(tmp.file("st/optimizer.safetensors.index.json")));

  opt.use_safetensors = false;
  save_state_dict(tmp.file("bin"), sd, opt, "optimizer");
  EXPECT_TRUE(fs::exists(tmp.file("bin/optimizer.bin.index.json")));
  EXPECT_TRUE(fs::exists(tmp.file("bin/optimizer-00003-of-00003.bin")));
  expect_same(sd, load_state_dict(tmp.file("bin"), "optimizer"));
  opt.shard = false;
  save_state_dict(tmp.file("bin1"), sd, opt, "optimizer");
  EXPECT_EQ(list_dir(tmp.file("bin1")), std::set<std::string>{"optimizer.bin"});
  expect_same(sd, load_state_dict(tmp.file("bin1/optimizer.bin")));
  // A file path of either format, whatever its name.
  write_bin(tmp.file("weights.pt"), sd);
  expect_same(sd, load_state_dict(tmp.file("weights.pt")));
}

// ---- Python interop -----------------------------------------------------------------------------

TEST(StateDictIO, PythonTorchLoadReadsOurBin) {
  const StateDict sd = all_dtypes(1024);
  for (bool shard : {false, true}) {
    SCOPED_TRACE(shard ? "sharded" : "unsharded");
    bt::TempDir tmp;
    SaveOptions opt;
    opt.use_safetensors = false;
    opt.shard = shard;
    opt.size_per_shard_mb = 1;
    save_state_dict(tmp.file("ckpt"), sd, opt);
    const auto r = run_python({"read_ours", tmp.file("ckpt"), tmp.file("back.bin")});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json summary = nlohmann::json::parse(r.output.substr(r.output.find('{')));
    EXPECT_EQ(summary["files"].size(), shard ? 3u : 1u) << summary["files"];
    const std::map<at::ScalarType, std::string> py_dtype = {
        {at::kDouble, "float64"}, {at::kFloat, "float32"}, {at::kHalf, "float16"}, {at::kBFloat16, "bfloat16"},
        {at::kLong, "int64"},     {at::kInt, "int32"},     {at::kShort, "int16"},  {at::kChar, "int8"},
        {at::kByte, "uint8"},     {at::kBool, "bool"}};
    for (const auto& [n, t] : sd) {
      const auto& d = summary["tensors"][n];
      EXPECT_EQ(d["dtype"], py_dtype.at(t.scalar_type())) << n;
      EXPECT_EQ(d["shape"].get<std::vector<int64_t>>(), t.sizes().vec()) << n;
      EXPECT_EQ(d["hex"], to_hex(raw_bytes(t))) << n;
    }
    // Python's torch.save of what it read comes back bit-exact.
    expect_same(sd, read_bin(tmp.file("back.bin")));
  }
}

TEST(StateDictIO, ReadsPythonTorchSave) {
  bt::TempDir tmp;
  const auto r = run_python({"write_ref", tmp.path()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json expected = read_json(tmp.file("expected.json"));
  const std::map<std::string, at::ScalarType> dtype = {
      {"float64", at::kDouble}, {"float32", at::kFloat}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int64", at::kLong},     {"int32", at::kInt},     {"int16", at::kShort},  {"int8", at::kChar},
      {"uint8", at::kByte},     {"bool", at::kBool}};
  auto check = [&](const StateDict& sd, bool check_order) {
    ASSERT_EQ(sd.size(), expected["order"].size());
    if (check_order) {
      EXPECT_EQ(names_of(sd), expected["order"].get<std::vector<std::string>>());
    }
    for (const auto& [n, t] : sd) {
      const auto& d = expected["tensors"][n];
      ASSERT_TRUE(d.is_object()) << n;
      EXPECT_EQ(t.scalar_type(), dtype.at(d["dtype"].get<std::string>())) << n;
      EXPECT_EQ(t.sizes().vec(), d["shape"].get<std::vector<int64_t>>()) << n;
      EXPECT_TRUE(raw_bytes(t) == from_hex(d["hex"].get<std::string>())) << n;
    }
  };
  check(load_state_dict(tmp.file("single")), true);                     // pytorch_model.bin
  check(read_bin(tmp.file("single/pytorch_model.bin")), true);
  check(load_state_dict(tmp.file("sharded")), false);                   // index + 2 shards
  // torch.save(model.state_dict()) pickles an OrderedDict (LibTorch's own unpickler cannot rebuild
  // one; Booster's restricted unpickler does).
  check(read_bin(tmp.file("ordered.bin")), true);
}

// ---- index validation ---------------------------------------------------------------------------

void expect_load_error(const std::string& path, const std::vector<std::string>& fragments) {
  try {
    load_state_dict(path);
    ADD_FAILURE() << "no error loading " << path;
  } catch (const CheckpointError& e) {
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what() << " / " << f;
  }
}

TEST(StateDictIO, IndexRejections) {
  for (bool safetensors : {true, false}) {
    SCOPED_TRACE(safetensors ? "safetensors" : "bin");
    bt::TempDir tmp;
    SaveOptions opt;
    opt.use_safetensors = safetensors;
    opt.shard = true;
    opt.size_per_shard_mb = 1;
    const std::string dir = tmp.file("ckpt");
    save_state_dict(dir, crafted(), opt);
    const std::string stem = safetensors ? "model" : "pytorch_model";
    const std::string ext = safetensors ? ".safetensors" : ".bin";
    const std::string index_name = stem + ext + ".index.json";
    const std::string index_path = dir + "/" + index_name;
    const std::string good = bt::read_file(index_path);
    const std::string shard1 = stem + "-00001-of-00004" + ext;
    auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
      nlohmann::json j = nlohmann::json::parse(good);
      edit(j);
      bt::write_file(index_path, j.dump(2));
    };
    // Weight-map values that are not plain file names inside the directory.
    for (const std::string& bad : {std::string("/etc/passwd"), "../" + shard1, "sub/" + shard1, "sub\\" + shard1,
                                  std::string(".."), std::string("."), std::string(""), "./" + shard1}) {
      SCOPED_TRACE(bad);
      with([&](nlohmann::json& j) { j["weight_map"]["t1.weight"] = bad; });
      expect_load_error(dir, {index_name, "t1.weight", "plain file name"});
    }
    // A name in the index that its shard lacks.
    with([&](nlohmann::json& j) { j["weight_map"]["ghost.weight"] = shard1; });
    expect_load_error(dir, {"ghost.weight", shard1, index_name});
    // Not JSON / wrong structure.
    bt::write_file(index_path, "{\"weight_map\": ");
    expect_load_error(dir, {index_name, "JSON"});
    bt::write_file(index_path, "[]");
    expect_load_error(dir, {index_name});
    with([&](nlohmann::json& j) { j.erase("weight_map"); });
    expect_load_error(dir, {index_name, "weight_map"});
    with([&](nlohmann::json& j) { j["weight_map"]["t1.weight"] = 3; });
    expect_load_error(dir, {index_name, "t1.weight"});
    // A shard in the shard directory that is missing.
    bt::write_file(index_path, good);
    ASSERT_NO_THROW(load_state_dict(dir));
    fs::rename(dir + "/" + shard1, dir + "/moved");
    expect_load_error(dir, {index_name, "missing shard", shard1});
    fs::rename(dir + "/moved", dir + "/" + shard1);
    // A corrupt shard names the shard.
    const std::string shard4 = dir + "/" + stem + "-00004-of-00004" + ext;
    const std::string shard4_bytes = bt::read_file(shard4);
    bt::write_file(shard4, shard4_bytes.substr(0, shard4_bytes.size() / 2));
    expect_load_error(dir, {stem + "-00004-of-00004" + ext});
    bt::write_file(shard4, shard4_bytes);
    // A shard with names the index does not list is fine: the index decides.
    with([&](nlohmann::json& j) { j["weight_map"].erase("t3.weight"); });
    const StateDict back = load_state_dict(dir);
    EXPECT_EQ(names_of(back), (std::vector<std::string>{"t1.weight", "t0.weight", "t2.weight", "t4.bias"}));
  }
}

TEST(StateDictIO, LoadErrors) {
  bt::TempDir tmp;
  expect_load_error(tmp.file("nope"), {"nope"});
  fs::create_directories(tmp.file("empty"));
  expect_load_error(tmp.file("empty"), {"no checkpoint", "model.safetensors", "pytorch_model.bin"});
  bt::write_file(tmp.file("junk.bin"), "not a zip archive at all");
  expect_load_error(tmp.file("junk.bin"), {"junk.bin"});
  bt::write_file(tmp.file("junk.safetensors"), "12345678");
  expect_load_error(tmp.file("junk.safetensors"), {"junk.safetensors"});
  // A .bin holding something else than a dict of tensors.
  const std::vector<char> list_bytes = torch::jit::pickle_save(c10::IValue(c10::List<int64_t>({1, 2})));
  bt::write_file(tmp.file("list.bin"), std::string(list_bytes.begin(), list_bytes.end()));
  expect_load_error(tmp.file("list.bin"), {"list.bin", "dict"});
}

// ---- atomic replacement and failures -------------------------------------------------------------


TEST(StateDictIO, SaveReplacesExistingCheckpoint) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  SaveOptions sharded;
  sharded.shard = true;
  sharded.size_per_shard_mb = 1;
  const StateDict a = all_dtypes(1024);
  save_state_dict(dir, a, sharded, "model", {{"config.json", "{\"a\": 1}"}, {"notes.txt", "old"}});
  EXPECT_EQ(bt::read_file(dir + "/notes.txt"), "old");
  EXPECT_EQ(list_dir(dir).size(), 6u);  // 3 shards, index, 2 extra files

  SaveOptions bin;
  bin.use_safetensors = false;
  StateDict b = {{"only", at::full({5}, 7.0)}};
  save_state_dict(dir + "/", b, bin, "model", {{"config.json", "{\"b\": 2}"}});
  EXPECT_EQ(list_dir(dir), (std::set<std::string>{"pytorch_model.bin", "config.json"}));
  EXPECT_EQ(bt::read_file(dir + "/config.json"), "{\"b\": 2}");
  expect_same(b, load_state_dict(dir));
  EXPECT_TRUE(leftovers(tmp.path()).empty());

  // Missing parents are created.
  save_state_dict(tmp.file("x/y/z"), b, bin);
  expect_same(b, load_state_dict(tmp.file("x/y/z")));

  // Argument errors change nothing.
  EXPECT_THROW(save_state_dict(dir, a, sharded, "model", {{"../escape", "x"}}), std::invalid_argument);
  EXPECT_THROW(save_state_dict(dir, a, sharded, "model", {{"model.safetensors.index.json", "x"}}), std::invalid_argument);
  EXPECT_THROW(save_state_dict(dir, {{"n", at::ones({1})}, {"n", at::ones({1})}}, bin), CheckpointError);
  EXPECT_THROW(save_state_dict(dir, {{"n", at::Tensor()}}, bin), CheckpointError);
  expect_same(b, load_state_dict(dir));
  EXPECT_TRUE(leftovers(tmp.path()).empty());
}

TEST(StateDictIO, AtomicWriteDirectory) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("d");
  booster::checkpoint::atomic_write_directory(dir, {{"a.txt", "one"}, {"b.bin", std::string("\0\1\2", 3)}});
  EXPECT_EQ(list_dir(dir), (std::set<std::string>{"a.txt", "b.bin"}));
  EXPECT_EQ(bt::read_file(dir + "/b.bin"), std::string("\0\1\2", 3));
  booster::checkpoint::atomic_write_directory(dir, {{"c.txt", "two"}});
  EXPECT_EQ(list_dir(dir), std::set<std::string>{"c.txt"});
  EXPECT_THROW(booster::checkpoint::atomic_write_directory(dir, {{"x/y", "no"}}), std::invalid_argument);
  EXPECT_EQ(list_dir(dir), std::set<std::string>{"c.txt"});
  // A regular file in the way is not replaced.
  bt::write_file(tmp.file("file"), "keep");
  EXPECT_THROW(booster::checkpoint::atomic_write_directory(tmp.file("file"), {{"a", "b"}}), CheckpointError);
  EXPECT_EQ(bt::read_file(tmp.file("file")), "keep");
  // Through a symlink: the directory it points to is replaced, the link stays.
  fs::create_directory_symlink(dir, tmp.file("link"));
  booster::checkpoint::atomic_write_directory(tmp.file("link"), {{"via_link", "3"}});
  EXPECT_TRUE(fs::is_symlink(tmp.file("link")));
  EXPECT_EQ(list_dir(dir), std::set<std::string>{"via_link"});
  EXPECT_TRUE(leftovers(tmp.path()).empty());
}


TEST(StateDictIO, FailedSaveLeavesOldCheckpointIntact) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  SaveOptions opt;
  opt.shard = true;
  opt.size_per_shard_mb = 1;
  const StateDict old = all_dtypes(1024);
  save_state_dict(dir, old, opt, "model", {{"marker", "old"}});
  const std::set<std::string> old_files = list_dir(dir);

  auto expect_intact = [&] {
    EXPECT_EQ(list_dir(dir), old_files);
    EXPECT_EQ(bt::read_file(dir + "/marker"), "old");
    expect_same(old, load_state_dict(dir));
    EXPECT_TRUE(leftovers(tmp.path()).empty()) << leftovers(tmp.path()).size();
  };

  // An I/O error in the middle of writing tensor data (EFBIG past a 1 MiB file size limit), for
  // both writers, sharded (split [a], [c], [a2]: the second shard fails) and not.
  const StateDict big = {{"a", at::ones({150 * 1024}, at::kFloat)},
                         {"a2", at::ones({150 * 1024}, at::kFloat)},
                         {"c", at::ones({384 * 1024}, at::kFloat)}};
  for (bool safetensors : {true, false}) {
    for (bool shard : {false, true}) {
      SCOPED_TRACE(std::string(safetensors ? "safetensors" : "bin") + (shard ? " sharded" : ""));
      SaveOptions o;
      o.use_safetensors = safetensors;
      o.shard = shard;
      o.size_per_shard_mb = 1;
      std::string message;
      {
        FileSizeLimit limit(1 << 20);
        try {
          save_state_dict(dir, big, o, "model", {{"marker", "new"}});
        } catch (const CheckpointError& e) {
          message = e.what();
        }
      }
      EXPECT_NE(message.find(std::strerror(EFBIG)), std::string::npos) << message;
      expect_intact();
    }
  }

  // A tensor the safetensors writer rejects (complex) after other shards were written.
  StateDict bad = all_dtypes(1024);
  bad.emplace_back("complex", at::ones({4}, at::kComplexFloat));
  EXPECT_THROW(save_state_dict(dir, bad, opt), CheckpointError);
  expect_intact();

  // Target parent is not a directory (root ignores permissions; a regular file gives ENOTDIR).
  bt::write_file(tmp.file("plain_file"), "x");
  try {
    save_state_dict(tmp.file("plain_file/ckpt"), old, opt);
    ADD_FAILURE() << "saved under a regular file";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("plain_file"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOTDIR)), std::string::npos) << e.what();
  }
  EXPECT_EQ(bt::read_file(tmp.file("plain_file")), "x");
  expect_intact();
}

// ---- SIGKILL during saves -------------------------------------------------------------------------

constexpr int kKillTensors = 10;
constexpr int64_t kKillFloats = 512 * 1024;  // 2 MiB each: ~20 MiB per version

// Version v: tensor i is full of v * 100 + i; "version" holds v. Even versions are written as
// sharded .bin, odd ones as sharded safetensors, so kills hit both writers and format switches.
StateDict kill_version(int64_t v) {
  StateDict sd;
  sd.emplace_back("version", at::scalar_tensor(v, at::kLong));
  for (int i = 0; i < kKillTensors; ++i)
    sd.emplace_back("layer" + std::to_string(i) + ".weight", at::full({kKillFloats}, static_cast<float>(v * 100 + i)));
  return sd;
}

SaveOptions kill_options(int64_t v) {
  SaveOptions o;
  o.shard = true;
  o.size_per_shard_mb = 4;
  o.use_safetensors = v % 2 == 1;
  return o;
}

// Returns the version of a complete checkpoint, failing the test if it is not one.
int64_t loaded_version(const std::string& dir) {
  StateDict sd;
  try {
    sd = load_state_dict(dir);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "checkpoint unreadable after kill: " << e.what();
    return -1;
  }
  std::map<std::string, at::Tensor> m(sd.begin(), sd.end());
  if (m.size() != kKillTensors + 1 || !m.count("version")) {
    ADD_FAILURE() << "checkpoint has " << m.size() << " tensors";
    return -1;
  }
  const int64_t v = m["version"].item<int64_t>();
  for (int i = 0; i < kKillTensors; ++i) {
    const at::Tensor& t = m["layer" + std::to_string(i) + ".weight"];
    EXPECT_EQ(t.numel(), kKillFloats);
    EXPECT_TRUE(t.eq(static_cast<float>(v * 100 + i)).all().item<bool>()) << "mixed versions in tensor " << i;
  }
  return v;
}

// The saving child: saves versions start, start+1, ... into $BOOSTER_CKPT_KILL_CHILD until killed,
// writing the last completed version into <dir>.progress after each save.
TEST(StateDictIO, DISABLED_KillChildSaveLoop) {
  const char* dir = std::getenv("BOOSTER_CKPT_KILL_CHILD");
  if (!dir) GTEST_SKIP() << "only run as the child of KillDuringSaveLeavesOldOrNew";
  const int64_t start = std::atoll(std::getenv("BOOSTER_CKPT_KILL_START"));
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t v = start; std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60); ++v) {
    save_state_dict(dir, kill_version(v), kill_options(v));
    bt::write_file(std::string(dir) + ".progress", std::to_string(v));
  }
}

TEST(StateDictIO, KillDuringSaveLeavesOldOrNew) {
  bt::TempDir tmp;
  const std::string dir = tmp.file("ckpt");
  const std::string progress = dir + ".progress";
  save_state_dict(dir, kill_version(0), kill_options(0));
  int64_t last = loaded_version(dir);
  ASSERT_EQ(last, 0);
  int from_old = 0, from_new = 0;
  for (int delay_ms : {0, 1, 3, 5, 10, 20, 35, 50, 75, 100, 150, 200, 300}) {
    SCOPED_TRACE("kill after " + std::to_string(delay_ms) + " ms");
    const bt::KilledChild k = bt::kill_test_child_while_writing(
        "StateDictIO.DISABLED_KillChildSaveLoop",
        {{"BOOSTER_CKPT_KILL_CHILD", dir}, {"BOOSTER_CKPT_KILL_START", std::to_string(last + 1)}}, progress,
        tmp.file("child.log"), delay_ms);
    ASSERT_GE(k.first_recorded, 0) << "child never completed a save: " << k.log;
    EXPECT_EQ(k.result.term_signal, SIGKILL) << k.log;
    const int64_t completed = k.recorded >= 0 ? k.recorded : k.first_recorded;
    const int64_t v = loaded_version(dir);
    // The last completed version, or the one being saved when the kill came.
    EXPECT_GE(v, completed);
    if (k.recorded >= 0) EXPECT_LE(v, completed + 1);
    (v == completed ? from_old : from_new)++;
    last = std::max(last, v);
    // Still writable: the next child saves over it.
  }
  std::cout << "[          ] kills that left the previous version: " << from_old
            << ", the version being saved: " << from_new << ", temp dirs left behind: " << leftovers(tmp.path()).size()
            << "\n";
  // A normal save still works and clears nothing it should not.
  save_state_dict(dir, kill_version(last + 1), kill_options(last + 1));
  EXPECT_EQ(loaded_version(dir), last + 1);
}

}  // namespace
