// torch_pickle_test.cpp — `.bin` files (booster/checkpoint/torch_pickle.h): torch::pickle_save's
// archive without the dict's TorchScript type tag (so weights_only torch.load reads it), read back
// bit-exact, and clear errors for what cannot be read. Python
// interop of whole checkpoints is in state_dict_io_test.cpp.
#include "booster/checkpoint/torch_pickle.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <string>
#include <vector>

#include "common/state_dict_fixtures.h"
#include "common/test_util.h"

namespace {

namespace bt = booster::testing;
using namespace booster::testing::fixtures;
using booster::checkpoint::CheckpointError;
using booster::checkpoint::read_bin;
using booster::checkpoint::write_bin;
using ::testing::HasSubstr;

TEST(TorchPickle, WriteIsTorchPickleSaveWithoutTheTypeTag) {
  bt::TempDir tmp;
  StateDict sd = all_dtypes(8);
  write_bin(tmp.file("a.bin"), sd);
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [n, t] : sd) dict.insert(n, t.contiguous().clone());
  const std::vector<char> tagged = torch::jit::pickle_save(c10::IValue(dict));
  const std::string got = bt::read_file(tmp.file("a.bin"));
  // pickle_save tags the dict (torch.jit._pickle.restore_type_tag, refused by weights_only loads);
  // ours has no tag in it.
  const std::string tag = "restore_type_tag";
  EXPECT_NE(std::string(tagged.begin(), tagged.end()).find(tag), std::string::npos);
  EXPECT_EQ(got.find(tag), std::string::npos);
  expect_same(sd, read_bin(tmp.file("a.bin")));
  // And torch::pickle_load reads it.
  c10::IValue v = torch::jit::pickle_load(std::vector<char>(got.begin(), got.end()));
  EXPECT_TRUE(v.isGenericDict());
  EXPECT_EQ(v.toGenericDict().size(), sd.size());

  StateDict dup = {{"a", at::ones({1})}, {"a", at::ones({1})}};
  EXPECT_THROW(write_bin(tmp.file("dup.bin"), dup), CheckpointError);
}

std::string read_error(const std::string& path) {
  try {
    read_bin(path);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "<no CheckpointError>";
}

TEST(TorchPickle, ReadErrorsNameTheFileAndTheProblem) {
  bt::TempDir tmp;
  EXPECT_THAT(read_error(tmp.file("missing.bin")), HasSubstr("cannot open '" + tmp.file("missing.bin") + "'"));
  EXPECT_THAT(read_error(tmp.path()), HasSubstr("is not a regular file"));
  bt::write_file(tmp.file("text.bin"), "not a zip");
  EXPECT_THAT(read_error(tmp.file("text.bin")), HasSubstr("is not a torch.save zip archive"));
  // A zip holding LibTorch's typed int list, not a dict: its global is not a state dict's.
  const std::vector<char> list = torch::jit::pickle_save(c10::IValue(c10::List<int64_t>({1, 2})));
  bt::write_file(tmp.file("list.bin"), std::string(list.begin(), list.end()));
  EXPECT_THAT(read_error(tmp.file("list.bin")), HasSubstr("refuses global 'torch.jit._pickle.build_intlist'"));
  // write_bin never overwrites: it fills fresh temporaries of the atomic writer.
  write_bin(tmp.file("once.bin"), {{"a", at::ones({1})}});
  EXPECT_THROW(write_bin(tmp.file("once.bin"), {{"a", at::ones({1})}}), CheckpointError);
  EXPECT_THROW(write_bin(tmp.file("u.bin"), {{"u", at::Tensor()}}), CheckpointError);
}

}  // namespace
