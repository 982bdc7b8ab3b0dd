// CUDA RMSNorm: one warp per row, fp32 statistics, bf16 in and out, fp32 weight.
#include "kernels/cuda/common.cuh"
#include "kernels/rmsnorm/rmsnorm.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void rms_norm_kernel(bf16_t* out, cuda::RowLayout lo, const bf16_t* x, cuda::RowLayout lx, const float* w,
                                float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < lx.rows; row += warps) {
    const bf16_t* xr = x + lx.offset(row);
    bf16_t* yr = out + lo.offset(row);
    float ss = 0.0f;
    for (int64_t i = lane; i < lx.length; i += 32) {
      const float v = __bfloat162float(xr[i]);
      ss += v * v;
    }
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / float(lx.length) + eps);
    for (int64_t i = lane; i < lx.length; i += 32) yr[i] = __float2bfloat16_rn(w[i] * (__bfloat162float(xr[i]) * inv));
  }
}
}  // namespace

void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params) {
  cuda::expect_cuda(out, "rms_norm out", DType::bf16);
  cuda::expect_cuda(x, "rms_norm x", DType::bf16);
  cuda::expect_cuda(weight, "rms_norm weight", DType::f32);
  const cuda::RowLayout lx = cuda::row_layout(x), lo = cuda::row_layout(out);
  rms_norm_kernel<<<cuda::capped_grid((lx.rows + 7) / 8), 256, 0, current_stream()>>>(
      out.data_as<cuda::bf16_t>(), lo, x.data_as<const cuda::bf16_t>(), lx, weight.data_as<const float>(), params.eps);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
