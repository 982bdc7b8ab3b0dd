// CUDA L2 norm of head vectors: one warp per (token, head) row, fp32 sums. The backward
// (dx = r dy − x r³ (x·dy)) has the same shape: one warp per row, bf16 or fp32 in and out.
#include "kernels/cuda/backward.cuh"
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

// Each lane reads and writes the same elements of its row (dy read again just before dx is written
// there), so dx may alias dy.
__global__ void __launch_bounds__(256) l2_norm_backward_kernel(cuda::FloatRows dx, cuda::FloatRows dy,
                                                               cuda::FloatRows x, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t n = x.layout.length;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < x.layout.rows; row += warps) {
    const int64_t ox = x.offset(row), ody = dy.offset(row), odx = dx.offset(row);
    float ss = 0.0f, dot = 0.0f;
    for (int64_t i = lane; i < n; i += 32) {
      const float xv = x.load(ox + i);
      ss += xv * xv;
      dot += xv * dy.load(ody + i);
    }
    ss = cuda::warp_sum(ss);
    dot = cuda::warp_sum(dot);
    const float r = rsqrtf(ss + eps);
    const float c = dot * r * r * r;
    for (int64_t i = lane; i < n; i += 32) dx.store(odx + i, r * dy.load(ody + i) - x.load(ox + i) * c);
  }
}
}  // namespace

void l2_norm(const TensorView& x, float eps) {
  cuda::expect_cuda(x, "l2_norm x", DType::bf16);
  const cuda::RowLayout l = cuda::row_layout(x);
  l2_norm_kernel<<<cuda::capped_grid((l.rows + 7) / 8), 256, 0, current_stream()>>>(x.data_as<cuda::bf16_t>(), l, eps);
  HYDRA_CUDA_LAUNCH_CHECK();
}

void l2_norm_backward(const TensorView& dx, const TensorView& dy, const TensorView& x, float eps) {
  const cuda::FloatRows fdx = cuda::float_rows(dx, "l2_norm_backward dx");
  const cuda::FloatRows fdy = cuda::float_rows(dy, "l2_norm_backward dy");
  const cuda::FloatRows fx = cuda::float_rows(x, "l2_norm_backward x");
  HYDRA_ASSERT(cuda::same_rows(fx.layout, fdy.layout) && cuda::same_rows(fx.layout, fdx.layout),
               "l2_norm_backward: dx {}, dy {} and x {} must have the same rows", dx.shape_string(), dy.shape_string(),
               x.shape_string());
  l2_norm_backward_kernel<<<cuda::capped_grid((fx.layout.rows + 7) / 8), 256, 0, current_stream()>>>(fdx, fdy, fx, eps);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
