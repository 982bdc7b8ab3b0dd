// Device-side helpers shared by the ops' CUDA launchers: bf16 conversion, launch configuration,
// and the post-launch check. Included only by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <utility>

#include "runtime/cuda_memory.h"
#include "runtime/programmatic_launch.h"
#include "runtime/tensor.h"

namespace hydra {
// Device tensors of DType::bf16 hold __nv_bfloat16 (same bits as hydra::bf16).
template <>
constexpr DType dtype_of<__nv_bfloat16>() { return DType::bf16; }
}  // namespace hydra

namespace hydra::cuda {

using bf16_t = __nv_bfloat16;

// Every launch is followed by this: a bad configuration fails here, at its launcher.
#define HYDRA_CUDA_LAUNCH_CHECK() HYDRA_CUDA_CHECK(cudaGetLastError())

// Programmatic dependent launch (runtime/programmatic_launch.h). A kernel launched through launch()
// below calls wait_for_previous_grid() as its first statement, in every thread, before any access to
// global memory and before any early return: with PDL it waits there until the kernel before it on
// the stream has completed and its writes are visible (without PDL it returns at once), and since
// every thread waits, this kernel never completes before its predecessor, so the kernels after it
// (PDL or not) see everything before it. allow_next_grid() right after lets the next PDL kernel be
// scheduled while this one runs (it only waits at its own top, for this one's completion). sm_90+.
__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_next_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, shared_bytes, current_stream()>>>(args...), with programmatic stream
// serialization while programmatic_launch_enabled() (the kernel must begin as said above); checked.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = current_stream();
  config.attrs = &attribute;
  config.numAttrs = programmatic_launch_enabled() ? 1 : 0;
  HYDRA_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(bf16_t x) { return __bfloat162float(x); }
template <class T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16_t from_float<bf16_t>(float x) { return __float2bfloat16_rn(x); }

// 2^x with the approximate unit, subnormal results flushed to zero: ex2(−inf) = +0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// σ(x) = 1 / (1 + e^−x) from the approximate units (relative error ~1e-7 against the rounded σ);
// 0 as x → −∞ (the reciprocal of +inf), 1 as x → +∞.
__device__ __forceinline__ float fast_sigmoid(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(1.0f + fast_exp2(-1.4426950408889634f * x)));
  return y;
}

// The line holding p brought into L2, nothing read into a register (the decode kernels' look-ahead
// on the streams they read: the GEMV's weights, the decode attention's cache).
__device__ __forceinline__ void prefetch_l2(const void* p) { asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p)); }

// Streaming multiprocessors of the current device (runtime/cuda_memory.h: queried once per device).
inline int sm_count() { return cuda_sm_count(); }

// A grid of `blocks` capped to a few waves (32 CTAs per SM); kernels loop (grid-stride) over the rest.
inline int capped_grid(int64_t blocks) {
  return static_cast<int>(std::clamp<int64_t>(blocks, 1, int64_t{32} * sm_count()));
}

// Rows of a [N, n] or [N, H, n] view as (pointer, row index -> offset) with unit last stride.
struct RowLayout {
  int64_t rows = 0;          // N or N·H
  int64_t inner = 1;         // H (1 for rank 2)
  int64_t stride_outer = 0;  // elements between consecutive N
  int64_t stride_inner = 0;  // elements between consecutive H
  int64_t length = 0;        // n
  __host__ __device__ int64_t offset(int64_t row) const {
    return (row / inner) * stride_outer + (row % inner) * stride_inner;
  }
};

inline RowLayout row_layout(const TensorView& v) {
  HYDRA_ASSERT((v.rank() == 2 || v.rank() == 3) && v.stride(v.rank() - 1) == 1,
               "device rows need rank 2 or 3 and a unit last stride, got {}", v.shape_string());
  RowLayout r;
  r.length = v.size(v.rank() - 1);
  if (v.rank() == 2) {
    r.rows = v.size(0);
    r.stride_outer = v.stride(0);
  } else {
    r.rows = v.size(0) * v.size(1);
    r.inner = v.size(1);
    r.stride_outer = v.stride(0);
    r.stride_inner = v.stride(1);
  }
  return r;
}

inline void expect_cuda(const TensorView& v, const char* what, DType dtype) {
  HYDRA_ASSERT(v.device() == Device::cuda && v.dtype() == dtype, "{} must be a CUDA {} tensor (is {} {})", what,
               dtype_name(dtype), device_name(v.device()), dtype_name(v.dtype()));
}

}  // namespace hydra::cuda

namespace hydra::ops::cuda_impl {
using cuda::bf16_t;
}  // namespace hydra::ops::cuda_impl
