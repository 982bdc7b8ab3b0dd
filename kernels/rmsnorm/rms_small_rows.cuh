// The RMSNorm's opt-in small-row kernels (HYDRA_SMALL_ROWS=1, kernels/small_rows.h), for rows of
// n = 8 … 1024 (forward) and 8 … 512 (backward) in the shape of rms_vector.h's small_shape: a group
// of G ≤ 32 threads a row, so every sum is a butterfly of shuffles inside a warp and the row loop
// has no block barrier. Written for the small-model step (qwen3-synth: 16384 rows of 256, the FA
// q/k norms' 131072 and 65536 head rows of 64); not yet timed on a GPU.
//
// Why the vector path is slow at these shapes (read from its code; the H200 profile,
// cluster/results/h200-2026-12-07: forward 7.9 us, backward 22.9 us + column_finish 7.3 us a launch):
//  - forward (rms_norm_vector_kernel): already a group per row at n ≤ 256 (8 rows a 256-thread
//    CTA at n = 256), but each thread has one 16-byte load in flight per grid-stride step, so a
//    CTA's rows are fetched one round trip at a time; at n = 512/1024 a row spans 2 or 4 warps
//    whose sums meet through shared memory behind two __syncthreads per row. Here each group keeps
//    two rows in flight (n ≤ 256) or takes a 512/1024 row in one warp (2 or 4 loads a thread), with
//    the same sums in the same order: the output is the vector path's, bit for bit (so the decode
//    GEMV's fused norm, held to rms_norm's bits, still is).
//  - backward (rms_norm_backward_vector_kernel): up to 1024 CTAs of ~4 rows a group, so the weight
//    gradient's partials are [1024, n] (512 KB at n = 256, 256 KB for the head rows), and
//    column_finish adds them with 8 row lanes per column in n/32 CTAs (8 CTAs at n = 256, 2 at
//    n = 64: 64–128 dependent fp64 additions a thread, latency-bound, 7.3 us). The per-group sums of
//    its CTA epilogue run one column per thread over every group in shared memory (256 serial
//    additions at n = 8). Here: at most 512 CTAs (rms_vector.h's small_backward_blocks) with
//    __launch_bounds__ asking for 4 CTAs an SM (all of them resident at once on a 132-SM GPU), the
//    groups of a warp add their weight-gradient terms by shuffles before the CTA adds its 8 warps'
//    through shared memory, and a finish of 32 lanes per column (≤ 16 additions a thread).
//
// Determinism: the CTAs, their rows and every order of addition are functions of the shapes alone,
// so the weight gradient has the same bits on every run and every GPU (no atomics).
#pragma once

#include "kernels/cuda/backward.cuh"
#include "kernels/rmsnorm/rms_backward.cuh"
#include "kernels/cuda/vector.cuh"
#include "kernels/rmsnorm/rms_row.cuh"
#include "kernels/rmsnorm/rms_vector.h"

namespace hydra::ops::cuda_impl::rms_small {
namespace {  // internal linkage, as rms_backward.cuh

constexpr int kThreads = rms_vector::kThreads;  // 256 a CTA, 8 warps
constexpr int kWarps = kThreads / 32;

// v[k] += the same value of the other lanes of the group of G (a power of two ≤ 32): offsets G/2 … 1,
// as rms_backward.cuh's group_sums for G ≤ 32 and, for G = 32, cuda::warp_sum.
__device__ __forceinline__ float group_sum(float v, int group) {
  for (int o = group / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Rows in flight per group in the forward: two for n ≤ 256, one row (of 2 or 4 loads a thread) above.
template <int V>
constexpr int forward_rows() {
  return V == 1 ? 2 : 1;
}

// The forward; out may alias x (each thread reads its elements before writing them). The sum of
// squares of a row: each thread's add_squares over each of its runs apart, each run's sum over the
// group's G lanes by the butterfly, then the V sums added from 0 in run order — the vector path's
// order (its group of G·V threads: thread v·32 + j holds run v of lane j here, the butterfly is the
// warp's sum, and the warps' sums are added from 0 in warp order; for V = 1, 0 + s = s).
template <int V>
__global__ void __launch_bounds__(kThreads) forward_kernel(cuda::FloatRows out, cuda::FloatRows x, const float* weight,
                                                           float eps, int group) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL where the caller opens it)
  cuda::allow_next_grid();
  constexpr int R = forward_rows<V>();
  const int groups = kThreads / group, gi = threadIdx.x / group, j = threadIdx.x % group;
  float w[V][8];
#pragma unroll
  for (int v = 0; v < V; ++v) cuda::load_f32<8>(weight + 8 * (v * group + j), w[v]);
  const float inv_n = rms_row::inverse_length(x.layout.length);
  const bf16_t* xd = static_cast<const bf16_t*>(x.data);
  bf16_t* od = static_cast<bf16_t*>(out.data);
  const int64_t rows = x.layout.rows, step = int64_t(groups) * R;
  // The loop bound depends on the block alone, so every lane of a warp meets the shuffles.
  for (int64_t base = int64_t(blockIdx.x) * step; base < rows; base += int64_t(gridDim.x) * step) {
    float xv[R][V][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {  // every load of the step before any sum
      const int64_t row = base + r * groups + gi;
#pragma unroll
      for (int v = 0; v < V; ++v) {
        if (row < rows) {
          cuda::load_bf16<8>(xd + x.offset(row) + 8 * (v * group + j), xv[r][v]);
        } else {
#pragma unroll
          for (int e = 0; e < 8; ++e) xv[r][v][e] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = base + r * groups + gi;
      float ss = 0.0f;
#pragma unroll
      for (int v = 0; v < V; ++v) ss += group_sum(rms_row::add_squares(0.0f, xv[r][v]), group);
      if (row < rows) {
        const float rr = rms_row::inverse_rms(ss, inv_n, eps);
#pragma unroll
        for (int v = 0; v < V; ++v) {
          float y[8];
#pragma unroll
          for (int e = 0; e < 8; ++e) y[e] = rms_row::normed(w[v][e], xv[r][v][e], rr);
          cuda::store_bf16<8>(od + out.offset(row) + 8 * (v * group + j), y);
        }
      }
    }
  }
}

struct BackwardArgs {
  cuda::FloatRows dx, dy, x;  // same rows; dx may alias dy
  const float* weight;        // [n]
  float* partial;             // [blocks, n]: Σ dy ⊙ x r over each CTA's rows, or nullptr
  int64_t rows_per_block;
  int group;
  float eps;
  bool accumulate;  // dx += instead of dx =
};

// The backward, one row a group at a time: dx = r (w ⊙ dy) − x r³ mean(x ⊙ w ⊙ dy) with the vector
// path's per-element arithmetic, and the CTA's column sums of dy ⊙ x r into partial[blockIdx.x].
// Each thread reads its elements of x, dy (and dx) before writing dx, so dx may alias dy. At most
// 64 registers (4 CTAs an SM) for V = 1.
template <int V>
__global__ void __launch_bounds__(kThreads, V == 1 ? 4 : 2) backward_kernel(BackwardArgs p) {
  extern __shared__ float warp_partial[];  // [kWarps][n]
  const int group = p.group, groups = kThreads / group, gi = threadIdx.x / group, j = threadIdx.x % group;
  const int64_t n = p.x.layout.length;
  const int64_t begin = int64_t(blockIdx.x) * p.rows_per_block;
  const int64_t end = begin + p.rows_per_block < p.x.layout.rows ? begin + p.rows_per_block : p.x.layout.rows;
  float w[V][8], dw[V][8];
#pragma unroll
  for (int v = 0; v < V; ++v) {
    cuda::load_f32<8>(p.weight + 8 * (v * group + j), w[v]);
#pragma unroll
    for (int e = 0; e < 8; ++e) dw[v][e] = 0.0f;
  }
  const float inv_n = 1.0f / float(n);
  const int64_t steps = (p.rows_per_block + groups - 1) / groups;  // the same for every thread (shuffles)
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
      }
#pragma unroll
      for (int v = 0; v < V; ++v) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          ss += xv[v][e] * xv[v][e];
          dot += xv[v][e] * w[v][e] * dyv[v][e];
        }
      }
    }
    ss = group_sum(ss, group);
    dot = group_sum(dot, group);
    if (valid) rms_backward::finish_row<V>(p.dx, row, group, j, ss, dot, inv_n, p.eps, p.accumulate, w, xv, dyv, old, dw);
  }
  if (p.partial == nullptr) return;  // uniform across the block
  // The groups of a warp (32 / G of them, holding the same columns) add theirs by shuffles over the
  // offsets G … 16, then lane j of the warp writes the warp's sum for its columns.
#pragma unroll
  for (int v = 0; v < V; ++v) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      for (int o = group; o < 32; o *= 2) dw[v][e] += __shfl_xor_sync(0xffffffffu, dw[v][e], o);
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane < group) {
#pragma unroll
    for (int v = 0; v < V; ++v) {
#pragma unroll
      for (int e = 0; e < 8; ++e) warp_partial[warp * n + 8 * (v * group + j) + e] = dw[v][e];
    }
  }
  __syncthreads();
  for (int64_t col = threadIdx.x; col < n; col += kThreads) {
    float sum = 0.0f;
    for (int k = 0; k < kWarps; ++k) sum += warp_partial[k * n + col];  // in warp order
    p.partial[int64_t(blockIdx.x) * n + col] = sum;
  }
}

// d_weight[c] += Σ_b partial[b][c], in fp64: lane y of a 32 × 32 CTA adds the partials y, y + 32, …
// of column x of the CTA's 32, then the 32 sums are added in order of y.
constexpr int kFinishColumns = 32, kFinishLanes = 32;
__global__ void __launch_bounds__(kFinishColumns* kFinishLanes)
    finish_kernel(const float* partial, int64_t blocks, int64_t n, float* d_weight) {
  __shared__ double sums[kFinishLanes][kFinishColumns + 1];
  const int64_t col = int64_t(blockIdx.x) * kFinishColumns + threadIdx.x;
  double s = 0.0;
  if (col < n) {
    for (int64_t b = threadIdx.y; b < blocks; b += kFinishLanes) s += partial[b * n + col];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < n) {
    double total = 0.0;
    for (int y = 0; y < kFinishLanes; ++y) total += sums[y][threadIdx.x];
    d_weight[col] += static_cast<float>(total);
  }
}

// The launches (the caller has checked the shapes, the 16-byte row starts and the weight's alignment).
inline void launch_forward(const cuda::FloatRows& out, const cuda::FloatRows& x, const float* weight, float eps,
                           rms_vector::VectorShape shape) {
  const int rows_per_cta = (kThreads / shape.group) * (shape.runs == 1 ? forward_rows<1>() : 1);
  const unsigned blocks = static_cast<unsigned>(cuda::capped_grid((x.layout.rows + rows_per_cta - 1) / rows_per_cta));
  auto* kernel = shape.runs == 1 ? forward_kernel<1> : shape.runs == 2 ? forward_kernel<2> : forward_kernel<4>;
  cuda::launch(kernel, blocks, kThreads, 0, out, x, weight, eps, shape.group);
  HYDRA_CUDA_LAUNCH_CHECK();
}

// The backward and, when d_weight is given, the finish onto it (partials freed in stream order).
inline void launch_backward(BackwardArgs args, rms_vector::VectorShape shape, float* d_weight) {
  const int64_t n = args.x.layout.length;
  const rms_vector::SmallBlocks sb = rms_vector::small_backward_blocks(args.x.layout.rows, shape.group);
  Tensor partial = d_weight != nullptr ? Tensor::empty({sb.blocks, n}, DType::f32, Device::cuda) : Tensor();
  args.partial = partial.defined() ? partial.data_as<float>() : nullptr;
  args.rows_per_block = sb.per_block;
  const size_t smem = d_weight != nullptr ? sizeof(float) * kWarps * static_cast<size_t>(n) : 0;
  auto* kernel = shape.runs == 1 ? backward_kernel<1> : backward_kernel<2>;
  kernel<<<static_cast<unsigned>(sb.blocks), kThreads, smem, current_stream()>>>(args);
  HYDRA_CUDA_LAUNCH_CHECK();
  if (d_weight == nullptr) return;
  finish_kernel<<<static_cast<unsigned>((n + kFinishColumns - 1) / kFinishColumns), dim3(kFinishColumns, kFinishLanes),
                  0, current_stream()>>>(partial.data_as<const float>(), sb.blocks, n, d_weight);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace
}  // namespace hydra::ops::cuda_impl::rms_small
