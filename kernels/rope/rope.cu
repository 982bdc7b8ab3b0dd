// CUDA RoPE (rotate-half). Angles are formed in fp64 and reduced modulo 2π before the fp32
// sin/cos, so positions in the millions keep their precision (fp32 angles would be off by
// ~0.1 rad at 512K).
#include "kernels/cuda/common.cuh"
#include "kernels/rope/rope.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void rope_kernel(bf16_t* x, int64_t t_len, int64_t heads, int64_t half, int64_t stride_t, int64_t stride_h,
                            const int64_t* pos, double log_theta_over_d) {
  const int64_t n = t_len * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / half, i = idx % half;
    const double inv_freq = exp(-double(2 * i) * log_theta_over_d);
    double angle = fmod(double(pos[t]) * inv_freq, 6.283185307179586);
    float s, c;
    sincosf(float(angle), &s, &c);
    for (int64_t h = 0; h < heads; ++h) {
      bf16_t* row = x + t * stride_t + h * stride_h;
      const float a = __bfloat162float(row[i]), b = __bfloat162float(row[i + half]);
      row[i] = __float2bfloat16_rn(a * c - b * s);
      row[i + half] = __float2bfloat16_rn(b * c + a * s);
    }
  }
}
}  // namespace

void rope(const TensorView& x, const TensorView& positions, const RopeParams& params) {
  cuda::expect_cuda(x, "rope x", DType::bf16);
  cuda::expect_cuda(positions, "rope positions", DType::i64);
  HYDRA_ASSERT(x.stride(2) == 1, "rope needs contiguous head rows");
  const int64_t half = x.size(2) / 2;
  rope_kernel<<<cuda::capped_grid((x.size(0) * half + 255) / 256), 256, 0, current_stream()>>>(
      x.data_as<cuda::bf16_t>(), x.size(0), x.size(1), half, x.stride(0), x.stride(1), positions.data_as<const int64_t>(),
      std::log(params.theta) / double(x.size(2)));
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
