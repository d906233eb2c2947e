// state_dict_fixtures.h — state dicts and comparisons shared by the checkpoint format tests
// (state_dict_io_test, torch_pickle_test): every dtype with special values and odd layouts, and a
// bit-exact comparison.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <filesystem>
#include <vector>

#include "booster/checkpoint/safetensors.h"
#include "common/test_util.h"

namespace booster::testing::fixtures {

using booster::checkpoint::StateDict;

inline std::string raw_bytes(const at::Tensor& t) {
  at::Tensor c = t.detach().cpu().contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.numel() * c.element_size());
}

inline std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// Same names (as sets: a sharded load comes back in shard order), dtype, shape and bytes.
inline void expect_same(const StateDict& expected, const StateDict& actual) {
  std::map<std::string, at::Tensor> got;
  for (const auto& [n, t] : actual) EXPECT_TRUE(got.emplace(n, t).second) << "duplicate " << n;
  ASSERT_EQ(expected.size(), got.size());
  for (const auto& [n, t] : expected) {
    auto it = got.find(n);
    ASSERT_NE(it, got.end()) << n;
    EXPECT_EQ(t.scalar_type(), it->second.scalar_type()) << n;
    EXPECT_EQ(t.sizes(), it->second.sizes()) << n;
    EXPECT_TRUE(raw_bytes(t) == raw_bytes(it->second)) << n;
  }
}

inline std::vector<std::string> names_of(const StateDict& sd) {
  std::vector<std::string> out;
  for (const auto& kv : sd) out.push_back(kv.first);
  return out;
}

// Every supported dtype, special float values, a non-contiguous tensor, a view with an offset, a
// 0-dim and an empty tensor. `rows` scales the sizes (so that a 1 MiB limit gives several shards).
// Temporaries of io::atomic_write_directory (".tmp-" / ".old-" names) left in `parent`.
inline std::vector<std::string> leftovers(const std::string& parent) {
  std::vector<std::string> out;
  for (const auto& name : list_dir(parent))
    if (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos) out.push_back(name);
  return out;
}

// Soft RLIMIT_FSIZE in this process for a scope: writes past it fail with EFBIG (SIGXFSZ ignored).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lim);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  sighandler_t old_handler_;
};

inline StateDict all_dtypes(int64_t rows) {
  at::Tensor base = at::arange(rows * 64, at::kDouble).mul(0.7371).sin().mul(1000.0).reshape({rows, 64});
  at::Tensor special =
      at::tensor(std::vector<double>{0.0, -0.0, INFINITY, -INFINITY, NAN, 1e-300, 65504.0, 1e-8}, at::kDouble);
  base.view(-1).narrow(0, 0, 8).copy_(special);
  at::Tensor ints =
      at::arange(rows * 64, at::kLong).mul(int64_t{2654435761}).remainder(int64_t{4294967296}).sub(int64_t{2147483648}).reshape({rows, 64});
  StateDict sd;
  sd.emplace_back("f64", base.clone());
  sd.emplace_back("f32", base.to(at::kFloat));
  sd.emplace_back("f16", base.to(at::kHalf));
  sd.emplace_back("bf16", base.to(at::kBFloat16));
  sd.emplace_back("i64", ints.mul(1000003));
  sd.emplace_back("i32", ints.to(at::kInt));
  sd.emplace_back("i16", ints.to(at::kShort));
  sd.emplace_back("i8", ints.to(at::kChar));
  sd.emplace_back("u8", ints.to(at::kByte));
  sd.emplace_back("bool", ints.remainder(3).eq(0));
  sd.emplace_back("transposed", base.to(at::kFloat).t());
  sd.emplace_back("offset_view", ints.narrow(0, 1, 1).squeeze(0).narrow(0, 5, 20));
  sd.emplace_back("scalar", at::scalar_tensor(2.5, at::kFloat));
  sd.emplace_back("empty", at::zeros({0, 3}, at::kFloat));
  return sd;
}

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

}  // namespace booster::testing::fixtures
