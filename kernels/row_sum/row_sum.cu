// add_row_sums on the GPU: one block of 256 threads; thread j adds rows j, j + 256, ... in fp64, then
// a fixed tree (warp shuffles, then the warps in order) merges them, and thread 0 adds the two totals
// to the accumulator. A few hundred thousand rows at most (a loss chunk), so one block suffices.
#include "kernels/cuda/common.cuh"
#include "kernels/row_sum/row_sum.h"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(kThreads)
    row_sums_kernel(double* sums, const float* values, int64_t value_stride, const int32_t* marks,
                    int64_t mark_stride, int64_t n) {
  __shared__ double scratch[2][kWarps];
  double all = 0.0, marked = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const double v = values[i * value_stride];
    all += v;
    if (marks && marks[i * mark_stride] != 0) marked += v;
  }
  all = warp_sum(all);
  marked = warp_sum(marked);
  if (threadIdx.x % 32 == 0) {
    scratch[0][threadIdx.x / 32] = all;
    scratch[1][threadIdx.x / 32] = marked;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    double a = 0.0, m = 0.0;
    for (int w = 0; w < kWarps; ++w) {
      a += scratch[0][w];
      m += scratch[1][w];
    }
    sums[0] += a;
    if (marks) sums[1] += m;
  }
}

}  // namespace

void add_row_sums(const TensorView& sums, const TensorView& values, const TensorView& marks) {
  cuda::expect_cuda(sums, "row sums", DType::f64);
  cuda::expect_cuda(values, "row values", DType::f32);
  HYDRA_ASSERT(sums.stride(0) == 1, "row sums must be contiguous");
  const int32_t* m = marks.defined() ? marks.data_as<const int32_t>() : nullptr;
  row_sums_kernel<<<1, kThreads, 0, current_stream()>>>(sums.data_as<double>(), values.data_as<const float>(),
                                                        values.stride(0), m, marks.defined() ? marks.stride(0) : 0,
                                                        values.size(0));
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
