// multi_tensor_l2norm: a multi-tensor pass writes one sum of squares per chunk; a second kernel adds
// each tensor's chunk sums (in double, fixed order); a third adds the tensors' sums. Deterministic.
// The chunk sums and the tensors' sums live in a workspace from a stream-ordered memory pool of this
// library's own (workspace_pool).
#include <cstdint>
#include <mutex>
#include <vector>

#include "booster/kernels/cuda_adam.h"
#include "cuda_launch.cuh"

namespace booster::kernels::cuda {
namespace {

// The current device's workspace pool, created on first use and never destroyed. Its release
// threshold is unlimited, so it keeps what it has reserved (the largest workspace in use at once,
// rounded up to the pool's granularity) and a call after the first maps no memory, whatever the
// device's default pool gives back at synchronisations.
cudaMemPool_t workspace_pool() {
  int device = 0;
  BOOSTER_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::vector<cudaMemPool_t>* pools = new std::vector<cudaMemPool_t>();  // by device; never freed
  std::lock_guard<std::mutex> lock(mutex);
  if (static_cast<size_t>(device) >= pools->size()) pools->resize(static_cast<size_t>(device) + 1, nullptr);
  cudaMemPool_t& pool = (*pools)[static_cast<size_t>(device)];
  if (pool == nullptr) {
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device;
    cudaMemPool_t created = nullptr;
    BOOSTER_CUDA_CHECK(cudaMemPoolCreate(&created, &props));
    uint64_t keep = UINT64_MAX;
    const cudaError_t err = cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &keep);
    if (err != cudaSuccess) {
      cudaMemPoolDestroy(created);
      BOOSTER_CUDA_CHECK(err);
    }
    pool = created;
  }
  return pool;
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), valid in thread 0.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T warp_sums[32];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  v = threadIdx.x < warps ? warp_sums[threadIdx.x] : T(0);
  if (warp == 0)
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

__global__ void __launch_bounds__(detail::kThreadsPerBlock)
    l2norm_chunks_kernel(const BOOSTER_GRID_CONSTANT detail::TensorListMeta<1> meta,
                         const BOOSTER_GRID_CONSTANT detail::L2NormFunctor f) {
  int64_t index = 0;
  const float sum = block_sum(f.thread_sum(meta, blockIdx.x, threadIdx.x, blockDim.x, index));
  if (threadIdx.x == 0) f.partials[index] = sum;
}

// One block per tensor of the batch: tensor tensor_begin + b owns chunk sums
// [chunk_begin[b], chunk_begin[b + 1]). As many tensors per launch as the kernel parameters hold.
constexpr int kFinalizeBatch = (detail::kKernelParamBytes - 64) / 4 - 2;
struct FinalizeBatch {
  int64_t tensor_begin;
  int32_t chunk_begin[kFinalizeBatch + 1];
};
static_assert(sizeof(FinalizeBatch) + 3 * sizeof(void*) <= detail::kKernelParamBytes, "kernel parameters too large");

constexpr int kReduceThreads = 512;
constexpr int kReduceIlp = 8;  // loads in flight per thread

// Thread k adds the values k, k + blockDim.x, ... of [begin, end) in order, kReduceIlp loads at a
// time (a missing value adds 0, which changes no sum of squares); then the block's sum.
template <class T, class I>
__device__ double block_sum_of(const T* values, I begin, I end) {
  double sum = 0.0;
  for (I i = begin + static_cast<I>(threadIdx.x); i < end; i += static_cast<I>(blockDim.x) * kReduceIlp) {
    T x[kReduceIlp];
#pragma unroll
    for (int u = 0; u < kReduceIlp; ++u) {
      const I j = i + static_cast<I>(u) * static_cast<I>(blockDim.x);
      x[u] = j < end ? values[j] : T(0);
    }
#pragma unroll
    for (int u = 0; u < kReduceIlp; ++u) sum += static_cast<double>(x[u]);
  }
  return block_sum(sum);
}

__global__ void __launch_bounds__(kReduceThreads)
    l2norm_tensors_kernel(const BOOSTER_GRID_CONSTANT FinalizeBatch batch, const float* partials, double* tensor_sumsq,
                          float* per_tensor_norms) {
  const double sum = block_sum_of(partials, batch.chunk_begin[blockIdx.x], batch.chunk_begin[blockIdx.x + 1]);
  if (threadIdx.x == 0) {
    const int64_t t = batch.tensor_begin + blockIdx.x;
    tensor_sumsq[t] = sum;
    if (per_tensor_norms != nullptr) per_tensor_norms[t] = static_cast<float>(sqrt(sum));
  }
}

__global__ void __launch_bounds__(kReduceThreads) l2norm_total_kernel(const double* tensor_sumsq, int64_t n, float* total) {
  const double sum = block_sum_of(tensor_sumsq, int64_t{0}, n);
  if (threadIdx.x == 0) *total = static_cast<float>(sqrt(sum));
}

}  // namespace

void multi_tensor_l2norm(const std::vector<NormTensor>& tensors, float* total_norm, float* per_tensor_norms,
                         Stream stream) {
  const std::vector<int32_t> chunk_begin = detail::check_l2norm_args(tensors, total_norm, kChunkSize);
  const int64_t n = static_cast<int64_t>(tensors.size());
  const int64_t chunks = chunk_begin.back();

  // Workspace: double tensor_sumsq[n], then float partials[chunks].
  void* workspace = nullptr;
  const size_t bytes = static_cast<size_t>(n) * sizeof(double) + static_cast<size_t>(chunks) * sizeof(float);
  BOOSTER_CUDA_CHECK(cudaMallocFromPoolAsync(&workspace, bytes > 0 ? bytes : sizeof(double), workspace_pool(), stream));
  double* tensor_sumsq = static_cast<double*>(workspace);
  float* partials = reinterpret_cast<float*>(tensor_sumsq + n);
  try {
    detail::L2NormFunctor f{kChunkSize, partials};
    detail::TensorListMeta<1> meta{};
    detail::plan_launches<1>(
        n, kChunkSize, meta, [&](int64_t t) { return tensors[t].numel; },
        [&](detail::TensorListMeta<1>& m, int slot, int64_t t) {
          detail::fill_l2norm_slot(m, slot, tensors[t], chunk_begin[t]);
        },
        [&](const detail::TensorListMeta<1>& m, int blocks) {
          static_assert(sizeof(m) + sizeof(f) <= detail::kKernelParamBytes, "kernel parameters exceed the limit");
          l2norm_chunks_kernel<<<blocks, detail::kThreadsPerBlock, 0, stream>>>(m, f);
          BOOSTER_CUDA_CHECK_LAUNCH("multi_tensor_l2norm chunk kernel", sizeof(m) + sizeof(f));
        });
    for (int64_t begin = 0; begin < n; begin += kFinalizeBatch) {
      const int64_t count = n - begin < kFinalizeBatch ? n - begin : kFinalizeBatch;
      FinalizeBatch batch{};
      batch.tensor_begin = begin;
      for (int64_t b = 0; b <= count; ++b) batch.chunk_begin[b] = chunk_begin[begin + b];
      l2norm_tensors_kernel<<<static_cast<unsigned>(count), kReduceThreads, 0, stream>>>(batch, partials, tensor_sumsq,
                                                                                       per_tensor_norms);
      BOOSTER_CUDA_CHECK_LAUNCH("multi_tensor_l2norm per-tensor kernel", sizeof(batch) + 3 * sizeof(void*));
    }
    l2norm_total_kernel<<<1, kReduceThreads, 0, stream>>>(tensor_sumsq, n, total_norm);
    BOOSTER_CUDA_CHECK_LAUNCH("multi_tensor_l2norm total kernel", 3 * sizeof(void*));
  } catch (...) {
    cudaFreeAsync(workspace, stream);
    throw;
  }
  BOOSTER_CUDA_CHECK(cudaFreeAsync(workspace, stream));
}

}  // namespace booster::kernels::cuda
