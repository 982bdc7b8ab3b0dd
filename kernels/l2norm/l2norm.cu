// CUDA L2 norm of head vectors: one warp per (token, head) row, fp32 sums.
#include "kernels/cuda/common.cuh"
#include "kernels/l2norm/l2norm.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void l2_norm_kernel(bf16_t* x, cuda::RowLayout l, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < l.rows; row += warps) {
    bf16_t* r = x + l.offset(row);
    float ss = 0.0f;
    for (int64_t i = lane; i < l.length; i += 32) {
      const float v = __bfloat162float(r[i]);
      ss += v * v;
    }
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss + eps);
    for (int64_t i = lane; i < l.length; i += 32) r[i] = __float2bfloat16_rn(__bfloat162float(r[i]) * inv);
  }
}

}  // namespace

void l2_norm(const TensorView& x, float eps) {
  cuda::expect_cuda(x, "l2_norm x", DType::bf16);
  const cuda::RowLayout l = cuda::row_layout(x);
  l2_norm_kernel<<<cuda::capped_grid((l.rows + 7) / 8), 256, 0, current_stream()>>>(x.data_as<cuda::bf16_t>(), l, eps);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
