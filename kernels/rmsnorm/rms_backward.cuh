// The RMSNorm backward kernels shared by rms_norm_backward (rmsnorm.cu) and the per-head fusion's
// backward (fusion.cu, where each head has its own weight row and a scale γ_h).
//
// For one row with y = s · w ⊙ x r, r = 1/sqrt(mean(x²) + eps) and s a per-head scale:
//   dx = s r (w ⊙ dy) − x r³ mean(x ⊙ s w ⊙ dy).
// One warp per row; the statistics are fp32 warp sums in a fixed order.
#pragma once

#include "kernels/cuda/backward.cuh"

namespace hydra::ops::cuda_impl::rms_backward {
namespace {  // internal linkage: each including .cu file gets its own kernels

struct RowsArgs {
  cuda::FloatRows dx, dy, x;   // same rows; dx may alias dy
  const float* weight;         // row of head h at weight + h · weight_head_stride
  int64_t weight_head_stride;  // 0: one weight vector for every row
  const float* head_scale;     // s = head_scale[h], or nullptr for s = 1
  float eps;
  bool accumulate;  // dx += instead of dx =
};

// Head index of a row (0 for [N, n] rows).
__device__ __forceinline__ int64_t head_of(const cuda::RowLayout& l, int64_t row) {
  return l.inner == 1 ? 0 : int64_t(static_cast<uint32_t>(row) % static_cast<uint32_t>(l.inner));
}

// Each lane reads and writes the same elements of its row, and every read of the row happens in the
// first loop or just before the write to the same element, so dx may alias dy.
__global__ void __launch_bounds__(256) rows_kernel(RowsArgs p) {
  const int lane = threadIdx.x % 32;
  const int64_t n = p.x.layout.length;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < p.x.layout.rows; row += warps) {
    const int64_t head = head_of(p.x.layout, row);
    const float* w = p.weight + head * p.weight_head_stride;
    const float s = p.head_scale != nullptr ? p.head_scale[head] : 1.0f;
    const int64_t ox = p.x.offset(row), ody = p.dy.offset(row), odx = p.dx.offset(row);
    float ss = 0.0f, dot = 0.0f;
    for (int64_t i = lane; i < n; i += 32) {
      const float xv = p.x.load(ox + i);
      ss += xv * xv;
      dot += xv * w[i] * p.dy.load(ody + i);
    }
    ss = cuda::warp_sum(ss);
    dot = cuda::warp_sum(dot);
    const float r = rsqrtf(ss / float(n) + p.eps);
    const float c = s * (dot / float(n)) * r * r * r;  // the coefficient of x
    for (int64_t i = lane; i < n; i += 32) {
      float v = s * r * w[i] * p.dy.load(ody + i) - p.x.load(ox + i) * c;
      if (p.accumulate) v += p.dx.load(odx + i);
      p.dx.store(odx + i, v);
    }
  }
}

// rstd[row] = r of the row (the weight gradients need it per row).
__global__ void __launch_bounds__(256) rstd_kernel(float* rstd, cuda::FloatRows x, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t n = x.layout.length;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < x.layout.rows; row += warps) {
    const int64_t o = x.offset(row);
    float ss = 0.0f;
    for (int64_t i = lane; i < n; i += 32) {
      const float xv = x.load(o + i);
      ss += xv * xv;
    }
    ss = cuda::warp_sum(ss);
    if (lane == 0) rstd[row] = rsqrtf(ss / float(n) + eps);
  }
}

inline int rows_grid(int64_t rows) { return cuda::capped_grid((rows + 7) / 8); }  // 8 warps of 256 threads

inline void launch_rows(const RowsArgs& p) {
  rows_kernel<<<rows_grid(p.x.layout.rows), 256, 0, current_stream()>>>(p);
  HYDRA_CUDA_LAUNCH_CHECK();
}

// A [rows] fp32 tensor of r per row (freed in stream order with the returned Tensor).
inline Tensor row_rstd(const cuda::FloatRows& x, float eps) {
  Tensor rstd = Tensor::empty({x.layout.rows}, DType::f32, Device::cuda);
  rstd_kernel<<<rows_grid(x.layout.rows), 256, 0, current_stream()>>>(rstd.data_as<float>(), x, eps);
  HYDRA_CUDA_LAUNCH_CHECK();
  return rstd;
}

}  // namespace
}  // namespace hydra::ops::cuda_impl::rms_backward
