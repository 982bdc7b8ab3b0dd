// CUDA row arg-max (argmax.h): one CTA of 256 threads per row, each thread scanning a strided part
// of the row (coalesced), then a block reduction of (value, index) that keeps the lower index on
// ties and a flag for non-finite values.
#include "kernels/argmax/argmax.h"
#include "kernels/cuda/common.cuh"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ bool better(float v, int64_t i, float bv, int64_t bi) { return v > bv || (v == bv && i < bi); }

__global__ void __launch_bounds__(kThreads) row_argmax_kernel(int32_t* ids, const float* logits, int64_t stride, int64_t v) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  const float* row = logits + blockIdx.x * stride;
  float best = -INFINITY;
  int64_t at = v;  // past the end: no element seen
  int bad = 0;
  for (int64_t i = threadIdx.x; i < v; i += kThreads) {
    const float x = row[i];
    bad |= !isfinite(x);
    if (at == v || better(x, i, best, at)) {
      best = x;
      at = i;
    }
  }
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  __shared__ int sbad;
  if (threadIdx.x == 0) sbad = 0;
  __syncthreads();
  if (bad) atomicOr(&sbad, 1);
  sv[threadIdx.x] = best;
  si[threadIdx.x] = at;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) {
      const int o = threadIdx.x + s;
      if (si[o] != v && (si[threadIdx.x] == v || better(sv[o], si[o], sv[threadIdx.x], si[threadIdx.x]))) {
        sv[threadIdx.x] = sv[o];
        si[threadIdx.x] = si[o];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) ids[blockIdx.x] = sbad ? -1 : static_cast<int32_t>(si[0]);
}

}  // namespace

void row_argmax(const TensorView& ids, const TensorView& logits) {
  HYDRA_ASSERT(logits.stride(1) == 1 && ids.stride(0) == 1, "argmax: unit strides needed");
  if (logits.size(0) == 0) return;
  cuda::launch(row_argmax_kernel, static_cast<unsigned>(logits.size(0)), kThreads, 0, static_cast<int32_t*>(ids.data()),
               static_cast<const float*>(logits.data()), logits.stride(0), logits.size(1));
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
