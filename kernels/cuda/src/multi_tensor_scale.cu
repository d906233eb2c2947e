// multi_tensor_scale: checks and launches (multi_tensor_functors.h), on the GPU.
#include "booster/kernels/cuda_adam.h"
#include "cuda_launch.cuh"

namespace booster::kernels::cuda {

void multi_tensor_scale(float scale, const std::vector<ScaleTensor>& tensors, int* found_inf, Stream stream) {
  detail::check_scale_args(tensors);
  const detail::ScaleFunctor f{scale, kChunkSize, found_inf};
  detail::TensorListMeta<2> meta{};
  detail::plan_launches<2>(
      static_cast<int64_t>(tensors.size()), kChunkSize, meta, [&](int64_t t) { return tensors[t].numel; },
      [&](detail::TensorListMeta<2>& m, int slot, int64_t t) { detail::fill_scale_slot(m, slot, tensors[t]); },
      [&](const detail::TensorListMeta<2>& m, int blocks) {
        detail::launch_multi_tensor(m, blocks, f, stream, "multi_tensor_scale kernel");
      });
}

}  // namespace booster::kernels::cuda
