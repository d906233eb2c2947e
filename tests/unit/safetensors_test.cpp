// safetensors_test.cpp — booster/checkpoint/safetensors.h: files written by other implementations
// (tests/fixtures/safetensors, see its README), bit-exact round trips of every dtype and layout,
// the writer's rejections and the reader's acceptance rules. The header parser's rejection rules are
// safetensors_header_test.cpp.

#include "booster/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/safetensors_fixtures.h"
#include "common/test_util.h"

using booster::checkpoint::CheckpointError;
using booster::checkpoint::load_safetensors;
using booster::checkpoint::parse_safetensors_header;
using booster::checkpoint::read_safetensors_header;
using booster::checkpoint::safetensors_dtype;
using booster::checkpoint::safetensors_dtype_size;
using booster::checkpoint::SAFETENSORS_MAX_HEADER_BYTES;
using booster::checkpoint::SafetensorsHeader;
using booster::checkpoint::scalar_type_from_safetensors;
using booster::checkpoint::StateDict;
using booster::checkpoint::write_safetensors;
using booster::testing::read_file;
using booster::testing::TempDir;
using booster::testing::write_file;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

namespace {

using namespace booster::testing::safetensors_fixtures;

// Files written by other implementations, committed with the tests (a missing one fails the test).
fs::path fixture_dir() { return fs::path(BOOSTER_SOURCE_DIR) / "tests/fixtures/safetensors"; }

#define REQUIRE_FIXTURES() ASSERT_TRUE(fs::is_directory(fixture_dir())) << fixture_dir() << " is missing"

std::string fixture(const std::string& name) { return (fixture_dir() / name).string(); }

uint64_t read_le64(const std::string& s) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[i]);
  return v;
}

// The raw bytes of a tensor in C order.
std::string bytes_of(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

// Same dtype, shape and bytes (NaN payloads and -0.0 included).
void expect_bit_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(got.defined());
  EXPECT_EQ(got.scalar_type(), want.scalar_type());
  EXPECT_EQ(got.sizes().vec(), want.sizes().vec());
  EXPECT_TRUE(got.is_contiguous());
  EXPECT_EQ(got.device().type(), at::kCPU);
  EXPECT_TRUE(bytes_of(got) == bytes_of(want)) << "bytes differ";
}

const std::vector<at::ScalarType> kAllTypes = {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong,
                                               at::kInt,    at::kShort, at::kChar, at::kByte,     at::kBool};

// Random bit patterns of `type` (NaNs with payloads, subnormals, ...); bools are 0/1.
at::Tensor random_tensor(at::ScalarType type, std::vector<int64_t> shape, uint64_t seed) {
  std::mt19937_64 rng(seed);
  int64_t numel = 1;
  for (auto d : shape) numel *= d;
  at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  const int64_t nbytes = numel * t.element_size();
  for (int64_t i = 0; i < nbytes; ++i) p[i] = static_cast<uint8_t>(type == at::kBool ? rng() & 1 : rng());
  return t;
}

StateDict roundtrip(const TempDir& dir, const std::string& name, const StateDict& sd,
                    const std::map<std::string, std::string>& metadata = {{"format", "pt"}}) {
  const std::string path = dir.file(name);
  write_safetensors(path, sd, metadata);
  return load_safetensors(path);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Files written by other implementations.

TEST(SafetensorsFixtures, SyoyoModel) {
  REQUIRE_FIXTURES();
  const std::string path = fixture("syoyo_model.safetensors");
  SafetensorsHeader h = read_safetensors_header(path);
  EXPECT_EQ(h.header_bytes, 136u);
  EXPECT_EQ(h.data_start, 144u);
  ASSERT_EQ(h.tensors.size(), 2u);
  EXPECT_EQ(h.tensors[0].name, "weight1");
  EXPECT_EQ(h.tensors[0].dtype, "F64");
  EXPECT_EQ(h.tensors[0].shape, (std::vector<int64_t>{8, 8}));
  EXPECT_EQ(h.tensors[0].begin, 0u);
  EXPECT_EQ(h.tensors[0].end, 512u);
  EXPECT_EQ(h.tensors[1].name, "weight2");
  EXPECT_EQ(h.tensors[1].shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(h.tensors[1].begin, 512u);
  EXPECT_EQ(h.tensors[1].end, 2560u);
  EXPECT_TRUE(h.metadata.empty());

  StateDict sd = load_safetensors(path);
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_EQ(sd[0].first, "weight1");
  EXPECT_EQ(sd[1].first, "weight2");
  const at::Tensor& w1 = sd[0].second;
  const at::Tensor& w2 = sd[1].second;
  ASSERT_EQ(w1.scalar_type(), at::kDouble);
  ASSERT_EQ(w1.sizes().vec(), (std::vector<int64_t>{8, 8}));
  ASSERT_EQ(w2.sizes().vec(), (std::vector<int64_t>{16, 16}));
  const double first[4] = {0.08001627472781947, 0.7158429049744487, 0.37342849283549107, 0.22132515212450743};
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(w1[0][j].item<double>(), first[j], 1e-12) << j;
  EXPECT_DOUBLE_EQ(w1[0][0].item<double>(), first[0]);
  EXPECT_NEAR(w1.sum().item<double>(), 31.741862223954204, 1e-12);
  EXPECT_NEAR(w2.sum().item<double>(), 126.67609970765008, 1e-12);
}

TEST(SafetensorsFixtures, SyoyoAbuseAttemptRejected) {
  REQUIRE_FIXTURES();
  const std::string path = fixture("syoyo_abuse_attempt_1.safetensors");
  for (int reader = 0; reader < 2; ++reader) {
    std::string msg = error_of([&] {
      if (reader == 0) read_safetensors_header(path);
      if (reader == 1) load_safetensors(path);
    });
    EXPECT_THAT(msg, HasSubstr(path));
    EXPECT_THAT(msg, HasSubstr("header length 1000 is longer than the file (88 bytes)"));
  }
}

namespace {

struct KolanichCase {
  std::string name;     // file suffix == tensor name
  std::string dtype;    // safetensors dtype
  at::ScalarType type;  // LibTorch type it loads as
  std::vector<double> values;
};

const std::vector<KolanichCase>& kolanich_cases() {
  static const std::vector<KolanichCase> cases = {
      {"B", "U8", at::kByte, {253, 254, 255, 0, 1, 2}},
      {"H", "U16", at::kInt, {65533, 65534, 65535, 0, 1, 2}},
      {"I", "U32", at::kLong, {4294967293.0, 4294967294.0, 4294967295.0, 0, 1, 2}},
      {"b", "I8", at::kChar, {-3, -2, -1, 0, 1, 2}},
      {"d", "F64", at::kDouble, {-3, -2, -1, 0, 1, 2}},
      {"e", "F16", at::kHalf, {-3, -2, -1, 0, 1, 2}},
      {"f", "F32", at::kFloat, {-3, -2, -1, 0, 1, 2}},
      {"h", "I16", at::kShort, {-3, -2, -1, 0, 1, 2}},
      {"i", "I32", at::kInt, {-3, -2, -1, 0, 1, 2}},
  };
  return cases;
}

void expect_kolanich_tensor(const KolanichCase& c, const at::Tensor& t) {
  SCOPED_TRACE("tensor " + c.name);
  ASSERT_EQ(t.scalar_type(), c.type);
  ASSERT_EQ(t.sizes().vec(), (std::vector<int64_t>{6}));
  at::Tensor d = t.to(at::kDouble);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(d[i].item<double>(), c.values[i]) << "element " << i;
  if (c.type == at::kLong) {
    EXPECT_EQ(t[0].item<int64_t>(), int64_t{4294967293});
  }
}

}  // namespace

TEST(SafetensorsFixtures, KolanichSingleDtypeFiles) {
  REQUIRE_FIXTURES();
  for (const auto& c : kolanich_cases()) {
    const std::string path = fixture("kolanich_" + c.name + ".safetensors");
    SCOPED_TRACE(path);
    SafetensorsHeader h = read_safetensors_header(path);
    EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"test", "a"}}));
    ASSERT_EQ(h.tensors.size(), 1u);
    EXPECT_EQ(h.tensors[0].name, c.name);
    EXPECT_EQ(h.tensors[0].dtype, c.dtype);
    EXPECT_EQ(h.tensors[0].end, 6 * safetensors_dtype_size(c.dtype));
    EXPECT_EQ(scalar_type_from_safetensors(c.dtype), c.type);
    StateDict sd = load_safetensors(path);
    ASSERT_EQ(sd.size(), 1u);
    EXPECT_EQ(sd[0].first, c.name);
    expect_kolanich_tensor(c, sd[0].second);
  }
}

TEST(SafetensorsFixtures, KolanichOverall) {
  REQUIRE_FIXTURES();
  const std::string path = fixture("kolanich_overall.safetensors");
  SafetensorsHeader h = read_safetensors_header(path);
  EXPECT_EQ(h.header_bytes, 526u);  // not a multiple of 8: accepted
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"test", "a"}}));
  StateDict sd = load_safetensors(path);
  ASSERT_EQ(sd.size(), 9u);
  for (size_t i = 0; i < 9; ++i) {
    const auto& c = kolanich_cases()[i];  // the file's offset order is the table's order
    EXPECT_EQ(sd[i].first, c.name);
    expect_kolanich_tensor(c, sd[i].second);
  }

  // A subset, in file order whatever the order asked for.
  std::vector<std::string> only = {"i", "H", "d"};
  StateDict part = load_safetensors(path, &only);
  ASSERT_EQ(part.size(), 3u);
  EXPECT_EQ(part[0].first, "H");
  EXPECT_EQ(part[1].first, "d");
  EXPECT_EQ(part[2].first, "i");
  expect_kolanich_tensor(kolanich_cases()[1], part[0].second);
  expect_kolanich_tensor(kolanich_cases()[4], part[1].second);
  expect_kolanich_tensor(kolanich_cases()[8], part[2].second);

  std::vector<std::string> missing = {"d", "nope"};
  std::string msg = error_of([&] { load_safetensors(path, &missing); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("no tensor named 'nope'"));

  std::vector<std::string> none;
  EXPECT_TRUE(load_safetensors(path, &none).empty());
}

// ---------------------------------------------------------------------------------------------
// dtype tables.

TEST(SafetensorsDtype, Tables) {
  const std::vector<std::pair<at::ScalarType, std::string>> names = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"}, {at::kLong, "I64"},
      {at::kInt, "I32"},    {at::kShort, "I16"}, {at::kChar, "I8"},  {at::kByte, "U8"},       {at::kBool, "BOOL"}};
  for (const auto& [type, name] : names) {
    EXPECT_EQ(safetensors_dtype(type), name);
    EXPECT_EQ(scalar_type_from_safetensors(name), type);
    EXPECT_EQ(safetensors_dtype_size(name), c10::elementSize(type)) << name;
  }
  EXPECT_EQ(scalar_type_from_safetensors("U16"), at::kInt);
  EXPECT_EQ(scalar_type_from_safetensors("U32"), at::kLong);
  EXPECT_EQ(safetensors_dtype_size("U16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("U32"), 4u);
  for (const char* bad : {"", "f32", "U64", "F8_E4M3", "C64", "float"}) {
    EXPECT_EQ(safetensors_dtype_size(bad), 0u) << bad;
    EXPECT_THAT(error_of([&] { scalar_type_from_safetensors(bad); }), HasSubstr("unsupported dtype")) << bad;
  }
  EXPECT_THAT(error_of([] { safetensors_dtype(at::kComplexFloat); }), HasSubstr("unsupported dtype"));
  EXPECT_THAT(error_of([] { safetensors_dtype(at::kQInt8); }), HasSubstr("unsupported dtype"));
}

// ---------------------------------------------------------------------------------------------
// Round trips.

TEST(SafetensorsRoundTrip, EveryDtypeBitExact) {
  TempDir dir;
  StateDict sd;
  uint64_t seed = 1;
  for (auto type : kAllTypes) {
    const std::string d = safetensors_dtype(type);
    sd.emplace_back(d + ".matrix", random_tensor(type, {3, 5}, seed++));
    sd.emplace_back(d + ".scalar", random_tensor(type, {}, seed++));
    sd.emplace_back(d + ".empty", at::empty({0}, at::TensorOptions().dtype(type)));
    sd.emplace_back(d + ".empty3d", at::empty({2, 0, 3}, at::TensorOptions().dtype(type)));
    sd.emplace_back(d + ".cube", random_tensor(type, {2, 3, 4}, seed++));
  }
  // Special floating-point values, not only random bits.
  at::Tensor special = at::tensor({0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-40, 65504.0, 1.5, -2.25}, at::kDouble);
  for (auto type : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16}) {
    sd.emplace_back("special." + safetensors_dtype(type), special.to(type));
  }
  StateDict back = roundtrip(dir, "all.safetensors", sd);
  ASSERT_EQ(back.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ(back[i].first, sd[i].first);
    expect_bit_equal(back[i].second, sd[i].second, sd[i].first);
    if (at::isIntegralType(sd[i].second.scalar_type(), /*includeBool=*/true)) {
      EXPECT_TRUE(at::equal(back[i].second, sd[i].second)) << sd[i].first;
    }
  }

  // The header agrees: offsets tile the buffer in the given order.
  SafetensorsHeader h = read_safetensors_header(dir.file("all.safetensors"));
  ASSERT_EQ(h.tensors.size(), sd.size());
  uint64_t offset = 0;
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ(h.tensors[i].name, sd[i].first);
    EXPECT_EQ(h.tensors[i].dtype, safetensors_dtype(sd[i].second.scalar_type()));
    EXPECT_EQ(h.tensors[i].shape, sd[i].second.sizes().vec());
    EXPECT_EQ(h.tensors[i].begin, offset);
    offset += sd[i].second.numel() * sd[i].second.element_size();
    EXPECT_EQ(h.tensors[i].end, offset);
  }
  EXPECT_EQ(fs::file_size(dir.file("all.safetensors")), h.data_start + offset);
}

TEST(SafetensorsRoundTrip, EachDtypeAlone) {
  TempDir dir;
  uint64_t seed = 100;
  for (auto type : kAllTypes) {
    for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{}, {0}, {1}, {7}, {4, 0}, {5, 3, 2}}) {
      at::Tensor t = random_tensor(type, shape, seed++);
      StateDict back = roundtrip(dir, "one.safetensors", {{"t", t}});
      ASSERT_EQ(back.size(), 1u);
      expect_bit_equal(back[0].second, t, safetensors_dtype(type) + " " + std::to_string(shape.size()) + "d");
      EXPECT_EQ(back[0].second.dim(), static_cast<int64_t>(shape.size()));
    }
  }
}

TEST(SafetensorsRoundTrip, NonContiguousInputs) {
  TempDir dir;
  for (auto type : kAllTypes) {
    at::Tensor base = random_tensor(type, {6, 8}, 7 + static_cast<int>(type));
    StateDict sd = {
        {"transposed", base.t()},
        {"sliced_step", base.slice(1, 1, 8, 3)},
        {"narrowed", base.narrow(0, 2, 3)},  // contiguous but with a storage offset
        {"column", base.select(1, 5)},
        {"expanded", base.select(0, 1).unsqueeze(0).expand({4, 8})},
        {"permuted", base.view({2, 3, 8}).permute({2, 0, 1})},
        {"element", base[3][4]},
    };
    ASSERT_FALSE(sd[0].second.is_contiguous());
    StateDict back = roundtrip(dir, "views.safetensors", sd);
    ASSERT_EQ(back.size(), sd.size());
    for (size_t i = 0; i < sd.size(); ++i) {
      EXPECT_EQ(back[i].first, sd[i].first);
      expect_bit_equal(back[i].second, sd[i].second.contiguous(), safetensors_dtype(type) + " " + sd[i].first);
    }
  }
  // Only the viewed elements are written, not the whole storage.
  at::Tensor big = at::arange(1000, at::kFloat);
  write_safetensors(dir.file("slice.safetensors"), {{"s", big.slice(0, 10, 14)}});
  SafetensorsHeader h = read_safetensors_header(dir.file("slice.safetensors"));
  EXPECT_EQ(fs::file_size(dir.file("slice.safetensors")), h.data_start + 16);
  at::Tensor s = load_safetensors(dir.file("slice.safetensors"))[0].second;
  EXPECT_TRUE(at::equal(s, at::arange(10, 14, at::kFloat)));
}

TEST(SafetensorsRoundTrip, HeaderPaddedToMultipleOf8) {
  TempDir dir;
  for (int len = 1; len <= 17; ++len) {
    const std::string path = dir.file("pad.safetensors");
    const std::string name(len, 'w');
    write_safetensors(path, {{name, at::ones({3}, at::kByte)}}, {{"format", "pt"}});
    const std::string bytes = read_file(path);
    ASSERT_GE(bytes.size(), 8u);
    const uint64_t n = read_le64(bytes);
    EXPECT_EQ((8 + n) % 8, 0u) << "name length " << len;
    ASSERT_EQ(bytes.size(), 8 + n + 3);
    const std::string header = bytes.substr(8, n);
    const size_t close = header.rfind('}');
    ASSERT_NE(close, std::string::npos);
    EXPECT_LT(header.size() - close - 1, 8u);
    EXPECT_EQ(header.substr(close + 1), std::string(header.size() - close - 1, ' '));
    EXPECT_EQ(header.substr(0, close + 1), "{\"__metadata__\":{\"format\":\"pt\"},\"" + name +
                                               "\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}");
    EXPECT_EQ(bytes.substr(8 + n), std::string("\x01\x01\x01", 3));
  }
}

TEST(SafetensorsRoundTrip, MetadataAndOrder) {
  TempDir dir;
  StateDict sd = {{"z.weight", at::ones({2}, at::kFloat)},
                  {"a.bias", at::zeros({0}, at::kFloat)},
                  {"m", at::full({1}, 7, at::kLong)},
                  {"", at::ones({}, at::kBool)},
                  {"ü/名前", at::ones({2}, at::kShort)}};
  // Default metadata.
  write_safetensors(dir.file("d.safetensors"), sd);
  SafetensorsHeader h = read_safetensors_header(dir.file("d.safetensors"));
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  ASSERT_EQ(h.tensors.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) EXPECT_EQ(h.tensors[i].name, sd[i].first);
  StateDict back = load_safetensors(dir.file("d.safetensors"));
  ASSERT_EQ(back.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ(back[i].first, sd[i].first);
    expect_bit_equal(back[i].second, sd[i].second, sd[i].first);
  }
  // Custom metadata, with characters that need escaping.
  std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "line\n\"quoted\" \\ é"}, {"", ""}};
  write_safetensors(dir.file("m.safetensors"), sd, meta);
  EXPECT_EQ(read_safetensors_header(dir.file("m.safetensors")).metadata, meta);
  // No metadata: no "__metadata__" key at all.
  write_safetensors(dir.file("n.safetensors"), sd, {});
  EXPECT_TRUE(read_safetensors_header(dir.file("n.safetensors")).metadata.empty());
  EXPECT_EQ(read_file(dir.file("n.safetensors")).find("__metadata__"), std::string::npos);
  // An empty state dict.
  write_safetensors(dir.file("e.safetensors"), {});
  EXPECT_TRUE(load_safetensors(dir.file("e.safetensors")).empty());
  // Overwriting a longer file truncates it.
  write_safetensors(dir.file("d.safetensors"), {{"x", at::ones({1}, at::kByte)}});
  EXPECT_EQ(load_safetensors(dir.file("d.safetensors")).size(), 1u);
}

TEST(SafetensorsRoundTrip, ManyTensors) {
  TempDir dir;
  StateDict sd;
  for (int i = 0; i < 5000; ++i) {
    sd.emplace_back("layers." + std::to_string(i) + ".weight", at::full({i % 3}, i, at::kInt));
  }
  StateDict back = roundtrip(dir, "many.safetensors", sd);
  ASSERT_EQ(back.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    ASSERT_EQ(back[i].first, sd[i].first);
    ASSERT_TRUE(at::equal(back[i].second, sd[i].second)) << sd[i].first;
  }
  std::vector<std::string> only = {"layers.4999.weight", "layers.7.weight"};
  StateDict part = load_safetensors(dir.file("many.safetensors"), &only);
  ASSERT_EQ(part.size(), 2u);
  EXPECT_EQ(part[0].first, "layers.7.weight");
  EXPECT_EQ(part[1].first, "layers.4999.weight");
}

TEST(SafetensorsRoundTrip, LoadedTensorsOwnTheirMemory) {
  TempDir dir;
  const std::string path = dir.file("own.safetensors");
  at::Tensor t = at::arange(64, at::kFloat).view({8, 8});
  write_safetensors(path, {{"t", t}});
  StateDict sd = load_safetensors(path);
  fs::remove(path);  // the mapping is gone; the tensors must still be valid and writable
  sd[0].second.add_(1);
  EXPECT_TRUE(at::equal(sd[0].second, t + 1));
  EXPECT_TRUE(sd[0].second.is_contiguous());
}

TEST(SafetensorsWriter, Rejections) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  auto expect_write_error = [&](const StateDict& sd, const std::string& phrase) {
    std::string msg = error_of([&] { write_safetensors(path, sd); });
    EXPECT_THAT(msg, HasSubstr(path));
    EXPECT_THAT(msg, HasSubstr(phrase));
  };
  expect_write_error({{"a", at::ones({1})}, {"b", at::ones({1})}, {"a", at::ones({2})}}, "duplicate tensor name 'a'");
  expect_write_error({{"__metadata__", at::ones({1})}}, "cannot be a tensor name");
  expect_write_error({{"c", at::ones({2}, at::kComplexFloat)}}, "unsupported dtype");
  expect_write_error({{"u", at::Tensor()}}, "undefined");
  expect_write_error({{"q", at::quantize_per_tensor(at::ones({2}), 0.1, 0, at::kQInt8)}}, "unsupported dtype");
  expect_write_error({{"s", at::ones({2, 2}).to_sparse()}}, "only dense tensors");
  expect_write_error({{"m", at::empty({2}, at::TensorOptions().device(at::kMeta))}}, "meta device");
  expect_write_error({{std::string("bad\xff", 4), at::ones({1})}}, "valid UTF-8");
  EXPECT_FALSE(fs::exists(path)) << "nothing is written when the input is invalid";

  // I/O errors carry the errno text.
  std::string msg = error_of([&] { write_safetensors(dir.file("no/such/dir/x.safetensors"), {{"a", at::ones({1})}}); });
  EXPECT_THAT(msg, HasSubstr("no/such/dir/x.safetensors"));
  EXPECT_THAT(msg, HasSubstr("No such file or directory"));
  if (fs::exists("/dev/full")) {
    msg = error_of([&] { write_safetensors("/dev/full", {{"a", at::ones({1024})}}); });
    EXPECT_THAT(msg, HasSubstr("/dev/full"));
    EXPECT_THAT(msg, HasSubstr("No space left on device"));
  }
}

TEST(SafetensorsReader, MissingFileAndDirectory) {
  TempDir dir;
  std::string msg = error_of([&] { load_safetensors(dir.file("absent.safetensors")); });
  EXPECT_THAT(msg, HasSubstr(dir.file("absent.safetensors")));
  EXPECT_THAT(msg, HasSubstr("No such file or directory"));
  msg = error_of([&] { read_safetensors_header(dir.file("absent.safetensors")); });
  EXPECT_THAT(msg, HasSubstr("No such file or directory"));
  msg = error_of([&] { load_safetensors(dir.path()); });
  EXPECT_THAT(msg, HasSubstr("not a regular file"));
}

TEST(SafetensorsReader, AcceptsWhatTheSpecAllows) {
  TempDir dir;
  auto accept = [&](const std::string& name, const std::string& bytes) -> StateDict {
    SCOPED_TRACE(name);
    const std::string path = dir.file(name + ".safetensors");
    write_file(path, bytes);
    StateDict sd;
    EXPECT_NO_THROW(sd = load_safetensors(path));
    return sd;
  };
  // Empty header object, with and without padding; metadata only.
  EXPECT_TRUE(accept("empty", st_bytes("{}")).empty());
  EXPECT_TRUE(accept("empty_padded", st_bytes("{}      ")).empty());
  EXPECT_TRUE(accept("whitespace", st_bytes(" \n{ }\t\r\n ")).empty());
  EXPECT_TRUE(accept("meta_only", st_bytes("{\"__metadata__\":{}}")).empty());
  // Unknown fields are ignored, whatever they hold (also deeply nested).
  std::string deep(100000, '[');
  deep += std::string(100000, ']');
  StateDict sd =
      accept("unknown_fields", st_bytes("{\"a\":{\"x\":{\"y\":[1,{\"z\":null}]},\"dtype\":\"U8\",\"w\":" + deep +
                                            ",\"shape\":[2],\"data_offsets\":[0,2],\"v\":-1.5e3}}",
                                        "\x05\x06"));
  ASSERT_EQ(sd.size(), 1u);
  EXPECT_TRUE(at::equal(sd[0].second, at::tensor({5, 6}, at::kByte)));
  // JSON escapes in names; offsets order differing from the key order; several empty tensors at
  // one offset.
  sd = accept("order", st_bytes("{\"b\\u00e9\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[1,3]}," +
                                    entry("e1", "F32", "[0,4]", 1, 1) + "," + entry("a", "I8", "[]", 0, 1) + "," +
                                    entry("e2", "F64", "[0]", 1, 1) + "}",
                                std::string("\xff\x02\x01", 3)));
  ASSERT_EQ(sd.size(), 4u);
  EXPECT_EQ(sd[0].first, "a");
  EXPECT_EQ(sd[0].second.item<int>(), -1);
  EXPECT_EQ(sd[1].first, "e1");
  EXPECT_EQ(sd[1].second.sizes().vec(), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(sd[2].first, "e2");
  EXPECT_EQ(sd[3].first, "b\xc3\xa9");
  EXPECT_EQ(sd[3].second.item<int>(), 0x0102);
  // U16 / U32 keep their values.
  sd = accept("unsigned", st_bytes("{" + entry("h", "U16", "[2]", 0, 4) + "," + entry("w", "U32", "[1]", 4, 8) + "}",
                                   std::string("\xff\xff\x00\x80\xfe\xff\xff\xff", 8)));
  ASSERT_EQ(sd.size(), 2u);
  EXPECT_TRUE(at::equal(sd[0].second, at::tensor({65535, 32768}, at::kInt)));
  EXPECT_EQ(sd[1].second.item<int64_t>(), int64_t{4294967294});
}
