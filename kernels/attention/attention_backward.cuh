// What the flash attention backward kernels share: their parameters (built once on the host from
// the ops interface), the visible-query range of a key block, τ, the tile schedule (BwdSteps), the
// dK/dV epilogue, and the two warp-level product shapes of the mma.sync kernel. Included only by
// attention_backward.cu.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kernels/attention/attention.h"
#include "kernels/attention/attention_tau.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace hydra::ops::cuda_impl {

constexpr int kBwdMaxHeads = 128;

struct BwdParams {
  const bf16_t* q;     // [Tq, Hq, d]
  const bf16_t* k;     // [Tk, Hk, d]
  const bf16_t* v;     // [Tk, Hk, d]
  const bf16_t* dout;  // [Tq, Hq, d]
  const float* lse;    // [Hq, Tq]
  const float* delta;  // [Hq, Tq]
  float* dq;           // [Tq, Hq, d] accumulator
  float* dk;           // [Tk, Hk, d] accumulator
  float* dv;           // [Tk, Hk, d] accumulator
  int64_t q_st, q_sh, k_st, k_sh, v_st, v_sh, do_st, do_sh, dq_st, dq_sh, dk_st, dk_sh, dv_st, dv_sh;
  int64_t lse_sh, lse_st, delta_sh, delta_st;
  int tq, tk;
  int64_t q_pos0, k_pos0;
  float scale;       // softmax scale
  float scale_log2;  // scale · log2(e)
  float tau_base;    // a of τ; 0 = off
  float inv_log_tau_base;
  int causal;
  // Packed documents (attention_mask.h): each query row's document start and each key row's
  // document end, global positions; null: one document. Only the mma.sync kernel takes them.
  const int64_t* q_doc_start;
  const int64_t* k_doc_end;
  // Query heads grouped by KV head: those of KV head g are heads_by_kv[group_begin[g] .. group_begin[g + 1]).
  int group_begin[kBwdMaxHeads + 1];
  int heads_by_kv[kBwdMaxHeads];
};

inline BwdParams make_bwd_params(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& d_out,
                                 const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& lse,
                                 const TensorView& delta, const AttentionParams& params) {
  BwdParams p{};
  p.q = q.data_as<const bf16_t>();
  p.k = k.data_as<const bf16_t>();
  p.v = v.data_as<const bf16_t>();
  p.dout = d_out.data_as<const bf16_t>();
  p.lse = lse.data_as<const float>();
  p.delta = delta.data_as<const float>();
  p.dq = dq.data_as<float>();
  p.dk = dk.data_as<float>();
  p.dv = dv.data_as<float>();
  p.q_st = q.stride(0), p.q_sh = q.stride(1);
  p.k_st = k.stride(0), p.k_sh = k.stride(1);
  p.v_st = v.stride(0), p.v_sh = v.stride(1);
  p.do_st = d_out.stride(0), p.do_sh = d_out.stride(1);
  p.dq_st = dq.stride(0), p.dq_sh = dq.stride(1);
  p.dk_st = dk.stride(0), p.dk_sh = dk.stride(1);
  p.dv_st = dv.stride(0), p.dv_sh = dv.stride(1);
  p.lse_sh = lse.stride(0), p.lse_st = lse.stride(1);
  p.delta_sh = delta.stride(0), p.delta_st = delta.stride(1);
  p.tq = static_cast<int>(q.size(0));
  p.tk = static_cast<int>(k.size(0));
  p.q_pos0 = params.q_position0;
  p.k_pos0 = params.k_position0;
  const int64_t d = q.size(2), hq = q.size(1), hk = k.size(1);
  p.scale = params.scale > 0 ? params.scale : 1.0f / std::sqrt(static_cast<float>(d));
  p.scale_log2 = p.scale * 1.4426950408889634f;
  p.tau_base = static_cast<float>(params.tau_log_base);
  p.inv_log_tau_base = inverse_log_tau_base(params.tau_log_base);
  p.causal = params.causality == Causality::causal;
  p.q_doc_start = params.q_document_start.defined() ? params.q_document_start.data_as<const int64_t>() : nullptr;
  p.k_doc_end = params.k_document_end.defined() ? params.k_document_end.data_as<const int64_t>() : nullptr;
  HYDRA_ASSERT(!params.q_document_start.defined() || params.q_document_start.stride(0) == 1,
               "attention backward: q_document_start must be contiguous");
  HYDRA_ASSERT(!params.k_document_end.defined() || params.k_document_end.stride(0) == 1,
               "attention backward: k_document_end must be contiguous");
  HYDRA_ASSERT(hk <= kBwdMaxHeads && (params.kv_head_of_query.empty() ? hq % hk == 0
                                                                     : static_cast<int64_t>(params.kv_head_of_query.size()) == hq),
               "attention backward: {} query heads, {} KV heads, mapping of {}", hq, hk, params.kv_head_of_query.size());
  int n = 0;
  for (int64_t g = 0; g < hk; ++g) {
    p.group_begin[g] = n;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kv = params.kv_head_of_query.empty() ? h / (hq / hk) : params.kv_head_of_query[h];
      HYDRA_ASSERT(kv >= 0 && kv < hk, "query head {} maps to KV head {} of {}", h, kv, hk);
      if (kv == g) p.heads_by_kv[n++] = static_cast<int>(h);
    }
  }
  p.group_begin[hk] = n;
  return p;
}

// 4-byte asynchronous copy (cp.async.ca); src_bytes = 0 writes zeros without reading src.
__device__ __forceinline__ void bwd_cp_async_4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

// τ at a global position (1 when off), as the forward's row scale.
__device__ __forceinline__ float bwd_tau(const BwdParams& p, int64_t pos) {
  return tau_f32(pos, p.tau_base, p.inv_log_tau_base);
}

// One past the last query row that may see a key of the block [k0, k0 + cols): the end of the last
// key's document (packed documents), else tq.
__device__ __forceinline__ int bwd_query_end(const BwdParams& p, int k0, int cols) {
  if (!p.k_doc_end) return p.tq;
  const int last_key = min(k0 + cols, p.tk) - 1;
  const int64_t end = p.k_doc_end[last_key] - p.q_pos0;
  return end <= 0 ? 0 : (end < p.tq ? static_cast<int>(end) : p.tq);
}

// First query row (a multiple of `rows`) that may see key row k0; tq when none can.
__device__ __forceinline__ int bwd_query_begin(const BwdParams& p, int k0, int rows) {
  if (!p.causal) return 0;
  const int64_t first = p.k_pos0 + k0 - p.q_pos0;  // queries at index ≥ first see key k0
  if (first >= p.tq) return p.tq;
  return first <= 0 ? 0 : static_cast<int>(first / rows) * rows;
}

// The tile schedule of both backward kernels: a CTA owns one block of keys [k0, k0 + cols) of KV
// head kvh and visits, for each query head of that KV head (GQA: dK/dV sum them without atomics),
// the query blocks of Rows rows from the first that can see its keys (causal) to m_end; step s is
// query head head(p, s), rows m0(s) ...
template <int Rows>
struct BwdSteps {
  int head_begin, n_heads, m_begin;
  int n_qblocks = 0, count = 0;
  __device__ __forceinline__ BwdSteps(const BwdParams& p, int kvh, int k0)
      : head_begin(p.group_begin[kvh]), n_heads(p.group_begin[kvh + 1] - head_begin), m_begin(bwd_query_begin(p, k0, Rows)) {}
  // Plans the steps up to query row m_end (tq, or bwd_query_end with packed documents); false: none.
  __device__ __forceinline__ bool plan(int m_end) {
    if (n_heads == 0 || m_begin >= m_end) return false;
    n_qblocks = (m_end - m_begin + Rows - 1) / Rows;
    count = n_heads * n_qblocks;
    return true;
  }
  __device__ __forceinline__ int head(const BwdParams& p, int step) const { return p.heads_by_kv[head_begin + step / n_qblocks]; }
  __device__ __forceinline__ int m0(int step) const { return m_begin + (step % n_qblocks) * Rows; }
};

// The dK/dV epilogue of both backward kernels: dk, dv += this CTA's sums for key rows key_row and
// key_row + 8 (one CTA owns these key rows of this KV head: no atomics), columns 8j + 2 c4 and + 1
// for j < D/8; dk_at(j, e), dv_at(j, e) give element e of the lane's 8-column tile j (mma C layout).
template <int D, class DkAt, class DvAt>
__device__ __forceinline__ void bwd_add_dk_dv(const BwdParams& p, int kvh, int key_row, int c4, DkAt dk_at, DvAt dv_at) {
#pragma unroll
  for (int h2 = 0; h2 < 2; ++h2) {
    const int key = key_row + h2 * 8;
    if (key >= p.tk) continue;
    float* dkr = p.dk + key * p.dk_st + kvh * p.dk_sh;
    float* dvr = p.dv + key * p.dv_st + kvh * p.dv_sh;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      float2* a = reinterpret_cast<float2*>(dkr + j * 8 + c4 * 2);
      float2* b = reinterpret_cast<float2*>(dvr + j * 8 + c4 * 2);
      float2 x = *a, y = *b;
      x.x += dk_at(j, 2 * h2);
      x.y += dk_at(j, 2 * h2 + 1);
      y.x += dv_at(j, 2 * h2);
      y.y += dv_at(j, 2 * h2 + 1);
      *a = x;
      *b = y;
    }
  }
}

// acc[N/8][4] = A[a_row0 .. a_row0+16) · B[b_row0 .. b_row0+N)ᵀ with the head dimension D as the
// reduction: A and B are row-major [rows][D] bf16 tiles with swizzled 16-byte chunks (cuda::swizzled<D/8>).
template <int D, int N>
__device__ __forceinline__ void bwd_mma_rows_by_rows(float (&acc)[N / 8][4], const unsigned char* a_tile,
                                                     const unsigned char* b_tile, int a_row0, int b_row0, int lane) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int j = 0; j < N / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t a[4];
    cuda::ldmatrix_x4(a, cuda::smem_addr(a_tile) + cuda::swizzled<kChunks>(a_row0 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
    for (int j = 0; j < N / 8; j += 2) {
      uint32_t b[4];
      const int row = b_row0 + j * 8 + (lane % 8) + (lane / 16) * 8, c = kk * 2 + (lane / 8) % 2;
      cuda::ldmatrix_x4(b, cuda::smem_addr(b_tile) + cuda::swizzled<kChunks>(row, c));
      cuda::mma_bf16(acc[j], a, b[0], b[1]);
      cuda::mma_bf16(acc[j + 1], a, b[2], b[3]);
    }
  }
}

// acc[D/8][4] += X · B: X is 16 × K held in mma accumulators x[K/8][4] (rounded to bf16 here), B a
// row-major [K][D] bf16 tile with swizzled chunks, read transposed.
template <int D, int K>
__device__ __forceinline__ void bwd_mma_acc_times_rows(float (&acc)[D / 8][4], const float (&x)[K / 8][4],
                                                       const unsigned char* b_tile, int lane) {
  constexpr int kChunks = D / 8;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
    const uint32_t a[4] = {cuda::pack_bf16(x[2 * kk][0], x[2 * kk][1]), cuda::pack_bf16(x[2 * kk][2], x[2 * kk][3]),
                           cuda::pack_bf16(x[2 * kk + 1][0], x[2 * kk + 1][1]),
                           cuda::pack_bf16(x[2 * kk + 1][2], x[2 * kk + 1][3])};
#pragma unroll
    for (int j = 0; j < D / 8; j += 2) {
      uint32_t b[4];
      const int row = kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8, c = j + lane / 16;
      cuda::ldmatrix_x4_trans(b, cuda::smem_addr(b_tile) + cuda::swizzled<kChunks>(row, c));
      cuda::mma_bf16(acc[j], a, b[0], b[1]);
      cuda::mma_bf16(acc[j + 1], a, b[2], b[3]);
    }
  }
}

}  // namespace hydra::ops::cuda_impl
