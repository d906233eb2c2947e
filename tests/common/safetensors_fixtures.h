// safetensors_fixtures.h — crafted safetensors bytes and error capture shared by the safetensors
// reader/writer tests and the header parser tests.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "booster/checkpoint/safetensors.h"
#include "common/test_util.h"

namespace booster::testing::safetensors_fixtures {

using booster::checkpoint::CheckpointError;

inline std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}

// A safetensors file: length prefix, header text, data bytes.
inline std::string st_bytes(const std::string& header, const std::string& data = "") {
  return le64(header.size()) + header + data;
}

// The message of the CheckpointError thrown by f ("" and a test failure otherwise).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected CheckpointError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected CheckpointError, nothing was thrown";
  return "";
}

// Writes `bytes` to <dir>/<name>.safetensors and expects all three readers to reject it with a
// message naming the file and containing `phrase`.
inline void expect_rejected(const booster::testing::TempDir& dir, const std::string& name, const std::string& bytes, const std::string& phrase) {
  SCOPED_TRACE("case " + name);
  const std::string path = dir.file(name + ".safetensors");
  booster::testing::write_file(path, bytes);
  auto data = reinterpret_cast<const uint8_t*>(bytes.data());
  for (int reader = 0; reader < 3; ++reader) {
    std::string msg = error_of([&] {
      if (reader == 0) booster::checkpoint::parse_safetensors_header(data, bytes.size(), bytes.size(), path);
      if (reader == 1) booster::checkpoint::read_safetensors_header(path);
      if (reader == 2) booster::checkpoint::load_safetensors(path);
    });
    EXPECT_THAT(msg, ::testing::HasSubstr(path)) << "reader " << reader;
    EXPECT_THAT(msg, ::testing::HasSubstr(phrase)) << "reader " << reader;
  }
}

// A one-tensor header entry.
inline std::string entry(const std::string& name, const std::string& dtype, const std::string& shape, uint64_t begin,
                  uint64_t end) {
  return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":[" +
         std::to_string(begin) + "," + std::to_string(end) + "]}";
}

}  // namespace booster::testing::safetensors_fixtures
