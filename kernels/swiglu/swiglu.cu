// CUDA SwiGLU: out = SiLU(gate) ⊙ up, element-wise over [T, I] (column blocks allowed).
// bf16 rows whose starts are 16-byte aligned with 8 | I (the model's MLP: I = 6144) run eight
// elements per thread with 16-byte accesses; other views one element per thread. The backward takes
// bf16 or fp32 views (element type chosen at run time, backward.cuh) on its general path.
#include "kernels/cuda/backward.cuh"
#include "kernels/cuda/vector.cuh"
#include "kernels/swiglu/swiglu.h"

namespace hydra::ops::cuda_impl {
namespace {

// Whether a bf16 view's rows can be read eight at a time.
bool rows_of_eight(const TensorView& v) {
  return v.dtype() == DType::bf16 && reinterpret_cast<uintptr_t>(v.data()) % 16 == 0 && v.stride(0) % 8 == 0 &&
         v.size(1) % 8 == 0;
}

__global__ void swiglu_kernel(bf16_t* out, int64_t so, const bf16_t* gate, int64_t sg, const bf16_t* up, int64_t su,
                              int64_t rows, int64_t cols) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  cuda::for_each_element(rows, cols, [&](int64_t r, int64_t c) {
    const float g = __bfloat162float(gate[r * sg + c]);
    out[r * so + c] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * __bfloat162float(up[r * su + c]));
  });
}

// cols8: columns / 8; each thread one group of eight.
__global__ void swiglu8_kernel(bf16_t* out, int64_t so, const bf16_t* gate, int64_t sg, const bf16_t* up, int64_t su,
                               int64_t rows, int64_t cols8) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  cuda::for_each_element(rows, cols8, [&](int64_t r, int64_t c8) {
    float g[8], u[8], y[8];
    cuda::load_bf16<8>(gate + r * sg + 8 * c8, g);
    cuda::load_bf16<8>(up + r * su + 8 * c8, u);
#pragma unroll
    for (int i = 0; i < 8; ++i) y[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    cuda::store_bf16<8>(out + r * so + 8 * c8, y);
  });
}

// The backward on bf16 rows of eight; every group's inputs are read before its outputs are written
// (d_gate/d_up may alias gate/up).
__global__ void swiglu8_backward_kernel(bf16_t* d_gate, int64_t sdg, bf16_t* d_up, int64_t sdu, const bf16_t* d_out,
                                        int64_t sdo, const bf16_t* gate, int64_t sg, const bf16_t* up, int64_t su,
                                        int64_t rows, int64_t cols8) {
  cuda::for_each_element(rows, cols8, [&](int64_t r, int64_t c8) {
    float g[8], u[8], dy[8], dg[8], du[8];
    cuda::load_bf16<8>(gate + r * sg + 8 * c8, g);
    cuda::load_bf16<8>(up + r * su + 8 * c8, u);
    cuda::load_bf16<8>(d_out + r * sdo + 8 * c8, dy);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float sg_i = 1.0f / (1.0f + expf(-g[i]));
      dg[i] = dy[i] * u[i] * sg_i * (1.0f + g[i] * (1.0f - sg_i));
      du[i] = dy[i] * g[i] * sg_i;
    }
    cuda::store_bf16<8>(d_gate + r * sdg + 8 * c8, dg);
    cuda::store_bf16<8>(d_up + r * sdu + 8 * c8, du);
  });
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
  const int64_t rows = out.size(0), cols = out.size(1);
  if (rows_of_eight(out) && rows_of_eight(gate) && rows_of_eight(up)) {
    cuda::launch(swiglu8_kernel, cuda::elementwise_grid(rows, cols / 8), cuda::kElementwiseThreads, 0,
                 out.data_as<bf16_t>(), out.stride(0), gate.data_as<const bf16_t>(), gate.stride(0),
                 up.data_as<const bf16_t>(), up.stride(0), rows, cols / 8);
  } else {
    cuda::launch(swiglu_kernel, cuda::elementwise_grid(rows, cols), cuda::kElementwiseThreads, 0, out.data_as<bf16_t>(),
                 out.stride(0), gate.data_as<const bf16_t>(), gate.stride(0), up.data_as<const bf16_t>(), up.stride(0),
                 rows, cols);
  }
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
  if (rows_of_eight(d_gate) && rows_of_eight(d_up) && rows_of_eight(d_out) && rows_of_eight(gate) && rows_of_eight(up)) {
    swiglu8_backward_kernel<<<cuda::elementwise_grid(rows, cols / 8), cuda::kElementwiseThreads, 0, current_stream()>>>(
        d_gate.data_as<bf16_t>(), d_gate.stride(0), d_up.data_as<bf16_t>(), d_up.stride(0), d_out.data_as<const bf16_t>(),
        d_out.stride(0), gate.data_as<const bf16_t>(), gate.stride(0), up.data_as<const bf16_t>(), up.stride(0), rows,
        cols / 8);
    HYDRA_CUDA_LAUNCH_CHECK();
    return;
  }
  swiglu_backward_kernel<<<cuda::elementwise_grid(rows, cols), cuda::kElementwiseThreads, 0, current_stream()>>>(
      fdg, fdu, fdo, fg, fu, rows, cols);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
