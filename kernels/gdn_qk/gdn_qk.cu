// CUDA GDN input pass (gdn_qk.h). A block holds a tile of R consecutive rows and 2W heads (W
// warps), a half-warp of 16 lanes per head; lane j owns elements i = j·E .. j·E + E − 1 of the
// head's first half and the same of its second half (E = d / 32: four bf16, 8 bytes, at d = 128),
// so a RoPE pair (i, i + d/2) never leaves its lane and the L2 norm is a 16-lane sum.
//
// Each lane first issues the loads of all its rows (the conv: R + K − 1 rows, the K − 1 before
// the tile again) as raw bf16 words, then computes the rows from registers: the rows of a tile are
// independent, so the loads are all in flight at once, and no row's work waits on a branch (the
// half-warp sum runs for every head; stores are predicated). The angles' cos and sin are computed
// once per (row, frequency) into shared memory by the block and read by each of its q/k heads
// (blocks of v heads alone skip it); the rows' positions are loaded with the inputs.
//
// It replaced a warp per (32-row run, head) walking its rows one at a time (each row's load waited
// on the last, every head recomputed its rows' angles in fp64, and the warp sum under a per-head
// branch compiled to a divergent-collective path) and a warp per head over 16-row tiles with a
// position load per angle in the table loop; both were slower. Tiles of 8 rows at d = 128
// (R below) rather than 4: 4-row tiles made the q/k backward faster alone but the conv slower, and
// the training step no faster. Figures: hydra bench --op gdn-input, cluster/results/h200-2026-12-06.
//
// Angles: kernels/rope/rope_angle.cuh, as kernels/rope forms them.
#include "kernels/cuda/backward.cuh"
#include "kernels/cuda/vector.cuh"
#include "kernels/gdn_qk/gdn_qk.h"
#include "kernels/rope/rope_angle.cuh"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kLanes = 16;               // lanes per head
constexpr int kMaxHalf = 128;            // d ≤ 256
constexpr int kMaxWarps = 8;             // 16 heads per block at most
constexpr int kMaxRows = 16;
constexpr int kMaxAngles = 512;          // R · d/2 for every (R, E) below

// Rows per tile: the loads of a whole tile sit in registers as raw words (at E = 4: 22 words of 8
// bytes for the conv's 8 + 3 rows, 32 for the backward's 8 rows).
template <int E>
constexpr int forward_rows() { return E >= 8 ? 4 : (E == 4 ? 8 : 16); }
template <int E>
constexpr int backward_rows() { return forward_rows<E>(); }
static_assert(forward_rows<8>() * 128 <= kMaxAngles && forward_rows<4>() * 64 <= kMaxAngles &&
                  forward_rows<2>() * 32 <= kMaxAngles && forward_rows<1>() * 16 <= kMaxAngles,
              "the angle table holds a tile's rows × d/2");

// cos and sin of pos_r · inv_freq_i for a tile's rows r and frequencies i < d/2, in shared memory.
struct AngleTable {
  float2 cs[kMaxAngles];  // [r · half + i]
  double inv_freq[kMaxHalf];
  int64_t pos[kMaxRows];

  // Thread r < rows brings pos_r (the position of the tile's row r; 0 past the end). Every thread of
  // the block calls it (it synchronises the block).
  __device__ void fill(int64_t my_pos, int rows, int half, double log_theta_over_d) {
    if (threadIdx.x < rows) pos[threadIdx.x] = my_pos;
    for (int i = threadIdx.x; i < half; i += blockDim.x) inv_freq[i] = rope_inv_freq(i, log_theta_over_d);
    __syncthreads();
    for (int at = threadIdx.x; at < rows * half; at += blockDim.x) {
      const int r = at / half, i = at - r * half;
      cs[at] = rope_cos_sin(pos[r], inv_freq[i]);
    }
    __syncthreads();
  }

  // Rotates a lane's E pairs (lo[e], hi[e]), elements i .. i + E − 1 of the half of tile row r, by
  // +angle (sign 1: the forward) or −angle (sign −1: the backward's inverse rotation).
  template <int E>
  __device__ __forceinline__ void rotate(int r, int half, int64_t i, float sign, float (&lo)[E], float (&hi)[E]) const {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const float2 c_s = cs[r * half + i + e];
      const float c = c_s.x, s = sign * c_s.y, a = lo[e], b = hi[e];
      lo[e] = a * c - b * s;
      hi[e] = b * c + a * s;
    }
  }
};

// A thread's place, the preamble of both kernels: blockIdx.x is the tile of R rows, blockIdx.y the
// block of heads, a half-warp per head, lane j of it owning elements i = j·E .. j·E + E − 1 of each half.
struct HeadLane {
  int j;
  int64_t i, t0, first_head, h;
  bool active;  // a real head and elements of it (d/2 < 16·E leaves lanes idle)

  __device__ HeadLane(int rows, int e, int heads_per_block, int64_t heads, int half)
      : j(threadIdx.x % kLanes),
        i(int64_t(j) * e),
        t0(int64_t(blockIdx.x) * rows),
        first_head(int64_t(blockIdx.y) * heads_per_block),
        h(first_head + threadIdx.x / kLanes),
        active(j * e < half && h < heads) {}
  // Thread r < rows loads the position of row t0 + r (0 past the end), for AngleTable::fill.
  __device__ int64_t row_position(const int64_t* pos, int rows, int64_t t_len) const {
    return threadIdx.x < rows && t0 + threadIdx.x < t_len ? pos[t0 + threadIdx.x] : 0;
  }
};

// The sum over the 16 lanes of a head (lanes 0–15 or 16–31 of the warp); every lane gets it.
__device__ __forceinline__ float head_sum(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

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
  int64_t t_len, heads, qk_heads;
  int half, heads_per_block;
  bool w_rows_16b;  // w's rows start on 16-byte boundaries
  double log_theta_over_d;
  float eps;
};

template <int K, int E>
__global__ void __launch_bounds__(32 * kMaxWarps) gdn_qkv_conv_kernel(ConvArgs p) {
  constexpr int R = forward_rows<E>();
  __shared__ AngleTable angles;
  const HeadLane lane(R, E, p.heads_per_block, p.heads, p.half);
  const int j = lane.j;
  const int64_t t0 = lane.t0, h = lane.h;
  const bool active = lane.active, qk = h < p.qk_heads;
  // Columns of the lane's two words: c_lo = h·d + i, c_hi = c_lo + d/2.
  const int64_t c_lo = h * 2 * p.half + lane.i, c_hi = c_lo + p.half;
  cuda::Bf16Word<E> in_lo[R + K - 1], in_hi[R + K - 1];  // in[m]: input row t0 − (K − 1) + m
#pragma unroll
  for (int m = 0; m < R + K - 1; ++m) {
    const int64_t row = t0 - (K - 1) + m;
    const bf16_t* src = nullptr;
    if (active && row < p.t_len) {
      if (row >= 0) {
        src = p.x + row * p.x_stride;
      } else if (p.prefix != nullptr) {
        src = p.prefix + (row + K - 1) * p.prefix_stride;
      }
    }
    in_lo[m] = src != nullptr ? cuda::load_bf16_word<E>(src + c_lo) : cuda::Bf16Word<E>{};
    in_hi[m] = src != nullptr ? cuda::load_bf16_word<E>(src + c_hi) : cuda::Bf16Word<E>{};
  }
  const int64_t my_pos = lane.row_position(p.pos, R, p.t_len);
  float w_lo[E][K], w_hi[E][K];
#pragma unroll
  for (int e = 0; e < E; ++e) {
    if constexpr (K == 4) {
      if (p.w_rows_16b) {  // a channel's four taps in one 16-byte load (the model's [C, 4] weights)
        const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        const float4 a = active ? *reinterpret_cast<const float4*>(p.w + (c_lo + e) * p.w_stride) : zero;
        const float4 b = active ? *reinterpret_cast<const float4*>(p.w + (c_hi + e) * p.w_stride) : zero;
        w_lo[e][0] = a.x, w_lo[e][1] = a.y, w_lo[e][2] = a.z, w_lo[e][3] = a.w;
        w_hi[e][0] = b.x, w_hi[e][1] = b.y, w_hi[e][2] = b.z, w_hi[e][3] = b.w;
        continue;
      }
    }
#pragma unroll
    for (int m = 0; m < K; ++m) {
      w_lo[e][m] = active ? p.w[(c_lo + e) * p.w_stride + m] : 0.0f;
      w_hi[e][m] = active ? p.w[(c_hi + e) * p.w_stride + m] : 0.0f;
    }
  }
  const bool block_has_qk = lane.first_head < p.qk_heads;  // uniform across the block
  if (block_has_qk) angles.fill(my_pos, R, p.half, p.log_theta_over_d);
  const bool rotate = block_has_qk && qk && active;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = t0 + r;
    float lo[E], hi[E], ss = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) lo[e] = hi[e] = 0.0f;
#pragma unroll
    for (int m = 0; m < K; ++m) {
      float xl[E], xh[E];
      cuda::unpack_bf16<E>(in_lo[r + m], xl);
      cuda::unpack_bf16<E>(in_hi[r + m], xh);
#pragma unroll
      for (int e = 0; e < E; ++e) {
        lo[e] += w_lo[e][m] * xl[e];
        hi[e] += w_hi[e][m] * xh[e];
      }
    }
#pragma unroll
    for (int e = 0; e < E; ++e) {  // SiLU
      lo[e] *= cuda::fast_sigmoid(lo[e]);
      hi[e] *= cuda::fast_sigmoid(hi[e]);
    }
    if (rotate) angles.rotate<E>(r, p.half, lane.i, 1.0f, lo, hi);
#pragma unroll
    for (int e = 0; e < E; ++e) ss += lo[e] * lo[e] + hi[e] * hi[e];
    const float inv = rsqrtf(head_sum(ss) + p.eps);  // every head sums; v heads do not use it
    if (qk) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        lo[e] *= inv;
        hi[e] *= inv;
      }
    }
    if (active && t < p.t_len) {
      cuda::store_bf16<E>(p.out + t * p.out_stride + c_lo, lo);
      cuda::store_bf16<E>(p.out + t * p.out_stride + c_hi, hi);
      if (qk && j == 0) p.inv_norm[t * p.inv_norm_stride + h] = inv;
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
  int64_t t_len, heads;
  int half, heads_per_block;
  double log_theta_over_d;
};

// d = r (dy − y (y·dy)), then the inverse rotation. Each lane loads all its rows of dy and y before
// it writes any dx, and writes only what it read, so dx may alias dy.
template <int E>
__global__ void __launch_bounds__(32 * kMaxWarps) gdn_qk_backward_kernel(BackwardArgs p) {
  constexpr int R = backward_rows<E>();
  __shared__ AngleTable angles;
  const HeadLane lane(R, E, p.heads_per_block, p.heads, p.half);
  const int64_t t0 = lane.t0, h = lane.h, i = lane.i;
  const bool active = lane.active;
  cuda::Bf16Word<E> dy_lo[R], dy_hi[R], y_lo[R], y_hi[R];
  float r_of[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = t0 + r;
    const bool here = active && t < p.t_len;
    const bf16_t* dy = p.dy + t * p.dy_t + h * p.dy_h;
    const bf16_t* y = p.y + t * p.y_t + h * p.y_h;
    dy_lo[r] = here ? cuda::load_bf16_word<E>(dy + i) : cuda::Bf16Word<E>{};
    dy_hi[r] = here ? cuda::load_bf16_word<E>(dy + i + p.half) : cuda::Bf16Word<E>{};
    y_lo[r] = here ? cuda::load_bf16_word<E>(y + i) : cuda::Bf16Word<E>{};
    y_hi[r] = here ? cuda::load_bf16_word<E>(y + i + p.half) : cuda::Bf16Word<E>{};
    r_of[r] = here ? p.inv_norm[t * p.r_t + h * p.r_h] : 0.0f;
  }
  const int64_t my_pos = lane.row_position(p.pos, R, p.t_len);
  angles.fill(my_pos, R, p.half, p.log_theta_over_d);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t t = t0 + r;
    float dlo[E], dhi[E], ylo[E], yhi[E], dot = 0.0f;
    cuda::unpack_bf16<E>(dy_lo[r], dlo);
    cuda::unpack_bf16<E>(dy_hi[r], dhi);
    cuda::unpack_bf16<E>(y_lo[r], ylo);
    cuda::unpack_bf16<E>(y_hi[r], yhi);
#pragma unroll
    for (int e = 0; e < E; ++e) dot += ylo[e] * dlo[e] + yhi[e] * dhi[e];
    dot = head_sum(dot);
    if (active && t < p.t_len) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        dlo[e] = r_of[r] * (dlo[e] - ylo[e] * dot);
        dhi[e] = r_of[r] * (dhi[e] - yhi[e] * dot);
      }
      angles.rotate<E>(r, p.half, i, -1.0f, dlo, dhi);
      bf16_t* dx = p.dx + t * p.dx_t + h * p.dx_h;
      cuda::store_bf16<E>(dx + i, dlo);
      cuda::store_bf16<E>(dx + i + p.half, dhi);
    }
  }
}

// E: the elements of each half a lane owns (the smallest of 1, 2, 4, 8 whose 16 lanes cover the half).
int lane_elements(int64_t half) {
  HYDRA_ASSERT(half >= 1 && half <= kMaxHalf, "gdn_qk on the GPU supports head dims 2..256, got {}", 2 * half);
  const int e = half <= 16 ? 1 : (half <= 32 ? 2 : (half <= 64 ? 4 : 8));
  HYDRA_ASSERT(half % e == 0, "gdn_qk on the GPU: head dim {} is not a multiple of {}", 2 * half, 2 * e);
  return e;
}

// E-element accesses need every base and stride at a multiple of E elements (2E bytes).
bool lane_words_aligned(int e, std::initializer_list<std::pair<const void*, int64_t>> bases_and_strides) {
  for (const auto& [base, stride] : bases_and_strides) {
    if (reinterpret_cast<uintptr_t>(base) % (2 * e) != 0 || stride % e != 0) return false;
  }
  return true;
}

// Heads per block (two per warp): all of them up to 2·kMaxWarps, else the even count in
// [kMaxWarps, 2·kMaxWarps] that leaves the fewest idle half-warps in the last block
// (hydrahead-1.7b's 42 conv heads: 14, none idle, so q, k and v heads have a block each).
int heads_per_block(int64_t heads) {
  if (heads <= 2 * kMaxWarps) return static_cast<int>((std::max<int64_t>(heads, 1) + 1) / 2 * 2);
  int best = 2 * kMaxWarps;
  int64_t best_idle = (heads + best - 1) / best * best - heads;
  for (int n = 2 * kMaxWarps - 2; n >= kMaxWarps; n -= 2) {
    const int64_t idle = (heads + n - 1) / n * n - heads;
    if (idle < best_idle) best = n, best_idle = idle;
  }
  return best;
}

// Calls f(std::integral_constant<int, E>{}) for the run-time E.
template <typename F>
void with_lane_elements(int e, F&& f) {
  if (e == 1) {
    f(std::integral_constant<int, 1>{});
  } else if (e == 2) {
    f(std::integral_constant<int, 2>{});
  } else if (e == 4) {
    f(std::integral_constant<int, 4>{});
  } else {
    f(std::integral_constant<int, 8>{});
  }
}

template <int K>
void launch_conv(const ConvArgs& p, int e) {
  with_lane_elements(e, [&](auto E) {
    const dim3 grid(static_cast<unsigned>((p.t_len + forward_rows<E>() - 1) / forward_rows<E>()),
                    static_cast<unsigned>((p.heads + p.heads_per_block - 1) / p.heads_per_block));
    gdn_qkv_conv_kernel<K, E><<<grid, kLanes * p.heads_per_block, 0, current_stream()>>>(p);
  });
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
  HYDRA_ASSERT(lane_words_aligned(e, {{out.data(), out.stride(0)}, {x.data(), x.stride(0)},
                                      {prefix.defined() ? prefix.data() : nullptr, prefix.defined() ? prefix.stride(0) : 0}}),
               "gdn conv: rows must start on {}-byte boundaries (strides {} {})", 2 * e, out.stride(0), x.stride(0));
  if (x.size(0) == 0) return;
  const int64_t heads = channels / d;
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
                   .heads = heads,
                   .qk_heads = params.qk_heads,
                   .half = static_cast<int>(d / 2),
                   .heads_per_block = heads_per_block(heads),
                   .w_rows_16b = reinterpret_cast<uintptr_t>(w.data()) % 16 == 0 && w.stride(0) % 4 == 0,
                   .log_theta_over_d = rope_log_theta_over_d(params.rope_theta, d),
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
  HYDRA_ASSERT(lane_words_aligned(e, {{dx.data(), dx.stride(0)}, {dx.data(), dx.stride(1)}, {dy.data(), dy.stride(0)},
                                      {dy.data(), dy.stride(1)}, {y.data(), y.stride(0)}, {y.data(), y.stride(1)}}),
               "gdn qk backward: rows and heads must start on {}-byte boundaries", 2 * e);
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
                       .half = static_cast<int>(half),
                       .heads_per_block = heads_per_block(y.size(1)),
                       .log_theta_over_d = rope_log_theta_over_d(params.rope_theta, params.head_dim)};
  with_lane_elements(e, [&](auto E) {
    const dim3 grid(static_cast<unsigned>((p.t_len + backward_rows<E>() - 1) / backward_rows<E>()),
                    static_cast<unsigned>((p.heads + p.heads_per_block - 1) / p.heads_per_block));
    gdn_qk_backward_kernel<E><<<grid, kLanes * p.heads_per_block, 0, current_stream()>>>(p);
  });
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
