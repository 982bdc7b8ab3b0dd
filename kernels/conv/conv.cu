// CUDA causal depthwise conv + SiLU: one thread per (token, channel), fp32 taps; rows before the
// segment come from the halo prefix (or are zero).
//
// Backward: one thread per (row split, channel) walks its split's rows in order, keeping the last K
// inputs and the last K pre-activation gradients in registers:
//   a_i = Σ_m w[m] x[i−K+1+m],  d_a_i = d_out_i σ(a_i)(1 + a_i(1 − σ(a_i)))   (SiLU'),
//   dw[m] += d_a_i x[i−K+1+m] over the split's rows (one partial per split, added in a fixed order:
//   deterministic, no atomics),
//   dx[j] = Σ_m w[m] d_a[j+K−1−m], complete once d_a[j+K−1] is known: a split over rows [s, e)
//   walks on to row e+K−2 (recomputing those d_a) to finish dx[e−1]. The first split also finishes
//   the halo rows j = −(K−1)..−1, which are d_prefix.
// bf16 views with 16-byte aligned rows and 8 | C (the model's) take the tiled kernel: the same walk,
// its rows staged through shared memory by 16-byte asynchronous copies.
#include "kernels/conv/conv.h"
#include "kernels/cuda/backward.cuh"
#include "kernels/cuda/mma.cuh"

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

// One channel's walk over rows s, s + 1, ... (both backward kernels): the last K inputs and
// pre-activation gradients in registers, the weight-gradient sums over the split's rows.
template <int K>
struct ConvWalk {
  float w[K], xw[K], da[K], dw[K];  // xw[m], da[m]: row i − K + 1 + m

  __device__ void init(const ConvBackwardArgs& p, int64_t s, int64_t c) {
#pragma unroll
    for (int m = 0; m < K; ++m) {
      w[m] = p.w[c * p.w_stride + m];
      xw[m] = m < K - 1 ? conv_input<K>(p, s - (K - 1) + m, c) : 0.0f;
      da[m] = 0.0f;  // rows before s are never needed: dx[j ≥ s] reads d_a[j..j+K−1]
      dw[m] = 0.0f;
    }
  }
  // Row i: x_i and d_out_i count only when has_row (i < T: rows past the end have no output, so no
  // gradient); dw sums when in_split (i < e). Returns dx of row i − (K − 1), now complete.
  __device__ float step(bool has_row, bool in_split, float x_i, float d_out_i) {
    float dai = 0.0f;
    if (has_row) {
      xw[K - 1] = x_i;
      float a = 0.0f;
#pragma unroll
      for (int m = 0; m < K; ++m) a += w[m] * xw[m];
      const float sg = __fdividef(1.0f, 1.0f + __expf(-a));  // fast intrinsics: 0 as a → −∞
      dai = d_out_i * sg * (1.0f + a * (1.0f - sg));
      if (in_split) {
#pragma unroll
        for (int m = 0; m < K; ++m) dw[m] += dai * xw[m];
      }
#pragma unroll
      for (int m = 0; m < K - 1; ++m) xw[m] = xw[m + 1];
    }
#pragma unroll
    for (int m = 0; m < K - 1; ++m) da[m] = da[m + 1];
    da[K - 1] = dai;
    float g = 0.0f;
#pragma unroll
    for (int m = 0; m < K; ++m) g += w[m] * da[K - 1 - m];
    return g;
  }
};

template <int K>
__global__ void __launch_bounds__(256) conv_backward_kernel(ConvBackwardArgs p) {
  const int64_t n = p.splits * p.channels;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < n; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t split = idx / p.channels, c = idx % p.channels;  // channels fastest: coalesced rows
    const int64_t s = split * p.rows_per_split;
    const int64_t e = s + p.rows_per_split < p.t_len ? s + p.rows_per_split : p.t_len;
    ConvWalk<K> walk;
    walk.init(p, s, c);
    for (int64_t i = s; i < e + K - 1; ++i) {
      const bool has_row = i < p.t_len;
      const float g = walk.step(has_row, i < e, has_row ? p.x.load(p.x.offset(i) + c) : 0.0f,
                                has_row ? p.d_out.load(p.d_out.offset(i) + c) : 0.0f);
      const int64_t j = i - (K - 1);  // the row whose dx is now complete
      if (j >= s) {
        p.dx.store(p.dx.offset(j) + c, g);
      } else if (s == 0 && p.d_prefix.data != nullptr) {  // j in [−(K−1), 0): a halo row
        p.d_prefix.store(p.d_prefix.offset(j + K - 1) + c, g);
      }
    }
    if (p.dw_partial != nullptr) {
#pragma unroll
      for (int m = 0; m < K; ++m) p.dw_partial[(split * p.channels + c) * K + m] = walk.dw[m];
    }
  }
}

// The same walk on bf16 x, d_out and dx whose rows start on 16-byte boundaries, with 8 | C (the
// model's), fed through shared memory: block (channel block of 256, row split), thread t walks the
// channel pair c0 + 2t, c0 + 2t + 1 (one 4-byte shared access per row for both). Tiles of 16 rows
// of x and d_out arrive by 16-byte cp.async, double-buffered (the next tile loads while this one is
// walked), and the tile's dx rows leave through shared memory in 16-byte stores, so the walk's
// serial dependence never waits on global memory (the one-thread-per-channel walk on global memory
// was latency-bound, far below the copy bandwidth). The halo rows (prefix, d_prefix) keep scalar
// accesses: they are K − 1 rows of the first split. Channel pairs in 16-row tiles rather than one
// channel per thread in 32-row tiles of 80 KB: the smaller tiles let more blocks share an SM, and
// the pair form was faster alone (hydra bench --op gdn-input; cluster/results/h200-2026-12-06).
constexpr int kTileRows = 16, kTileChannels = 256, kTileThreads = kTileChannels / 2;
constexpr int kTileChunks = kTileChannels / 8;  // 16-byte chunks per tile row
constexpr size_t kTileBytes = size_t{kTileRows} * kTileChannels * 2;
constexpr size_t kConvTiledSmem = 5 * kTileBytes;  // x and d_out × 2 buffers, dx: 40 KB, under the default limit

template <int K>
__global__ void __launch_bounds__(kTileThreads) conv_backward_tiled_kernel(ConvBackwardArgs p) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem);                    // [2][rows][channels]
  bf16_t* ds = reinterpret_cast<bf16_t*>(smem + 2 * kTileBytes);   // [2][rows][channels]
  bf16_t* gs = reinterpret_cast<bf16_t*>(smem + 4 * kTileBytes);   // [rows][channels]: dx of the tile
  const int t = threadIdx.x;
  const int64_t c0 = int64_t(blockIdx.x) * kTileChannels, c = c0 + 2 * t;  // this thread: c, c + 1
  const bool active = c < p.channels;  // 8 | C: both channels or neither
  const int64_t split = blockIdx.y, s = split * p.rows_per_split;
  const int64_t e = s + p.rows_per_split < p.t_len ? s + p.rows_per_split : p.t_len;
  const int64_t walk_end = e + K - 1, load_end = walk_end < p.t_len ? walk_end : p.t_len;
  const bf16_t* xd = static_cast<const bf16_t*>(p.x.data);
  const bf16_t* dod = static_cast<const bf16_t*>(p.d_out.data);
  bf16_t* dxd = static_cast<bf16_t*>(p.dx.data);
  // Rows [r0, r0 + kTileRows) ∩ [r0, load_end) of x and d_out into buffer `buf`, 16 bytes per copy.
  const auto load_tile = [&](int64_t r0, int buf) {
    const uint32_t xs_base = static_cast<uint32_t>(__cvta_generic_to_shared(xs + buf * kTileRows * kTileChannels));
    const uint32_t ds_base = static_cast<uint32_t>(__cvta_generic_to_shared(ds + buf * kTileRows * kTileChannels));
    for (int q = t; q < kTileRows * kTileChunks; q += kTileThreads) {
      const int r = q / kTileChunks, chunk = q % kTileChunks;
      const int64_t row = r0 + r, ch = c0 + 8 * chunk;
      if (row >= load_end || ch >= p.channels) continue;
      const uint32_t at = static_cast<uint32_t>((r * kTileChannels + 8 * chunk) * 2);
      cuda::cp_async_16(xs_base + at, xd + p.x.offset(row) + ch, 16);
      cuda::cp_async_16(ds_base + at, dod + p.d_out.offset(row) + ch, 16);
    }
    cuda::cp_async_commit();
  };
  ConvWalk<K> walk0, walk1;  // channels c and c + 1
  if (active) {
    walk0.init(p, s, c);
    walk1.init(p, s, c + 1);
  }
  load_tile(s, 0);
  int buf = 0;
  for (int64_t r0 = s; r0 < walk_end; r0 += kTileRows, buf ^= 1) {
    const int rows = walk_end - r0 < kTileRows ? static_cast<int>(walk_end - r0) : kTileRows;
    if (r0 + kTileRows < load_end) {
      load_tile(r0 + kTileRows, buf ^ 1);
      cuda::cp_async_wait<1>();  // this tile's group is complete, the next one may still fly
    } else {
      cuda::cp_async_wait<0>();
    }
    __syncthreads();  // the tile is visible to every thread; the last tile's dx rows were stored
    const __nv_bfloat162* xt = reinterpret_cast<const __nv_bfloat162*>(xs + buf * kTileRows * kTileChannels);
    const __nv_bfloat162* dt = reinterpret_cast<const __nv_bfloat162*>(ds + buf * kTileRows * kTileChannels);
    __nv_bfloat162* gt = reinterpret_cast<__nv_bfloat162*>(gs);
    if (active) {
#pragma unroll 4
      for (int r = 0; r < rows; ++r) {
        const int64_t i = r0 + r;
        const bool has_row = i < p.t_len;
        const float2 xv = has_row ? __bfloat1622float2(xt[r * kTileThreads + t]) : make_float2(0.0f, 0.0f);
        const float2 dv = has_row ? __bfloat1622float2(dt[r * kTileThreads + t]) : make_float2(0.0f, 0.0f);
        const float g0 = walk0.step(has_row, i < e, xv.x, dv.x), g1 = walk1.step(has_row, i < e, xv.y, dv.y);
        const int64_t j = i - (K - 1);  // the row whose dx is now complete
        if (j >= s) {
          gt[r * kTileThreads + t] = __floats2bfloat162_rn(g0, g1);
        } else if (s == 0 && p.d_prefix.data != nullptr) {  // j in [−(K−1), 0): a halo row
          p.d_prefix.store(p.d_prefix.offset(j + K - 1) + c, g0);
          p.d_prefix.store(p.d_prefix.offset(j + K - 1) + c + 1, g1);
        }
      }
    }
    __syncthreads();  // the tile's dx rows are in gs
    for (int q = t; q < rows * kTileChunks; q += kTileThreads) {
      const int r = q / kTileChunks, chunk = q % kTileChunks;
      const int64_t j = r0 + r - (K - 1), ch = c0 + 8 * chunk;
      if (j < s || ch >= p.channels) continue;
      *reinterpret_cast<uint4*>(dxd + p.dx.offset(j) + ch) =
          *reinterpret_cast<const uint4*>(gs + r * kTileChannels + 8 * chunk);
    }
  }
  if (active && p.dw_partial != nullptr) {
#pragma unroll
    for (int m = 0; m < K; ++m) {
      p.dw_partial[(split * p.channels + c) * K + m] = walk0.dw[m];
      p.dw_partial[(split * p.channels + c + 1) * K + m] = walk1.dw[m];
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
void launch_conv_backward(const ConvBackwardArgs& p, bool tiled) {
  if (tiled) {
    const dim3 grid(static_cast<unsigned>((p.channels + kTileChannels - 1) / kTileChannels),
                    static_cast<unsigned>(p.splits));
    conv_backward_tiled_kernel<K><<<grid, kTileThreads, kConvTiledSmem, current_stream()>>>(p);
  } else {
    conv_backward_kernel<K><<<cuda::capped_grid((p.splits * p.channels + 255) / 256), 256, 0, current_stream()>>>(p);
  }
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
  const cuda::FloatRows fdx = cuda::float_rows(dx, "conv dx"), fdo = cuda::float_rows(d_out, "conv d_out"),
                        fx = cuda::float_rows(x, "conv x");
  const bool tiled = channels % 8 == 0 && fdx.bf16 && fdo.bf16 && fx.bf16 && cuda::row_starts_aligned(fdx, 16) &&
                     cuda::row_starts_aligned(fdo, 16) && cuda::row_starts_aligned(fx, 16);
  // Splits: a function of T (and of the path) alone, for the weight gradient's order; ≥ 64 rows each
  // so the K−1 extra rows stay cheap. The tiled path's blocks cover 256 channels, so more splits.
  const int64_t wanted = std::clamp<int64_t>((t_len + 63) / 64, 1, tiled ? 256 : 128);
  const int64_t rows_per_split = std::max<int64_t>(1, (t_len + wanted - 1) / wanted);
  const int64_t splits = t_len == 0 ? 1 : (t_len + rows_per_split - 1) / rows_per_split;
  Tensor partial = dw.defined() ? Tensor::empty({splits, channels * k}, DType::f32, Device::cuda) : Tensor();
  ConvBackwardArgs p{.dx = fdx,
                     .d_out = fdo,
                     .x = fx,
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
    case 1: launch_conv_backward<1>(p, tiled); break;
    case 2: launch_conv_backward<2>(p, tiled); break;
    case 3: launch_conv_backward<3>(p, tiled); break;
    case 4: launch_conv_backward<4>(p, tiled); break;
    default: HYDRA_ASSERT(false, "conv backward on the GPU supports kernel widths 1 to 4, got {}", k);
  }
  if (dw.defined()) {
    cuda::launch_column_finish(partial.data_as<const float>(), splits, channels * k,
                               ConvWeightFinish{dw.data_as<float>(), dw.stride(0), static_cast<int>(k)});
  }
}

}  // namespace hydra::ops::cuda_impl
