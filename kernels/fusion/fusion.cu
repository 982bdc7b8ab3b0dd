// CUDA fusion of the head outputs (kernels/fusion/fusion.h): one warp per (token, head) row,
// y = c · w_h ⊙ o / rms(o) with c = γ_h · 2σ(s + b_h) (each factor only where the variant has it; no
// norm: y = c · o).
// Backward of scale_norm (the default): d_o as RMSNorm's backward with the head's weight row and
// scale γ_h; the parameter gradients from P[h][j] = Σ_t d_y o r (in a fixed order): d_weight[h][j] +=
// γ_h P[h][j], d_gamma[h] += Σ_j w[h][j] P[h][j] (= Σ_t d_y · RMSNorm(o_h; w_h)). Token rows of H·d =
// 8·G elements (G a power of two ≤ 256; 16 heads of 128: 2048) with 16-byte aligned starts and a
// contiguous weight take RMSNorm's one-pass vector kernel (rms_backward.cuh) with per-head
// statistics: one read of d_y and o, P's partials on the way; other shapes run the row kernel and
// a separate column reduction of P.
// Backward of the other variants (the row scale c may change per token): a row kernel writes each
// row's scalars (c r, g d_y·n, d_s; the gate's d_s also into its logits' gradient), the weight and
// scalar gradients are deterministic column reductions of them (cuda::reduce_columns), then the row
// kernel runs again to write d_o (after the reductions, which read d_y, since d_o may alias d_y).
#include "kernels/cuda/backward.cuh"
#include "kernels/fusion/fusion.h"
#include "kernels/rmsnorm/rms_backward.cuh"

namespace hydra::ops::cuda_impl {
namespace {
// A variant's tensors on the device; null (gate: data null) where it has none.
struct FusionArgs {
  const float* w = nullptr;  // [H, d], row stride w_stride
  int64_t w_stride = 0;
  const float* gamma = nullptr;  // [H]
  cuda::FloatRows gate;          // [T, H] logits s (bf16 or fp32, rows of the projection)
  const float* bias = nullptr;   // [H]

  // c = γ_h · 2σ(s + b_h) of row (t, h), and σ itself (½ without a gate).
  __device__ float scale(int64_t t, int64_t h, float* sig) const {
    float c = gamma != nullptr ? gamma[h] : 1.0f;
    *sig = 0.5f;
    if (gate.data != nullptr) {
      *sig = 1.0f / (1.0f + __expf(-(gate.load(gate.offset(t) + h) + bias[h])));
      c *= 2.0f * *sig;
    }
    return c;
  }
};

FusionArgs fusion_args(const FusionTensors& p, int64_t heads, int64_t d) {
  FusionArgs a;
  if (p.weight.defined()) {
    cuda::expect_cuda(p.weight, "fusion weight", DType::f32);
    HYDRA_ASSERT(p.weight.rank() == 2 && p.weight.size(0) == heads && p.weight.size(1) == d && p.weight.stride(1) == 1,
                 "fusion weight {} for {} heads of {}", p.weight.shape_string(), heads, d);
    a.w = p.weight.data_as<const float>();
    a.w_stride = p.weight.stride(0);
  }
  if (p.gamma.defined()) {
    cuda::expect_cuda(p.gamma, "fusion gamma", DType::f32);
    HYDRA_ASSERT(p.gamma.rank() == 1 && p.gamma.size(0) == heads && p.gamma.stride(0) == 1,
                 "fusion gamma {} for {} heads", p.gamma.shape_string(), heads);
    a.gamma = p.gamma.data_as<const float>();
  }
  if (p.gate.defined()) {
    a.gate = cuda::float_rows(p.gate, "fusion gate");
    cuda::expect_cuda(p.gate_bias, "fusion gate bias", DType::f32);
    HYDRA_ASSERT(p.gate_bias.rank() == 1 && p.gate_bias.size(0) == heads && p.gate_bias.stride(0) == 1,
                 "fusion gate bias {} for {} heads", p.gate_bias.shape_string(), heads);
    a.bias = p.gate_bias.data_as<const float>();
  }
  return a;
}

__global__ void fusion_kernel(bf16_t* y, cuda::RowLayout ly, const bf16_t* o, cuda::RowLayout lo, FusionArgs a,
                              float eps) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < lo.rows; row += warps) {
    const int64_t h = row % lo.inner, t = row / lo.inner;
    const bf16_t* x = o + lo.offset(row);
    bf16_t* out = y + ly.offset(row);
    float sig;
    float scale = a.scale(t, h, &sig);
    if (a.w != nullptr) {
      float ss = 0.0f;
      for (int64_t i = lane; i < lo.length; i += 32) {
        const float v = __bfloat162float(x[i]);
        ss += v * v;
      }
      for (int s = 16; s > 0; s /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, s);
      scale *= rsqrtf(ss / float(lo.length) + eps);
    }
    for (int64_t i = lane; i < lo.length; i += 32) {
      const float wi = a.w != nullptr ? a.w[h * a.w_stride + i] : 1.0f;
      out[i] = __float2bfloat16_rn(wi * __bfloat162float(x[i]) * scale);
    }
  }
}

// The backward's row pass of the variants other than scale_norm, one warp per (token, head) row,
// with r = 1/rms(o) (1 without a norm), n = w ⊙ o r, c the row scale, g = 2σ:
//   scalars:  row_cr = c r, row_dgamma = g (d_y · n), row_ds = d_s = γ (d_y · n) 2σ(1 − σ) (also into
//             d_gate when given);
//   write_dx: d_o = r w ⊙ c d_y − o r³ mean(o ⊙ w ⊙ c d_y) (c d_y without a norm).
// Each lane reads and writes only its own elements of the row, after the row's sums.
__global__ void fusion_backward_rows_kernel(cuda::FloatRows dx, cuda::FloatRows dy, cuda::FloatRows o, FusionArgs a,
                                            float eps, bool write_dx, float* row_cr, float* row_dgamma, float* row_ds,
                                            cuda::FloatRows d_gate) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  const int64_t heads = o.layout.inner, d = o.layout.length;
  for (int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32; row < o.layout.rows; row += warps) {
    const int64_t h = row % heads, t = row / heads;
    const int64_t xo = o.offset(row), yo = dy.offset(row);
    float sig;
    const float c = a.scale(t, h, &sig);
    float ss = 0.0f, ydn = 0.0f;  // Σ o², d_y · (w ⊙ o)
    for (int64_t i = lane; i < d; i += 32) {
      const float xi = o.load(xo + i), wi = a.w != nullptr ? a.w[h * a.w_stride + i] : 1.0f;
      ss += xi * xi;
      ydn += dy.load(yo + i) * wi * xi;
    }
    ss = cuda::warp_sum(ss);
    ydn = cuda::warp_sum(ydn);
    const float r = a.w != nullptr ? rsqrtf(ss / float(d) + eps) : 1.0f;
    if (!write_dx) {
      if (lane == 0) {
        const float yn = ydn * r, gamma = a.gamma != nullptr ? a.gamma[h] : 1.0f;
        const float g = a.gate.data != nullptr ? 2.0f * sig : 1.0f;
        const float ds = a.gate.data != nullptr ? gamma * yn * 2.0f * sig * (1.0f - sig) : 0.0f;
        row_cr[row] = c * r;
        row_dgamma[row] = g * yn;
        row_ds[row] = ds;
        if (d_gate.data != nullptr) d_gate.store(d_gate.offset(t) + h, ds);
      }
      continue;
    }
    const int64_t xd = dx.offset(row);
    const float k = r * r * r * c * ydn / float(d);  // r³ mean(o ⊙ w ⊙ c d_y)
    for (int64_t i = lane; i < d; i += 32) {
      const float dn = c * dy.load(yo + i);
      if (a.w == nullptr) {
        dx.store(xd + i, dn);
      } else {
        dx.store(xd + i, r * a.w[h * a.w_stride + i] * dn - o.load(xo + i) * k);
      }
    }
  }
}

// d_y ⊙ o · s at (token t, column c = h·d + j), s a per-row scalar [T·H]: the d_w terms of the
// variants (s = c r) and the terms of scale_norm's P (s = r).
struct RowScaledTerm {
  cuda::FloatRows dy, o;  // [T, H, d] rows
  const float* row_scale;  // [T·H]: s
  uint32_t heads, d;
  __device__ float operator()(int64_t t, int64_t c) const {
    const uint32_t h = static_cast<uint32_t>(c) / d, j = static_cast<uint32_t>(c) % d;
    const int64_t row = t * heads + h;
    return dy.load(dy.offset(row) + j) * o.load(o.offset(row) + j) * row_scale[row];
  }
};

struct AddToRows {  // out[h][j] += total, rows of `stride`
  float* out;
  int64_t stride;
  uint32_t d;
  __device__ void operator()(int64_t c, float total) const {
    out[(static_cast<uint32_t>(c) / d) * stride + static_cast<uint32_t>(c) % d] += total;
  }
};

// Columns [0, H): the γ terms; [H, 2H): the bias terms (row scalars [T·H] each).
struct ScalarTerms {
  const float* dgamma;
  const float* ds;
  int64_t heads;
  __device__ float operator()(int64_t t, int64_t c) const {
    return c < heads ? dgamma[t * heads + c] : ds[t * heads + c - heads];
  }
};

struct ScalarFinish {
  float* d_gamma;  // [H] or null
  float* d_bias;   // [H] or null
  int64_t heads;
  __device__ void operator()(int64_t c, float total) const {
    if (c < heads) {
      if (d_gamma != nullptr) d_gamma[c] += total;
    } else if (d_bias != nullptr) {
      d_bias[c - heads] += total;
    }
  }
};

void variant_backward(const TensorView& d_o, const FusionTensors& grads, const TensorView& d_y, const TensorView& o,
                      const FusionTensors& p, const HeadFusionParams& params) {
  const int64_t t_len = o.size(0), heads = o.size(1), d = o.size(2);
  const cuda::FloatRows fdo = cuda::float_rows(d_o, "fusion d_o"), fdy = cuda::float_rows(d_y, "fusion d_y");
  const cuda::FloatRows fo = cuda::float_rows(o, "fusion o");
  const FusionArgs a = fusion_args(p, heads, d);
  cuda::FloatRows d_gate;
  if (grads.gate.defined()) d_gate = cuda::float_rows(grads.gate, "fusion d_gate");
  for (const TensorView* g : {&grads.weight, &grads.gamma, &grads.gate_bias}) {
    if (g->defined()) cuda::expect_cuda(*g, "fusion parameter gradient", DType::f32);
  }
  HYDRA_ASSERT(!grads.weight.defined() || grads.weight.stride(1) == 1, "fusion d_weight needs a unit last stride");
  HYDRA_ASSERT((!grads.gamma.defined() || grads.gamma.stride(0) == 1) &&
                   (!grads.gate_bias.defined() || grads.gate_bias.stride(0) == 1),
               "fusion d_gamma / d_gate_bias must be contiguous");
  const int64_t rows = t_len * heads;
  // c r | g d_y·n | d_s; freed in stream order
  Tensor scalars = head_fusion_backward_scratch(t_len, heads, params.fusion).empty(Device::cuda);
  float* row_cr = scalars.data_as<float>();
  float* row_dgamma = row_cr + rows;
  float* row_ds = row_dgamma + rows;
  const int grid = cuda::capped_grid((rows + 7) / 8);
  fusion_backward_rows_kernel<<<grid, 256, 0, current_stream()>>>(fdo, fdy, fo, a, params.eps, false, row_cr,
                                                                   row_dgamma, row_ds, d_gate);
  HYDRA_CUDA_LAUNCH_CHECK();
  if (grads.weight.defined()) {
    const RowScaledTerm term{fdy, fo, row_cr, static_cast<uint32_t>(heads), static_cast<uint32_t>(d)};
    cuda::reduce_columns(t_len, heads * d, term,
                         AddToRows{grads.weight.data_as<float>(), grads.weight.stride(0), static_cast<uint32_t>(d)});
  }
  if (grads.gamma.defined() || grads.gate_bias.defined()) {
    cuda::reduce_columns(t_len, 2 * heads, ScalarTerms{row_dgamma, row_ds, heads},
                         ScalarFinish{grads.gamma.defined() ? grads.gamma.data_as<float>() : nullptr,
                                      grads.gate_bias.defined() ? grads.gate_bias.data_as<float>() : nullptr, heads});
  }
  fusion_backward_rows_kernel<<<grid, 256, 0, current_stream()>>>(fdo, fdy, fo, a, params.eps, true, row_cr,
                                                                   row_dgamma, row_ds, cuda::FloatRows{});
  HYDRA_CUDA_LAUNCH_CHECK();
}

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

void head_fusion(const TensorView& y, const TensorView& o, const FusionTensors& p, const HeadFusionParams& params) {
  cuda::expect_cuda(y, "fusion y", DType::bf16);
  cuda::expect_cuda(o, "fusion o", DType::bf16);
  const cuda::RowLayout lo = cuda::row_layout(o), ly = cuda::row_layout(y);
  const FusionArgs a = fusion_args(p, o.size(1), o.size(2));
  if (lo.rows == 0) return;
  cuda::launch(fusion_kernel, cuda::capped_grid((lo.rows + 7) / 8), 256, 0, y.data_as<cuda::bf16_t>(), ly,
               o.data_as<const cuda::bf16_t>(), lo, a, params.eps);
  HYDRA_CUDA_LAUNCH_CHECK();
}

void head_fusion_backward(const TensorView& d_o, const FusionTensors& grads, const TensorView& d_y,
                          const TensorView& o, const FusionTensors& tensors, const HeadFusionParams& params) {
  HYDRA_ASSERT(o.rank() == 3, "fusion o must be [T, H, d], got {}", o.shape_string());
  if (params.fusion != Fusion::scale_norm) {
    if (o.size(0) > 0 && o.size(1) > 0) variant_backward(d_o, grads, d_y, o, tensors, params);
    return;
  }
  const TensorView &weight = tensors.weight, &gamma = tensors.gamma, &d_weight = grads.weight, &d_gamma = grads.gamma;
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
    const RowScaledTerm term{fdy, fo, rstd.data_as<const float>(), static_cast<uint32_t>(heads), static_cast<uint32_t>(d)};
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
