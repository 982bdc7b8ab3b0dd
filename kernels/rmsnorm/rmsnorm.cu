// CUDA RMSNorm: one warp per row, fp32 statistics, bf16 in and out, fp32 weight.
// Backward: dx by the shared row kernel (rms_backward.cuh); the weight gradient Σ_rows dy ⊙ x r by
// the deterministic column reduction (per-split partials added in a fixed order, no atomics).
#include "kernels/cuda/backward.cuh"
#include "kernels/rmsnorm/rms_backward.cuh"
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

// dy ⊙ x r at (row, column): the terms of the weight gradient.
struct WeightTerm {
  cuda::FloatRows dy, x;
  const float* rstd;  // [rows]
  __device__ float operator()(int64_t row, int64_t col) const {
    return dy.load(dy.offset(row) + col) * x.load(x.offset(row) + col) * rstd[row];
  }
};
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

void rms_norm_backward(const TensorView& dx, const TensorView& d_weight, const TensorView& dy, const TensorView& x,
                       const TensorView& weight, const RmsNormParams& params, Accumulate accumulate) {
  const cuda::FloatRows fdx = cuda::float_rows(dx, "rms_norm_backward dx");
  const cuda::FloatRows fdy = cuda::float_rows(dy, "rms_norm_backward dy");
  const cuda::FloatRows fx = cuda::float_rows(x, "rms_norm_backward x");
  HYDRA_ASSERT(cuda::same_rows(fx.layout, fdy.layout) && cuda::same_rows(fx.layout, fdx.layout),
               "rms_norm_backward: dx {}, dy {} and x {} must have the same rows", dx.shape_string(), dy.shape_string(),
               x.shape_string());
  const int64_t n = fx.layout.length;
  cuda::expect_cuda(weight, "rms_norm weight", DType::f32);
  HYDRA_ASSERT(weight.rank() == 1 && weight.size(0) == n && weight.stride(0) == 1,
               "rms_norm weight must be a contiguous [{}] vector, got {}", n, weight.shape_string());
  if (d_weight.defined()) {
    cuda::expect_cuda(d_weight, "rms_norm d_weight", DType::f32);
    HYDRA_ASSERT(d_weight.rank() == 1 && d_weight.size(0) == n && d_weight.stride(0) == 1,
                 "rms_norm d_weight must be a contiguous [{}] vector, got {}", n, d_weight.shape_string());
    // Runs before dx is written, because dx may alias dy.
    const Tensor rstd = rms_backward::row_rstd(fx, params.eps);
    cuda::reduce_columns(fx.layout.rows, n, WeightTerm{fdy, fx, rstd.data_as<const float>()},
                         cuda::AddTo{d_weight.data_as<float>()});
  }
  rms_backward::launch_rows({.dx = fdx,
                             .dy = fdy,
                             .x = fx,
                             .weight = weight.data_as<const float>(),
                             .weight_head_stride = 0,
                             .head_scale = nullptr,
                             .eps = params.eps,
                             .accumulate = accumulate == Accumulate::yes});
}

}  // namespace hydra::ops::cuda_impl
