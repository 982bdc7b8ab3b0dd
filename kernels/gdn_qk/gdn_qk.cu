// CUDA GDN input pass (gdn_qk.h): one warp per (run of kRun rows, head). Lane l owns elements
// i = l·E .. l·E + E − 1 of the head's first half and the same of its second half (E = d / 64 for
// d = 128: a bf16 pair in each half), so a RoPE pair (i, i + d/2) never leaves its lane and the
// L2 norm is one warp sum. The conv walks the run with a sliding window of K input rows in
// registers and the lane's 2E·K taps loaded once per run; values stay fp32 from the conv to the
// normalised output.
//
// Angles: inv_freq_i = exp(−2i ln θ / d) and pos · inv_freq_i in fp64, reduced to [−π, π] in fp64
// before the fp32 sincos (positions in the millions keep their precision), as kernels/rope does.
#include "kernels/cuda/backward.cuh"
#include "kernels/gdn_qk/gdn_qk.h"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kRun = 32;          // rows per warp
constexpr int kWarpsPerBlock = 8;

// The E consecutive bf16 values at p (E = 2: one aligned 4-byte access), as fp32.
template <int E>
__device__ __forceinline__ void load_pack(const bf16_t* p, float (&v)[E]) {
  if constexpr (E == 2) {
    const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(p);
    v[0] = __low2float(pair);
    v[1] = __high2float(pair);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) v[e] = __bfloat162float(p[e]);
  }
}
template <int E>
__device__ __forceinline__ void store_pack(bf16_t* p, const float (&v)[E]) {
  if constexpr (E == 2) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(v[0], v[1]);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) p[e] = __float2bfloat16_rn(v[e]);
  }
}

struct Rope {
  double inv_freq[4];  // per owned element of the first half (E ≤ 4)
  template <int E>
  __device__ void init(int lane, double log_theta_over_d) {
#pragma unroll
    for (int e = 0; e < E; ++e) inv_freq[e] = exp(-double(2 * (lane * E + e)) * log_theta_over_d);
  }
  // cos and sin of pos · inv_freq_e.
  template <int E>
  __device__ void angles(int64_t pos, float (&c)[E], float (&s)[E]) const {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const double a = double(pos) * inv_freq[e];
      const double reduced = a - 6.283185307179586 * rint(a * 0.15915494309189535);
      sincosf(float(reduced), &s[e], &c[e]);
    }
  }
};

struct ConvArgs {
  bf16_t* out;
  int64_t out_stride;
  const bf16_t* x;
  int64_t x_stride;
  const float* w;
  int64_t w_stride;
  const bf16_t* prefix;  // nullptr: zeros
  int64_t prefix_stride;
  const int64_t* pos;
  float* inv_norm;
  int64_t inv_norm_stride;
  int64_t t_len, heads, qk_heads, half;
  double log_theta_over_d;
  float eps;
};

template <int K>
__device__ __forceinline__ const bf16_t* input_row(const ConvArgs& p, int64_t row) {
  if (row >= 0) return p.x + row * p.x_stride;
  if (p.prefix != nullptr) return p.prefix + (row + K - 1) * p.prefix_stride;
  return nullptr;
}

template <int K, int E>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) gdn_qkv_conv_kernel(ConvArgs p) {
  const int lane = threadIdx.x % 32;
  const bool active = int64_t(lane) * E < p.half;
  const int64_t runs = (p.t_len + kRun - 1) / kRun, units = runs * p.heads;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  Rope rope;
  rope.init<E>(lane, p.log_theta_over_d);
  for (int64_t u = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; u < units; u += warps) {
    const int64_t run = u / p.heads, h = u % p.heads;
    const int64_t t0 = run * kRun, t1 = t0 + kRun < p.t_len ? t0 + kRun : p.t_len;
    const bool qk = h < p.qk_heads;
    // Columns of the lane's two packs: c_lo = h·d + lane·E, c_hi = c_lo + d/2.
    const int64_t c_lo = h * 2 * p.half + int64_t(lane) * E, c_hi = c_lo + p.half;
    float w_lo[E][K], w_hi[E][K], win_lo[K][E], win_hi[K][E];  // win[m]: input row t − K + 1 + m
    if (active) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
#pragma unroll
        for (int m = 0; m < K; ++m) {
          w_lo[e][m] = p.w[(c_lo + e) * p.w_stride + m];
          w_hi[e][m] = p.w[(c_hi + e) * p.w_stride + m];
        }
      }
#pragma unroll
      for (int m = 0; m < K - 1; ++m) {
        const bf16_t* row = input_row<K>(p, t0 - (K - 1) + m);
        if (row != nullptr) {
          load_pack<E>(row + c_lo, win_lo[m]);
          load_pack<E>(row + c_hi, win_hi[m]);
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) win_lo[m][e] = win_hi[m][e] = 0.0f;
        }
      }
    }
    for (int64_t t = t0; t < t1; ++t) {
      float lo[E], hi[E], ss = 0.0f;
      if (active) {
        load_pack<E>(p.x + t * p.x_stride + c_lo, win_lo[K - 1]);
        load_pack<E>(p.x + t * p.x_stride + c_hi, win_hi[K - 1]);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          float a = 0.0f, b = 0.0f;
#pragma unroll
          for (int m = 0; m < K; ++m) {
            a += w_lo[e][m] * win_lo[m][e];
            b += w_hi[e][m] * win_hi[m][e];
          }
          lo[e] = a / (1.0f + __expf(-a));
          hi[e] = b / (1.0f + __expf(-b));
        }
#pragma unroll
        for (int m = 0; m < K - 1; ++m) {
#pragma unroll
          for (int e = 0; e < E; ++e) {
            win_lo[m][e] = win_lo[m + 1][e];
            win_hi[m][e] = win_hi[m + 1][e];
          }
        }
        if (qk) {
          float c[E], s[E];
          rope.angles<E>(p.pos[t], c, s);
#pragma unroll
          for (int e = 0; e < E; ++e) {
            const float a = lo[e], b = hi[e];
            lo[e] = a * c[e] - b * s[e];
            hi[e] = b * c[e] + a * s[e];
            ss += lo[e] * lo[e] + hi[e] * hi[e];
          }
        }
      }
      if (qk) {  // uniform across the warp
        const float r = rsqrtf(cuda::warp_sum(ss) + p.eps);
#pragma unroll
        for (int e = 0; e < E; ++e) {
          lo[e] *= r;
          hi[e] *= r;
        }
        if (lane == 0) p.inv_norm[t * p.inv_norm_stride + h] = r;
      }
      if (active) {
        store_pack<E>(p.out + t * p.out_stride + c_lo, lo);
        store_pack<E>(p.out + t * p.out_stride + c_hi, hi);
      }
    }
  }
}

struct BackwardArgs {
  bf16_t* dx;
  const bf16_t* dy;
  const bf16_t* y;
  int64_t dx_t, dx_h, dy_t, dy_h, y_t, y_h;  // strides (elements) of token and head
  const float* inv_norm;
  int64_t r_t, r_h;
  const int64_t* pos;
  int64_t t_len, heads, half;
  double log_theta_over_d;
};

// d = r (dy − y (y·dy)), then the inverse rotation; each lane reads its own dy before writing dx.
template <int E>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) gdn_qk_backward_kernel(BackwardArgs p) {
  const int lane = threadIdx.x % 32;
  const bool active = int64_t(lane) * E < p.half;
  const int64_t runs = (p.t_len + kRun - 1) / kRun, units = runs * p.heads;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  Rope rope;
  rope.init<E>(lane, p.log_theta_over_d);
  const int64_t i = int64_t(lane) * E;
  for (int64_t u = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; u < units; u += warps) {
    const int64_t run = u / p.heads, h = u % p.heads;
    const int64_t t0 = run * kRun, t1 = t0 + kRun < p.t_len ? t0 + kRun : p.t_len;
    for (int64_t t = t0; t < t1; ++t) {
      const bf16_t* dy = p.dy + t * p.dy_t + h * p.dy_h;
      const bf16_t* y = p.y + t * p.y_t + h * p.y_h;
      float dlo[E], dhi[E], ylo[E], yhi[E], dot = 0.0f;
      if (active) {
        load_pack<E>(dy + i, dlo);
        load_pack<E>(dy + i + p.half, dhi);
        load_pack<E>(y + i, ylo);
        load_pack<E>(y + i + p.half, yhi);
#pragma unroll
        for (int e = 0; e < E; ++e) dot += ylo[e] * dlo[e] + yhi[e] * dhi[e];
      }
      dot = cuda::warp_sum(dot);
      if (!active) continue;
      const float r = p.inv_norm[t * p.r_t + h * p.r_h];
      float c[E], s[E];
      rope.angles<E>(p.pos[t], c, s);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const float a = r * (dlo[e] - ylo[e] * dot), b = r * (dhi[e] - yhi[e] * dot);
        dlo[e] = a * c[e] + b * s[e];  // rotation by −angle
        dhi[e] = b * c[e] - a * s[e];
      }
      bf16_t* dx = p.dx + t * p.dx_t + h * p.dx_h;
      store_pack<E>(dx + i, dlo);
      store_pack<E>(dx + i + p.half, dhi);
    }
  }
}

// E: the elements of each half a lane owns (the smallest of 1, 2, 4 that covers the half).
int lane_elements(int64_t half) {
  HYDRA_ASSERT(half >= 1 && half <= 128, "gdn_qk on the GPU supports head dims 2..256, got {}", 2 * half);
  const int e = half <= 32 ? 1 : (half <= 64 ? 2 : 4);
  HYDRA_ASSERT(half % e == 0, "gdn_qk on the GPU: head dim {} is not a multiple of {}", 2 * half, 2 * e);
  return e;
}

bool aligned_pairs(std::initializer_list<std::pair<const void*, int64_t>> bases_and_strides, int64_t half) {
  for (const auto& [base, stride] : bases_and_strides) {
    if (reinterpret_cast<uintptr_t>(base) % 4 != 0 || stride % 2 != 0) return false;
  }
  return half % 2 == 0;
}

int grid_for(int64_t t_len, int64_t heads) {
  const int64_t units = (t_len + kRun - 1) / kRun * heads;
  return cuda::capped_grid((units + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

template <int K>
void launch_conv(const ConvArgs& p, int e) {
  const int grid = grid_for(p.t_len, p.heads);
  if (e == 1) {
    gdn_qkv_conv_kernel<K, 1><<<grid, 32 * kWarpsPerBlock, 0, current_stream()>>>(p);
  } else if (e == 2) {
    gdn_qkv_conv_kernel<K, 2><<<grid, 32 * kWarpsPerBlock, 0, current_stream()>>>(p);
  } else {
    gdn_qkv_conv_kernel<K, 4><<<grid, 32 * kWarpsPerBlock, 0, current_stream()>>>(p);
  }
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace

void gdn_qkv_conv(const TensorView& out, const TensorView& inv_norm, const TensorView& x, const TensorView& w,
                  const TensorView& prefix, const TensorView& positions, const GdnQkParams& params) {
  cuda::expect_cuda(out, "gdn conv out", DType::bf16);
  cuda::expect_cuda(x, "gdn conv x", DType::bf16);
  cuda::expect_cuda(w, "gdn conv weight", DType::f32);
  cuda::expect_cuda(inv_norm, "gdn conv inv_norm", DType::f32);
  cuda::expect_cuda(positions, "gdn conv positions", DType::i64);
  if (prefix.defined()) cuda::expect_cuda(prefix, "gdn conv prefix", DType::bf16);
  const int64_t d = params.head_dim, channels = x.size(1), k = w.size(1);
  HYDRA_ASSERT(channels % d == 0, "gdn conv: {} channels are not whole heads of {}", channels, d);
  HYDRA_ASSERT(out.data() != x.data(), "gdn conv: out must not alias x");
  HYDRA_ASSERT(out.stride(1) == 1 && x.stride(1) == 1 && w.stride(1) == 1 && inv_norm.stride(1) == 1 &&
                   (!prefix.defined() || prefix.stride(1) == 1),
               "gdn conv needs unit column strides");
  const int e = lane_elements(d / 2);
  HYDRA_ASSERT(e != 2 || aligned_pairs({{out.data(), out.stride(0)}, {x.data(), x.stride(0)},
                                        {prefix.defined() ? prefix.data() : nullptr, prefix.defined() ? prefix.stride(0) : 0}},
                                       d / 2),
               "gdn conv: bf16 pairs need 4-byte aligned rows (strides {} {})", out.stride(0), x.stride(0));
  if (x.size(0) == 0) return;
  const ConvArgs p{.out = out.data_as<bf16_t>(),
                   .out_stride = out.stride(0),
                   .x = x.data_as<const bf16_t>(),
                   .x_stride = x.stride(0),
                   .w = w.data_as<const float>(),
                   .w_stride = w.stride(0),
                   .prefix = prefix.defined() ? prefix.data_as<const bf16_t>() : nullptr,
                   .prefix_stride = prefix.defined() ? prefix.stride(0) : 0,
                   .pos = positions.data_as<const int64_t>(),
                   .inv_norm = inv_norm.data_as<float>(),
                   .inv_norm_stride = inv_norm.stride(0),
                   .t_len = x.size(0),
                   .heads = channels / d,
                   .qk_heads = params.qk_heads,
                   .half = d / 2,
                   .log_theta_over_d = std::log(params.rope_theta) / double(d),
                   .eps = params.l2_eps};
  switch (k) {
    case 1: launch_conv<1>(p, e); break;
    case 2: launch_conv<2>(p, e); break;
    case 3: launch_conv<3>(p, e); break;
    case 4: launch_conv<4>(p, e); break;
    default: HYDRA_ASSERT(false, "gdn conv on the GPU supports kernel widths 1 to 4, got {}", k);
  }
}

void gdn_qk_backward(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& inv_norm,
                     const TensorView& positions, const GdnQkParams& params) {
  cuda::expect_cuda(dx, "gdn qk dx", DType::bf16);
  cuda::expect_cuda(dy, "gdn qk dy", DType::bf16);
  cuda::expect_cuda(y, "gdn qk y", DType::bf16);
  cuda::expect_cuda(inv_norm, "gdn qk inv_norm", DType::f32);
  cuda::expect_cuda(positions, "gdn qk positions", DType::i64);
  HYDRA_ASSERT(dx.stride(2) == 1 && dy.stride(2) == 1 && y.stride(2) == 1, "gdn qk backward needs unit head strides");
  const int64_t half = params.head_dim / 2;
  const int e = lane_elements(half);
  HYDRA_ASSERT(e != 2 || aligned_pairs({{dx.data(), dx.stride(0)}, {dx.data(), dx.stride(1)}, {dy.data(), dy.stride(0)},
                                        {dy.data(), dy.stride(1)}, {y.data(), y.stride(0)}, {y.data(), y.stride(1)}},
                                       half),
               "gdn qk backward: bf16 pairs need 4-byte aligned rows");
  if (y.size(0) == 0 || y.size(1) == 0) return;
  const BackwardArgs p{.dx = dx.data_as<bf16_t>(),
                       .dy = dy.data_as<const bf16_t>(),
                       .y = y.data_as<const bf16_t>(),
                       .dx_t = dx.stride(0),
                       .dx_h = dx.stride(1),
                       .dy_t = dy.stride(0),
                       .dy_h = dy.stride(1),
                       .y_t = y.stride(0),
                       .y_h = y.stride(1),
                       .inv_norm = inv_norm.data_as<const float>(),
                       .r_t = inv_norm.stride(0),
                       .r_h = inv_norm.stride(1),
                       .pos = positions.data_as<const int64_t>(),
                       .t_len = y.size(0),
                       .heads = y.size(1),
                       .half = half,
                       .log_theta_over_d = std::log(params.rope_theta) / double(params.head_dim)};
  const int grid = grid_for(p.t_len, p.heads);
  if (e == 1) {
    gdn_qk_backward_kernel<1><<<grid, 32 * kWarpsPerBlock, 0, current_stream()>>>(p);
  } else if (e == 2) {
    gdn_qk_backward_kernel<2><<<grid, 32 * kWarpsPerBlock, 0, current_stream()>>>(p);
  } else {
    gdn_qk_backward_kernel<4><<<grid, 32 * kWarpsPerBlock, 0, current_stream()>>>(p);
  }
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
