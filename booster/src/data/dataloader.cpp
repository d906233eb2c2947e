// dataloader.cpp — DistributedSampler (index-for-index the same as PyTorch's
// torch.utils.data.DistributedSampler) and the batching DataLoader over it.
#include "booster/data/dataloader.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

namespace booster::data {

// ---- DistributedSampler

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle,
                                       uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      drop_last_(drop_last),
      seed_(seed) {
  if (dataset_size < 0) {
    throw std::invalid_argument("DistributedSampler: negative dataset size " + std::to_string(dataset_size));
  }
  if (num_replicas < 1) {
    throw std::invalid_argument("DistributedSampler: num_replicas must be >= 1, got " +
                                std::to_string(num_replicas));
  }
  if (rank < 0 || rank >= num_replicas) {
    throw std::invalid_argument("DistributedSampler: invalid rank " + std::to_string(rank) +
                                ", rank should be in the interval [0, " + std::to_string(num_replicas - 1) +
                                "]");
  }
  const int64_t r = num_replicas;
  if (drop_last && dataset_size % r != 0) {
    // PyTorch: ceil((n - R) / R) with n = q*R + m, 0 < m < R, which is q (0 when n < R).
    num_samples_ = dataset_size / r;
  } else {
    num_samples_ = (dataset_size + r - 1) / r;  // ceil(n / R)
  }
}

std::vector<int64_t> DistributedSampler::indices() const {
  const int64_t n = dataset_size_;
  std::vector<int64_t> all(static_cast<size_t>(n));
  if (shuffle_) {
    // Same stream as Python: g = torch.Generator(); g.manual_seed(seed + epoch); torch.randperm(n, generator=g).
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch_));
    at::Tensor perm = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong)).contiguous();
    const int64_t* p = perm.data_ptr<int64_t>();
    std::copy(p, p + n, all.begin());
  } else {
    for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = i;
  }

  const int64_t total = total_size();
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(num_samples_));
  // Padding (drop_last=false) repeats the list from its start, i.e. padded[i] = all[i % n];
  // truncation (drop_last=true) keeps the first total_size entries. Rank r takes r, r+R, r+2R, ...
  for (int64_t i = rank_; i < total; i += num_replicas_) {
    out.push_back(all[static_cast<size_t>(i % n)]);
  }
  return out;
}

// ---- DataLoader

DataLoader::DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options, int num_replicas,
                       int rank)
    : dataset_(std::move(dataset)),
      options_(options),
      sampler_(dataset_ ? dataset_->size() : 0, num_replicas, rank, options.shuffle, options.seed,
               options.drop_last) {
  if (!dataset_) throw std::invalid_argument("DataLoader: dataset is null");
  if (options_.batch_size < 1) {
    throw std::invalid_argument("DataLoader: batch_size must be >= 1, got " +
                                std::to_string(options_.batch_size));
  }
}

int64_t DataLoader::num_batches() const {
  const int64_t n = sampler_.num_samples();
  const int64_t b = options_.batch_size;
  return options_.drop_last ? n / b : (n + b - 1) / b;
}

DataLoader::Iterator::Iterator(const DataLoader* loader, std::shared_ptr<const std::vector<int64_t>> indices,
                               int64_t batch)
    : loader_(loader), indices_(std::move(indices)), batch_(batch) {}

Example DataLoader::Iterator::operator*() const {
  if (!indices_) throw std::logic_error("DataLoader::Iterator: dereferencing the end iterator");
  const int64_t size = static_cast<int64_t>(indices_->size());
  const int64_t b = loader_->options_.batch_size;
  const int64_t first = batch_ * b;
  if (batch_ < 0 || first >= size) throw std::out_of_range("DataLoader::Iterator: batch out of range");
  const int64_t last = std::min(first + b, size);
  std::vector<int64_t> batch(indices_->begin() + first, indices_->begin() + last);
  Example example = loader_->dataset_->get_batch(batch);
  const DataLoaderOptions& o = loader_->options_;
  if (o.device.is_cpu()) return example;
  auto to_device = [&o](const at::Tensor& t) {
    if (!t.defined() || t.device() == o.device) return t;
    const at::Tensor src = o.pin_memory && t.device().is_cpu() ? t.pin_memory() : t;
    return src.to(o.device, /*non_blocking=*/o.pin_memory);
  };
  example.data = to_device(example.data);
  example.target = to_device(example.target);
  return example;
}

DataLoader::Iterator DataLoader::begin() const {
  return Iterator(this, std::make_shared<const std::vector<int64_t>>(sampler_.indices()), 0);
}

DataLoader::Iterator DataLoader::end() const { return Iterator(this, nullptr, num_batches()); }

}  // namespace booster::data
