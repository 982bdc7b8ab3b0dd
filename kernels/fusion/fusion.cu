// CUDA scale-normalised fusion: one warp per (token, head): y = γ_h · w_h ⊙ o / rms(o).
#include "kernels/cuda/common.cuh"
#include "kernels/fusion/fusion.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void fusion_kernel(bf16_t* y, cuda::RowLayout ly, const bf16_t* o, cuda::RowLayout lo, const float* w,
                              const float* gamma, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < lo.rows; row += warps) {
    const int64_t h = row % lo.inner;
    const bf16_t* x = o + lo.offset(row);
    bf16_t* out = y + ly.offset(row);
    float ss = 0.0f;
    for (int64_t i = lane; i < lo.length; i += 32) {
      const float v = __bfloat162float(x[i]);
      ss += v * v;
    }
    for (int s = 16; s > 0; s /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, s);
    const float scale = gamma[h] * rsqrtf(ss / float(lo.length) + eps);
    for (int64_t i = lane; i < lo.length; i += 32)
      out[i] = __float2bfloat16_rn(w[h * lo.length + i] * __bfloat162float(x[i]) * scale);
  }
}
}  // namespace

void head_fusion(const TensorView& y, const TensorView& o, const TensorView& weight, const TensorView& gamma,
                 const HeadFusionParams& params) {
  cuda::expect_cuda(y, "fusion y", DType::bf16);
  cuda::expect_cuda(o, "fusion o", DType::bf16);
  cuda::expect_cuda(weight, "fusion weight", DType::f32);
  cuda::expect_cuda(gamma, "fusion gamma", DType::f32);
  HYDRA_ASSERT(weight.is_contiguous(), "fusion weight must be contiguous");
  const cuda::RowLayout lo = cuda::row_layout(o), ly = cuda::row_layout(y);
  fusion_kernel<<<cuda::capped_grid((lo.rows + 7) / 8), 256, 0, current_stream()>>>(
      y.data_as<cuda::bf16_t>(), ly, o.data_as<const cuda::bf16_t>(), lo, weight.data_as<const float>(),
      gamma.data_as<const float>(), params.eps);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
