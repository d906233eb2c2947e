// replicate.cpp — DDP's model hooks over the core's GradientReducer (see
// booster/parallel/replicate.h).
#include "booster/parallel/replicate.h"

#include <stdexcept>
#include <vector>

#include "booster/core/replica.h"

namespace booster::parallel {

namespace {

class ReplicateHooks : public ModelHooks {
 public:
  ReplicateHooks(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<dist::ProcessGroup> group,
                 ReplicateOptions options)
      : model_(std::move(model)), group_(std::move(group)), options_(std::move(options)) {
    sync_replicas(*group_, *model_);
    for (auto& [n, t] : named_buffers_of(*model_)) buffers_.push_back(t);
    options_.reducer.rebuild_buckets = true;  // PyTorch DDP: buckets follow the gradient-ready order
    if (group_->size() > 1)
      reducer_ = std::make_unique<GradientReducer>(named_parameters_of(*model_, true), group_, options_.reducer);
  }

  void pre_forward() override {
    // As DDP: keep buffers (e.g. BatchNorm running statistics) identical to rank 0's.
    if (options_.broadcast_buffers && model_->is_training() && group_->size() > 1 && !buffers_.empty())
      broadcast_coalesced(*group_, buffers_, 0);
  }

  void set_require_grad_sync(bool required) override {
    if (reducer_) reducer_->set_require_grad_sync(required);
  }

  torch::nn::Module& module() override { return *model_; }

  int64_t communication_buffer_bytes() const override {
    if (!reducer_ || options_.reducer.gradient_as_bucket_view) return 0;  // buckets are the gradients then
    int64_t bytes = 0;
    for (int64_t b : reducer_->bucket_bytes()) bytes += b;
    return bytes;
  }

  std::map<std::string, int64_t> stats() const override {
    if (!reducer_) return {{"buckets", 0}};
    return reducer_->stats();
  }

 private:
  std::shared_ptr<torch::nn::Module> model_;
  std::shared_ptr<dist::ProcessGroup> group_;
  ReplicateOptions options_;
  std::vector<torch::Tensor> buffers_;
  std::unique_ptr<GradientReducer> reducer_;
};

}  // namespace

std::shared_ptr<ModelHooks> replicate(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<dist::ProcessGroup> group,
                                      ReplicateOptions options) {
  if (!model) throw std::invalid_argument("booster: replicate: the model is null");
  if (!group) throw std::invalid_argument("booster: replicate: the process group is null");
  return std::make_shared<ReplicateHooks>(std::move(model), std::move(group), std::move(options));
}

}  // namespace booster::parallel
