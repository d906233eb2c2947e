// dataset.h — map-style datasets for prepare_dataloader, and the Fashion-MNIST reader.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "booster/export.h"

namespace booster::data {

// One sample or one batch: `data` and `target` (batch: leading dimension = batch size).
struct Example {
  at::Tensor data;
  at::Tensor target;
};

// A map-style dataset (like torch.utils.data.Dataset): size() samples, get(i) for i in [0, size()).
class BOOSTER_API Dataset {
 public:
  virtual ~Dataset();
  virtual int64_t size() const = 0;
  virtual Example get(int64_t index) const = 0;
  // The batch of the given indices, stacked along a new dim 0. Default: get() each and stack.
  virtual Example get_batch(const std::vector<int64_t>& indices) const;
};

// A dataset over two tensors with the same leading dimension N: sample i is (data[i], target[i]).
// get_batch is one index_select per tensor. Throws std::invalid_argument if the leading dims differ.
class BOOSTER_API TensorDataset : public Dataset {
 public:
  TensorDataset(at::Tensor data, at::Tensor target);
  int64_t size() const override;
  Example get(int64_t index) const override;
  Example get_batch(const std::vector<int64_t>& indices) const override;
  const at::Tensor& data() const { return data_; }
  const at::Tensor& target() const { return target_; }

 private:
  at::Tensor data_, target_;
};

// Thrown when a data file is missing or malformed; the message names the file and the fix.
class BOOSTER_API DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr const char* FASHION_MNIST_DEFAULT_DIR = "/usr/share/datasets/fashion-mnist";

// Reads Fashion-MNIST (Xiao et al. 2017) from the IDX files, gzip-compressed or not, as shipped by
// Debian's dataset-fashion-mnist: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz].
// Returns data float32 [N, 1, 28, 28] scaled to [0, 1] then normalised with mean 0.2860 and
// std 0.3530 (the training set's), target int64 [N] in 0..9. N = 60000 (train) or 10000 (test).
// Throws DataError naming the file when it is absent (with "apt-get install dataset-fashion-mnist"),
// truncated, or has a wrong magic number / dimensions.
BOOSTER_API std::shared_ptr<TensorDataset> load_fashion_mnist(const std::string& dir, bool train);

// Reads one IDX file (magic 0x0000 08 <ndim>, big-endian dims, then uint8 data), gz or raw.
// Returns uint8 tensor of the file's shape. Throws DataError as above.
BOOSTER_API at::Tensor read_idx_file(const std::string& path);

}  // namespace booster::data
