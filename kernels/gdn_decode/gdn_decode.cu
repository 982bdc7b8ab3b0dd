// CUDA fused GDN decode step (gdn_decode.h): the conv step, the gates and the delta-rule step of a
// decode step's GDN heads in one launch.
//
// A cluster of d/16 CTAs per (GDN head, row) (8 at d = 128), CTA p owning value columns
// [16p, 16p + 16) of the head's [d, d] fp32 state: 14 heads at batch 1 stream their states with 112
// CTAs at once (the separate step uses 4 per head). Each CTA of 128 threads:
//  1. issues its state tile's loads first (thread: 4 columns × d/32 rows, float4; they are in flight
//     during 2 and 3);
//  2. computes q and k of the head whole (every CTA of the cluster does: their L2 norms need all d
//     channels; gdn_qk_step.cu's arithmetic, thread i < d/2 the q RoPE pair (i, i + d/2), the next
//     d/2 threads k's), its own 16 v channels, and the head's β and g (gdn_gates.cu's arithmetic);
//     q, k, v rounded to bf16 as the separate path's conv output holds them;
//  3. runs the step on its tile (delta_rule_step.cu's arithmetic: s ← e^g s; δ_j = β (v_j − Σ_i s_ij
//     k_i); s_ij += k_i δ_j; o_j = scale Σ_i s_ij q_i), each column sum a fixed tree (4 rows in a
//     thread, 8 row groups by shuffles, 4 warps through shared memory in warp order): deterministic,
//     no atomics;
//  4. advances the conv tail of the channels it owns (q/k pairs [8p, 8p + 8), its v channels) after a
//     cluster barrier that every CTA reaches once it has read the tail: no CTA overwrites a tail value
//     another still has to read. The barrier's wait comes last, so step 3 hides it.
// CTA 0 of a cluster writes the head's q/k conv output, inverse norms, β and g; every CTA its v columns.
#include "kernels/cuda/common.cuh"
#include "kernels/gdn_decode/gdn_decode.h"
#include "kernels/gdn_gates/gdn_gates.cuh"
#include "kernels/rope/rope_angle.cuh"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kCols = 16;  // value columns per CTA
constexpr int kMaxTaps = 8;

struct FusedArgs {
  bf16_t* out;
  int64_t out_stride_b, out_stride_h;
  bf16_t* conv_out;
  int64_t conv_stride;
  float* inv_norm;
  int64_t inv_stride;
  float* beta_out;
  int64_t beta_stride;
  float* g_out;
  int64_t g_stride;
  float* state;  // [S, H, d, d] contiguous
  bf16_t* tail;  // [S, K−1, C] contiguous, or null (K = 1)
  const int32_t* slots;
  const int64_t* pos;
  const bf16_t* x;
  int64_t x_stride;
  const float* w;
  int64_t w_stride;
  const bf16_t* b_logits;
  int64_t b_stride;
  const bf16_t* a_logits;
  int64_t a_stride;
  const float* a_log;
  const float* dt_bias;
  int64_t heads, channels;
  int taps;
  double log_theta_over_d;
  float eps, scale;
};

// The conv + SiLU of channel c at row b: gdn_qk_step.cu's sum (the tail rows in order, then the new
// input), with the loops unrolled to kMaxTaps so the tail values stay in registers.
struct ConvTap {
  float in[kMaxTaps - 1];  // the tail rows read
  bf16_t x;                // the new input
};
__device__ __forceinline__ float conv_silu(const FusedArgs& a, const bf16_t* tail, int64_t b, int64_t c, ConvTap& t) {
  const int halo = a.taps - 1;
#pragma unroll
  for (int m = 0; m < kMaxTaps - 1; ++m) t.in[m] = m < halo ? cuda::to_float(tail[m * a.channels + c]) : 0.0f;
  t.x = a.x[b * a.x_stride + c];
  float acc = 0.0f;
#pragma unroll
  for (int m = 0; m < kMaxTaps - 1; ++m) {
    if (m < halo) acc += a.w[c * a.w_stride + m] * t.in[m];
  }
  acc += a.w[c * a.w_stride + halo] * cuda::to_float(t.x);
  return acc * cuda::fast_sigmoid(acc);
}

// The tail of channel c advances: row m ← row m + 1, the last row ← the new input (bf16 as stored).
__device__ __forceinline__ void advance_tail(const FusedArgs& a, bf16_t* tail, int64_t c, const ConvTap& t) {
  const int halo = a.taps - 1;
#pragma unroll
  for (int m = 0; m < kMaxTaps - 2; ++m) {
    if (m + 1 < halo) tail[m * a.channels + c] = cuda::from_float<bf16_t>(t.in[m + 1]);
  }
  if (halo > 0) tail[(halo - 1) * a.channels + c] = t.x;
}

__device__ __forceinline__ float4 operator*(float4 s, float f) { return {s.x * f, s.y * f, s.z * f, s.w * f}; }
__device__ __forceinline__ void add_product(float4& acc, float4 s, float f) {
  acc.x += s.x * f;
  acc.y += s.y * f;
  acc.z += s.z * f;
  acc.w += s.w * f;
}
// Sums over the 8 row groups of a warp (lanes with the same lane % 4 hold the same columns).
__device__ __forceinline__ float4 sum_row_groups(float4 v) {
#pragma unroll
  for (int o = 4; o < 32; o *= 2) {
    v.x += __shfl_xor_sync(0xffffffffu, v.x, o);
    v.y += __shfl_xor_sync(0xffffffffu, v.y, o);
    v.z += __shfl_xor_sync(0xffffffffu, v.z, o);
    v.w += __shfl_xor_sync(0xffffffffu, v.w, o);
  }
  return v;
}

// The cluster (its dimensions part of the kernel: cuda::launch takes plain grids) spans the d/16
// CTAs of a (head, row) along grid x.
template <int D>
__global__ void __cluster_dims__(D / kCols, 1, 1) __launch_bounds__(kThreads) gdn_decode_fused_kernel(const FusedArgs a) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  constexpr int kSplit = D / kCols;  // CTAs per (head, row): the cluster
  constexpr int R = D / 32;          // state rows per thread
  constexpr int kHalf = D / 2;       // RoPE pairs per head
  constexpr int kPairsPerCta = kHalf / kSplit;
  static_assert(kHalf % 32 == 0 && kPairsPerCta * kSplit == kHalf, "d must be 64 or 128");
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int part = blockIdx.x;  // the CTA's rank in its cluster (the cluster spans grid x)
  const int64_t h = blockIdx.y, b = blockIdx.z;
  const int64_t slot = a.slots != nullptr ? a.slots[b] : b;

  // 1. The state tile: thread (row group rg, column quad c4) holds rows rg + 32m, columns col0 .. col0 + 3.
  const int c4 = tid & 3, rg = tid >> 2;
  const int col0 = part * kCols + c4 * 4;
  float* s_head = a.state + (slot * a.heads + h) * D * D;
  float4 s[R];
#pragma unroll
  for (int m = 0; m < R; ++m) s[m] = *reinterpret_cast<const float4*>(s_head + int64_t(rg + 32 * m) * D + col0);

  __shared__ float qvec[D], kvec[D], vvec[kCols], warp_sums[kWarps];
  __shared__ __align__(16) float delta[kCols];
  __shared__ __align__(16) float partial[kWarps][kCols];
  __shared__ float gate[2];  // e^g, β

  // 2. q and k (threads < d: which = 0 q, 1 k; pair i), this CTA's v channels (threads < 16), the gates.
  const int halo = a.taps - 1;
  bf16_t* tail = a.tail != nullptr ? a.tail + slot * halo * a.channels : nullptr;
  const bool qk_thread = tid < D;
  const int which = tid / kHalf, i = tid % kHalf;
  const int64_t qk_head = which * a.heads + h;  // the conv head: q heads first, then k heads
  const int64_t c_lo = qk_head * D + i, c_hi = c_lo + kHalf;
  ConvTap t_lo{}, t_hi{}, t_v{};
  float lo = 0.0f, hi = 0.0f;
  if (qk_thread) {
    lo = conv_silu(a, tail, b, c_lo, t_lo);
    hi = conv_silu(a, tail, b, c_hi, t_hi);
    const float2 cos_sin = rope_cos_sin(a.pos[b], rope_inv_freq(i, a.log_theta_over_d));
    const float cs = cos_sin.x, sn = cos_sin.y;
    const float r_lo = lo * cs - hi * sn, r_hi = hi * cs + lo * sn;
    lo = r_lo;
    hi = r_hi;
  }
  const int64_t c_v = (2 * a.heads + h) * D + part * kCols + tid;  // for tid < kCols
  if (tid < kCols) {
    const bf16_t v = cuda::from_float<bf16_t>(conv_silu(a, tail, b, c_v, t_v));
    vvec[tid] = cuda::to_float(v);
    a.conv_out[b * a.conv_stride + c_v] = v;
  }
  // Every tail value this CTA reads has been read: the cluster's CTAs may advance theirs (4.).
  asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  if (tid == kThreads - 1) {  // the gates kernel's formula (gdn_gates.cuh)
    const float bv = cuda::to_float(a.b_logits[b * a.b_stride + h]);
    const float sp = gdn_softplus(cuda::to_float(a.a_logits[b * a.a_stride + h]), a.dt_bias[h]);
    const float beta = gdn_beta(bv), g = gdn_g(sp, a.a_log[h]);
    gate[0] = expf(g);
    gate[1] = beta;
    if (part == 0) {
      a.beta_out[b * a.beta_stride + h] = beta;
      a.g_out[b * a.g_stride + h] = g;
    }
  }
  float ss = lo * lo + hi * hi;  // 0 outside the q/k threads
#pragma unroll
  for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (lane == 0) warp_sums[warp] = ss;
  __syncthreads();
  if (qk_thread) {  // the L2 norm over the head's d/2 threads' warps, in warp order
    constexpr int kHeadWarps = kHalf / 32;
    float total = 0.0f;
    for (int w = 0; w < kHeadWarps; ++w) total += warp_sums[which * kHeadWarps + w];
    const float inv = rsqrtf(total + a.eps);
    const bf16_t out_lo = cuda::from_float<bf16_t>(lo * inv), out_hi = cuda::from_float<bf16_t>(hi * inv);
    float* vec = which == 0 ? qvec : kvec;
    vec[i] = cuda::to_float(out_lo);
    vec[i + kHalf] = cuda::to_float(out_hi);
    if (part == 0) {
      a.conv_out[b * a.conv_stride + c_lo] = out_lo;
      a.conv_out[b * a.conv_stride + c_hi] = out_hi;
      if (i == 0) a.inv_norm[b * a.inv_stride + qk_head] = inv;
    }
  }
  __syncthreads();

  // 3. The step on the tile.
  const float decay = gate[0], beta = gate[1];
  float4 kv{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int m = 0; m < R; ++m) {
    s[m] = s[m] * decay;
    add_product(kv, s[m], kvec[rg + 32 * m]);
  }
  kv = sum_row_groups(kv);
  if (lane < 4) reinterpret_cast<float4*>(partial[warp])[lane] = kv;
  __syncthreads();
  if (tid < kCols) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][tid];
    delta[tid] = beta * (vvec[tid] - sum);
  }
  __syncthreads();
  const float4 dl = reinterpret_cast<const float4*>(delta)[c4];
  float4 o{0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int m = 0; m < R; ++m) {
    const float k_i = kvec[rg + 32 * m];
    s[m].x += k_i * dl.x;
    s[m].y += k_i * dl.y;
    s[m].z += k_i * dl.z;
    s[m].w += k_i * dl.w;
    add_product(o, s[m], qvec[rg + 32 * m]);
    *reinterpret_cast<float4*>(s_head + int64_t(rg + 32 * m) * D + col0) = s[m];
  }
  o = sum_row_groups(o);
  if (lane < 4) reinterpret_cast<float4*>(partial[warp])[lane] = o;  // every thread read the kv partials
  __syncthreads();
  if (tid < kCols) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][tid];
    a.out[b * a.out_stride_b + h * a.out_stride_h + part * kCols + tid] = cuda::from_float<bf16_t>(sum * a.scale);
  }

  // 4. The tail advance, once every CTA of the cluster has read the old tail.
  asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
  if (tail != nullptr) {
    if (qk_thread && i / kPairsPerCta == part) {
      advance_tail(a, tail, c_lo, t_lo);
      advance_tail(a, tail, c_hi, t_hi);
    }
    if (tid < kCols) advance_tail(a, tail, c_v, t_v);
  }
}

}  // namespace

void gdn_decode_fused(const GdnDecodeTensors& t, const GdnQkParams& qk, float scale) {
  cuda::expect_cuda(t.out, "GDN decode out", DType::bf16);
  cuda::expect_cuda(t.conv_out, "GDN decode conv out", DType::bf16);
  cuda::expect_cuda(t.inv_norm, "GDN decode inv_norm", DType::f32);
  cuda::expect_cuda(t.beta, "GDN decode beta", DType::f32);
  cuda::expect_cuda(t.g, "GDN decode g", DType::f32);
  cuda::expect_cuda(t.state, "GDN decode state", DType::f32);
  cuda::expect_cuda(t.x, "GDN decode x", DType::bf16);
  cuda::expect_cuda(t.conv_w, "GDN decode conv weight", DType::f32);
  cuda::expect_cuda(t.b_logits, "GDN decode b logits", DType::bf16);
  cuda::expect_cuda(t.a_logits, "GDN decode a logits", DType::bf16);
  cuda::expect_cuda(t.a_log, "GDN decode A_log", DType::f32);
  cuda::expect_cuda(t.dt_bias, "GDN decode dt_bias", DType::f32);
  cuda::expect_cuda(t.positions, "GDN decode positions", DType::i64);
  if (t.slots.defined()) cuda::expect_cuda(t.slots, "GDN decode slots", DType::i32);
  const int64_t rows = t.x.size(0), heads = t.state.size(1), d = t.state.size(2), channels = t.x.size(1);
  const int64_t taps = t.conv_w.size(1);
  HYDRA_ASSERT(d == 64 || d == 128, "GDN decode (fused): head dim {} (the kernel takes 64 or 128)", d);
  HYDRA_ASSERT(taps >= 1 && taps <= kMaxTaps, "GDN decode (fused): {} conv taps (at most {})", taps, kMaxTaps);
  HYDRA_ASSERT(t.conv_w.size(0) == channels, "GDN decode (fused): conv weight of {} channels for {}", t.conv_w.size(0),
               channels);
  HYDRA_ASSERT(t.state.is_contiguous(), "GDN decode (fused): contiguous state needed");
  HYDRA_ASSERT(t.tail.defined() == (taps > 1), "GDN decode (fused): a conv tail is needed exactly when taps > 1");
  if (t.tail.defined()) {
    cuda::expect_cuda(t.tail, "GDN decode tail", DType::bf16);
    HYDRA_ASSERT(t.tail.is_contiguous() && t.tail.size(1) == taps - 1 && t.tail.size(2) == channels &&
                     t.tail.size(0) == t.state.size(0),
                 "GDN decode (fused): tail [{}, {}, {}] contiguous needed (got {})", t.state.size(0), taps - 1, channels,
                 t.tail.shape_string());
  }
  HYDRA_ASSERT(!t.slots.defined() ? t.state.size(0) >= rows : true,
               "GDN decode (fused): {} rows without a slot map need as many slots (have {})", rows, t.state.size(0));
  HYDRA_ASSERT(t.out.stride(2) == 1 && t.conv_out.stride(1) == 1 && t.inv_norm.stride(1) == 1 && t.beta.stride(1) == 1 &&
                   t.g.stride(1) == 1 && t.x.stride(1) == 1 && t.conv_w.stride(1) == 1 && t.b_logits.stride(1) == 1 &&
                   t.a_logits.stride(1) == 1 && t.a_log.is_contiguous() && t.dt_bias.is_contiguous() &&
                   t.positions.is_contiguous() && (!t.slots.defined() || t.slots.is_contiguous()),
               "GDN decode (fused): unit last strides needed");
  if (rows == 0 || heads == 0) return;
  const FusedArgs a{.out = static_cast<bf16_t*>(t.out.data()), .out_stride_b = t.out.stride(0),
                    .out_stride_h = t.out.stride(1), .conv_out = static_cast<bf16_t*>(t.conv_out.data()),
                    .conv_stride = t.conv_out.stride(0), .inv_norm = static_cast<float*>(t.inv_norm.data()),
                    .inv_stride = t.inv_norm.stride(0), .beta_out = static_cast<float*>(t.beta.data()),
                    .beta_stride = t.beta.stride(0), .g_out = static_cast<float*>(t.g.data()), .g_stride = t.g.stride(0),
                    .state = static_cast<float*>(t.state.data()),
                    .tail = t.tail.defined() ? static_cast<bf16_t*>(t.tail.data()) : nullptr,
                    .slots = t.slots.defined() ? static_cast<const int32_t*>(t.slots.data()) : nullptr,
                    .pos = static_cast<const int64_t*>(t.positions.data()),
                    .x = static_cast<const bf16_t*>(t.x.data()), .x_stride = t.x.stride(0),
                    .w = static_cast<const float*>(t.conv_w.data()), .w_stride = t.conv_w.stride(0),
                    .b_logits = static_cast<const bf16_t*>(t.b_logits.data()), .b_stride = t.b_logits.stride(0),
                    .a_logits = static_cast<const bf16_t*>(t.a_logits.data()), .a_stride = t.a_logits.stride(0),
                    .a_log = static_cast<const float*>(t.a_log.data()),
                    .dt_bias = static_cast<const float*>(t.dt_bias.data()), .heads = heads, .channels = channels,
                    .taps = static_cast<int>(taps), .log_theta_over_d = rope_log_theta_over_d(qk.rope_theta, d),
                    .eps = qk.l2_eps, .scale = scale};
  const dim3 grid(static_cast<unsigned>(d / kCols), static_cast<unsigned>(heads), static_cast<unsigned>(rows));
  cuda::launch(d == 64 ? gdn_decode_fused_kernel<64> : gdn_decode_fused_kernel<128>, grid, kThreads, 0, a);
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
