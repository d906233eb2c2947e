// dataset.cpp — Dataset's default batching, TensorDataset, the IDX file reader (gzip or raw, via
// zlib) and the Fashion-MNIST loader built on it.
#include "booster/data/dataset.h"

#include <ATen/ATen.h>
#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

namespace booster::data {

// ---- Dataset

Dataset::~Dataset() = default;

Example Dataset::get_batch(const std::vector<int64_t>& indices) const {
  if (indices.empty()) {
    throw std::invalid_argument("Dataset::get_batch: empty index list (cannot infer the sample shape)");
  }
  std::vector<at::Tensor> data, target;
  data.reserve(indices.size());
  target.reserve(indices.size());
  for (int64_t index : indices) {
    Example example = get(index);
    data.push_back(std::move(example.data));
    target.push_back(std::move(example.target));
  }
  return {at::stack(data), at::stack(target)};
}

// ---- TensorDataset

TensorDataset::TensorDataset(at::Tensor data, at::Tensor target)
    : data_(std::move(data)), target_(std::move(target)) {
  if (!data_.defined() || !target_.defined()) {
    throw std::invalid_argument("TensorDataset: data and target must be defined tensors");
  }
  if (data_.dim() < 1 || target_.dim() < 1) {
    throw std::invalid_argument("TensorDataset: data and target need a leading (sample) dimension");
  }
  if (data_.size(0) != target_.size(0)) {
    throw std::invalid_argument("TensorDataset: data has " + std::to_string(data_.size(0)) +
                                " samples but target has " + std::to_string(target_.size(0)));
  }
}

int64_t TensorDataset::size() const { return data_.size(0); }

namespace {

void check_index(int64_t index, int64_t size) {
  if (index < 0 || index >= size) {
    throw std::out_of_range("TensorDataset: index " + std::to_string(index) + " out of range [0, " +
                            std::to_string(size) + ")");
  }
}

}  // namespace

Example TensorDataset::get(int64_t index) const {
  check_index(index, size());
  return {data_[index], target_[index]};
}

Example TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t n = size();
  for (int64_t index : indices) check_index(index, n);
  at::Tensor index = at::tensor(at::ArrayRef<int64_t>(indices), at::TensorOptions().dtype(at::kLong));
  at::Tensor data_index = index.to(data_.device());
  at::Tensor target_index = target_.device() == data_.device() ? data_index : index.to(target_.device());
  return {data_.index_select(0, data_index), target_.index_select(0, target_index)};
}

// ---- IDX reader

namespace {

constexpr int kMaxIdxDims = 8;
// Initial buffer reservation cap: a corrupt header cannot make us reserve more than this up front;
// beyond it the buffer grows only as real data arrives.
constexpr size_t kMaxInitialReserve = size_t{64} << 20;
constexpr unsigned kReadChunk = 4u << 20;

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// A gzFile that closes itself.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path) {
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      const int err = errno;
      std::string why = err != 0 ? std::strerror(err) : "out of memory";
      if (err == ENOENT) why = "no such file";
      throw DataError("cannot open IDX file " + path + ": " + why);
    }
    gzbuffer(file_, 1u << 17);
  }
  ~GzReader() {
    if (file_ != nullptr) gzclose_r(file_);
  }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `len` bytes; returns how many were read (less only at the end of the data).
  size_t read(uint8_t* out, size_t len) {
    size_t done = 0;
    while (done < len) {
      const unsigned want = static_cast<unsigned>(std::min<size_t>(len - done, kReadChunk));
      const int got = gzread(file_, out + done, want);
      if (got < 0) {
        int code = 0;
        const char* msg = gzerror(file_, &code);
        throw DataError("cannot read IDX file " + path_ + ": " + (msg != nullptr ? msg : "read error") +
                        " (corrupt or truncated gzip stream?)");
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

  // Throws if zlib recorded an error (e.g. a gzip stream cut short: "unexpected end of file").
  void check_stream() {
    int code = Z_OK;
    const char* msg = gzerror(file_, &code);
    if (code != Z_OK) {
      throw DataError("IDX file " + path_ + " is truncated or corrupt: " +
                      (msg != nullptr ? msg : "gzip error"));
    }
  }

 private:
  std::string path_;
  gzFile file_ = nullptr;
};

std::string shape_string(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

}  // namespace

at::Tensor read_idx_file(const std::string& path) {
  GzReader reader(path);

  uint8_t magic[4];
  if (reader.read(magic, 4) != 4) {
    reader.check_stream();
    throw DataError("IDX file " + path + " is truncated: fewer than 4 bytes, no IDX header");
  }
  if (magic[0] != 0 || magic[1] != 0) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x", magic[0], magic[1], magic[2], magic[3]);
    throw DataError("IDX file " + path + " has a wrong magic number 0x" + hex +
                    " (expected 0x000008NN); not an IDX file");
  }
  if (magic[2] != 0x08) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", magic[2]);
    throw DataError("IDX file " + path + " has element type " + hex +
                    ", only unsigned byte (0x08) is supported");
  }
  const int ndim = magic[3];
  if (ndim < 1 || ndim > kMaxIdxDims) {
    throw DataError("IDX file " + path + " declares " + std::to_string(ndim) +
                    " dimensions (supported: 1.." + std::to_string(kMaxIdxDims) + ")");
  }

  uint8_t dim_bytes[4 * kMaxIdxDims];
  if (reader.read(dim_bytes, 4 * static_cast<size_t>(ndim)) != 4 * static_cast<size_t>(ndim)) {
    reader.check_stream();
    throw DataError("IDX file " + path + " is truncated inside its header (" + std::to_string(ndim) +
                    " dimensions declared)");
  }
  std::vector<int64_t> dims(ndim);
  // Products beyond this are rejected outright; anything below is still only believed as far as
  // the file actually holds data.
  constexpr uint64_t kMaxElements = uint64_t{1} << 48;
  uint64_t expected = 1;
  bool too_large = false;
  for (int i = 0; i < ndim; ++i) {
    const uint8_t* b = dim_bytes + 4 * i;
    const uint32_t d = (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | uint32_t{b[3]};
    dims[i] = static_cast<int64_t>(d);
    if (d != 0 && expected > kMaxElements / d) too_large = true;
    if (!too_large) expected *= d;
  }
  if (too_large) {
    throw DataError("IDX file " + path + " declares absurd dimensions " + shape_string(dims) +
                    " (corrupt header?)");
  }

  // Read into a buffer that grows with the data actually present, never trusting the header for
  // more than kMaxInitialReserve up front.
  auto buffer = std::make_unique<std::vector<uint8_t>>();
  buffer->reserve(static_cast<size_t>(std::min<uint64_t>(expected, kMaxInitialReserve)));
  while (buffer->size() < expected) {
    const size_t old = buffer->size();
    const size_t want = static_cast<size_t>(std::min<uint64_t>(expected - old, kReadChunk));
    buffer->resize(old + want);
    const size_t got = reader.read(buffer->data() + old, want);
    buffer->resize(old + got);
    if (got < want) break;
  }
  if (buffer->size() < expected) {
    reader.check_stream();
    throw DataError("IDX file " + path + " is truncated: dimensions " + shape_string(dims) + " need " +
                    std::to_string(expected) + " data bytes but the file holds only " +
                    std::to_string(buffer->size()));
  }
  uint8_t extra = 0;
  if (reader.read(&extra, 1) != 0) {
    throw DataError("IDX file " + path + " has more data than its dimensions " + shape_string(dims) +
                    " describe (" + std::to_string(expected) + " bytes); wrong dimensions?");
  }
  reader.check_stream();

  // Hand the buffer to the tensor without copying.
  auto* owned = buffer.release();
  return at::from_blob(
      owned->data(), dims, [owned](void*) { delete owned; }, at::TensorOptions().dtype(at::kByte));
}

// ---- Fashion-MNIST

namespace {

constexpr double kFashionMnistMean = 0.2860;
constexpr double kFashionMnistStd = 0.3530;

// "<dir>/<name>.gz" if present, else "<dir>/<name>", else a DataError telling how to get the data.
std::string find_idx_file(const std::string& dir, const std::string& name) {
  std::string base = dir.empty() ? name : (dir.back() == '/' ? dir + name : dir + "/" + name);
  if (file_exists(base + ".gz")) return base + ".gz";
  if (file_exists(base)) return base;
  throw DataError("Fashion-MNIST file " + base + ".gz not found (nor " + base +
                  "); install the data with `sudo apt-get install dataset-fashion-mnist` (files in " +
                  FASHION_MNIST_DEFAULT_DIR + ") or pass the directory that holds the IDX files");
}

}  // namespace

std::shared_ptr<TensorDataset> load_fashion_mnist(const std::string& dir, bool train) {
  const std::string prefix = train ? "train" : "t10k";
  const std::string images_path = find_idx_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_idx_file(dir, prefix + "-labels-idx1-ubyte");

  at::Tensor images = read_idx_file(images_path);
  if (images.dim() != 3 || images.size(1) != 28 || images.size(2) != 28) {
    throw DataError("Fashion-MNIST images file " + images_path + " has shape " +
                    shape_string(images.sizes().vec()) + ", expected [N, 28, 28]");
  }
  at::Tensor labels = read_idx_file(labels_path);
  if (labels.dim() != 1) {
    throw DataError("Fashion-MNIST labels file " + labels_path + " has shape " +
                    shape_string(labels.sizes().vec()) + ", expected [N]");
  }
  if (labels.size(0) != images.size(0)) {
    throw DataError("Fashion-MNIST labels file " + labels_path + " has " + std::to_string(labels.size(0)) +
                    " labels but " + images_path + " has " + std::to_string(images.size(0)) + " images");
  }
  if (labels.numel() > 0 && labels.max().item<uint8_t>() > 9) {
    throw DataError("Fashion-MNIST labels file " + labels_path + " has a label " +
                    std::to_string(labels.max().item<uint8_t>()) + " outside 0..9");
  }

  at::Tensor data = images.to(at::kFloat)
                        .div_(255.0)
                        .sub_(kFashionMnistMean)
                        .div_(kFashionMnistStd)
                        .unsqueeze(1)
                        .contiguous();
  at::Tensor target = labels.to(at::kLong);
  return std::make_shared<TensorDataset>(std::move(data), std::move(target));
}

}  // namespace booster::data
