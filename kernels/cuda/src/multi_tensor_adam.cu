// multi_tensor_adam: checks, per-step constants and launches (multi_tensor_functors.h), on the GPU.
#include "booster/kernels/cuda_adam.h"
#include "cuda_launch.cuh"

namespace booster::kernels::cuda {

void multi_tensor_adam(const AdamConfig& config, const std::vector<AdamTensor>& tensors, const int* noop_flag,
                       Stream stream) {
  detail::check_adam_args(config, tensors);
  const detail::AdamFunctor f = detail::make_adam_functor(config, kChunkSize, noop_flag);
  detail::TensorListMeta<5> meta{};
  detail::plan_launches<5>(
      static_cast<int64_t>(tensors.size()), kChunkSize, meta, [&](int64_t t) { return tensors[t].numel; },
      [&](detail::TensorListMeta<5>& m, int slot, int64_t t) { detail::fill_adam_slot(m, slot, tensors[t]); },
      [&](const detail::TensorListMeta<5>& m, int blocks) {
        detail::launch_multi_tensor(m, blocks, f, stream, "multi_tensor_adam kernel");
      });
}

}  // namespace booster::kernels::cuda
