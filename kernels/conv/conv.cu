// CUDA causal depthwise conv + SiLU: one thread per (token, channel), fp32 taps; rows before the
// segment come from the halo prefix (or are zero).
//
// Backward: one thread per (row split, channel) walks its split's rows in order, keeping the last K
// inputs and the last K pre-activation gradients in registers:
//   a_i = Σ_m w[m] x[i−K+1+m],  d_a_i = d_out_i σ(a_i)(1 + a_i(1 − σ(a_i)))   (SiLU'),
//   dw[m] += d_a_i x[i−K+1+m] over the split's rows (one partial per split, added in split order:
//   deterministic, no atomics),
//   dx[j] = Σ_m w[m] d_a[j+K−1−m], complete once d_a[j+K−1] is known: a split over rows [s, e)
//   walks on to row e+K−2 (recomputing those d_a) to finish dx[e−1]. The first split also finishes
//   the halo rows j = −(K−1)..−1, which are d_prefix.
#include "kernels/conv/conv.h"
#include "kernels/cuda/backward.cuh"

namespace hydra::ops::cuda_impl {
namespace {
__global__ void conv_kernel(bf16_t* out, int64_t out_stride, const bf16_t* x, int64_t x_stride, const float* w,
                            int64_t w_stride, const bf16_t* prefix, int64_t prefix_stride, int64_t t_len,
                            int64_t channels, int kernel) {
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < t_len * channels;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / channels, c = idx % channels;
    float acc = 0.0f;
    for (int m = 0; m < kernel; ++m) {
      const int64_t src = t - kernel + 1 + m;
      float v = 0.0f;
      if (src >= 0) {
        v = __bfloat162float(x[src * x_stride + c]);
      } else if (prefix != nullptr && src + kernel - 1 >= 0) {
        v = __bfloat162float(prefix[(src + kernel - 1) * prefix_stride + c]);
      }
      acc += w[c * w_stride + m] * v;
    }
    out[t * out_stride + c] = __float2bfloat16_rn(acc / (1.0f + expf(-acc)));
  }
}

struct ConvBackwardArgs {
  cuda::FloatRows dx, d_out, x;  // [T, C]
  cuda::FloatRows prefix;        // [K−1, C]; data == nullptr: zeros
  cuda::FloatRows d_prefix;      // [K−1, C]; data == nullptr: not wanted
  const float* w;                // [C, K]
  int64_t w_stride;
  int64_t t_len, channels, rows_per_split, splits;
  float* dw_partial;  // [splits, C·K], or nullptr when dw is not wanted
};

// Input row `row` (negative: the halo) of channel c, as the forward reads it.
template <int K>
__device__ float conv_input(const ConvBackwardArgs& p, int64_t row, int64_t c) {
  if (row >= 0) return p.x.load(p.x.offset(row) + c);
  if (p.prefix.data != nullptr && row >= -(K - 1)) return p.prefix.load(p.prefix.offset(row + K - 1) + c);
  return 0.0f;
}

template <int K>
__global__ void __launch_bounds__(256) conv_backward_kernel(ConvBackwardArgs p) {
  const int64_t n = p.splits * p.channels;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t split = idx / p.channels, c = idx % p.channels;  // channels fastest: coalesced rows
    const int64_t s = split * p.rows_per_split;
    const int64_t e = s + p.rows_per_split < p.t_len ? s + p.rows_per_split : p.t_len;
    float w[K], xw[K], da[K], dw[K];  // xw[m]: input row i−K+1+m; da[m]: d_a of row i−K+1+m
#pragma unroll
    for (int m = 0; m < K; ++m) {
      w[m] = p.w[c * p.w_stride + m];
      xw[m] = m < K - 1 ? conv_input<K>(p, s - (K - 1) + m, c) : 0.0f;
      da[m] = 0.0f;  // rows before s are never needed: dx[j ≥ s] reads d_a[j..j+K−1]
      dw[m] = 0.0f;
    }
    for (int64_t i = s; i < e + K - 1; ++i) {
      float dai = 0.0f;  // rows past the end have no output, so no gradient
      if (i < p.t_len) {
        xw[K - 1] = p.x.load(p.x.offset(i) + c);
        float a = 0.0f;
#pragma unroll
        for (int m = 0; m < K; ++m) a += w[m] * xw[m];
        const float sg = 1.0f / (1.0f + expf(-a));
        dai = p.d_out.load(p.d_out.offset(i) + c) * sg * (1.0f + a * (1.0f - sg));
        if (i < e) {
#pragma unroll
          for (int m = 0; m < K; ++m) dw[m] += dai * xw[m];
        }
#pragma unroll
        for (int m = 0; m < K - 1; ++m) xw[m] = xw[m + 1];
      }
#pragma unroll
      for (int m = 0; m < K - 1; ++m) da[m] = da[m + 1];
      da[K - 1] = dai;
      const int64_t j = i - (K - 1);  // the row whose dx is now complete
      float g = 0.0f;
#pragma unroll
      for (int m = 0; m < K; ++m) g += w[m] * da[K - 1 - m];
      if (j >= s) {
        p.dx.store(p.dx.offset(j) + c, g);
      } else if (s == 0 && p.d_prefix.data != nullptr) {  // j in [−(K−1), 0): a halo row
        p.d_prefix.store(p.d_prefix.offset(j + K - 1) + c, g);
      }
    }
    if (p.dw_partial != nullptr) {
#pragma unroll
      for (int m = 0; m < K; ++m) p.dw_partial[(split * p.channels + c) * K + m] = dw[m];
    }
  }
}

struct ConvWeightFinish {  // dw[c][m] += Σ_split partial, column index c·K + m
  float* dw;
  int64_t dw_stride;
  int k;
  __device__ void operator()(int64_t col, float total) const { dw[(col / k) * dw_stride + col % k] += total; }
};

template <int K>
void launch_conv_backward(const ConvBackwardArgs& p) {
  conv_backward_kernel<K><<<cuda::capped_grid((p.splits * p.channels + 255) / 256), 256, 0, current_stream()>>>(p);
  HYDRA_CUDA_LAUNCH_CHECK();
}
}  // namespace

void causal_conv_silu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix) {
  cuda::expect_cuda(out, "conv out", DType::bf16);
  cuda::expect_cuda(x, "conv x", DType::bf16);
  cuda::expect_cuda(w, "conv weight", DType::f32);
  if (prefix.defined()) cuda::expect_cuda(prefix, "conv prefix", DType::bf16);
  const int64_t n = x.size(0) * x.size(1);
  conv_kernel<<<cuda::capped_grid((n + 255) / 256), 256, 0, current_stream()>>>(
      out.data_as<cuda::bf16_t>(), out.stride(0), x.data_as<const cuda::bf16_t>(), x.stride(0), w.data_as<const float>(),
      w.stride(0), prefix.defined() ? prefix.data_as<const cuda::bf16_t>() : nullptr,
      prefix.defined() ? prefix.stride(0) : 0, x.size(0), x.size(1), static_cast<int>(w.size(1)));
  HYDRA_CUDA_LAUNCH_CHECK();
}

void causal_conv_silu_backward(const TensorView& dx, const TensorView& dw, const TensorView& d_prefix,
                               const TensorView& d_out, const TensorView& x, const TensorView& w,
                               const TensorView& prefix) {
  HYDRA_ASSERT(x.rank() == 2 && w.rank() == 2 && w.size(0) == x.size(1),
               "conv backward: x {} and weight {} must be [T, C] and [C, K]", x.shape_string(), w.shape_string());
  const int64_t t_len = x.size(0), channels = x.size(1), k = w.size(1);
  for (const TensorView* v : {&dx, &d_out})
    HYDRA_ASSERT(v->rank() == 2 && v->size(0) == t_len && v->size(1) == channels,
                 "conv backward: dx and d_out must be [{}, {}], got {}", t_len, channels, v->shape_string());
  for (const TensorView* v : {&prefix, &d_prefix})
    HYDRA_ASSERT(!v->defined() || (v->rank() == 2 && v->size(0) == k - 1 && v->size(1) == channels),
                 "conv backward: prefix and d_prefix must be [{}, {}], got {}", k - 1, channels, v->shape_string());
  // Each thread writes dx rows that neighbouring splits read from x and d_out.
  HYDRA_ASSERT(dx.data() != x.data() && dx.data() != d_out.data(), "conv backward cannot write dx over x or d_out");
  cuda::expect_cuda(w, "conv weight", DType::f32);
  HYDRA_ASSERT(w.stride(1) == 1, "conv weight needs unit tap stride");
  if (dw.defined()) {
    cuda::expect_cuda(dw, "conv dw", DType::f32);
    HYDRA_ASSERT(dw.rank() == 2 && dw.size(0) == channels && dw.size(1) == k && dw.stride(1) == 1,
                 "conv dw must be [{}, {}], got {}", channels, k, dw.shape_string());
  }
  if (channels == 0) return;
  // Splits: a function of T alone (determinism); ≥ 64 rows each so the K−1 extra rows stay cheap.
  const int64_t wanted = std::clamp<int64_t>((t_len + 63) / 64, 1, 128);
  const int64_t rows_per_split = std::max<int64_t>(1, (t_len + wanted - 1) / wanted);
  const int64_t splits = t_len == 0 ? 1 : (t_len + rows_per_split - 1) / rows_per_split;
  Tensor partial = dw.defined() ? Tensor::empty({splits, channels * k}, DType::f32, Device::cuda) : Tensor();
  ConvBackwardArgs p{.dx = cuda::float_rows(dx, "conv dx"),
                     .d_out = cuda::float_rows(d_out, "conv d_out"),
                     .x = cuda::float_rows(x, "conv x"),
                     .prefix = prefix.defined() ? cuda::float_rows(prefix, "conv prefix") : cuda::FloatRows{},
                     .d_prefix = d_prefix.defined() ? cuda::float_rows(d_prefix, "conv d_prefix") : cuda::FloatRows{},
                     .w = w.data_as<const float>(),
                     .w_stride = w.stride(0),
                     .t_len = t_len,
                     .channels = channels,
                     .rows_per_split = rows_per_split,
                     .splits = splits,
                     .dw_partial = partial.defined() ? partial.data_as<float>() : nullptr};
  switch (k) {
    case 1: launch_conv_backward<1>(p); break;
    case 2: launch_conv_backward<2>(p); break;
    case 3: launch_conv_backward<3>(p); break;
    case 4: launch_conv_backward<4>(p); break;
    default: HYDRA_ASSERT(false, "conv backward on the GPU supports kernel widths 1 to 4, got {}", k);
  }
  if (dw.defined()) {
    cuda::column_finish_kernel<<<cuda::capped_grid((channels * k + 255) / 256), 256, 0, current_stream()>>>(
        partial.data_as<const float>(), splits, channels * k,
        ConvWeightFinish{dw.data_as<float>(), dw.stride(0), static_cast<int>(k)});
    HYDRA_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace hydra::ops::cuda_impl
