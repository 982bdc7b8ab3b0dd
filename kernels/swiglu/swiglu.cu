// CUDA SwiGLU: out = SiLU(gate) ⊙ up, element-wise over [T, I] (column blocks allowed).
#include "kernels/cuda/common.cuh"
#include "kernels/swiglu/swiglu.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void swiglu_kernel(bf16_t* out, int64_t so, const bf16_t* gate, int64_t sg, const bf16_t* up, int64_t su,
                              int64_t rows, int64_t cols) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * cols;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    const float g = __bfloat162float(gate[r * sg + c]);
    out[r * so + c] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * __bfloat162float(up[r * su + c]));
  }
}
}  // namespace

void swiglu(const TensorView& out, const TensorView& gate, const TensorView& up) {
  cuda::expect_cuda(out, "swiglu out", DType::bf16);
  cuda::expect_cuda(gate, "swiglu gate", DType::bf16);
  cuda::expect_cuda(up, "swiglu up", DType::bf16);
  const int64_t n = out.size(0) * out.size(1);
  swiglu_kernel<<<cuda::capped_grid((n + 255) / 256), 256, 0, current_stream()>>>(
      out.data_as<cuda::bf16_t>(), out.stride(0), gate.data_as<const cuda::bf16_t>(), gate.stride(0),
      up.data_as<const cuda::bf16_t>(), up.stride(0), out.size(0), out.size(1));
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
