// The decode attention's split kernel arguments and chunk epilogue (attention_decode.h), included
// only by attention_decode.cu (the pipelined kernel).
//
// The kernel splits the keys of each (row b, KV head) into chunks, one CTA of kWarps warps per
// chunk, the CTA serving every query head of its KV head (GQA: up to kMaxGroup of them, so the cache
// is read once per KV head). A key row of D bf16 is spread over L = D/8 lanes (16 bytes each), so one warp
// access covers 32/L consecutive keys and a CTA round kWarps times as many. Each CTA ends with the
// (out, lse) of its chunk (write_chunk_result): fp32, out normalised, lse natural log, −inf and
// out = 0 where the chunk holds no visible key, as attention.h's merge expects.
#pragma once

#include <cstdint>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_tau.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vector.cuh"
#include "runtime/tensor.h"

namespace hydra::ops::cuda_impl::decode {

constexpr int kWarps = 4;
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
  int64_t num_slots, capacity;                  // S, cap
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
  // The cache loads marked L2 evict-first (AttentionParams::decode_kv_evict_first). Last, so the
  // fields above keep their offsets and the plain kernel its machine code.
  bool kv_evict_first;
};

// Checks the call (attention_decode.h's contract on the GPU) and fills every field of `a` but out,
// lse and chunk; returns the largest number of query heads sharing one KV head (attention_decode.cu).
int decode_args(DecodeArgs& a, const TensorView& out, const TensorView& lse, const TensorView& q,
                const TensorView& k_cache, const TensorView& v_cache, const TensorView& slots,
                const TensorView& lengths, const TensorView& q_positions, const AttentionParams& params);

// The query rows of head group [h0, h0 + nh) of row b for lane element block `sub`, pre-scaled by
// scale·τ·log2 e (the exp2 domain); rows g ≥ nh are zero.
template <int G>
__device__ __forceinline__ void load_scaled_queries(const DecodeArgs& a, int64_t b, int h0, int nh, int sub,
                                                    float (&q)[G][8]) {
  double factor = a.scale;
  if (a.tau_log_base > 0) factor *= tau_f64(a.positions[b], a.tau_log_base);
  const float qscale = float(factor) * kLog2e;
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
}

// The end of a split CTA: the online-softmax states (m in the exp2 domain, l, acc) of each lane
// group of a warp (lanes sub, sub + L, ...) are combined by xor shuffles, the warps' through shared
// memory in warp order, and chunk `split`'s (out, lse) written for the nh heads of the group.
template <int D, int G>
__device__ __forceinline__ void write_chunk_result(const DecodeArgs& a, int64_t split, int64_t b, int h0, int nh,
                                                   float (&m)[G], float (&l)[G], float (&acc)[G][8]) {
  constexpr int L = D / 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane % L, group = lane / L;
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int o = L; o < 32; o *= 2) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float l2 = __shfl_xor_sync(0xffffffffu, l[g], o);
      const float mm = fmaxf(m[g], m2);
      const float c1 = mm == -INFINITY ? 0.0f : cuda::fast_exp2(m[g] - mm);
      const float c2 = mm == -INFINITY ? 0.0f : cuda::fast_exp2(m2 - mm);
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
  // Thread i writes element i % D of head i / D (G·D outputs over the CTA's threads).
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
        const float c = cuda::fast_exp2(sm_m[w][g] - mm);
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

}  // namespace hydra::ops::cuda_impl::decode
