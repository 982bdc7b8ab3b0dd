// CUDA causal depthwise conv + SiLU: one thread per (token, channel), fp32 taps; rows before the
// segment come from the halo prefix (or are zero).
#include "kernels/conv/conv.h"
#include "kernels/cuda/common.cuh"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void conv_kernel(bf16_t* out, int64_t out_stride, const bf16_t* x, int64_t x_stride, const float* w,
                            int64_t w_stride, const bf16_t* prefix, int64_t prefix_stride, int64_t t_len,
                            int64_t channels, int kernel) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < t_len * channels;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / channels, c = idx % channels;
    float acc = 0.0f;
    for (int m = 0; m < kernel; ++m) {
      const int64_t src = t - kernel + 1 + m;
      float v = 0.0f;
      if (src >= 0) {
        v = __bfloat162float(x[src * x_stride + c]);
      } else if (prefix != nullptr && src + kernel - 1 >= 0) {
        v = __bfloat162float(prefix[(src + kernel - 1) * prefix_stride + c]);
      }
      acc += w[c * w_stride + m] * v;
    }
    out[t * out_stride + c] = __float2bfloat16_rn(acc / (1.0f + expf(-acc)));
  }
}
}  // namespace

void causal_conv_silu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix) {
  cuda::expect_cuda(out, "conv out", DType::bf16);
  cuda::expect_cuda(x, "conv x", DType::bf16);
  cuda::expect_cuda(w, "conv weight", DType::f32);
  if (prefix.defined()) cuda::expect_cuda(prefix, "conv prefix", DType::bf16);
  const int64_t n = x.size(0) * x.size(1);
  conv_kernel<<<cuda::capped_grid((n + 255) / 256), 256, 0, current_stream()>>>(
      out.data_as<cuda::bf16_t>(), out.stride(0), x.data_as<const cuda::bf16_t>(), x.stride(0), w.data_as<const float>(),
      w.stride(0), prefix.defined() ? prefix.data_as<const cuda::bf16_t>() : nullptr,
      prefix.defined() ? prefix.stride(0) : 0, x.size(0), x.size(1), static_cast<int>(w.size(1)));
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
