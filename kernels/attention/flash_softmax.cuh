// The online softmax and the positional mask of the flash attention kernels (mma.sync in
// attention.cu, wgmma in attention_hopper.cu), written once.
//
// Both keep a score tile in the tensor-core accumulator layout: a thread holds two rows of
// the tile, r = 0 (row g = lane / 4 of its 16-row slice) and r = 1 (row g + 8), and for every
// 8-column group j the four values s[4j .. 4j+3] = (r0: columns 8j + 2c, 8j + 2c + 1;
// r1: the same columns) with c = lane % 4. A quad (4 lanes) holds whole rows.
//
// Scores are kept raw (q·k) until the softmax: row r's base-2 logit is s · rs[r] with
// rs = softmax scale · log2(e) · τ(position) > 0, so the running maximum is tracked in logit units
// and exp2 needs one FFMA per element. Rows that see no key keep m = −inf and l = 0.
#pragma once

#include <climits>
#include <cstdint>

#include "kernels/attention/flash_common.cuh"
#include "kernels/cuda/mma.cuh"

namespace hydra::ops::cuda_impl {

using cuda::fast_exp2;  // kernels/cuda/common.cuh

// The last column of a key tile starting at key `key0` that query row `row` may see (every column
// when the result is ≥ the tile width, none when < 0): keys past the end, and with causal masking
// keys whose position exceeds the query's.
__device__ __forceinline__ int flash_last_visible(const FlashParams& p, int key0, int row) {
  int64_t last = static_cast<int64_t>(p.tk) - 1 - key0;
  if (p.causal) {
    const int64_t causal_last = p.q_pos0 + row - p.k_pos0 - key0;
    last = causal_last < last ? causal_last : last;
  }
  return last < -1 ? -1 : (last > INT_MAX / 2 ? INT_MAX / 2 : static_cast<int>(last));
}

// Whether any element of the key tile [key0, key0 + cols) is hidden from rows [row_first, ...]:
// only such tiles (the diagonal ones and the last, partial one) pay for the per-element mask.
__device__ __forceinline__ bool flash_tile_needs_mask(const FlashParams& p, int key0, int cols, int row_first) {
  return key0 + cols > p.tk || (p.causal && p.k_pos0 + key0 + cols - 1 > p.q_pos0 + row_first);
}

// Packed documents: the first column of the key tile at key0 that row `row` may see (columns
// before it belong to earlier documents), and whether a tile needs that mask for some row up to
// `row_last` (document starts do not decrease along the rows).
__device__ __forceinline__ int flash_first_visible(const FlashParams& p, int key0, int row) {
  const int64_t first = flash_doc_start(p, row) - p.k_pos0 - key0;
  return first < 0 ? 0 : (first > INT_MAX / 2 ? INT_MAX / 2 : static_cast<int>(first));
}
__device__ __forceinline__ bool flash_tile_needs_doc_mask(const FlashParams& p, int key0, int row_last) {
  return p.q_doc_start && p.k_pos0 + key0 < flash_doc_start(p, row_last);
}

// Sets the scores of hidden keys to −inf: columns outside [first[r], last[r]] of the thread's row r.
template <int N>
__device__ __forceinline__ void flash_apply_mask(float (&s)[N], int c4, const int (&first)[2], const int (&last)[2]) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = j * 8 + c4 * 2 + (e % 2);
      if (col > last[e / 2] || col < first[e / 2]) s[4 * j + e] = -INFINITY;
    }
}

// Sets the scores of hidden keys to −inf (last[r]: flash_last_visible of the thread's row r).
template <int N>
__device__ __forceinline__ void flash_apply_mask(float (&s)[N], int c4, const int (&last)[2]) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (j * 8 + c4 * 2 + (e % 2) > last[e / 2]) s[4 * j + e] = -INFINITY;
}

// One online-softmax step over a score tile: raises the running maxima m (logit units) with this
// tile's rows, turns s into p = 2^(s·rs − m) in place, folds the tile's sums into the thread's
// partial row sums l, and returns in corr the factor by which earlier output rows must be scaled.
template <int N>
__device__ __forceinline__ void flash_softmax_step(float (&s)[N], const float (&rs)[2], float (&m)[2], float (&l)[2],
                                                   float (&corr)[2]) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
    mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
    mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
  }
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(m[r], mx[r] * rs[r]);
    base[r] = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: keep exp2 finite (p = 0)
    corr[r] = fast_exp2(m[r] - base[r]);
    m[r] = m_new;
  }
  float sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < N / 4; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = e / 2;
      const float pe = fast_exp2(fmaf(s[4 * j + e], rs[r], -base[r]));
      s[4 * j + e] = pe;
      sum[r] += pe;
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + sum[r];
}

// Scales output rows (same layout as the scores, head dim instead of keys) by corr.
template <int N>
__device__ __forceinline__ void flash_rescale(float (&o)[N], const float (&corr)[2]) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
    o[4 * j + 0] *= corr[0];
    o[4 * j + 1] *= corr[0];
    o[4 * j + 2] *= corr[1];
    o[4 * j + 3] *= corr[1];
  }
}

// P (fp32 accumulators) as bf16 A-operand fragments of the P·V product, 16 keys per fragment:
// two adjacent 8-column groups form the m16n8k16 / wgmma A-register layout of their 16 keys.
template <int N>
__device__ __forceinline__ void flash_pack_p(const float (&s)[N], uint32_t (&pa)[N / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < N / 8; ++kk) {
    pa[kk][0] = cuda::pack_bf16(s[8 * kk + 0], s[8 * kk + 1]);
    pa[kk][1] = cuda::pack_bf16(s[8 * kk + 2], s[8 * kk + 3]);
    pa[kk][2] = cuda::pack_bf16(s[8 * kk + 4], s[8 * kk + 5]);
    pa[kk][3] = cuda::pack_bf16(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

}  // namespace hydra::ops::cuda_impl
