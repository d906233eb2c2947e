// safetensors_header_test.cpp — the safetensors header parser (safetensors_header.cpp, the code the
// fuzzer builds): one crafted file per rejection rule of safetensors.h, each checked through the
// parser, read_safetensors_header and load_safetensors; and random corruptions only ever throw
// CheckpointError.
#include "booster/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "common/safetensors_fixtures.h"
#include "common/test_util.h"

using booster::checkpoint::CheckpointError;
using booster::checkpoint::load_safetensors;
using booster::checkpoint::parse_safetensors_header;
using booster::checkpoint::read_safetensors_header;
using booster::checkpoint::SAFETENSORS_MAX_HEADER_BYTES;
using booster::checkpoint::SafetensorsHeader;
using booster::checkpoint::StateDict;
using booster::checkpoint::write_safetensors;
using booster::testing::read_file;
using booster::testing::TempDir;
using booster::testing::write_file;
using namespace booster::testing::safetensors_fixtures;
using ::testing::HasSubstr;

// ---------------------------------------------------------------------------------------------
// Rejection rules (safetensors.h, parse_safetensors_header): one crafted file each.

TEST(SafetensorsReject, TooShort) {
  TempDir dir;
  expect_rejected(dir, "empty_file", "", "too short");
  expect_rejected(dir, "five_bytes", std::string("\x02\x00\x00\x00\x00", 5), "too short");
  expect_rejected(dir, "seven_bytes", std::string("\x00\x00\x00\x00\x00\x00\x00", 7), "too short");
}

TEST(SafetensorsReject, HeaderOverLimit) {
  TempDir dir;
  expect_rejected(dir, "over_limit", le64(SAFETENSORS_MAX_HEADER_BYTES + 1) + "{}", "exceeds the limit of 100000000");
  expect_rejected(dir, "huge", le64(~uint64_t{0}) + "{}", "exceeds the limit");
  expect_rejected(dir, "at_limit_but_short", le64(SAFETENSORS_MAX_HEADER_BYTES) + "{}", "longer than the file");
}

TEST(SafetensorsReject, HeaderLongerThanFile) {
  TempDir dir;
  expect_rejected(dir, "longer", le64(1000) + std::string(80, ' '),
                  "header length 1000 is longer than the file (88 bytes)");
  expect_rejected(dir, "one_more", le64(3) + "{}", "longer than the file");
}

TEST(SafetensorsReject, TruncatedBuffer) {
  // The buffer given to the parser must cover the header (read_safetensors_header's contract).
  const std::string bytes = st_bytes("{" + entry("a", "U8", "[1]", 0, 1) + "}", "\x01");
  auto data = reinterpret_cast<const uint8_t*>(bytes.data());
  for (size_t size : {size_t{0}, size_t{7}, size_t{8}, size_t{20}, bytes.size() - 2}) {
    std::string msg = error_of([&] { parse_safetensors_header(data, size, bytes.size(), "buf.safetensors"); });
    EXPECT_THAT(msg, HasSubstr("buf.safetensors"));
    EXPECT_THAT(msg, HasSubstr("header is truncated"));
  }
  EXPECT_NO_THROW(parse_safetensors_header(data, bytes.size() - 1, bytes.size(), "buf.safetensors"));
}

TEST(SafetensorsReject, InvalidUtf8) {
  TempDir dir;
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"ff_in_name", "\xff"},
      {"lone_continuation", "a\x80"},
      {"overlong_slash", "\xc0\xaf"},
      {"overlong_3byte", "\xe0\x80\xaf"},
      {"surrogate_utf8", "\xed\xa0\x80"},
      {"above_10ffff", "\xf4\x90\x80\x80"},
      {"truncated_seq", "\xe2\x82"},
  };
  for (const auto& [name, raw] : bad) {
    expect_rejected(dir, name, st_bytes("{" + entry(raw, "U8", "[1]", 0, 1) + "}", "\x01"), "invalid JSON header");
    expect_rejected(dir, name + "_meta", st_bytes("{\"__metadata__\":{\"k\":\"" + raw + "\"}}"), "invalid JSON header");
  }
  // Escaped lone surrogates are not valid UTF-16 either.
  expect_rejected(dir, "escaped_surrogate", st_bytes("{\"\\ud800\":{}}"), "invalid JSON header");
  // The parser's message says what is wrong.
  std::string bytes = st_bytes("{\"\xff\":1}");
  std::string msg = error_of([&] {
    parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), bytes.size(), "u.st");
  });
  EXPECT_THAT(msg, HasSubstr("UTF-8"));
}

TEST(SafetensorsReject, InvalidJson) {
  TempDir dir;
  const std::string good = "{" + entry("a", "U8", "[1]", 0, 1) + "}";
  expect_rejected(dir, "empty_header", st_bytes(""), "invalid JSON header");
  expect_rejected(dir, "spaces_only", st_bytes("        "), "invalid JSON header");
  expect_rejected(dir, "unterminated", st_bytes("{\"a\":", "\x01"), "invalid JSON header");
  expect_rejected(dir, "trailing_comma", st_bytes("{" + entry("a", "U8", "[1]", 0, 1) + ",}", "\x01"),
                  "invalid JSON header");
  expect_rejected(dir, "comment", st_bytes("{/*c*/" + entry("a", "U8", "[1]", 0, 1) + "}", "\x01"),
                  "invalid JSON header");
  expect_rejected(dir, "nul_padding", st_bytes(good + std::string(3, '\0'), "\x01"), "invalid JSON header: NUL byte");
  expect_rejected(dir, "nul_then_garbage", st_bytes(good + std::string(1, '\0') + "garbage", "\x01"), "NUL byte");
  expect_rejected(dir, "nul_in_string", st_bytes("{\"a" + std::string(1, '\0') + "\":1}"), "NUL byte");
  expect_rejected(dir, "two_values", st_bytes(good + " {}", "\x01"), "invalid JSON header");
  expect_rejected(dir, "bom", st_bytes("\xef\xbb\xbf" + good, "\x01"), "invalid JSON header");
  expect_rejected(dir, "single_quotes", st_bytes("{'a':1}"), "invalid JSON header");
  expect_rejected(dir, "control_char", st_bytes("{\"a\nb\":1}"), "invalid JSON header");
  expect_rejected(dir, "number_overflow", st_bytes("{\"a\":{\"dtype\":\"U8\",\"shape\":[1e999]}}"),
                  "invalid JSON header");
  expect_rejected(dir, "unclosed_deep", st_bytes(std::string(200000, '[')), "invalid JSON header");
  // A JSON error later in the header wins over a structural error earlier in it.
  expect_rejected(dir, "structure_then_syntax", st_bytes("{\"a\":5,\"b\":}"), "invalid JSON header");
}

TEST(SafetensorsReject, NotAnObject) {
  TempDir dir;
  int i = 0;
  for (const char* h : {"[]", "\"x\"", "3", "-3", "null", "true", "1.5", "[{}]"}) {
    expect_rejected(dir, "root_" + std::to_string(i++), st_bytes(h), "header is not a JSON object");
  }
  expect_rejected(dir, "deep_array", st_bytes(std::string(100000, '[') + std::string(100000, ']')),
                  "header is not a JSON object");
  expect_rejected(dir, "entry_number", st_bytes("{\"a\":1}"), "tensor 'a' is not a JSON object");
  expect_rejected(dir, "entry_array", st_bytes("{\"a\":[]}"), "tensor 'a' is not a JSON object");
  expect_rejected(dir, "entry_null", st_bytes("{\"a\":null}"), "tensor 'a' is not a JSON object");
}

TEST(SafetensorsReject, MissingFields) {
  TempDir dir;
  expect_rejected(dir, "no_dtype", st_bytes("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", "\x01"),
                  "tensor 'a': missing \"dtype\"");
  expect_rejected(dir, "no_shape", st_bytes("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", "\x01"),
                  "tensor 'a': missing \"shape\"");
  expect_rejected(dir, "no_offsets", st_bytes("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", "\x01"),
                  "tensor 'a': missing \"data_offsets\"");
  expect_rejected(dir, "empty_entry", st_bytes("{\"a\":{}}"), "tensor 'a': missing");
}

TEST(SafetensorsReject, WrongTypes) {
  TempDir dir;
  auto e = [](const std::string& dtype, const std::string& shape, const std::string& offsets) {
    return st_bytes("{\"t\":{\"dtype\":" + dtype + ",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}}",
                    std::string(4, '\0'));
  };
  expect_rejected(dir, "dtype_number", e("5", "[1]", "[0,4]"), "\"dtype\" must be a string");
  expect_rejected(dir, "dtype_array", e("[\"F32\"]", "[1]", "[0,4]"), "\"dtype\" must be a string");
  expect_rejected(dir, "dtype_null", e("null", "[1]", "[0,4]"), "\"dtype\" must be a string");
  expect_rejected(dir, "shape_string", e("\"F32\"", "\"1\"", "[0,4]"), "\"shape\" must be an array");
  expect_rejected(dir, "shape_number", e("\"F32\"", "1", "[0,4]"), "\"shape\" must be an array");
  expect_rejected(dir, "shape_float", e("\"F32\"", "[1.0]", "[0,4]"),
                  "\"shape\" must be an array of non-negative integers");
  expect_rejected(dir, "shape_nested", e("\"F32\"", "[[1]]", "[0,4]"), "\"shape\" must be an array");
  expect_rejected(dir, "shape_bool", e("\"F32\"", "[true]", "[0,4]"), "\"shape\" must be an array");
  expect_rejected(dir, "shape_object", e("\"F32\"", "{}", "[0,4]"), "\"shape\" must be an array");
  expect_rejected(dir, "shape_too_large", e("\"F32\"", "[9223372036854775808]", "[0,4]"), "is too large");
  expect_rejected(dir, "offsets_one", e("\"F32\"", "[1]", "[4]"), "\"data_offsets\" must be an array of two");
  expect_rejected(dir, "offsets_three", e("\"F32\"", "[1]", "[0,4,4]"), "\"data_offsets\" must be an array of two");
  expect_rejected(dir, "offsets_float", e("\"F32\"", "[1]", "[0,4.0]"), "\"data_offsets\" must be an array of two");
  expect_rejected(dir, "offsets_string", e("\"F32\"", "[1]", "[\"0\",\"4\"]"), "\"data_offsets\" must be an array");
  expect_rejected(dir, "offsets_object", e("\"F32\"", "[1]", "{\"0\":4}"), "\"data_offsets\" must be an array");
  expect_rejected(dir, "offsets_negative", e("\"F32\"", "[1]", "[-4,0]"), "negative value -4 in \"data_offsets\"");
  expect_rejected(dir, "offsets_too_big", e("\"F32\"", "[1]", "[0,18446744073709551616]"), "\"data_offsets\" must be");
  expect_rejected(dir, "duplicate_field",
                  st_bytes("{\"t\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", "\x01"),
                  "tensor 't': duplicate key \"dtype\"");
}

TEST(SafetensorsReject, UnknownDtype) {
  TempDir dir;
  for (const char* d : {"F8_E4M3", "U64", "f32", "", "C64", "FLOAT"}) {
    expect_rejected(dir, std::string("dtype_") + (d[0] ? d : "empty"),
                    st_bytes("{" + entry("t", d, "[1]", 0, 8) + "}", std::string(8, '\0')), "unknown dtype");
  }
}

TEST(SafetensorsReject, NegativeDimension) {
  TempDir dir;
  expect_rejected(dir, "neg", st_bytes("{" + entry("t", "F32", "[2,-1]", 0, 0) + "}"), "negative dimension -1");
  expect_rejected(dir, "neg_zero_size", st_bytes("{" + entry("t", "F32", "[0,-2]", 0, 0) + "}"), "negative dimension");
}

TEST(SafetensorsReject, SizeMismatchAndOverflow) {
  TempDir dir;
  expect_rejected(dir, "short", st_bytes("{" + entry("t", "F32", "[2]", 0, 4) + "}", std::string(4, '\0')),
                  "size mismatch");
  expect_rejected(dir, "long", st_bytes("{" + entry("t", "F32", "[2]", 0, 12) + "}", std::string(12, '\0')),
                  "size mismatch");
  expect_rejected(dir, "scalar", st_bytes("{" + entry("t", "F64", "[]", 0, 0) + "}"), "size mismatch");
  expect_rejected(dir, "empty", st_bytes("{" + entry("t", "F64", "[0]", 0, 8) + "}", std::string(8, '\0')),
                  "size mismatch");
  expect_rejected(dir, "reversed", st_bytes("{" + entry("t", "U8", "[2]", 4, 2) + "}", std::string(4, '\0')),
                  "end before begin");
  // numel * size wraps around 2^64 to exactly the declared length: must still be refused.
  expect_rejected(dir, "wrap", st_bytes("{" + entry("t", "F32", "[4611686018427387904,1]", 0, 0) + "}"), "overflows");
  expect_rejected(dir, "numel_overflow", st_bytes("{" + entry("t", "U8", "[4294967296,4294967296,2]", 0, 0) + "}"),
                  "overflows");
  expect_rejected(dir, "numel_over_int64", st_bytes("{" + entry("t", "U8", "[9223372036854775807,2]", 0, 0) + "}"),
                  "overflows");
}

TEST(SafetensorsReject, OffsetsLayout) {
  TempDir dir;
  const std::string d8(8, '\0');
  expect_rejected(dir, "not_at_zero", st_bytes("{" + entry("t", "U8", "[4]", 4, 8) + "}", d8),
                  "data offsets do not start at 0");
  expect_rejected(
      dir, "overlap",
      st_bytes("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "U8", "[4]", 2, 6) + "}", d8.substr(0, 6)),
      "tensor 'b' overlaps tensor 'a'");
  expect_rejected(
      dir, "same_range",
      st_bytes("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("b", "I8", "[4]", 0, 4) + "}", d8.substr(0, 4)),
      "overlaps");
  expect_rejected(
      dir, "empty_inside",
      st_bytes("{" + entry("a", "U8", "[4]", 0, 4) + "," + entry("z", "U8", "[0]", 2, 2) + "}", d8.substr(0, 4)),
      "tensor 'z' overlaps tensor 'a'");
  expect_rejected(dir, "gap",
                  st_bytes("{" + entry("a", "U8", "[2]", 0, 2) + "," + entry("b", "U8", "[4]", 4, 8) + "}", d8),
                  "gap of 2 bytes");
}

TEST(SafetensorsReject, TrailingAndTruncatedData) {
  TempDir dir;
  const std::string h = "{" + entry("a", "F32", "[2]", 0, 8) + "}";
  expect_rejected(dir, "trailing", st_bytes(h, std::string(9, '\0')), "1 trailing bytes after the last tensor");
  expect_rejected(dir, "trailing_no_tensors", st_bytes("{}", "x"), "trailing bytes");
  expect_rejected(dir, "truncated", st_bytes(h, std::string(7, '\0')), "file is truncated");
  expect_rejected(dir, "no_data", st_bytes(h), "file is truncated");
}

TEST(SafetensorsReject, DuplicateNames) {
  TempDir dir;
  expect_rejected(dir, "dup",
                  st_bytes("{" + entry("a", "U8", "[1]", 0, 1) + "," + entry("a", "U8", "[1]", 1, 2) + "}", "ab"),
                  "duplicate tensor name 'a'");
  // The same name spelled with an escape is the same name.
  expect_rejected(dir, "dup_escaped",
                  st_bytes("{" + entry("a", "U8", "[1]", 0, 1) + "," + entry("\\u0061", "U8", "[1]", 1, 2) + "}", "ab"),
                  "duplicate tensor name 'a'");
  expect_rejected(dir, "dup_metadata", st_bytes("{\"__metadata__\":{},\"__metadata__\":{}}"),
                  "duplicate \"__metadata__\"");
}

TEST(SafetensorsReject, BadMetadata) {
  TempDir dir;
  for (const auto& [name, meta] : std::vector<std::pair<std::string, std::string>>{
           {"meta_array", "[]"}, {"meta_string", "\"x\""}, {"meta_null", "null"}, {"meta_number", "1"}}) {
    expect_rejected(dir, name, st_bytes("{\"__metadata__\":" + meta + "}"),
                    "\"__metadata__\" must be an object of strings");
  }
  for (const auto& [name, value] : std::vector<std::pair<std::string, std::string>>{{"meta_value_number", "1"},
                                                                                    {"meta_value_null", "null"},
                                                                                    {"meta_value_object", "{}"},
                                                                                    {"meta_value_array", "[\"a\"]"},
                                                                                    {"meta_value_bool", "false"}}) {
    expect_rejected(dir, name, st_bytes("{\"__metadata__\":{\"k\":" + value + "}}"),
                    "\"__metadata__\" value of 'k' must be a string");
  }
  expect_rejected(dir, "meta_dup_key", st_bytes("{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}"),
                  "__metadata__ has a duplicate key 'k'");
}

TEST(SafetensorsReject, BoolOtherThanZeroOrOne) {
  TempDir dir;
  const std::string path = dir.file("bool.safetensors");
  write_file(path, st_bytes("{" + entry("flags", "BOOL", "[3]", 0, 3) + "}", std::string("\x01\x00\x02", 3)));
  EXPECT_NO_THROW(read_safetensors_header(path));  // the header is fine
  std::string msg = error_of([&] { load_safetensors(path); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("tensor 'flags': BOOL element 2 is 2"));
}

TEST(SafetensorsReject, MessagesAreSanitized) {
  // Names in messages are quoted with control characters escaped, and cut when long.
  TempDir dir;
  expect_rejected(dir, "ctrl", st_bytes("{\"a\\nb\":1}"), "tensor 'a\\x0ab' is not a JSON object");
  std::string msg = error_of([&] {
    std::string bytes = st_bytes("{\"" + std::string(100000, 'n') + "\":1}");
    parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), bytes.size(), "long");
  });
  EXPECT_LT(msg.size(), 400u);
  EXPECT_THAT(msg, HasSubstr("'..."));
}

// Random corruptions of a valid file are rejected with CheckpointError or accepted with a
// consistent header, never anything else (a short in-tree version of tests/fuzz).
TEST(SafetensorsReject, RandomCorruptionsOnlyThrowCheckpointError) {
  TempDir dir;
  StateDict sd = {{"w", at::arange(12, at::kFloat).view({3, 4})},
                  {"b", at::ones({2}, at::kHalf)},
                  {"flag", at::ones({}, at::kBool)},
                  {"e", at::empty({0, 3}, at::kLong)}};
  write_safetensors(dir.file("good.safetensors"), sd, {{"format", "pt"}, {"k", "v"}});
  const std::string good = read_file(dir.file("good.safetensors"));
  std::mt19937_64 rng(12345);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string b = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < edits; ++k) {
      const size_t pos = b.empty() ? 0 : rng() % b.size();
      switch (rng() % 5) {
        case 0:
          if (!b.empty()) b[pos] = static_cast<char>(rng());
          break;
        case 1:
          if (!b.empty()) b[pos] ^= static_cast<char>(1u << (rng() % 8));
          break;
        case 2:
          b.insert(pos, 1, "{}[],:\"0 -9e\\"[rng() % 13]);
          break;
        case 3:
          b.erase(pos, 1 + rng() % 8);
          break;
        case 4:
          b.resize(rng() % (b.size() + 1));
          break;
      }
    }
    try {
      SafetensorsHeader h =
          parse_safetensors_header(reinterpret_cast<const uint8_t*>(b.data()), b.size(), b.size(), "m");
      ++accepted;
      uint64_t end = 0;
      for (const auto& t : h.tensors) {
        ASSERT_EQ(t.begin, end);
        end = t.end;
      }
      ASSERT_EQ(h.data_start + end, b.size());
    } catch (const CheckpointError& e) {
      ++rejected;
      ASSERT_EQ(std::string(e.what()).rfind("m: ", 0), 0u) << e.what();
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(accepted, 0);  // e.g. changed data bytes
}
