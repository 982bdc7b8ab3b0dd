// CUDA RMSNorm, fp32 statistics, fp32 weight.
//
// Rows whose length is n = 8·V·G (G a power of two ≤ 256, V = 1 or 2: n = 8, 16, ..., 2048, 4096)
// and whose starts are 16-byte aligned take the vector path: a group of G threads owns a row,
// thread j of the group the V runs of eight columns starting at 8(v·G + j), each read and written
// in one 16-byte access (bf16) or two float4 accesses (fp32). The group's sums are shuffles when
// G ≤ 32 and warp sums added through shared memory otherwise. Other rows (the tiny presets' odd
// widths) run one warp per row with scalar accesses.
//
// Backward, vector path, one pass: each thread loads its x, dy (and, when accumulating, dx) once,
// writes dx, and keeps its columns' weight-gradient terms dy ⊙ x r summed in registers across its
// rows. Block b owns rows [b·R, b·R + R), R a function of the row count alone; at the end it adds
// its groups' sums in group order into partial[b], and column_finish adds the partials in a
// fixed order: the weight gradient has the same bits on every run and every GPU. The scalar path runs
// the shared row kernel (rms_backward.cuh) and the column reduction of dy ⊙ x r.
//
// With HYDRA_SMALL_ROWS=1 (kernels/small_rows.h; opt-in until a GPU has timed it) rows of n ≤ 1024
// (forward) and n ≤ 512 (backward) that would take the vector path take rms_small_rows.cuh's
// kernels instead (a group of ≤ 32 threads a row; the forward's output is the vector path's bits).
#include "kernels/cuda/backward.cuh"
#include "kernels/cuda/vector.cuh"
#include "kernels/rmsnorm/rms_backward.cuh"
#include "kernels/rmsnorm/rms_row.cuh"
#include "kernels/rmsnorm/rms_small_rows.cuh"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/small_rows.h"

namespace hydra::ops::cuda_impl {
namespace {

using rms_backward::group_sums;
using rms_backward::kThreads;
using rms_backward::vector_shape;
using rms_backward::VectorShape;

__global__ void rms_norm_kernel(bf16_t* out, cuda::RowLayout lo, const bf16_t* x, cuda::RowLayout lx, const float* w,
                                float eps) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < lx.rows; row += warps) {
    const bf16_t* xr = x + lx.offset(row);
    bf16_t* yr = out + lo.offset(row);
    float ss = 0.0f;
    for (int64_t i = lane; i < lx.length; i += 32) {
      const float v = __bfloat162float(xr[i]);
      ss += v * v;
    }
    ss = cuda::warp_sum(ss);
    const float inv = rsqrtf(ss / float(lx.length) + eps);
    for (int64_t i = lane; i < lx.length; i += 32) yr[i] = __float2bfloat16_rn(w[i] * (__bfloat162float(xr[i]) * inv));
  }
}

// The forward on the vector path; out may alias x (each thread reads its elements before writing them).
// Its arithmetic is rms_row.cuh's, which the decode GEMV's fused norm repeats bit for bit.
template <int V>
__global__ void __launch_bounds__(kThreads) rms_norm_vector_kernel(cuda::FloatRows out, cuda::FloatRows x,
                                                                   const float* weight, float eps, int group) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  __shared__ float scratch[kThreads / 32][2];
  const int groups = kThreads / group, gi = threadIdx.x / group, j = threadIdx.x % group;
  float w[V][8];
#pragma unroll
  for (int v = 0; v < V; ++v) cuda::load_f32<8>(weight + 8 * (v * group + j), w[v]);
  const float inv_n = rms_row::inverse_length(x.layout.length);
  const bf16_t* xd = static_cast<const bf16_t*>(x.data);
  bf16_t* od = static_cast<bf16_t*>(out.data);
  // The loop bound depends on the block alone, so every thread meets group_sums' barriers equally.
  for (int64_t base = int64_t(blockIdx.x) * groups; base < x.layout.rows; base += int64_t(gridDim.x) * groups) {
    const int64_t row = base + gi;
    const bool valid = row < x.layout.rows;
    float xv[V][8];
    float ss = 0.0f, unused = 0.0f;
    if (valid) {
#pragma unroll
      for (int v = 0; v < V; ++v) {
        cuda::load_bf16<8>(xd + x.offset(row) + 8 * (v * group + j), xv[v]);
        ss = rms_row::add_squares(ss, xv[v]);
      }
    }
    group_sums(ss, unused, group, scratch);
    if (valid) {
      const float r = rms_row::inverse_rms(ss, inv_n, eps);
#pragma unroll
      for (int v = 0; v < V; ++v) {
        float y[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) y[e] = rms_row::normed(w[v][e], xv[v][e], r);
        cuda::store_bf16<8>(od + out.offset(row) + 8 * (v * group + j), y);
      }
    }
  }
}

// dy ⊙ x r at (row, column): the terms of the weight gradient (scalar path).
struct WeightTerm {
  cuda::FloatRows dy, x;
  const float* rstd;  // [rows]
  __device__ float operator()(int64_t row, int64_t col) const {
    return dy.load(dy.offset(row) + col) * x.load(x.offset(row) + col) * rstd[row];
  }
};

bool weight_aligned(const TensorView& w) { return reinterpret_cast<uintptr_t>(w.data()) % 16 == 0; }

}  // namespace

void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params) {
  cuda::expect_cuda(out, "rms_norm out", DType::bf16);
  cuda::expect_cuda(x, "rms_norm x", DType::bf16);
  cuda::expect_cuda(weight, "rms_norm weight", DType::f32);
  const cuda::RowLayout lx = cuda::row_layout(x), lo = cuda::row_layout(out);
  const VectorShape shape = vector_shape(lx.length);
  const cuda::FloatRows fx = cuda::float_rows(x, "rms_norm x"), fo = cuda::float_rows(out, "rms_norm out");
  const bool aligned = cuda::row_starts_aligned(fx, 16) && cuda::row_starts_aligned(fo, 16) && weight_aligned(weight);
  const VectorShape small = rms_vector::small_shape(lx.length, rms_vector::kSmallForwardRuns);
  if (small.group > 0 && aligned && small_row_kernels_enabled()) {
    rms_small::launch_forward(fo, fx, weight.data_as<const float>(), params.eps, small);
    return;
  }
  if (shape.group > 0 && aligned) {
    const int groups = kThreads / shape.group;
    const unsigned blocks = static_cast<unsigned>(cuda::capped_grid((lx.rows + groups - 1) / groups));
    const float* w = weight.data_as<const float>();
    cuda::launch(shape.runs == 1 ? rms_norm_vector_kernel<1> : rms_norm_vector_kernel<2>, blocks, kThreads, 0, fo, fx, w,
                 params.eps, shape.group);
  } else {
    cuda::launch(rms_norm_kernel, cuda::capped_grid((lx.rows + 7) / 8), kThreads, 0, out.data_as<cuda::bf16_t>(), lo,
                 x.data_as<const cuda::bf16_t>(), lx, weight.data_as<const float>(), params.eps);
  }
  HYDRA_CUDA_LAUNCH_CHECK();
}

void rms_norm_backward(const TensorView& dx, const TensorView& d_weight, const TensorView& dy, const TensorView& x,
                       const TensorView& weight, const RmsNormParams& params, Accumulate accumulate) {
  const cuda::FloatRows fdx = cuda::float_rows(dx, "rms_norm_backward dx");
  const cuda::FloatRows fdy = cuda::float_rows(dy, "rms_norm_backward dy");
  const cuda::FloatRows fx = cuda::float_rows(x, "rms_norm_backward x");
  HYDRA_ASSERT(cuda::same_rows(fx.layout, fdy.layout) && cuda::same_rows(fx.layout, fdx.layout),
               "rms_norm_backward: dx {}, dy {} and x {} must have the same rows", dx.shape_string(), dy.shape_string(),
               x.shape_string());
  const int64_t n = fx.layout.length, rows = fx.layout.rows;
  cuda::expect_cuda(weight, "rms_norm weight", DType::f32);
  HYDRA_ASSERT(weight.rank() == 1 && weight.size(0) == n && weight.stride(0) == 1,
               "rms_norm weight must be a contiguous [{}] vector, got {}", n, weight.shape_string());
  if (d_weight.defined()) {
    cuda::expect_cuda(d_weight, "rms_norm d_weight", DType::f32);
    HYDRA_ASSERT(d_weight.rank() == 1 && d_weight.size(0) == n && d_weight.stride(0) == 1,
                 "rms_norm d_weight must be a contiguous [{}] vector, got {}", n, d_weight.shape_string());
  }
  if (rows == 0 || n == 0) return;
  const VectorShape shape = vector_shape(n);
  const bool aligned = cuda::row_starts_aligned(fdx, 16) && cuda::row_starts_aligned(fdy, 16) &&
                       cuda::row_starts_aligned(fx, 16) && weight_aligned(weight);
  const VectorShape small = rms_vector::small_shape(n, rms_vector::kSmallBackwardRuns);
  if (small.group > 0 && aligned && small_row_kernels_enabled()) {
    rms_small::launch_backward({.dx = fdx,
                                .dy = fdy,
                                .x = fx,
                                .weight = weight.data_as<const float>(),
                                .partial = nullptr,
                                .rows_per_block = 0,
                                .group = small.group,
                                .eps = params.eps,
                                .accumulate = accumulate == Accumulate::yes},
                               small, d_weight.defined() ? d_weight.data_as<float>() : nullptr);
    return;
  }
  if (shape.group > 0 && aligned) {
    const rms_backward::VectorBlocks vb = rms_backward::vector_blocks(rows, shape.group);
    const int64_t blocks = vb.blocks;
    Tensor partial = d_weight.defined() ? Tensor::empty({blocks, n}, DType::f32, Device::cuda) : Tensor();
    const rms_backward::FusedBackwardArgs args{.dx = fdx,
                                               .dy = fdy,
                                               .x = fx,
                                               .weight = weight.data_as<const float>(),
                                               .head_scale = nullptr,
                                               .partial = partial.defined() ? partial.data_as<float>() : nullptr,
                                               .rows_per_block = vb.per_block,
                                               .group = shape.group,
                                               .segment = shape.group,
                                               .eps = params.eps,
                                               .accumulate = accumulate == Accumulate::yes};
    if (shape.runs == 1) {
      rms_backward::launch_backward_vector<1>(args, blocks);
    } else {
      rms_backward::launch_backward_vector<2>(args, blocks);
    }
    if (d_weight.defined()) {
      cuda::launch_column_finish(partial.data_as<const float>(), blocks, n, cuda::AddTo{d_weight.data_as<float>()});
    }
    return;
  }
  if (d_weight.defined()) {
    // Runs before dx is written, because dx may alias dy.
    const Tensor rstd = rms_backward::row_rstd(fx, params.eps);
    cuda::reduce_columns(rows, n, WeightTerm{fdy, fx, rstd.data_as<const float>()},
                         cuda::AddTo{d_weight.data_as<float>()});
  }
  rms_backward::launch_rows({.dx = fdx,
                             .dy = fdy,
                             .x = fx,
                             .weight = weight.data_as<const float>(),
                             .weight_head_stride = 0,
                             .head_scale = nullptr,
                             .eps = params.eps,
                             .accumulate = accumulate == Accumulate::yes});
}

}  // namespace hydra::ops::cuda_impl
