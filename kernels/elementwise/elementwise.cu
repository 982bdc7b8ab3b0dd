// CUDA residual add and sigmoid output gate (the gate reads the fp32 attention accumulator).
#include "kernels/cuda/common.cuh"
#include "kernels/elementwise/elementwise.h"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void add_kernel(bf16_t* x, int64_t sx, const bf16_t* y, int64_t sy, int64_t rows, int64_t cols) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * cols;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    x[r * sx + c] = __float2bfloat16_rn(__bfloat162float(x[r * sx + c]) + __bfloat162float(y[r * sy + c]));
  }
}

template <class In>
__global__ void gate_kernel(bf16_t* out, int64_t so, const In* x, int64_t sx, const bf16_t* gate, int64_t sg,
                            int64_t rows, int64_t cols) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * cols;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    const float g = __bfloat162float(gate[r * sg + c]);
    out[r * so + c] = __float2bfloat16_rn(cuda::to_float(x[r * sx + c]) / (1.0f + expf(-g)));
  }
}
}  // namespace

void add_inplace(const TensorView& x, const TensorView& y) {
  cuda::expect_cuda(x, "add x", DType::bf16);
  cuda::expect_cuda(y, "add y", DType::bf16);
  const int64_t n = x.size(0) * x.size(1);
  add_kernel<<<cuda::capped_grid((n + 255) / 256), 256, 0, current_stream()>>>(
      x.data_as<cuda::bf16_t>(), x.stride(0), y.data_as<const cuda::bf16_t>(), y.stride(0), x.size(0), x.size(1));
  HYDRA_CUDA_LAUNCH_CHECK();
}

void sigmoid_gate(const TensorView& out, const TensorView& x, const TensorView& gate) {
  cuda::expect_cuda(out, "gate out", DType::bf16);
  cuda::expect_cuda(gate, "gate logits", DType::bf16);
  const int64_t n = x.size(0) * x.size(1);
  const int grid = cuda::capped_grid((n + 255) / 256);
  if (x.dtype() == DType::f32) {
    gate_kernel<<<grid, 256, 0, current_stream()>>>(out.data_as<cuda::bf16_t>(), out.stride(0), x.data_as<const float>(),
                                                    x.stride(0), gate.data_as<const cuda::bf16_t>(), gate.stride(0),
                                                    x.size(0), x.size(1));
  } else {
    cuda::expect_cuda(x, "gate x", DType::bf16);
    gate_kernel<<<grid, 256, 0, current_stream()>>>(out.data_as<cuda::bf16_t>(), out.stride(0),
                                                    x.data_as<const cuda::bf16_t>(), x.stride(0),
                                                    gate.data_as<const cuda::bf16_t>(), gate.stride(0), x.size(0), x.size(1));
  }
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
