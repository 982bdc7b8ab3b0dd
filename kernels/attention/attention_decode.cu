// CUDA decode-step attention (attention_decode.h): flash decoding over a bf16 cache, pipelined.
//
// attention_decode_pipelined_kernel (attention_decode_split.cuh: its arguments and chunk epilogue):
// one CTA of 4 warps per (row b, KV head, chunk of keys), serving every query head of the
// KV head. Each lane owns one key of every round (a round: 32/L keys a warp, 4 warps: d = 128 → 8
// keys, 4 KB of K and V) and keeps U rounds of its K words and U of its V words in registers
// (U = 8 for groups of ≤ 2 heads, 4 for ≤ 4, 2 beyond: the queries and accumulators take the rest).
// The loads run ahead of the math: the K words of the next U rounds are issued as soon as this
// iteration's scores are taken, its V words as soon as they are accumulated, so a lane always has
// U·32 bytes in flight instead of issuing a burst and waiting for all of it (the kernels it
// replaced kept 128 bytes, then nothing: one dependent round trip per 32 keys). Scores are L-lane sums (xor
// shuffles); the softmax is online per lane group in the exp2 domain, one rescale per U keys.
//
// Before griddepcontrol.wait (PDL: the previous kernel, the cache append, may still run) each lane
// only prefetches the first two iterations of its chunk into L2 (prefetch.global.L2, no register
// written, nothing read into the result): every row but the one being appended is final by then,
// L2 is the GPU's point of coherence, so the appended row's line is updated in L2 by the append
// and reread after the wait. The slot index read for those addresses is clamped into the cache; it
// only steers the prefetch. This overlaps the first DRAM round trip of the chunk with the append.
//
// Chunking: as many CTAs as fit on the GPU at once (the occupancy of the instantiation × SMs, or
// AttentionParams::decode_ctas_per_sm × SMs), spread over the (row, KV head) pairs at the longest
// row, with at least two iterations a chunk; one chunk writes the final (out, lse) directly.
//
// attention_merge_columns_kernel merges the chunks' partials, and the ranks' (model/kv_cache.cpp):
// one CTA of 256 threads per (row, head, 16 columns): the n lse of the (row, head) are read once into
// shared memory (every thread a few, all loads independent), lse = m + log Σ e^{lse_i − m} by block
// reductions, the weights e^{lse_i − lse} kept in shared memory; then the CTA's 16 columns of all n
// parts are read with every thread's loads independent (float4 where the strides allow: 64 parts
// a pass, 8 passes unrolled), summed per thread in part order, then over the warp by a fixed xor
// tree and over the warps in warp order: deterministic (the same bits for the same parts, whatever
// the timing, so every rank merging the same gathered parts gets the same result).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/attention/attention_decode.h"
#include "kernels/attention/attention_decode_split.cuh"

namespace hydra::ops::cuda_impl {
namespace decode {

int decode_args(DecodeArgs& a, const TensorView& out, const TensorView& lse, const TensorView& q,
                const TensorView& k_cache, const TensorView& v_cache, const TensorView& slots,
                const TensorView& lengths, const TensorView& q_positions, const AttentionParams& params) {
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
  // Group the query heads by KV head (host); the largest group picks the kernel.
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
  a.q = static_cast<const bf16_t*>(q.data());
  a.q_stride_b = q.stride(0);
  a.q_stride_h = q.stride(1);
  a.k = static_cast<const bf16_t*>(k_cache.data());
  a.v = static_cast<const bf16_t*>(v_cache.data());
  a.cache_stride_slot = k_cache.stride(0);
  a.cache_stride_row = k_cache.stride(1);
  a.num_slots = k_cache.size(0);
  a.capacity = k_cache.size(1);
  a.slots = slots.defined() ? static_cast<const int32_t*>(slots.data()) : nullptr;
  a.lengths = static_cast<const int32_t*>(lengths.data());
  a.positions = params.tau_log_base > 0 ? static_cast<const int64_t*>(q_positions.data()) : nullptr;
  a.rows = rows;
  a.hq = hq;
  a.hk = hk;
  a.scale = params.scale > 0 ? params.scale : 1.0 / std::sqrt(static_cast<double>(d));
  a.tau_log_base = params.tau_log_base;
  a.kv_evict_first = params.decode_kv_evict_first;
  return group;
}

namespace {

// U: rounds of K (and of V) words a lane keeps in flight; and the CTAs per SM the registers allow.
constexpr int rounds_for(int group) { return group <= 2 ? 8 : group <= 4 ? 4 : 2; }
constexpr int min_blocks_for(int group) { return group <= 4 ? 3 : group <= 8 ? 2 : 1; }

// EvictFirst: the cache loads carry an L2 evict-first policy (a.kv_evict_first; a template
// parameter, so the default instantiation's code is the plain loads' alone).
template <int D, int G, bool EvictFirst>
__global__ void __launch_bounds__(32 * kWarps, min_blocks_for(G))
    attention_decode_pipelined_kernel(const __grid_constant__ DecodeArgs a) {
  constexpr int L = D / 8;            // lanes per key
  constexpr int KPW = 32 / L;         // keys per warp access
  constexpr int KEYS_PER_ROUND = KPW * kWarps;
  constexpr int U = rounds_for(G);
  constexpr int64_t STEP = int64_t{KEYS_PER_ROUND} * U;  // keys per iteration of the CTA
  using Word = cuda::Bf16Word<8>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane % L, group = lane / L;  // element block of a key, key within the warp access
  const int64_t b = blockIdx.y / a.hk, kvh = blockIdx.y % a.hk, split = blockIdx.x;
  const int64_t key_begin = split * a.chunk;
  const int64_t lane_key = warp * KPW + group;  // this lane's key in round 0 of an iteration, from its start
  {  // Before the wait: the L2 prefetch of the chunk's first two iterations (see the file header).
    const int64_t hint = a.slots != nullptr ? a.slots[b] : b;
    const int64_t slot = min(max(hint, int64_t{0}), a.num_slots - 1);
    const int64_t stop = min(a.capacity, key_begin + min(a.chunk, 2 * STEP));
    const int64_t offset = slot * a.cache_stride_slot + kvh * D + sub * 8;
    if (sub % 8 == 0) {  // one lane per 128-byte line
#pragma unroll
      for (int r = 0; r < 2 * U; ++r) {
        const int64_t key = key_begin + int64_t(r) * KEYS_PER_ROUND + lane_key;
        if (key < stop) {
          cuda::prefetch_l2(a.k + offset + key * a.cache_stride_row);
          cuda::prefetch_l2(a.v + offset + key * a.cache_stride_row);
        }
      }
    }
  }
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  const int h0 = a.group_begin[kvh], nh = a.group_begin[kvh + 1] - h0;
  const int64_t slot = a.slots != nullptr ? a.slots[b] : b;
  const int64_t key_end = min(int64_t{a.lengths[b]}, key_begin + a.chunk);
  const bf16_t* kbase = a.k + slot * a.cache_stride_slot + kvh * D + sub * 8;
  const bf16_t* vbase = a.v + slot * a.cache_stride_slot + kvh * D + sub * 8;
  // The words of the U rounds of the iteration starting at key t (zero past the chunk's end). Under
  // the decode weight prefetch (EvictFirst) the cache stream is marked L2 evict-first, so it does not
  // push out the weights prefetched for the projections after it (read once a step, it gains nothing
  // from L2).
  const auto load_rounds = [&](Word (&w)[U], const bf16_t* base, int64_t t) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t key = t + int64_t(u) * KEYS_PER_ROUND + lane_key;
      if constexpr (EvictFirst) {
        w[u] = key < key_end ? cuda::load_bf16_word_evict_first(base + key * a.cache_stride_row) : Word{};
      } else {
        w[u] = key < key_end ? cuda::load_bf16_word<8>(base + key * a.cache_stride_row) : Word{};
      }
    }
  };
  Word kw[U], vw[U];
  load_rounds(kw, kbase, key_begin);
  load_rounds(vw, vbase, key_begin);
  float q[G][8];
  load_scaled_queries<G>(a, b, h0, nh, sub, q);
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }
  for (int64_t t0 = key_begin; t0 < key_end; t0 += STEP) {
    float s[U][G];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool valid = t0 + int64_t(u) * KEYS_PER_ROUND + lane_key < key_end;
      float kf[8];
      cuda::unpack_bf16<8>(kw[u], kf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += q[g][e] * kf[e];
#pragma unroll
        for (int o = L / 2; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        s[u][g] = valid ? dot : -INFINITY;
      }
    }
    load_rounds(kw, kbase, t0 + STEP);  // the next iteration's keys, in flight during the rest
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float m_new = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) m_new = fmaxf(m_new, s[u][g]);
      if (m_new == -INFINITY) continue;  // no key of this lane group yet
      const float corr = cuda::fast_exp2(m[g] - m_new);
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
      m[g] = m_new;
#pragma unroll
      for (int u = 0; u < U; ++u) s[u][g] = cuda::fast_exp2(s[u][g] - m_new);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float vf[8];
      cuda::unpack_bf16<8>(vw[u], vf);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (m[g] == -INFINITY) continue;  // s[u][g] is still a score (−inf): no key yet
        l[g] += s[u][g];
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += s[u][g] * vf[e];
      }
    }
    load_rounds(vw, vbase, t0 + STEP);
  }
  write_chunk_result<D, G>(a, split, b, h0, nh, m, l, acc);
}

// CTAs of the plain instantiation that fit on one SM at once (queried once per instantiation: every
// device of a process is the same kind of GPU here).
template <int D, int G>
int pipelined_occupancy() {
  static const int blocks = [] {
    int n = 0;
    HYDRA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_decode_pipelined_kernel<D, G, false>,
                                                                   32 * kWarps, 0));
    return std::max(n, 1);
  }();
  return blocks;
}

template <int D, int G>
void run_pipelined(DecodeArgs& a, int64_t longest, int ctas_per_sm, const TensorView& out, const TensorView& lse) {
  constexpr int64_t step = int64_t{32 / (D / 8)} * kWarps * rounds_for(G);
  // The plain kernel's occupancy sizes the chunks with or without the evict-first hint, so the hint
  // never changes the chunking, and the result keeps its bits.
  const int per_sm = ctas_per_sm > 0 ? ctas_per_sm : pipelined_occupancy<D, G>();
  const int64_t target = int64_t{per_sm} * cuda::sm_count(), pairs = a.rows * a.hk;
  const int64_t per_pair = std::max<int64_t>(1, target / pairs);
  int64_t chunk = std::max<int64_t>(2 * step, (longest + per_pair - 1) / per_pair);
  chunk = (chunk + step - 1) / step * step;
  const int64_t splits = std::max<int64_t>(1, (longest + chunk - 1) / chunk);
  a.chunk = chunk;
  Tensor part_out, part_lse;
  if (splits == 1) {
    a.out = static_cast<float*>(out.data());
    a.lse = static_cast<float*>(lse.data());
  } else {
    part_out = Tensor::empty({splits, a.rows, a.hq, D}, DType::f32, Device::cuda);
    part_lse = Tensor::empty({splits, a.hq, a.rows}, DType::f32, Device::cuda);
    a.out = static_cast<float*>(part_out.data());
    a.lse = static_cast<float*>(part_lse.data());
  }
  const dim3 grid(static_cast<unsigned>(splits), static_cast<unsigned>(a.rows * a.hk));
  if (a.kv_evict_first) {
    cuda::launch(attention_decode_pipelined_kernel<D, G, true>, grid, 32 * kWarps, 0, a);
  } else {
    cuda::launch(attention_decode_pipelined_kernel<D, G, false>, grid, 32 * kWarps, 0, a);
  }
  HYDRA_CUDA_LAUNCH_CHECK();
  if (splits > 1) ops::cuda_impl::attention_merge_partials(out, lse, part_out, part_lse);
}

template <int D>
void run_pipelined_d(DecodeArgs& a, int group, int64_t longest, int ctas_per_sm, const TensorView& out,
                     const TensorView& lse) {
  if (group <= 1) return run_pipelined<D, 1>(a, longest, ctas_per_sm, out, lse);
  if (group <= 2) return run_pipelined<D, 2>(a, longest, ctas_per_sm, out, lse);
  if (group <= 4) return run_pipelined<D, 4>(a, longest, ctas_per_sm, out, lse);
  if (group <= 8) return run_pipelined<D, 8>(a, longest, ctas_per_sm, out, lse);
  run_pipelined<D, 16>(a, longest, ctas_per_sm, out, lse);
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

constexpr int kMergeThreads = 256;
constexpr int kMergeWarps = kMergeThreads / 32;
constexpr int kMergeColumns = 16;  // columns of out per CTA
constexpr int kMergeUnroll = 8;    // passes of loads issued before their sums
constexpr int64_t kMergeMaxParts = 48 * 1024 / 4;  // the weights fit the default 48 KB of shared memory

// The block-wide reduction of one value per thread (max or sum), in a fixed order; `red` is reused.
template <bool Max>
__device__ __forceinline__ float block_reduce(float x, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = Max ? fmaxf(x, y) : x + y;
  }
  if (lane == 0) red[warp] = x;
  __syncthreads();
  x = red[0];
#pragma unroll
  for (int w = 1; w < kMergeWarps; ++w) x = Max ? fmaxf(x, red[w]) : x + red[w];
  __syncthreads();
  return x;
}

// VEC: columns per load (4: float4, the strides allow it; 1 otherwise).
template <int VEC>
__global__ void __launch_bounds__(kMergeThreads) attention_merge_columns_kernel(const MergeArgs a) {
  extern __shared__ float weight[];  // [n]: lse_i, then e^{lse_i − lse}
  __shared__ float red[kMergeWarps];
  __shared__ float warp_sum[kMergeWarps][kMergeColumns];
  cuda::wait_for_previous_grid();  // launched through cuda::launch (PDL in a decode step)
  cuda::allow_next_grid();
  const int64_t b = blockIdx.x / a.hq, h = blockIdx.x % a.hq, c0 = int64_t{blockIdx.y} * kMergeColumns;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const float* lse_of = a.part_lse + h * a.part_lse_stride_h + b;  // part i at [i · part_lse_stride_n]
  float m = -INFINITY;
#pragma unroll 4
  for (int64_t i = tid; i < a.n; i += kMergeThreads) {
    const float x = lse_of[i * a.part_lse_stride_n];
    weight[i] = x;
    m = fmaxf(m, x);
  }
  m = block_reduce<true>(m, red);
  float sum = 0.0f;  // each thread rereads only the entries it wrote
  if (m != -INFINITY) {
    for (int64_t i = tid; i < a.n; i += kMergeThreads) sum += weight[i] == -INFINITY ? 0.0f : expf(weight[i] - m);
  }
  sum = block_reduce<false>(sum, red);
  const float total = m == -INFINITY ? -INFINITY : m + logf(sum);
  for (int64_t i = tid; i < a.n; i += kMergeThreads) {
    weight[i] = total == -INFINITY || weight[i] == -INFINITY ? 0.0f : expf(weight[i] - total);
  }
  __syncthreads();
  // Thread → (part offset r, column block q of VEC columns); R parts per pass.
  constexpr int Q = kMergeColumns / VEC, R = kMergeThreads / Q;
  const int q = tid % Q, r = tid / Q;
  const int64_t c = c0 + q * VEC;
  const bool column = c < a.dv;
  const float* part = a.part_out + b * a.part_stride_b + h * a.part_stride_h + c;
  float acc[VEC] = {};
  for (int64_t i0 = r; i0 < a.n; i0 += int64_t{R} * kMergeUnroll) {
    float x[kMergeUnroll][VEC], w[kMergeUnroll];
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {  // every load first
      const int64_t i = i0 + int64_t{u} * R;
      const bool in = column && i < a.n;
      w[u] = in ? weight[i] : 0.0f;
      if constexpr (VEC == 4) {
        const float4 v = in ? *reinterpret_cast<const float4*>(part + i * a.part_stride_n) : float4{0, 0, 0, 0};
        x[u][0] = v.x;
        x[u][1] = v.y;
        x[u][2] = v.z;
        x[u][3] = v.w;
      } else {
        x[u][0] = in ? part[i * a.part_stride_n] : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kMergeUnroll; ++u) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[e] += w[u] * x[u][e];
    }
  }
  // Lanes q, q + Q, ... of a warp hold the same columns: a fixed xor tree, then the warps in order.
#pragma unroll
  for (int o = Q; o < 32; o *= 2) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
  }
  if (lane < Q) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) warp_sum[warp][q * VEC + e] = acc[e];
  }
  __syncthreads();
  if (tid < kMergeColumns && c0 + tid < a.dv) {
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kMergeWarps; ++w) o += warp_sum[w][tid];
    a.out[b * a.out_stride_b + h * a.out_stride_h + c0 + tid] = o;
  }
  if (blockIdx.y == 0 && tid == 0) a.lse[h * a.lse_stride_h + b] = total;
}

}  // namespace
}  // namespace decode

void attention_decode(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k_cache,
                      const TensorView& v_cache, const TensorView& slots, const TensorView& lengths,
                      int64_t max_length, const TensorView& q_positions, const AttentionParams& params) {
  decode::DecodeArgs a{};
  const int group = decode::decode_args(a, out, lse, q, k_cache, v_cache, slots, lengths, q_positions, params);
  if (a.rows == 0) return;
  // The longest row decides the chunking: the caller's bound, so no device-to-host read (a sync) per call.
  const int64_t longest = std::max<int64_t>(max_length, 1);
  HYDRA_ASSERT(params.decode_ctas_per_sm >= 0, "decode attention: {} CTAs per SM", params.decode_ctas_per_sm);
  if (q.size(2) == 64) {
    decode::run_pipelined_d<64>(a, group, longest, params.decode_ctas_per_sm, out, lse);
  } else {
    decode::run_pipelined_d<128>(a, group, longest, params.decode_ctas_per_sm, out, lse);
  }
}

void attention_merge_partials(const TensorView& out, const TensorView& lse, const TensorView& part_out,
                              const TensorView& part_lse) {
  using namespace decode;
  cuda::expect_cuda(out, "merge out", DType::f32);
  cuda::expect_cuda(lse, "merge lse", DType::f32);
  cuda::expect_cuda(part_out, "merge parts", DType::f32);
  cuda::expect_cuda(part_lse, "merge parts lse", DType::f32);
  HYDRA_ASSERT(out.stride(2) == 1 && lse.stride(1) == 1 && part_out.stride(3) == 1 && part_lse.stride(2) == 1,
               "attention merge: unit last strides needed");
  const MergeArgs a{.out = static_cast<float*>(out.data()), .lse = static_cast<float*>(lse.data()),
                    .part_out = static_cast<const float*>(part_out.data()),
                    .part_lse = static_cast<const float*>(part_lse.data()),
                    .n = part_out.size(0), .rows = out.size(0), .hq = out.size(1), .dv = out.size(2),
                    .out_stride_b = out.stride(0), .out_stride_h = out.stride(1), .lse_stride_h = lse.stride(0),
                    .part_stride_n = part_out.stride(0), .part_stride_b = part_out.stride(1),
                    .part_stride_h = part_out.stride(2), .part_lse_stride_n = part_lse.stride(0),
                    .part_lse_stride_h = part_lse.stride(1)};
  HYDRA_ASSERT(a.n <= kMergeMaxParts, "attention merge: {} parts (at most {})", a.n, kMergeMaxParts);
  if (a.rows * a.hq == 0 || a.dv == 0) return;
  const dim3 grid(static_cast<unsigned>(a.rows * a.hq), static_cast<unsigned>((a.dv + kMergeColumns - 1) / kMergeColumns));
  const size_t shared = static_cast<size_t>(std::max<int64_t>(a.n, 1)) * sizeof(float);
  const bool vec4 = a.dv % 4 == 0 && a.part_stride_n % 4 == 0 && a.part_stride_b % 4 == 0 && a.part_stride_h % 4 == 0 &&
                    reinterpret_cast<uintptr_t>(a.part_out) % 16 == 0;
  if (vec4) {
    cuda::launch(attention_merge_columns_kernel<4>, grid, kMergeThreads, shared, a);
  } else {
    cuda::launch(attention_merge_columns_kernel<1>, grid, kMergeThreads, shared, a);
  }
  HYDRA_CUDA_LAUNCH_CHECK();
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
