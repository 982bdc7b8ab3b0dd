// CUDA scale-normalised fusion: one warp per (token, head): y = γ_h · w_h ⊙ o / rms(o).
// Backward: d_o as RMSNorm's backward with the head's weight row and scale γ_h; the parameter
// gradients from P[h][j] = Σ_t d_y o r (in a fixed order): d_weight[h][j] += γ_h P[h][j],
// d_gamma[h] += Σ_j w[h][j] P[h][j] (= Σ_t d_y · RMSNorm(o_h; w_h)). Token rows of H·d = 8·G
// elements (G a power of two ≤ 256; 16 heads of 128: 2048) with 16-byte aligned starts and a
// contiguous weight take RMSNorm's one-pass vector kernel (rms_backward.cuh) with per-head
// statistics: one read of d_y and o, P's partials on the way; other shapes run the row kernel and
// a separate column reduction of P.
#include "kernels/cuda/backward.cuh"
#include "kernels/fusion/fusion.h"
#include "kernels/rmsnorm/rms_backward.cuh"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void fusion_kernel(bf16_t* y, cuda::RowLayout ly, const bf16_t* o, cuda::RowLayout lo, const float* w,
                              const float* gamma, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < lo.rows; row += warps) {
    const int64_t h = row % lo.inner;
    const bf16_t* x = o + lo.offset(row);
    bf16_t* out = y + ly.offset(row);
    float ss = 0.0f;
    for (int64_t i = lane; i < lo.length; i += 32) {
      const float v = __bfloat162float(x[i]);
      ss += v * v;
    }
    for (int s = 16; s > 0; s /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, s);
    const float scale = gamma[h] * rsqrtf(ss / float(lo.length) + eps);
    for (int64_t i = lane; i < lo.length; i += 32)
      out[i] = __float2bfloat16_rn(w[h * lo.length + i] * __bfloat162float(x[i]) * scale);
  }
}

// d_y ⊙ o r at (token t, column c = h·d + j): the terms of P.
struct FusionTerm {
  cuda::FloatRows dy, o;  // [T, H, d] rows
  const float* rstd;      // [T·H]
  uint32_t heads, d;
  __device__ float operator()(int64_t t, int64_t c) const {
    const uint32_t h = static_cast<uint32_t>(c) / d, j = static_cast<uint32_t>(c) % d;
    const int64_t row = t * heads + h;
    return dy.load(dy.offset(row) + j) * o.load(o.offset(row) + j) * rstd[row];
  }
};

struct FusionFinish {
  float* d_weight;  // [H, d] with row stride dw_stride, or nullptr
  int64_t dw_stride;
  const float* gamma;  // [H]
  float* p;            // [H·d] P for the γ gradient, or nullptr
  uint32_t d;
  __device__ void operator()(int64_t c, float total) const {
    const uint32_t h = static_cast<uint32_t>(c) / d, j = static_cast<uint32_t>(c) % d;
    if (d_weight != nullptr) d_weight[h * dw_stride + j] += gamma[h] * total;
    if (p != nullptr) p[c] = total;
  }
};

// d_gamma[h] += Σ_j w[h][j] P[h][j]: one warp per head, a fixed summation order.
__global__ void fusion_gamma_kernel(float* d_gamma, const float* w, int64_t w_stride, const float* p, int64_t heads,
                                    int64_t d) {
  const int lane = threadIdx.x % 32;
  const int64_t h = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (h >= heads) return;
  float s = 0.0f;
  for (int64_t j = lane; j < d; j += 32) s += w[h * w_stride + j] * p[h * d + j];
  s = cuda::warp_sum(s);
  if (lane == 0) d_gamma[h] += s;
}

// A [T, H, d] view whose tokens hold their H·d elements contiguously, as token rows [T, H·d].
bool token_rows(const TensorView& t, TensorView* rows) {
  if (t.rank() != 3 || t.stride(2) != 1 || t.stride(1) != t.size(2)) return false;
  const int64_t shape[2] = {t.size(0), t.size(1) * t.size(2)}, strides[2] = {t.stride(0), 1};
  *rows = TensorView(t.data(), t.dtype(), t.device(), shape, strides);
  return true;
}
}  // namespace

void head_fusion(const TensorView& y, const TensorView& o, const TensorView& weight, const TensorView& gamma,
                 const HeadFusionParams& params) {
  cuda::expect_cuda(y, "fusion y", DType::bf16);
  cuda::expect_cuda(o, "fusion o", DType::bf16);
  cuda::expect_cuda(weight, "fusion weight", DType::f32);
  cuda::expect_cuda(gamma, "fusion gamma", DType::f32);
  HYDRA_ASSERT(weight.is_contiguous(), "fusion weight must be contiguous");
  const cuda::RowLayout lo = cuda::row_layout(o), ly = cuda::row_layout(y);
  fusion_kernel<<<cuda::capped_grid((lo.rows + 7) / 8), 256, 0, current_stream()>>>(
      y.data_as<cuda::bf16_t>(), ly, o.data_as<const cuda::bf16_t>(), lo, weight.data_as<const float>(),
      gamma.data_as<const float>(), params.eps);
  HYDRA_CUDA_LAUNCH_CHECK();
}

void head_fusion_backward(const TensorView& d_o, const TensorView& d_weight, const TensorView& d_gamma,
                          const TensorView& d_y, const TensorView& o, const TensorView& weight,
                          const TensorView& gamma, const HeadFusionParams& params) {
  HYDRA_ASSERT(o.rank() == 3, "fusion o must be [T, H, d], got {}", o.shape_string());
  const int64_t t_len = o.size(0), heads = o.size(1), d = o.size(2);
  const cuda::FloatRows fdo = cuda::float_rows(d_o, "fusion d_o");
  const cuda::FloatRows fdy = cuda::float_rows(d_y, "fusion d_y");
  const cuda::FloatRows fo = cuda::float_rows(o, "fusion o");
  HYDRA_ASSERT(d_o.rank() == 3 && d_y.rank() == 3 && cuda::same_rows(fo.layout, fdy.layout) &&
                   cuda::same_rows(fo.layout, fdo.layout),
               "fusion backward: d_o {}, d_y {} and o {} must all be [T, H, d]", d_o.shape_string(),
               d_y.shape_string(), o.shape_string());
  cuda::expect_cuda(weight, "fusion weight", DType::f32);
  cuda::expect_cuda(gamma, "fusion gamma", DType::f32);
  HYDRA_ASSERT(weight.rank() == 2 && weight.size(0) == heads && weight.size(1) == d && weight.stride(1) == 1 &&
                   gamma.rank() == 1 && gamma.size(0) == heads && gamma.stride(0) == 1,
               "fusion weight {} / gamma {} for {} heads of {}", weight.shape_string(), gamma.shape_string(), heads, d);
  if (d_weight.defined()) {
    cuda::expect_cuda(d_weight, "fusion d_weight", DType::f32);
    HYDRA_ASSERT(d_weight.rank() == 2 && d_weight.size(0) == heads && d_weight.size(1) == d && d_weight.stride(1) == 1,
                 "fusion d_weight must be [{}, {}], got {}", heads, d, d_weight.shape_string());
  }
  if (d_gamma.defined()) {
    cuda::expect_cuda(d_gamma, "fusion d_gamma", DType::f32);
    HYDRA_ASSERT(d_gamma.rank() == 1 && d_gamma.size(0) == heads && d_gamma.stride(0) == 1,
                 "fusion d_gamma must be a contiguous [{}] vector, got {}", heads, d_gamma.shape_string());
  }
  if (t_len == 0 || heads == 0) return;
  const bool want_p = d_weight.defined() || d_gamma.defined();
  Tensor p = d_gamma.defined() ? Tensor::empty({heads * d}, DType::f32, Device::cuda) : Tensor();
  const FusionFinish finish{d_weight.defined() ? d_weight.data_as<float>() : nullptr,
                            d_weight.defined() ? d_weight.stride(0) : 0, gamma.data_as<const float>(),
                            p.defined() ? p.data_as<float>() : nullptr, static_cast<uint32_t>(d)};
  const auto gamma_gradient = [&] {
    if (!d_gamma.defined()) return;
    fusion_gamma_kernel<<<static_cast<unsigned>((heads + 7) / 8), 256, 0, current_stream()>>>(
        d_gamma.data_as<float>(), weight.data_as<const float>(), weight.stride(0), p.data_as<const float>(), heads, d);
    HYDRA_CUDA_LAUNCH_CHECK();
  };
  TensorView tdo, tdy, to;
  const rms_backward::VectorShape shape = rms_backward::vector_shape(heads * d);
  const int segment = static_cast<int>(d / 8);
  if (shape.group > 0 && shape.runs == 1 && d % 8 == 0 && segment <= 32 && (segment & (segment - 1)) == 0 &&
      weight.stride(0) == d && reinterpret_cast<uintptr_t>(weight.data()) % 16 == 0 && token_rows(d_o, &tdo) &&
      token_rows(d_y, &tdy) && token_rows(o, &to)) {
    const cuda::FloatRows vdo = cuda::float_rows(tdo, "fusion d_o"), vdy = cuda::float_rows(tdy, "fusion d_y");
    const cuda::FloatRows vo = cuda::float_rows(to, "fusion o");
    if (cuda::row_starts_aligned(vdo, 16) && cuda::row_starts_aligned(vdy, 16) && cuda::row_starts_aligned(vo, 16)) {
      const int64_t n = heads * d;
      const rms_backward::VectorBlocks vb = rms_backward::vector_blocks(t_len, shape.group);
      Tensor partial = want_p ? Tensor::empty({vb.blocks, n}, DType::f32, Device::cuda) : Tensor();
      rms_backward::launch_backward_vector<1>({.dx = vdo,
                                               .dy = vdy,
                                               .x = vo,
                                               .weight = weight.data_as<const float>(),
                                               .head_scale = gamma.data_as<const float>(),
                                               .partial = want_p ? partial.data_as<float>() : nullptr,
                                               .rows_per_block = vb.per_block,
                                               .group = shape.group,
                                               .segment = segment,
                                               .eps = params.eps,
                                               .accumulate = false},
                                              vb.blocks);
      if (want_p) {
        cuda::launch_column_finish(partial.data_as<const float>(), vb.blocks, n, finish);
        gamma_gradient();
      }
      return;
    }
  }
  if (want_p) {
    // Runs before d_o is written, because d_o may alias d_y.
    const Tensor rstd = rms_backward::row_rstd(fo, params.eps);
    const FusionTerm term{fdy, fo, rstd.data_as<const float>(), static_cast<uint32_t>(heads), static_cast<uint32_t>(d)};
    cuda::reduce_columns(t_len, heads * d, term, finish);
    gamma_gradient();
  }
  rms_backward::launch_rows({.dx = fdo,
                             .dy = fdy,
                             .x = fo,
                             .weight = weight.data_as<const float>(),
                             .weight_head_stride = weight.stride(0),
                             .head_scale = gamma.data_as<const float>(),
                             .eps = params.eps,
                             .accumulate = false});
}

}  // namespace hydra::ops::cuda_impl
