// CUDA decode-step attention (attention_decode.h): flash decoding over a bf16 cache.
//
// attention_decode_split_kernel: one CTA per (row b, KV head, chunk of keys). The CTA serves every
// query head that reads its KV head (GQA: up to G ≤ 16 of them), so each cached key and value is
// read from memory once per step. A key row of d bf16 is spread over L = d/8 lanes (16 bytes each:
// d = 128 → 16 lanes, two keys per warp access), so a warp's loads of one round cover 2 (d = 128) or
// 4 (d = 64) consecutive keys of 256/128 bytes, and the four warps of a CTA cover consecutive keys
// too: a round of the CTA reads one contiguous run of the cache. Each lane issues the loads of U = 4
// rounds (its K and V words) before it uses any, which keeps 128 bytes per lane in flight. Scores are
// L-lane sums (xor shuffles); the softmax is online per lane group in the exp2 domain (the query is
// pre-scaled by scale·τ·log2 e), one rescale per U keys. At the end the lane groups of a warp are
// combined by shuffles, the warps through shared memory, and the chunk's (out, lse) written: fp32,
// out normalised, lse natural log, as attention.h's merge expects. The chunks' partials are merged
// by attention_merge_partials_kernel (one CTA per (row, head): lse = m + log Σ e^{lse_i − m},
// out = Σ e^{lse_i − lse} out_i, the parts spread over its warps), the same kernel that merges the
// ranks' partials.
//
// Chunking: enough CTAs for about four per SM at the longest row (B · Hk · chunks ≥ 4 · SMs), at
// least 256 keys a chunk (a multiple of the CTA's 32- or 64-key round set); one chunk writes the
// final (out, lse) directly.
#include <cmath>
#include <vector>

#include "kernels/attention/attention_decode.h"
#include "kernels/attention/attention_tau.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vector.cuh"

namespace hydra::ops::cuda_impl {
namespace {

constexpr int kWarps = 4;
constexpr int kRounds = 4;          // U: rounds of loads in flight per lane
constexpr int kMaxQueryHeads = 128;
constexpr int kMaxGroup = 16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct DecodeArgs {
  const bf16_t* q;  // [B, Hq, d] with strides
  int64_t q_stride_b, q_stride_h;
  const bf16_t* k;  // [S, cap, Hk, d] contiguous
  const bf16_t* v;
  int64_t cache_stride_slot, cache_stride_row;  // elements; head stride is d
  const int32_t* slots;  // [B] or null
  const int32_t* lengths;
  const int64_t* positions;  // [B] or null (no τ)
  float* out;    // [n_split, B, Hq, dv] (n_split = 1: the final out)
  float* lse;    // [n_split, Hq, B]
  int64_t rows, hq, hk;
  int64_t chunk;  // keys per CTA
  double scale, tau_log_base;
  // Query heads grouped by KV head: heads[group_begin[g] .. group_begin[g + 1]) read KV head g.
  int16_t heads[kMaxQueryHeads];
  int16_t group_begin[kMaxQueryHeads + 1];
};

// 2^x, 0 at −inf (the approximate unit gives +0 there; callers never pass NaN: −inf − −inf is guarded).
__device__ __forceinline__ float exp2_or_zero(float x) { return cuda::fast_exp2(x); }

template <int D, int G>
__global__ void __launch_bounds__(32 * kWarps) attention_decode_split_kernel(const __grid_constant__ DecodeArgs a) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  constexpr int L = D / 8;            // lanes per key
  constexpr int KPW = 32 / L;         // keys per warp access
  constexpr int KEYS_PER_ROUND = KPW * kWarps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane % L, group = lane / L;  // element block of a key, key within the warp access
  const int64_t b = blockIdx.y / a.hk, kvh = blockIdx.y % a.hk, split = blockIdx.x;
  const int h0 = a.group_begin[kvh], nh = a.group_begin[kvh + 1] - h0;
  const int64_t slot = a.slots != nullptr ? a.slots[b] : b;
  const int64_t len = a.lengths[b];
  const int64_t key_begin = split * a.chunk, key_end = min(len, key_begin + a.chunk);

  // The query rows of the group, pre-scaled into the exp2 domain.
  double factor = a.scale;
  if (a.tau_log_base > 0) factor *= tau_f64(a.positions[b], a.tau_log_base);
  const float qscale = float(factor) * kLog2e;
  float q[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g < nh) {
      cuda::load_bf16<8>(a.q + b * a.q_stride_b + a.heads[h0 + g] * a.q_stride_h + sub * 8, q[g]);
#pragma unroll
      for (int e = 0; e < 8; ++e) q[g][e] *= qscale;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) q[g][e] = 0.0f;
    }
  }
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }
  const bf16_t* kbase = a.k + slot * a.cache_stride_slot + kvh * D + sub * 8;
  const bf16_t* vbase = a.v + slot * a.cache_stride_slot + kvh * D + sub * 8;
  for (int64_t t0 = key_begin; t0 < key_end; t0 += int64_t{KEYS_PER_ROUND} * kRounds) {
    cuda::Bf16Word<8> kw[kRounds], vw[kRounds];
    bool valid[kRounds];
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {  // all loads first
      const int64_t key = t0 + int64_t(u) * KEYS_PER_ROUND + warp * KPW + group;
      valid[u] = key < key_end;
      if (valid[u]) {
        kw[u] = cuda::load_bf16_word<8>(kbase + key * a.cache_stride_row);
        vw[u] = cuda::load_bf16_word<8>(vbase + key * a.cache_stride_row);
      } else {
        kw[u] = vw[u] = cuda::Bf16Word<8>{};
      }
    }
    float s[kRounds][G];
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      float kf[8];
      cuda::unpack_bf16<8>(kw[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += q[g][e] * kf[e];
#pragma unroll
        for (int o = L / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        s[u][g] = valid[u] ? dot : -INFINITY;
      }
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < kRounds; ++u) m_new = fmaxf(m_new, s[u][g]);
      if (m_new == -INFINITY) continue;  // no key of this lane group yet
      const float corr = exp2_or_zero(m[g] - m_new);
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
      m[g] = m_new;
#pragma unroll
      for (int u = 0; u < kRounds; ++u) {
        const float p = exp2_or_zero(s[u][g] - m_new);
        float vf[8];
        cuda::unpack_bf16<8>(vw[u], vf);
        l[g] += p;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += p * vf[e];
      }
    }
  }
  // Combine the lane groups of the warp (lanes sub, sub + L, ...), then the warps.
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int o = L; o < 32; o *= 2) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float l2 = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float mm = fmaxf(m[g], m2);
      const float c1 = mm == -INFINITY ? 0.0f : exp2_or_zero(m[g] - mm);
      const float c2 = mm == -INFINITY ? 0.0f : exp2_or_zero(m2 - mm);
      l[g] = l[g] * c1 + l2 * c2;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] = acc[g][e] * c1 + __shfl_xor_sync(0xffffffffu, acc[g][e], o) * c2;
      m[g] = mm;
    }
  }
  __shared__ float sm_m[kWarps][G], sm_l[kWarps][G];
  __shared__ float sm_acc[kWarps][G][D];
  if (group == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      if (sub == 0) {
        sm_m[warp][g] = m[g];
        sm_l[warp][g] = l[g];
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) sm_acc[warp][g][sub * 8 + e] = acc[g][e];
    }
  }
  __syncthreads();
  // Thread i writes element i % D of head i / D (G·D outputs over 128 threads).
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, e = i % D;
    if (g >= nh) continue;
    float mm = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mm = fmaxf(mm, sm_m[w][g]);
    float lsum = 0.0f, o = 0.0f;
    if (mm != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float c = exp2_or_zero(sm_m[w][g] - mm);
        lsum += sm_l[w][g] * c;
        o += sm_acc[w][g][e] * c;
      }
    }
    const int64_t h = a.heads[h0 + g];
    const bool any = lsum > 0.0f;
    a.out[((split * a.rows + b) * a.hq + h) * D + e] = any ? o / lsum : 0.0f;
    if (e == 0) a.lse[(split * a.hq + h) * a.rows + b] = any ? (mm + log2f(lsum)) * kLn2 : -INFINITY;
  }
}

// out [B, Hq, dv], lse [Hq, B] ← merge of parts [n, B, Hq, dv] / [n, Hq, B] (strided: see MergeArgs).
struct MergeArgs {
  float* out;
  float* lse;
  const float* part_out;
  const float* part_lse;
  int64_t n, rows, hq, dv;
  int64_t out_stride_b, out_stride_h;               // out [B, Hq, dv], unit last stride
  int64_t lse_stride_h;                             // lse [Hq, B], unit stride over B
  int64_t part_stride_n, part_stride_b, part_stride_h;
  int64_t part_lse_stride_n, part_lse_stride_h;
};

// One CTA of 8 warps per (row, head). The lse of every part first (max, then Σ e^{lse_i − m}, block
// reductions), then warp w takes parts w, w + 8, … with lane l owning columns l, l + 32, … (coalesced
// 128-byte rows), four parts in flight per loop; the warps' sums meet in shared memory in a fixed
// order. The split kernel leaves up to ~4·SMs parts per (row, KV head) at long context: walking them
// in one thread would be a chain of hundreds of dependent-latency loads.
constexpr int kMergeWarps = 8;
constexpr int kMergeMaxDv = 128;

__global__ void __launch_bounds__(32 * kMergeWarps) attention_merge_partials_kernel(const MergeArgs a) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  const int64_t b = blockIdx.x / a.hq, h = blockIdx.x % a.hq;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float* lse_of = a.part_lse + h * a.part_lse_stride_h + b;  // part i at [i · part_lse_stride_n]
  __shared__ float red[kMergeWarps];
  __shared__ float acc_sm[kMergeWarps][kMergeMaxDv];
  // m = max_i lse_i.
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < a.n; i += blockDim.x) m = fmaxf(m, lse_of[i * a.part_lse_stride_n]);
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  for (int w = 1; w < kMergeWarps; ++w) m = fmaxf(m, red[w]);
  __syncthreads();
  // total = m + log Σ_i e^{lse_i − m}.
  float sum = 0.0f;
  if (m != -INFINITY) {
    for (int64_t i = threadIdx.x; i < a.n; i += blockDim.x) {
      const float x = lse_of[i * a.part_lse_stride_n];
      sum += x == -INFINITY ? 0.0f : expf(x - m);
    }
  }
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int w = 0; w < kMergeWarps; ++w) sum += red[w];
  const float total = m == -INFINITY ? -INFINITY : m + logf(sum);
  // out = Σ_i e^{lse_i − total} out_i.
  float acc[kMergeMaxDv / 32] = {};
  if (total != -INFINITY) {
    const float* part = a.part_out + b * a.part_stride_b + h * a.part_stride_h;
#pragma unroll 4
    for (int64_t i = warp; i < a.n; i += kMergeWarps) {
      const float x = lse_of[i * a.part_lse_stride_n];
      const float wgt = x == -INFINITY ? 0.0f : expf(x - total);
#pragma unroll
      for (int j = 0; j < kMergeMaxDv / 32; ++j) {
        const int64_t c = lane + 32 * j;
        if (c < a.dv) acc[j] += wgt * part[i * a.part_stride_n + c];
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kMergeMaxDv / 32; ++j) acc_sm[warp][lane + 32 * j] = acc[j];
  __syncthreads();
  for (int64_t c = threadIdx.x; c < a.dv; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kMergeWarps; ++w) o += acc_sm[w][c];
    a.out[b * a.out_stride_b + h * a.out_stride_h + c] = o;
  }
  if (threadIdx.x == 0) a.lse[h * a.lse_stride_h + b] = total;
}

void launch_merge(const TensorView& out, const TensorView& lse, const TensorView& part_out, const TensorView& part_lse) {
  cuda::expect_cuda(out, "merge out", DType::f32);
  cuda::expect_cuda(lse, "merge lse", DType::f32);
  cuda::expect_cuda(part_out, "merge parts", DType::f32);
  cuda::expect_cuda(part_lse, "merge parts lse", DType::f32);
  HYDRA_ASSERT(out.stride(2) == 1 && lse.stride(1) == 1 && part_out.stride(3) == 1 && part_lse.stride(2) == 1,
               "attention merge: unit last strides needed");
  HYDRA_ASSERT(out.size(2) <= kMergeMaxDv, "attention merge: dv {} (at most {})", out.size(2), kMergeMaxDv);
  const MergeArgs a{.out = static_cast<float*>(out.data()), .lse = static_cast<float*>(lse.data()),
                    .part_out = static_cast<const float*>(part_out.data()),
                    .part_lse = static_cast<const float*>(part_lse.data()),
                    .n = part_out.size(0), .rows = out.size(0), .hq = out.size(1), .dv = out.size(2),
                    .out_stride_b = out.stride(0), .out_stride_h = out.stride(1), .lse_stride_h = lse.stride(0),
                    .part_stride_n = part_out.stride(0), .part_stride_b = part_out.stride(1),
                    .part_stride_h = part_out.stride(2), .part_lse_stride_n = part_lse.stride(0),
                    .part_lse_stride_h = part_lse.stride(1)};
  const int64_t blocks = a.rows * a.hq;
  if (blocks == 0) return;
  cuda::launch(attention_merge_partials_kernel, static_cast<unsigned>(blocks), 32 * kMergeWarps, 0, a);
  HYDRA_CUDA_LAUNCH_CHECK();
}

template <int D, int G>
void launch_split(const DecodeArgs& a, int64_t splits) {
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(a.rows * a.hk));
  cuda::launch(attention_decode_split_kernel<D, G>, grid, 32 * kWarps, 0, a);
  HYDRA_CUDA_LAUNCH_CHECK();
}

template <int D>
void launch_split_d(const DecodeArgs& a, int64_t splits, int group) {
  if (group <= 1) return launch_split<D, 1>(a, splits);
  if (group <= 2) return launch_split<D, 2>(a, splits);
  if (group <= 4) return launch_split<D, 4>(a, splits);
  if (group <= 8) return launch_split<D, 8>(a, splits);
  launch_split<D, 16>(a, splits);
}

}  // namespace

void attention_decode(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k_cache,
                      const TensorView& v_cache, const TensorView& slots, const TensorView& lengths,
                      int64_t max_length, const TensorView& q_positions, const AttentionParams& params) {
  const int64_t rows = q.size(0), hq = q.size(1), d = q.size(2), hk = k_cache.size(2);
  cuda::expect_cuda(q, "decode q", DType::bf16);
  cuda::expect_cuda(k_cache, "decode k cache", DType::bf16);
  cuda::expect_cuda(v_cache, "decode v cache", DType::bf16);
  cuda::expect_cuda(out, "decode out", DType::f32);
  cuda::expect_cuda(lse, "decode lse", DType::f32);
  HYDRA_ASSERT(d == 64 || d == 128, "decode attention: head dim {} (the kernel takes 64 or 128)", d);
  HYDRA_ASSERT(v_cache.size(3) == d, "decode attention: dv {} != d {}", v_cache.size(3), d);
  HYDRA_ASSERT(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.stride(0) == v_cache.stride(0),
               "decode attention: contiguous caches of one layout needed");
  HYDRA_ASSERT(q.stride(2) == 1 && q.stride(1) % 8 == 0 && q.stride(0) % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(q.data()) % 16 == 0,
               "decode attention: q rows must be 16-byte aligned with unit last stride");
  HYDRA_ASSERT(out.is_contiguous() && lse.is_contiguous(), "decode attention: contiguous out and lse needed");
  HYDRA_ASSERT(hq <= kMaxQueryHeads, "decode attention: {} query heads (at most {})", hq, kMaxQueryHeads);
  DecodeArgs a{};
  // Group the query heads by KV head (host), and the largest group picks the kernel.
  std::vector<std::vector<int>> by_kv(static_cast<size_t>(hk));
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t kvh = params.kv_head_of_query.empty() ? h / (hq / hk) : params.kv_head_of_query[static_cast<size_t>(h)];
    HYDRA_ASSERT(kvh >= 0 && kvh < hk, "decode attention: query head {} maps to KV head {} of {}", h, kvh, hk);
    by_kv[static_cast<size_t>(kvh)].push_back(static_cast<int>(h));
  }
  int group = 1, at = 0;
  for (int64_t g = 0; g < hk; ++g) {
    a.group_begin[g] = static_cast<int16_t>(at);
    for (const int h : by_kv[static_cast<size_t>(g)]) a.heads[at++] = static_cast<int16_t>(h);
    group = std::max(group, static_cast<int>(by_kv[static_cast<size_t>(g)].size()));
  }
  a.group_begin[hk] = static_cast<int16_t>(at);
  HYDRA_ASSERT(group <= kMaxGroup, "decode attention: {} query heads share one KV head (at most {})", group, kMaxGroup);
  if (rows == 0) return;
  // The longest row decides the chunking: the caller's bound, so no device-to-host read (a sync) per call.
  const int64_t longest = std::max<int64_t>(max_length, 1);
  const int64_t round = (32 / (d / 8)) * kWarps * kRounds;  // keys per CTA iteration
  const int64_t pairs = rows * hk, target = 4 * static_cast<int64_t>(cuda::sm_count());
  int64_t chunk = std::max<int64_t>(256, (longest + std::max<int64_t>(1, target / pairs) - 1) / std::max<int64_t>(1, target / pairs));
  chunk = (chunk + round - 1) / round * round;
  const int64_t splits = std::max<int64_t>(1, (longest + chunk - 1) / chunk);

  a.q = static_cast<const bf16_t*>(q.data());
  a.q_stride_b = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.k = static_cast<const bf16_t*>(k_cache.data());
  a.v = static_cast<const bf16_t*>(v_cache.data());
  a.cache_stride_slot = k_cache.stride(0);
  a.cache_stride_row = k_cache.stride(1);
  a.slots = slots.defined() ? static_cast<const int32_t*>(slots.data()) : nullptr;
  a.lengths = static_cast<const int32_t*>(lengths.data());
  a.positions = params.tau_log_base > 0 ? static_cast<const int64_t*>(q_positions.data()) : nullptr;
  a.rows = rows;
  a.hq = hq;
  a.hk = hk;
  a.chunk = chunk;
  a.scale = params.scale > 0 ? params.scale : 1.0 / std::sqrt(static_cast<double>(d));
  a.tau_log_base = params.tau_log_base;
  Tensor part_out, part_lse;
  if (splits == 1) {
    a.out = static_cast<float*>(out.data());
    a.lse = static_cast<float*>(lse.data());
  } else {
    part_out = Tensor::empty({splits, rows, hq, d}, DType::f32, Device::cuda);
    part_lse = Tensor::empty({splits, hq, rows}, DType::f32, Device::cuda);
    a.out = static_cast<float*>(part_out.data());
    a.lse = static_cast<float*>(part_lse.data());
  }
  if (d == 64) {
    launch_split_d<64>(a, splits, group);
  } else {
    launch_split_d<128>(a, splits, group);
  }
  if (splits > 1) launch_merge(out, lse, part_out, part_lse);
}

void attention_merge_partials(const TensorView& out, const TensorView& lse, const TensorView& part_out,
                              const TensorView& part_lse) {
  launch_merge(out, lse, part_out, part_lse);
}

namespace {

// Row b of k_new/v_new [B, Hk, d] (row and head strides, unit last) → row rows[b] of slot slots[b].
template <class T>
__global__ void kv_cache_append_kernel(T* kc, T* vc, int64_t cache_stride_slot, int64_t cache_stride_row,
                                       int64_t cache_stride_head, const T* kn, const T* vn, int64_t k_stride_b,
                                       int64_t k_stride_h, int64_t v_stride_b, int64_t v_stride_h, int64_t d, int64_t dv,
                                       int64_t hk, const int32_t* slots, const int32_t* rows) {
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  const int64_t b = blockIdx.x / hk, h = blockIdx.x % hk;
  const int64_t row = rows[b];
  if (row < 0) return;
  const int64_t slot = slots != nullptr ? slots[b] : b;
  const int64_t base = slot * cache_stride_slot + row * cache_stride_row + h * cache_stride_head;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) kc[base + c] = kn[b * k_stride_b + h * k_stride_h + c];
  for (int64_t c = threadIdx.x; c < dv; c += blockDim.x) vc[base + c] = vn[b * v_stride_b + h * v_stride_h + c];
}

}  // namespace

void kv_cache_append(const TensorView& k_cache, const TensorView& v_cache, const TensorView& k_new,
                     const TensorView& v_new, const TensorView& slots, const TensorView& rows) {
  HYDRA_ASSERT(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.stride(1) == v_cache.stride(1) &&
                   k_cache.size(3) == v_cache.size(3),
               "append: contiguous caches of one layout needed");
  HYDRA_ASSERT(k_new.stride(2) == 1 && v_new.stride(2) == 1, "append: unit last stride needed");
  const int64_t n = k_new.size(0), hk = k_new.size(1);
  if (n == 0) return;
  const unsigned blocks = static_cast<unsigned>(n * hk);
  const int32_t* slot_ptr = slots.defined() ? static_cast<const int32_t*>(slots.data()) : nullptr;
  const int32_t* row_ptr = static_cast<const int32_t*>(rows.data());
  const auto launch = [&](auto zero) {
    using T = decltype(zero);
    cuda::launch(kv_cache_append_kernel<T>, blocks, 128, 0,
        static_cast<T*>(k_cache.data()), static_cast<T*>(v_cache.data()), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), static_cast<const T*>(k_new.data()), static_cast<const T*>(v_new.data()), k_new.stride(0),
        k_new.stride(1), v_new.stride(0), v_new.stride(1), k_new.size(2), v_new.size(2), hk, slot_ptr, row_ptr);
  };
  if (k_cache.dtype() == DType::bf16) {
    launch(bf16_t{});
  } else {
    HYDRA_ASSERT(k_cache.dtype() == DType::f32, "append: bf16 or f32 caches (is {})", dtype_name(k_cache.dtype()));
    launch(float{});
  }
  HYDRA_CUDA_LAUNCH_CHECK();
}

}  // namespace hydra::ops::cuda_impl
