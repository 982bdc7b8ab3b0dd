// CUDA add (bf16 or fp32 on either side), the scaling by a device scalar and sigmoid output gate (the gate reads the fp32 attention accumulator).
// The gate's backward takes bf16 or fp32 views (element type chosen at run time, backward.cuh).
#include "kernels/cuda/backward.cuh"
#include "kernels/elementwise/elementwise.h"

namespace hydra::ops::cuda_impl {
namespace {
// x += y, each bf16 or fp32 (the ring's dK/dV accumulators are fp32, the residual stream bf16).
__global__ void add_kernel(cuda::FloatRows x, cuda::FloatRows y, int64_t rows, int64_t cols) {
  cuda::for_each_element(rows, cols, [&](int64_t r, int64_t c) {
    const int64_t at = x.offset(r) + c;
    x.store(at, x.load(at) + y.load(y.offset(r) + c));
  });
}

template <class In>
__global__ void gate_kernel(bf16_t* out, int64_t so, const In* x, int64_t sx, const bf16_t* gate, int64_t sg,
                            int64_t rows, int64_t cols) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < rows * cols;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = idx / cols, c = idx % cols;
    const float g = __bfloat162float(gate[r * sg + c]);
    out[r * so + c] = __float2bfloat16_rn(cuda::to_float(x[r * sx + c]) / (1.0f + expf(-g)));
  }
}

// Every element's inputs are read before its outputs are written, so dx may alias d_out or x.
__global__ void gate_backward_kernel(cuda::FloatRows dx, cuda::FloatRows d_gate, cuda::FloatRows d_out,
                                     cuda::FloatRows x, cuda::FloatRows gate, int64_t rows, int64_t cols) {
  cuda::for_each_element(rows, cols, [&](int64_t r, int64_t c) {
    const float dy = d_out.load(d_out.offset(r) + c), xv = x.load(x.offset(r) + c);
    const float sg = 1.0f / (1.0f + expf(-gate.load(gate.offset(r) + c)));
    dx.store(dx.offset(r) + c, dy * sg);
    d_gate.store(d_gate.offset(r) + c, dy * xv * sg * (1.0f - sg));
  });
}
}  // namespace

void add_inplace(const TensorView& x, const TensorView& y) {
  const cuda::FloatRows fx = cuda::float_rows(x, "add x"), fy = cuda::float_rows(y, "add y");
  const int64_t rows = x.size(0), cols = x.size(1);
  add_kernel<<<cuda::elementwise_grid(rows, cols), cuda::kElementwiseThreads, 0, current_stream()>>>(fx, fy, rows,
                                                                                                      cols);
  HYDRA_CUDA_LAUNCH_CHECK();
}

void sigmoid_gate(const TensorView& out, const TensorView& x, const TensorView& gate) {
  cuda::expect_cuda(out, "gate out", DType::bf16);
  cuda::expect_cuda(gate, "gate logits", DType::bf16);
  const int64_t n = x.size(0) * x.size(1);
  const int grid = cuda::capped_grid((n + 255) / 256);
  if (x.dtype() == DType::f32) {
    cuda::launch(gate_kernel<float>, grid, 256, 0, out.data_as<cuda::bf16_t>(), out.stride(0), x.data_as<const float>(),
                 x.stride(0), gate.data_as<const cuda::bf16_t>(), gate.stride(0), x.size(0), x.size(1));
  } else {
    cuda::expect_cuda(x, "gate x", DType::bf16);
    cuda::launch(gate_kernel<cuda::bf16_t>, grid, 256, 0, out.data_as<cuda::bf16_t>(), out.stride(0),
                 x.data_as<const cuda::bf16_t>(), x.stride(0), gate.data_as<const cuda::bf16_t>(), gate.stride(0),
                 x.size(0), x.size(1));
  }
  HYDRA_CUDA_LAUNCH_CHECK();
}

void sigmoid_gate_backward(const TensorView& dx, const TensorView& d_gate, const TensorView& d_out, const TensorView& x,
                           const TensorView& gate) {
  const cuda::FloatRows fdx = cuda::float_rows(dx, "gate dx"), fdg = cuda::float_rows(d_gate, "gate d_gate");
  const cuda::FloatRows fdo = cuda::float_rows(d_out, "gate d_out");
  const cuda::FloatRows fx = cuda::float_rows(x, "gate x"), fg = cuda::float_rows(gate, "gate logits");
  for (const TensorView* v : {&dx, &d_gate, &d_out, &x, &gate})
    HYDRA_ASSERT(v->rank() == 2 && v->size(0) == d_out.size(0) && v->size(1) == d_out.size(1),
                 "sigmoid_gate_backward views must all be [T, n] = {}, got {}", d_out.shape_string(),
                 v->shape_string());
  const int64_t rows = d_out.size(0), cols = d_out.size(1);
  gate_backward_kernel<<<cuda::elementwise_grid(rows, cols), cuda::kElementwiseThreads, 0, current_stream()>>>(
      fdx, fdg, fdo, fx, fg, rows, cols);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
