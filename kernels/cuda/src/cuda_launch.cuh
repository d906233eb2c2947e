// Error checking and the generic multi-tensor kernel, shared by the .cu files of this library.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "multi_tensor_functors.h"

// Kernel parameters above 4 KiB (multi_tensor_apply.h) are read in place: __grid_constant__ keeps
// the compiler from copying a parameter whose address is taken (dynamic indexing) to local memory.
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12010
#define BOOSTER_GRID_CONSTANT __grid_constant__
#else
#define BOOSTER_GRID_CONSTANT
#endif

namespace booster::kernels::cuda::detail {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("booster::kernels::cuda: ") + what + " failed at " + file + ":" +
                           std::to_string(line) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

// The failure of a launch whose parameters take `param_bytes`: names the kernel and, when the
// parameters exceed 4 KiB and the driver predates CUDA 12.1 (which allows up to 32764 bytes), says so.
[[noreturn]] inline void throw_launch_error(cudaError_t err, const char* what, size_t param_bytes, const char* file,
                                            int line) {
  int driver = 0;
  if (param_bytes > 4096 && cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0 && driver < 12010) {
    throw std::runtime_error(std::string("booster::kernels::cuda: launch of ") + what + " failed at " + file + ":" +
                             std::to_string(line) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err) +
                             " (its " + std::to_string(param_bytes) +
                             " bytes of kernel parameters need a driver of CUDA 12.1 or newer; this one is " +
                             std::to_string(driver / 1000) + "." + std::to_string(driver % 1000 / 10) + ")");
  }
  throw_cuda_error(err, (std::string("launch of ") + what).c_str(), file, line);
}

// BOOSTER_CUDA_CHECK(call): throws std::runtime_error naming the call and the call site on failure.
#define BOOSTER_CUDA_CHECK(call)                                                                     \
  do {                                                                                               \
    const cudaError_t booster_cuda_err_ = (call);                                                    \
    if (booster_cuda_err_ != cudaSuccess)                                                            \
      ::booster::kernels::cuda::detail::throw_cuda_error(booster_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Reports a failed launch (bad configuration, no device, ...) of the kernel named `what`, whose
// parameters take param_bytes.
#define BOOSTER_CUDA_CHECK_LAUNCH(what, param_bytes)                                                 \
  do {                                                                                               \
    const cudaError_t booster_cuda_err_ = cudaGetLastError();                                        \
    if (booster_cuda_err_ != cudaSuccess)                                                            \
      ::booster::kernels::cuda::detail::throw_launch_error(booster_cuda_err_, what, param_bytes, __FILE__, __LINE__); \
  } while (0)

template <int kDepth, class Functor>
__global__ void __launch_bounds__(kThreadsPerBlock)
    multi_tensor_kernel(const BOOSTER_GRID_CONSTANT TensorListMeta<kDepth> meta, const BOOSTER_GRID_CONSTANT Functor f) {
  f(meta, static_cast<int>(blockIdx.x), static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x));
}

// Runs blocks 0..blocks-1 of `meta` with kThreadsPerBlock threads each; throws on a failed launch.
template <int kDepth, class Functor>
void launch_multi_tensor(const TensorListMeta<kDepth>& meta, int blocks, const Functor& f, cudaStream_t stream,
                         const char* what) {
  static_assert(sizeof(Functor) <= kFunctorParamBytes, "functor larger than its share of the kernel parameters");
  static_assert(sizeof(TensorListMeta<kDepth>) + sizeof(Functor) <= kKernelParamBytes,
                "kernel parameters exceed the launch limit");
  multi_tensor_kernel<kDepth, Functor><<<blocks, kThreadsPerBlock, 0, stream>>>(meta, f);
  BOOSTER_CUDA_CHECK_LAUNCH(what, sizeof(TensorListMeta<kDepth>) + sizeof(Functor));
}

}  // namespace booster::kernels::cuda::detail
