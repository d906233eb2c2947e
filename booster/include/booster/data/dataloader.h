// dataloader.h — DistributedSampler (torch.utils.data.DistributedSampler's semantics) and a
// simple batching DataLoader over a Dataset, as returned by Booster::prepare_dataloader.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "booster/data/dataset.h"
#include "booster/export.h"

namespace booster::data {

// Splits [0, dataset_size) among num_replicas ranks as PyTorch's DistributedSampler does:
// shuffle with a generator seeded by seed + epoch (set_epoch changes it), then either pad by
// repeating the first indices so the total divides evenly (drop_last=false) or drop the tail
// (drop_last=true); rank r takes indices r, r + num_replicas, r + 2*num_replicas, ...
// Every rank yields num_samples() indices; the shards of one epoch are disjoint when drop_last or
// when no padding was needed. Throws std::invalid_argument for rank outside [0, num_replicas).
class BOOSTER_API DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);
  void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }
  int64_t num_samples() const { return num_samples_; }
  int64_t total_size() const { return num_samples_ * num_replicas_; }
  // This rank's indices for the current epoch.
  std::vector<int64_t> indices() const;

 private:
  int64_t dataset_size_;
  int num_replicas_, rank_;
  bool shuffle_, drop_last_;
  uint64_t seed_;
  int64_t epoch_ = 0;
  int64_t num_samples_;
};

struct DataLoaderOptions {
  int64_t batch_size = 1;  // per rank
  bool shuffle = false;
  uint64_t seed = 1024;    // ColossalAI's prepare_dataloader default
  bool drop_last = false;  // drops both the sampler's tail and a last incomplete batch
  // Where batches are delivered: the dataset's CPU tensors are copied there (asynchronously with
  // respect to the host when pin_memory: the batch is first copied into page-locked memory, as
  // PyTorch's DataLoader(pin_memory=True) followed by .to(device, non_blocking=True)). The copy is
  // queued on the device's current stream, so work queued after it on that stream sees the batch.
  // Booster::prepare_dataloader sets both from [booster] device.
  c10::Device device{c10::kCPU};
  bool pin_memory = false;  // only for a non-CPU device
};

// Iterates a dataset in batches of this rank's sampler indices. Single-threaded: batches are built
// by Dataset::get_batch on the calling thread.
class BOOSTER_API DataLoader {
 public:
  DataLoader(std::shared_ptr<Dataset> dataset, DataLoaderOptions options, int num_replicas, int rank);

  // Changes the shuffle of the next iteration (call at the start of each epoch, as in PyTorch).
  void set_epoch(int64_t epoch) { sampler_.set_epoch(epoch); }
  // Batches per epoch on this rank.
  int64_t num_batches() const;
  const DistributedSampler& sampler() const { return sampler_; }
  const DataLoaderOptions& options() const { return options_; }
  const std::shared_ptr<Dataset>& dataset() const { return dataset_; }

  class Iterator {
   public:
    Iterator(const DataLoader* loader, std::shared_ptr<const std::vector<int64_t>> indices, int64_t batch);
    Example operator*() const;
    Iterator& operator++() { ++batch_; return *this; }
    bool operator!=(const Iterator& other) const { return batch_ != other.batch_; }

   private:
    const DataLoader* loader_;
    std::shared_ptr<const std::vector<int64_t>> indices_;
    int64_t batch_;
  };
  // Indices are drawn once per begin() from the sampler's current epoch.
  Iterator begin() const;
  Iterator end() const;

 private:
  std::shared_ptr<Dataset> dataset_;
  DataLoaderOptions options_;
  DistributedSampler sampler_;
};

}  // namespace booster::data
