// CUDA SwiGLU: out = SiLU(gate) ⊙ up, element-wise over [T, I] (column blocks allowed).
// The backward takes bf16 or fp32 views (element type chosen at run time, backward.cuh).
#include "kernels/cuda/backward.cuh"
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

// Every element's inputs are read before its outputs are written, so d_gate/d_up may alias gate/up.
__global__ void swiglu_backward_kernel(cuda::FloatRows d_gate, cuda::FloatRows d_up, cuda::FloatRows d_out,
                                       cuda::FloatRows gate, cuda::FloatRows up, int64_t rows, int64_t cols) {
  cuda::for_each_element(rows, cols, [&](int64_t r, int64_t c) {
    const float g = gate.load(gate.offset(r) + c), u = up.load(up.offset(r) + c), dy = d_out.load(d_out.offset(r) + c);
    const float sg = 1.0f / (1.0f + expf(-g));
    d_gate.store(d_gate.offset(r) + c, dy * u * sg * (1.0f + g * (1.0f - sg)));
    d_up.store(d_up.offset(r) + c, dy * g * sg);
  });
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

void swiglu_backward(const TensorView& d_gate, const TensorView& d_up, const TensorView& d_out, const TensorView& gate,
                     const TensorView& up) {
  const cuda::FloatRows fdg = cuda::float_rows(d_gate, "swiglu d_gate"), fdu = cuda::float_rows(d_up, "swiglu d_up");
  const cuda::FloatRows fdo = cuda::float_rows(d_out, "swiglu d_out");
  const cuda::FloatRows fg = cuda::float_rows(gate, "swiglu gate"), fu = cuda::float_rows(up, "swiglu up");
  for (const TensorView* v : {&d_gate, &d_up, &d_out, &gate, &up})
    HYDRA_ASSERT(v->rank() == 2 && v->size(0) == d_out.size(0) && v->size(1) == d_out.size(1),
                 "swiglu_backward views must all be [T, I] = {}, got {}", d_out.shape_string(), v->shape_string());
  const int64_t rows = d_out.size(0), cols = d_out.size(1);
  swiglu_backward_kernel<<<cuda::elementwise_grid(rows, cols), cuda::kElementwiseThreads, 0, current_stream()>>>(
      fdg, fdu, fdo, fg, fu, rows, cols);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
