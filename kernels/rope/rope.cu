// CUDA RoPE (rotate-half). Angles as rope_angle.cuh forms them (fp64, reduced to [−π, π] before
// the fp32 sincos). RopeDirection::inverse rotates by −angle (sin negated): the transpose of the
// rotation, so the backward of rope is rope of the gradient in that direction.
// x is bf16 (activations) or fp32 (e.g. the attention backward's fp32 dq/dk accumulators).
#include "kernels/cuda/common.cuh"
#include "kernels/rope/rope.h"
#include "kernels/rope/rope_angle.cuh"

namespace hydra::ops::cuda_impl {
namespace {
template <class T>
__global__ void rope_kernel(T* x, int64_t t_len, int64_t heads, int64_t half, int64_t stride_t, int64_t stride_h,
                            const int64_t* pos, double log_theta_over_d, float sin_sign) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  const int64_t n = t_len * half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / half, i = idx % half;
    const float2 cs = rope_cos_sin(pos[t], rope_inv_freq(i, log_theta_over_d));
    const float c = cs.x, s = cs.y * sin_sign;
    for (int64_t h = 0; h < heads; ++h) {
      T* row = x + t * stride_t + h * stride_h;
      const float a = cuda::to_float(row[i]), b = cuda::to_float(row[i + half]);
      row[i] = cuda::from_float<T>(a * c - b * s);
      row[i + half] = cuda::from_float<T>(b * c + a * s);
    }
  }
}

template <class T>
void launch_rope(const TensorView& x, const TensorView& positions, const RopeParams& params) {
  const int64_t half = x.size(2) / 2;
  const float sin_sign = params.direction == RopeDirection::inverse ? -1.0f : 1.0f;
  cuda::launch(rope_kernel<T>, cuda::capped_grid((x.size(0) * half + 255) / 256), 256, 0, x.data_as<T>(), x.size(0),
               x.size(1), half, x.stride(0), x.stride(1), positions.data_as<const int64_t>(),
               rope_log_theta_over_d(params.theta, x.size(2)), sin_sign);
  HYDRA_CUDA_LAUNCH_CHECK();
}
}  // namespace

void rope(const TensorView& x, const TensorView& positions, const RopeParams& params) {
  HYDRA_ASSERT(x.device() == Device::cuda && (x.dtype() == DType::bf16 || x.dtype() == DType::f32),
               "rope x must be a CUDA bfloat16 or float32 tensor (is {} {})", device_name(x.device()),
               dtype_name(x.dtype()));
  cuda::expect_cuda(positions, "rope positions", DType::i64);
  HYDRA_ASSERT(x.rank() == 3 && x.stride(2) == 1 && x.size(2) % 2 == 0,
               "rope needs [T, H, d] with contiguous head rows and an even d, got {}", x.shape_string());
  if (x.dtype() == DType::bf16) {
    launch_rope<cuda::bf16_t>(x, positions, params);
  } else {
    launch_rope<float>(x, positions, params);
  }
}

}  // namespace hydra::ops::cuda_impl
