// The RMSNorm backward kernels shared by rms_norm_backward (rmsnorm.cu) and the per-head fusion's
// backward (fusion.cu, where each head has its own weight row and a scale γ_h): the scalar row
// kernel (one warp per row, any width) and the one-pass vector kernel (widths 8·V·G).
//
// For one row with y = s · w ⊙ x r, r = 1/sqrt(mean(x²) + eps) and s a per-head scale:
//   dx = s r (w ⊙ dy) − x r³ mean(x ⊙ s w ⊙ dy).
// One warp per row; the statistics are fp32 warp sums in a fixed order.
#pragma once

#include <algorithm>

#include "kernels/cuda/backward.cuh"
#include "kernels/cuda/vector.cuh"
#include "kernels/rmsnorm/rms_vector.h"

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

// ---- The vector path (rows of n = 8·V·G elements, 16-byte aligned starts): rmsnorm.cu's forward
// and backward, and the fusion's backward (fusion.cu) with per-head statistics.
constexpr int kThreads = rms_vector::kThreads;
using rms_vector::vector_shape;
using rms_vector::VectorShape;

// Sums of a and b over aligned groups of `group` threads (every thread of the block calls it, the
// same number of times: above 32 threads per group it meets the block barrier). scratch: kThreads / 32 floats × 2.
__device__ __forceinline__ void group_sums(float& a, float& b, int group, float (*scratch)[2]) {
  if (group <= 32) {
    for (int o = group / 2; o > 0; o /= 2) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    return;
  }
  a = cuda::warp_sum(a);
  b = cuda::warp_sum(b);
  const int warp = threadIdx.x / 32, per_group = group / 32, first = warp / per_group * per_group;
  if (threadIdx.x % 32 == 0) {
    scratch[warp][0] = a;
    scratch[warp][1] = b;
  }
  __syncthreads();
  a = b = 0.0f;
  for (int w = first; w < first + per_group; ++w) {  // in warp order: the same bits every run
    a += scratch[w][0];
    b += scratch[w][1];
  }
  __syncthreads();  // scratch is rewritten by the next call
}

// The end of one row of the vector backward, written once for rms_norm_backward_vector_kernel and
// the small-row backward (rms_small_rows.cuh), which must give the same dx: from the row's sums
// ss = Σ x² and dot = Σ x ⊙ w ⊙ dy over 1/inv_n elements, this thread's V runs of eight (columns
// 8·(v·G + j)) of dx = r (w ⊙ dy) − x r³ mean(x ⊙ w ⊙ dy) (plus what dx held when accumulating; `old`
// is read only then) are stored, and its terms dy ⊙ x r of the weight gradient added into dw.
template <int V>
__device__ __forceinline__ void finish_row(const cuda::FloatRows& dx, int64_t row, int group, int j, float ss, float dot,
                                           float inv_n, float eps, bool accumulate, const float (&w)[V][8],
                                           const float (&xv)[V][8], const float (&dyv)[V][8],
                                           const float (&old)[V][8], float (&dw)[V][8]) {
  const float r = rsqrtf(ss * inv_n + eps);
  const float c = (dot * inv_n) * r * r * r;  // the coefficient of x
  const int64_t odx = dx.offset(row);
#pragma unroll
  for (int v = 0; v < V; ++v) {
    float out[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      out[e] = r * w[v][e] * dyv[v][e] - xv[v][e] * c;
      if (accumulate) out[e] += old[v][e];
      dw[v][e] += dyv[v][e] * xv[v][e] * r;
    }
    cuda::store_vec<8>(dx, odx + 8 * (v * group + j), out);
  }
}

// One row of n = 8·V·G elements per group of G threads. The statistics (mean square, the dot of the
// backward) run over segments of `segment` threads (8·segment elements, V = 1 when segment < G):
// the whole row for RMSNorm (segment = G), one head of d = 8·segment for the fusion, whose token
// rows are [H, d] with the weight [H·d] and a scale γ_h per head (head_scale; nullptr: 1).
struct FusedBackwardArgs {
  cuda::FloatRows dx, dy, x;  // same rows; dx may alias dy
  const float* weight;        // [n]
  const float* head_scale;    // [n / (8·segment)] or nullptr
  float* partial;             // [blocks, n] partials of Σ dy ⊙ x r per column, or nullptr
  int64_t rows_per_block;
  int group, segment;
  float eps;
  bool accumulate;
};

template <int V>
__global__ void __launch_bounds__(kThreads) rms_norm_backward_vector_kernel(FusedBackwardArgs p) {
  __shared__ float scratch[kThreads / 32][2];
  extern __shared__ float group_partial[];  // [groups][n]: 2048·V floats
  const int group = p.group, groups = kThreads / group, gi = threadIdx.x / group, j = threadIdx.x % group;
  const int64_t n = p.x.layout.length;
  const int64_t begin = int64_t(blockIdx.x) * p.rows_per_block;
  const int64_t end = begin + p.rows_per_block < p.x.layout.rows ? begin + p.rows_per_block : p.x.layout.rows;
  float w[V][8], dw[V][8];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    cuda::load_f32<8>(p.weight + 8 * (v * group + j), w[v]);
    const float scale = p.head_scale != nullptr ? p.head_scale[(v * group + j) / p.segment] : 1.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      w[v][e] *= scale;  // s·w: dx = s r (w ⊙ dy) − x r³ mean(x ⊙ s w ⊙ dy)
      dw[v][e] = 0.0f;
    }
  }
  const float inv_n = 1.0f / float(8 * V * p.segment);  // elements per statistics segment
  const int64_t steps = (p.rows_per_block + groups - 1) / groups;  // the same for every thread (barriers)
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t row = begin + s * groups + gi;
    const bool valid = row < end;
    float xv[V][8], dyv[V][8], old[V][8];
    float ss = 0.0f, dot = 0.0f;
    if (valid) {
      const int64_t ox = p.x.offset(row), ody = p.dy.offset(row), odx = p.dx.offset(row);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int64_t c = 8 * (v * group + j);
        cuda::load_vec<8>(p.x, ox + c, xv[v]);
        cuda::load_vec<8>(p.dy, ody + c, dyv[v]);
        if (p.accumulate) cuda::load_vec<8>(p.dx, odx + c, old[v]);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          ss += xv[v][e] * xv[v][e];
          dot += xv[v][e] * w[v][e] * dyv[v][e];
        }
      }
    }
    group_sums(ss, dot, p.segment, scratch);
    if (valid) finish_row<V>(p.dx, row, group, j, ss, dot, inv_n, p.eps, p.accumulate, w, xv, dyv, old, dw);
  }
  if (p.partial == nullptr) return;  // uniform across the block
#pragma unroll
  for (int v = 0; v < V; ++v) {
#pragma unroll
    for (int e = 0; e < 8; ++e) group_partial[gi * n + 8 * (v * group + j) + e] = dw[v][e];
  }
  __syncthreads();
  for (int64_t col = threadIdx.x; col < n; col += kThreads) {
    float sum = 0.0f;
    for (int g = 0; g < groups; ++g) sum += group_partial[g * n + col];  // in group order
    p.partial[int64_t(blockIdx.x) * n + col] = sum;
  }
}

// Blocks of the vector backward: a function of the row count alone (the partials' order), about four
// rows per group and at most 1024 blocks.
struct VectorBlocks {
  int64_t per_block, blocks;
};
inline VectorBlocks vector_blocks(int64_t rows, int group) {
  const int64_t groups = kThreads / group;
  const int64_t wanted = std::clamp<int64_t>((rows + 4 * groups - 1) / (4 * groups), 1, 1024);
  const int64_t per_block = (rows + wanted - 1) / wanted;
  return {per_block, (rows + per_block - 1) / per_block};
}

template <int V>
void launch_backward_vector(const FusedBackwardArgs& args, int64_t blocks) {
  const size_t smem = args.partial != nullptr ? sizeof(float) * 2048 * V : 0;
  rms_norm_backward_vector_kernel<V><<<static_cast<unsigned>(blocks), kThreads, smem, current_stream()>>>(args);
  HYDRA_CUDA_LAUNCH_CHECK();
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
