// data_test.cpp — unit tests of booster/data (DistributedSampler against Python PyTorch's, the
// DataLoader, the IDX reader, Fashion-MNIST) and of booster/logging.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "booster/data/dataloader.h"
#include "booster/data/dataset.h"
#include "booster/logging.h"
#include "common/test_util.h"

#ifndef BOOSTER_PYTHON
#define BOOSTER_PYTHON "/usr/bin/python3"
#endif

namespace {

using booster::data::DataError;
using booster::data::DataLoader;
using booster::data::DataLoaderOptions;
using booster::data::DistributedSampler;
using booster::data::Example;
using booster::data::TensorDataset;

// ---- helpers

struct SamplerCase {
  int64_t n;
  int replicas;
  int rank;
  bool shuffle;
  uint64_t seed;
  int64_t epoch;
  bool drop_last;

  std::string key() const {
    std::ostringstream s;
    s << n << "," << replicas << "," << rank << "," << (shuffle ? 1 : 0) << "," << seed << "," << epoch << ","
      << (drop_last ? 1 : 0);
    return s.str();
  }
};

std::vector<int64_t> cpp_indices(const SamplerCase& c) {
  DistributedSampler sampler(c.n, c.replicas, c.rank, c.shuffle, c.seed, c.drop_last);
  sampler.set_epoch(c.epoch);
  auto indices = sampler.indices();
  EXPECT_EQ(static_cast<int64_t>(indices.size()), sampler.num_samples()) << c.key();
  return indices;
}

// Runs tests/unit/sampler_reference.py once for all cases; returns case key -> indices.
std::map<std::string, std::vector<int64_t>> python_indices(const std::vector<SamplerCase>& cases) {
  std::vector<std::string> argv = {BOOSTER_PYTHON, std::string(BOOSTER_SOURCE_DIR) + "/tests/unit/sampler_reference.py"};
  for (const auto& c : cases) argv.push_back(c.key());
  auto result = booster::testing::run_process(argv, {}, 300);
  EXPECT_EQ(result.exit_code, 0) << result.output;
  std::map<std::string, std::vector<int64_t>> out;
  std::istringstream lines(result.output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("ref ", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::istringstream values(line.substr(colon + 1));
    std::vector<int64_t> indices;
    int64_t v;
    while (values >> v) indices.push_back(v);
    out[line.substr(4, colon - 4)] = std::move(indices);
  }
  return out;
}

std::string idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data,
                      uint8_t magic0 = 0, uint8_t magic1 = 0) {
  std::string s;
  s.push_back(static_cast<char>(magic0));
  s.push_back(static_cast<char>(magic1));
  s.push_back(static_cast<char>(type));
  s.push_back(static_cast<char>(dims.size()));
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  s.append(data.begin(), data.end());
  return s;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  if (!bytes.empty()) {
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

std::string gunzip_file(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return {};
  std::string out;
  char buf[1 << 16];
  int got;
  while ((got = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(got));
  gzclose(f);
  return out;
}

std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 % 256);
  return v;
}

// Expects read_idx_file(path) to throw DataError whose message contains the path and `needle`.
void expect_idx_error(const std::string& path, const std::string& needle) {
  try {
    booster::data::read_idx_file(path);
    ADD_FAILURE() << "no DataError for " << path;
  } catch (const DataError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

long max_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

bool dir_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

at::Tensor to_tensor(const std::vector<int64_t>& v) {
  return at::tensor(at::ArrayRef<int64_t>(v), at::TensorOptions().dtype(at::kLong));
}

// ---- DistributedSampler

TEST(DistributedSamplerTest, MatchesPyTorch) {
  std::vector<SamplerCase> cases;
  auto all_ranks = [&](int64_t n, int replicas, bool shuffle, uint64_t seed, int64_t epoch, bool drop_last) {
    for (int r = 0; r < replicas; ++r) cases.push_back({n, replicas, r, shuffle, seed, epoch, drop_last});
  };
  for (bool drop_last : {false, true}) {
    for (bool shuffle : {false, true}) {
      all_ranks(10, 4, shuffle, 0, 0, drop_last);        // n not divisible by R
      all_ranks(12, 3, shuffle, 42, 3, drop_last);       // divisible
      all_ranks(3, 4, shuffle, 7, 1, drop_last);         // n < R
      all_ranks(2, 7, shuffle, 1, 0, drop_last);         // padding longer than the list
      all_ranks(1, 5, shuffle, 0, 2, drop_last);
      all_ranks(0, 2, shuffle, 0, 0, drop_last);         // empty dataset
      all_ranks(5003, 3, shuffle, 1024, 5, drop_last);
    }
    cases.push_back({1000, 8, 0, true, 1024, 0, drop_last});
    cases.push_back({1000, 8, 7, true, 1024, 9, drop_last});
    cases.push_back({999, 8, 5, true, (uint64_t{1} << 40) + 3, 11, drop_last});  // large seed
    cases.push_back({17, 1, 0, true, 123, 4, drop_last});                         // single replica
  }

  const auto reference = python_indices(cases);
  ASSERT_EQ(reference.size(), cases.size()) << "sampler_reference.py printed fewer cases than asked";
  for (const auto& c : cases) {
    auto it = reference.find(c.key());
    ASSERT_NE(it, reference.end()) << c.key();
    EXPECT_EQ(cpp_indices(c), it->second) << "case n,R,rank,shuffle,seed,epoch,drop_last = " << c.key();
  }
}

TEST(DistributedSamplerTest, NumSamples) {
  EXPECT_EQ(DistributedSampler(10, 4, 0, false, 0, false).num_samples(), 3);
  EXPECT_EQ(DistributedSampler(10, 4, 0, false, 0, false).total_size(), 12);
  EXPECT_EQ(DistributedSampler(10, 4, 0, false, 0, true).num_samples(), 2);
  EXPECT_EQ(DistributedSampler(12, 4, 0, false, 0, true).num_samples(), 3);
  EXPECT_EQ(DistributedSampler(3, 4, 3, false, 0, true).num_samples(), 0);
  EXPECT_EQ(DistributedSampler(3, 4, 3, false, 0, false).num_samples(), 1);
}

TEST(DistributedSamplerTest, ShardsAreDisjointAndCover) {
  const int64_t n = 120;
  const int replicas = 4;
  for (int64_t epoch : {0, 1, 7}) {
    std::vector<int64_t> all;
    for (int r = 0; r < replicas; ++r) {
      DistributedSampler sampler(n, replicas, r, true, 5);
      sampler.set_epoch(epoch);
      auto indices = sampler.indices();
      EXPECT_EQ(static_cast<int64_t>(indices.size()), n / replicas);
      all.insert(all.end(), indices.begin(), indices.end());
    }
    std::sort(all.begin(), all.end());
    std::vector<int64_t> expected(n);
    std::iota(expected.begin(), expected.end(), 0);
    EXPECT_EQ(all, expected) << "epoch " << epoch;
  }
}

TEST(DistributedSamplerTest, EpochChangesOrderDeterministically) {
  DistributedSampler a(100, 2, 1, true, 3), b(100, 2, 1, true, 3);
  EXPECT_EQ(a.indices(), b.indices());
  const auto epoch0 = a.indices();
  a.set_epoch(1);
  EXPECT_EQ(a.epoch(), 1);
  const auto epoch1 = a.indices();
  EXPECT_NE(epoch0, epoch1);
  EXPECT_EQ(epoch1, a.indices());  // same epoch, same order
  b.set_epoch(1);
  EXPECT_EQ(b.indices(), epoch1);
  // Another seed gives another order; no shuffle gives rank, rank + R, ... padded from the start.
  EXPECT_NE(DistributedSampler(100, 2, 1, true, 4).indices(), epoch0);
  EXPECT_EQ(DistributedSampler(7, 2, 1, false).indices(), (std::vector<int64_t>{1, 3, 5, 0}));
  EXPECT_EQ(DistributedSampler(7, 2, 1, false, 0, true).indices(), (std::vector<int64_t>{1, 3, 5}));
}

TEST(DistributedSamplerTest, InvalidArguments) {
  EXPECT_THROW(DistributedSampler(10, 4, 4), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 4, -1), std::invalid_argument);
  EXPECT_THROW(DistributedSampler(10, 0, 0), std::invalid_argument);
}

// ---- DataLoader

std::shared_ptr<TensorDataset> rows_dataset(int64_t n) {
  at::Tensor data = at::arange(n * 3, at::TensorOptions().dtype(at::kFloat)).view({n, 3});
  at::Tensor target = at::arange(n, at::TensorOptions().dtype(at::kLong)) * 10;
  return std::make_shared<TensorDataset>(data, target);
}

// Iterates the loader and checks every batch against the dataset rows of the sampler's indices.
void check_loader(const DataLoader& loader, const std::vector<int64_t>& expected_batch_sizes) {
  const auto dataset = std::static_pointer_cast<TensorDataset>(loader.dataset());
  const auto indices = loader.sampler().indices();
  ASSERT_EQ(loader.num_batches(), static_cast<int64_t>(expected_batch_sizes.size()));
  size_t b = 0, offset = 0;
  for (const Example& batch : loader) {
    ASSERT_LT(b, expected_batch_sizes.size());
    const int64_t size = expected_batch_sizes[b];
    EXPECT_EQ(batch.data.sizes(), (at::IntArrayRef{size, 3})) << "batch " << b;
    EXPECT_EQ(batch.target.sizes(), (at::IntArrayRef{size})) << "batch " << b;
    std::vector<int64_t> want(indices.begin() + offset, indices.begin() + offset + size);
    EXPECT_TRUE(batch.data.equal(dataset->data().index_select(0, to_tensor(want)))) << "batch " << b;
    EXPECT_TRUE(batch.target.equal(dataset->target().index_select(0, to_tensor(want)))) << "batch " << b;
    offset += static_cast<size_t>(size);
    ++b;
  }
  EXPECT_EQ(b, expected_batch_sizes.size());
}

TEST(DataLoaderTest, BatchesWithoutDropLast) {
  DataLoaderOptions options;
  options.batch_size = 5;
  options.shuffle = true;
  // 23 samples over 2 ranks: 12 each (one padded), batches 5, 5, 2.
  for (int rank : {0, 1}) {
    DataLoader loader(rows_dataset(23), options, 2, rank);
    EXPECT_EQ(loader.sampler().num_samples(), 12);
    check_loader(loader, {5, 5, 2});
  }
}

TEST(DataLoaderTest, BatchesWithDropLast) {
  DataLoaderOptions options;
  options.batch_size = 5;
  options.shuffle = true;
  options.drop_last = true;
  // 23 samples over 2 ranks: 11 each, batches 5, 5 (the last 1 dropped).
  for (int rank : {0, 1}) {
    DataLoader loader(rows_dataset(23), options, 2, rank);
    EXPECT_EQ(loader.sampler().num_samples(), 11);
    check_loader(loader, {5, 5});
  }
}

TEST(DataLoaderTest, UnshuffledSingleRankAndEpochs) {
  DataLoaderOptions options;
  options.batch_size = 4;
  DataLoader plain(rows_dataset(10), options, 1, 0);
  check_loader(plain, {4, 4, 2});
  auto first = *plain.begin();
  EXPECT_TRUE(first.target.equal(at::arange(4, at::TensorOptions().dtype(at::kLong)) * 10));

  options.shuffle = true;
  DataLoader shuffled(rows_dataset(64), options, 2, 1);
  const auto before = (*shuffled.begin()).target;
  shuffled.set_epoch(3);
  EXPECT_EQ(shuffled.sampler().epoch(), 3);
  check_loader(shuffled, {4, 4, 4, 4, 4, 4, 4, 4});
  EXPECT_FALSE((*shuffled.begin()).target.equal(before));
}

TEST(DataLoaderTest, InvalidOptions) {
  DataLoaderOptions options;
  options.batch_size = 0;
  EXPECT_THROW(DataLoader(rows_dataset(4), options, 1, 0), std::invalid_argument);
  options.batch_size = 1;
  EXPECT_THROW(DataLoader(nullptr, options, 1, 0), std::invalid_argument);
  EXPECT_THROW(DataLoader(rows_dataset(4), options, 2, 2), std::invalid_argument);
}

// A dataset without its own get_batch: the default stacks get() of each index.
class SquaresDataset : public booster::data::Dataset {
 public:
  int64_t size() const override { return 6; }
  Example get(int64_t index) const override {
    return {at::full({2}, static_cast<double>(index * index), at::TensorOptions().dtype(at::kFloat)),
            at::scalar_tensor(index, at::TensorOptions().dtype(at::kLong))};
  }
};

TEST(DatasetTest, DefaultGetBatchStacks) {
  SquaresDataset dataset;
  Example batch = dataset.get_batch({5, 1, 3});
  EXPECT_EQ(batch.data.sizes(), (at::IntArrayRef{3, 2}));
  EXPECT_TRUE(batch.data.select(1, 0).equal(at::tensor({25.0f, 1.0f, 9.0f})));
  EXPECT_TRUE(batch.target.equal(to_tensor({5, 1, 3})));
  EXPECT_THROW(dataset.get_batch({}), std::invalid_argument);

  DataLoaderOptions options;
  options.batch_size = 4;
  DataLoader loader(std::make_shared<SquaresDataset>(), options, 1, 0);
  int64_t batches = 0;
  for (const Example& b : loader) {
    EXPECT_EQ(b.data.size(0), batches == 0 ? 4 : 2);
    ++batches;
  }
  EXPECT_EQ(batches, 2);
}

TEST(DatasetTest, TensorDataset) {
  auto dataset = rows_dataset(5);
  EXPECT_EQ(dataset->size(), 5);
  Example e = dataset->get(2);
  EXPECT_TRUE(e.data.equal(at::tensor({6.0f, 7.0f, 8.0f})));
  EXPECT_EQ(e.target.item<int64_t>(), 20);
  EXPECT_THROW(dataset->get(5), std::out_of_range);
  EXPECT_THROW(dataset->get_batch({0, 5}), std::out_of_range);
  EXPECT_THROW(TensorDataset(at::zeros({3, 2}), at::zeros({4})), std::invalid_argument);
}

// ---- read_idx_file

TEST(IdxFileTest, ReadsPlainAndGzip) {
  booster::testing::TempDir dir;
  const auto values = iota_bytes(24);
  const std::string bytes = idx_bytes(0x08, {2, 3, 4}, values);
  booster::testing::write_file(dir.file("a.idx"), bytes);
  write_gz(dir.file("a.idx.gz"), bytes);
  for (const std::string name : {"a.idx", "a.idx.gz"}) {
    at::Tensor t = booster::data::read_idx_file(dir.file(name));
    EXPECT_EQ(t.scalar_type(), at::kByte) << name;
    ASSERT_EQ(t.sizes(), (at::IntArrayRef{2, 3, 4})) << name;
    const uint8_t* p = t.contiguous().data_ptr<uint8_t>();
    EXPECT_TRUE(std::equal(values.begin(), values.end(), p)) << name;
    EXPECT_EQ(t[1][2][3].item<uint8_t>(), values[23]) << name;
  }

  booster::testing::write_file(dir.file("b.idx"), idx_bytes(0x08, {5}, {9, 8, 7, 6, 5}));
  at::Tensor b = booster::data::read_idx_file(dir.file("b.idx"));
  ASSERT_EQ(b.sizes(), (at::IntArrayRef{5}));
  EXPECT_EQ(b[0].item<uint8_t>(), 9);
  EXPECT_EQ(b[4].item<uint8_t>(), 5);

  booster::testing::write_file(dir.file("empty.idx"), idx_bytes(0x08, {0, 28}, {}));
  EXPECT_EQ(booster::data::read_idx_file(dir.file("empty.idx")).sizes(), (at::IntArrayRef{0, 28}));
}

TEST(IdxFileTest, TruncatedFiles) {
  booster::testing::TempDir dir;
  const std::string full = idx_bytes(0x08, {2, 3, 4}, iota_bytes(24));
  booster::testing::write_file(dir.file("short.idx"), full.substr(0, full.size() - 5));
  expect_idx_error(dir.file("short.idx"), "truncated");
  write_gz(dir.file("short.idx.gz"), full.substr(0, full.size() - 5));
  expect_idx_error(dir.file("short.idx.gz"), "truncated");

  booster::testing::write_file(dir.file("header.idx"), full.substr(0, 9));  // cut inside the dims
  expect_idx_error(dir.file("header.idx"), "truncated");
  booster::testing::write_file(dir.file("tiny.idx"), full.substr(0, 2));
  expect_idx_error(dir.file("tiny.idx"), "truncated");
  booster::testing::write_file(dir.file("zero.idx"), "");
  expect_idx_error(dir.file("zero.idx"), "truncated");

  // A gzip stream cut in the middle (valid prefix of the compressed bytes).
  const std::string big = idx_bytes(0x08, {64, 1024}, iota_bytes(64 * 1024));
  write_gz(dir.file("big.idx.gz"), big);
  const std::string gz = booster::testing::read_file(dir.file("big.idx.gz"));
  booster::testing::write_file(dir.file("cut.idx.gz"), gz.substr(0, gz.size() / 2));
  expect_idx_error(dir.file("cut.idx.gz"), "");
  // Whole data but the gzip trailer (CRC, size) missing.
  booster::testing::write_file(dir.file("notrailer.idx.gz"), gz.substr(0, gz.size() - 8));
  expect_idx_error(dir.file("notrailer.idx.gz"), "");
}

TEST(IdxFileTest, BadMagicAndType) {
  booster::testing::TempDir dir;
  booster::testing::write_file(dir.file("magic.idx"), idx_bytes(0x08, {4}, {1, 2, 3, 4}, 0x12, 0x34));
  expect_idx_error(dir.file("magic.idx"), "magic");
  booster::testing::write_file(dir.file("type.idx"), idx_bytes(0x0D, {1}, {0, 0, 0, 0}));
  expect_idx_error(dir.file("type.idx"), "0x0d");
  booster::testing::write_file(dir.file("ndim.idx"), idx_bytes(0x08, {}, {1}));
  expect_idx_error(dir.file("ndim.idx"), "dimensions");
  booster::testing::write_file(dir.file("text.idx"), "hello, this is not an IDX file\n");
  expect_idx_error(dir.file("text.idx"), "magic");
}

TEST(IdxFileTest, WrongDimensions) {
  booster::testing::TempDir dir;
  // More data than the dimensions describe.
  booster::testing::write_file(dir.file("long.idx"), idx_bytes(0x08, {2, 2}, iota_bytes(7)));
  expect_idx_error(dir.file("long.idx"), "more data");
  write_gz(dir.file("long.idx.gz"), idx_bytes(0x08, {2, 2}, iota_bytes(7)));
  expect_idx_error(dir.file("long.idx.gz"), "more data");
}

TEST(IdxFileTest, AbsurdDimensionsDoNotAllocate) {
  booster::testing::TempDir dir;
  const long rss_before = max_rss_kib();
  // 4e9 x 4e9 bytes (16 EB), 4e9^3 (overflows 64 bits) and 65536 x 65536 (4 GiB, plausible in
  // range but not backed by the file): each a DataError, none allocating what the header claims.
  booster::testing::write_file(dir.file("absurd.idx"), idx_bytes(0x08, {4000000000u, 4000000000u}, iota_bytes(16)));
  expect_idx_error(dir.file("absurd.idx"), "dimensions");
  booster::testing::write_file(dir.file("overflow.idx"),
                               idx_bytes(0x08, {4000000000u, 4000000000u, 4000000000u}, iota_bytes(16)));
  expect_idx_error(dir.file("overflow.idx"), "dimensions");
  booster::testing::write_file(dir.file("large.idx"), idx_bytes(0x08, {65536, 65536}, iota_bytes(1000)));
  expect_idx_error(dir.file("large.idx"), "truncated");
  write_gz(dir.file("large.idx.gz"), idx_bytes(0x08, {65536, 65536}, iota_bytes(1000)));
  expect_idx_error(dir.file("large.idx.gz"), "truncated");
  // Peak RSS grows by far less than what the headers claim (ru_maxrss is in KiB).
  EXPECT_LT(max_rss_kib() - rss_before, 256L * 1024);
}

TEST(IdxFileTest, MissingFile) {
  booster::testing::TempDir dir;
  expect_idx_error(dir.file("nope.idx.gz"), "no such file");
}

// ---- Fashion-MNIST

const std::string kFashionDir = booster::data::FASHION_MNIST_DEFAULT_DIR;

#define SKIP_WITHOUT_FASHION_MNIST()                                                               \
  if (!dir_exists(kFashionDir)) GTEST_SKIP() << kFashionDir << " absent (apt-get install dataset-fashion-mnist)"

TEST(FashionMnistTest, TrainSet) {
  SKIP_WITHOUT_FASHION_MNIST();
  auto train = booster::data::load_fashion_mnist(kFashionDir, true);
  ASSERT_EQ(train->size(), 60000);
  EXPECT_EQ(train->data().sizes(), (at::IntArrayRef{60000, 1, 28, 28}));
  EXPECT_EQ(train->data().scalar_type(), at::kFloat);
  EXPECT_EQ(train->target().sizes(), (at::IntArrayRef{60000}));
  EXPECT_EQ(train->target().scalar_type(), at::kLong);
  EXPECT_GE(train->target().min().item<int64_t>(), 0);
  EXPECT_LE(train->target().max().item<int64_t>(), 9);
  at::Tensor counts = at::bincount(train->target(), {}, 10);
  ASSERT_EQ(counts.numel(), 10);
  for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c].item<int64_t>(), 6000) << "class " << c;
  const double mean = train->data().to(at::kDouble).mean().item<double>();
  const double std = train->data().to(at::kDouble).std().item<double>();
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(std, 1.0, 0.01);
  // Pixel values map back to [0, 1].
  const double lo = train->data().min().item<double>() * 0.3530 + 0.2860;
  const double hi = train->data().max().item<double>() * 0.3530 + 0.2860;
  EXPECT_NEAR(lo, 0.0, 1e-5);
  EXPECT_NEAR(hi, 1.0, 1e-5);
}

TEST(FashionMnistTest, TestSetGzAndPlainAgree) {
  SKIP_WITHOUT_FASHION_MNIST();
  auto test = booster::data::load_fashion_mnist(kFashionDir, false);
  ASSERT_EQ(test->size(), 10000);
  EXPECT_EQ(test->data().sizes(), (at::IntArrayRef{10000, 1, 28, 28}));
  EXPECT_EQ(test->target().sizes(), (at::IntArrayRef{10000}));
  at::Tensor counts = at::bincount(test->target(), {}, 10);
  for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[c].item<int64_t>(), 1000) << "class " << c;

  // The same files uncompressed (names without .gz) load to the same tensors.
  booster::testing::TempDir dir;
  for (const std::string name : {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    booster::testing::write_file(dir.file(name), gunzip_file(kFashionDir + "/" + name + ".gz"));
  }
  auto plain = booster::data::load_fashion_mnist(dir.path(), false);
  EXPECT_TRUE(plain->data().equal(test->data()));
  EXPECT_TRUE(plain->target().equal(test->target()));
}

TEST(FashionMnistTest, MissingDirectory) {
  booster::testing::TempDir dir;
  const std::string missing = dir.file("no-such-dir");
  for (bool train : {true, false}) {
    try {
      booster::data::load_fashion_mnist(missing, train);
      ADD_FAILURE() << "no DataError";
    } catch (const DataError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("apt-get install dataset-fashion-mnist"), std::string::npos) << msg;
      EXPECT_NE(msg.find(missing + (train ? "/train" : "/t10k")), std::string::npos) << msg;
    }
  }
}

TEST(FashionMnistTest, MalformedFiles) {
  booster::testing::TempDir dir;
  const std::string images = dir.file("t10k-images-idx3-ubyte");
  const std::string labels = dir.file("t10k-labels-idx1-ubyte");
  booster::testing::write_file(images, idx_bytes(0x08, {2, 28, 28}, iota_bytes(2 * 28 * 28)));

  booster::testing::write_file(labels, idx_bytes(0x08, {2}, {3, 12}));  // label out of range
  EXPECT_THROW(booster::data::load_fashion_mnist(dir.path(), false), DataError);
  booster::testing::write_file(labels, idx_bytes(0x08, {3}, {3, 1, 2}));  // count mismatch
  EXPECT_THROW(booster::data::load_fashion_mnist(dir.path(), false), DataError);
  booster::testing::write_file(labels, idx_bytes(0x08, {2}, {3, 9}));
  auto ok = booster::data::load_fashion_mnist(dir.path(), false);
  EXPECT_EQ(ok->data().sizes(), (at::IntArrayRef{2, 1, 28, 28}));
  EXPECT_TRUE(ok->target().equal(to_tensor({3, 9})));

  booster::testing::write_file(images, idx_bytes(0x08, {2, 784}, iota_bytes(2 * 28 * 28)));  // wrong shape
  try {
    booster::data::load_fashion_mnist(dir.path(), false);
    ADD_FAILURE() << "no DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find(images), std::string::npos) << e.what();
  }
}

// ---- logging

// Restores rank 0 and level info whatever the test did.
struct LoggingReset {
  ~LoggingReset() {
    booster::log::set_rank(0);
    booster::log::set_level("info");
  }
};

size_t count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++n;
  return n;
}

TEST(LoggingTest, RankPrefixAndRankZeroOnly) {
  LoggingReset reset;
  booster::log::set_level("info");
  booster::log::set_rank(0);
  ::testing::internal::CaptureStdout();
  booster::log::info("hello {} from rank zero");
  booster::log::warn("careful");
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("[rank 0]"), std::string::npos) << out;
  EXPECT_NE(out.find("hello {} from rank zero"), std::string::npos) << out;  // no format expansion
  EXPECT_NE(out.find("careful"), std::string::npos) << out;

  booster::log::set_rank(3);
  ::testing::internal::CaptureStdout();
  booster::log::info("hidden info");
  booster::log::warn("hidden warn");
  booster::log::info_all("every rank");
  booster::log::warn_all("every rank warns");
  out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.find("hidden"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 3]"), std::string::npos) << out;
  EXPECT_NE(out.find("every rank"), std::string::npos) << out;
  EXPECT_NE(out.find("every rank warns"), std::string::npos) << out;
}

TEST(LoggingTest, Levels) {
  LoggingReset reset;
  booster::log::set_rank(0);
  booster::log::set_level("error");
  ::testing::internal::CaptureStdout();
  booster::log::info("quiet info");
  booster::log::warn_all("quiet warn");
  booster::log::error_all("loud error");
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.find("quiet"), std::string::npos) << out;
  EXPECT_NE(out.find("loud error"), std::string::npos) << out;

  booster::log::set_level("off");
  ::testing::internal::CaptureStdout();
  booster::log::error_all("silenced");
  out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out.find("silenced"), std::string::npos) << out;

  EXPECT_THROW(booster::log::set_level("verbose"), std::invalid_argument);
  booster::log::set_level("DEBUG");  // case-insensitive
}

TEST(LoggingTest, ProgressBarPlainLines) {
  LoggingReset reset;
  booster::log::set_rank(0);
  // Under capture stdout is a file, so the bar prints plain lines every 4 steps and at the end.
  ::testing::internal::CaptureStdout();
  {
    booster::log::ProgressBar bar("epoch 1/2", 10, 4);
    for (int64_t step = 1; step <= 10; ++step) bar.update(step, "loss 0.5");
  }
  std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(count(out, "epoch 1/2"), 3u) << out;
  EXPECT_NE(out.find("4/10 loss 0.5"), std::string::npos) << out;
  EXPECT_NE(out.find("8/10 loss 0.5"), std::string::npos) << out;
  EXPECT_NE(out.find("10/10 loss 0.5"), std::string::npos) << out;

  booster::log::set_rank(1);  // not drawn on other ranks
  ::testing::internal::CaptureStdout();
  {
    booster::log::ProgressBar bar("epoch 2/2", 10, 1);
    for (int64_t step = 1; step <= 10; ++step) bar.update(step);
    bar.finish();
  }
  out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out, "");

  booster::log::set_rank(0);  // nor when the level hides info
  booster::log::set_level("warn");
  ::testing::internal::CaptureStdout();
  {
    booster::log::ProgressBar bar("epoch 3/3", 4, 1);
    for (int64_t step = 1; step <= 4; ++step) bar.update(step);
  }
  out = ::testing::internal::GetCapturedStdout();
  EXPECT_EQ(out, "");
}

}  // namespace
