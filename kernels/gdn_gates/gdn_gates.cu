// CUDA GDN gates: β = sigmoid(b), g = −exp(A_log)·softplus(a + dt_bias), fp32 outputs.
#include "kernels/cuda/common.cuh"
#include "kernels/gdn_gates/gdn_gates.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void gdn_gates_kernel(float* beta, float* g, int64_t out_stride, const bf16_t* b, int64_t b_stride,
                                 const bf16_t* a, int64_t a_stride, const float* a_log, const float* dt_bias,
                                 int64_t t_len, int64_t heads) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < t_len * heads;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / heads, h = idx % heads;
    const float bv = __bfloat162float(b[t * b_stride + h]);
    const float x = __bfloat162float(a[t * a_stride + h]) + dt_bias[h];
    const float sp = x > 20.0f ? x : log1pf(expf(x));
    beta[t * out_stride + h] = 1.0f / (1.0f + expf(-bv));
    g[t * out_stride + h] = -expf(a_log[h]) * sp;
  }
}
}  // namespace

void gdn_gates(const TensorView& beta, const TensorView& g, const TensorView& b_logits, const TensorView& a_logits,
               const TensorView& a_log, const TensorView& dt_bias) {
  cuda::expect_cuda(beta, "beta", DType::f32);
  cuda::expect_cuda(g, "g", DType::f32);
  cuda::expect_cuda(b_logits, "b logits", DType::bf16);
  cuda::expect_cuda(a_logits, "a logits", DType::bf16);
  HYDRA_ASSERT(beta.stride(0) == g.stride(0) && beta.stride(1) == 1 && g.stride(1) == 1 && b_logits.stride(1) == 1 &&
                   a_logits.stride(1) == 1,
               "gdn_gates layouts");
  const int64_t n = b_logits.size(0) * b_logits.size(1);
  gdn_gates_kernel<<<cuda::capped_grid((n + 255) / 256), 256, 0, current_stream()>>>(
      beta.data_as<float>(), g.data_as<float>(), beta.stride(0), b_logits.data_as<const cuda::bf16_t>(),
      b_logits.stride(0), a_logits.data_as<const cuda::bf16_t>(), a_logits.stride(0), a_log.data_as<const float>(),
      dt_bias.data_as<const float>(), b_logits.size(0), b_logits.size(1));
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
