// What the flash attention kernels (mma.sync in attention.cu, the warp-specialised Hopper kernel in
// attention_hopper.cu) share: their
// parameters, the launchers' declarations, and the epilogue that normalises the output, forms the
// natural-log log-sum-exp and, in merge mode, folds the block's result into the earlier partial
// result of each row in fp32 (the ring-attention merge, done in place). The online softmax and the
// mask are in flash_softmax.cuh.
#pragma once

#include <cstdint>

#include "kernels/attention/attention_mask.h"
#include "kernels/attention/attention_tau.h"
#include "kernels/cuda/common.cuh"

namespace hydra::ops::cuda_impl {

constexpr int kMaxHeads = 128;

struct FlashParams {
  const bf16_t* q;
  const bf16_t* k;
  const bf16_t* v;
  float* out;
  float* lse;
  int64_t q_st, q_sh, k_st, k_sh, v_st, v_sh, o_st, o_sh, lse_sh, lse_st;
  int tq, tk;
  int64_t q_pos0, k_pos0;
  float scale_log2;      // softmax scale · log2(e)
  float tau_base;        // a of τ; 0 = off
  float inv_log_tau_base;
  int causal, merge;
  // Packed documents (attention_mask.h): each query row's document start, global position [tq];
  // null: one document. Only the mma.sync kernel takes them (the dispatcher sends such calls there).
  const int64_t* q_doc_start;
  int kv_of[kMaxHeads];
};

// attention_hopper.cu: head dim 128 on sm_90a, for q/k/v views whose rows nest (stride(0) ≥
// heads · stride(1), stride(1) ≥ d), which TMA tensor maps describe.
bool flash_forward_hopper_supports(const TensorView& q, const TensorView& k, const TensorView& v);
void flash_forward_hopper(const FlashParams& p, const TensorView& q, const TensorView& k, const TensorView& v);

// Keys [0, end) that some query row of a block of `rows` rows starting at q0 may see.
__device__ __forceinline__ int flash_key_end(const FlashParams& p, int q0, int rows) {
  if (!p.causal) return p.tk;
  const int q_last = min(q0 + rows, p.tq) - 1;
  const int64_t visible = p.q_pos0 + q_last - p.k_pos0 + 1;
  return visible <= 0 ? 0 : (visible < p.tk ? static_cast<int>(visible) : p.tk);
}

// The document start s(q) of query row `row` (rows past the end read the last row's; 0 without
// documents).
__device__ __forceinline__ int64_t flash_doc_start(const FlashParams& p, int row) {
  return p.q_doc_start ? p.q_doc_start[row < p.tq ? row : p.tq - 1] : 0;
}

// The first key any row of a block starting at q0 may see: s(q0) (attention_mask.h), as an index.
__device__ __forceinline__ int flash_key_begin(const FlashParams& p, int q0) {
  if (!p.q_doc_start) return 0;
  const int64_t first = flash_doc_start(p, q0) - p.k_pos0;
  return first <= 0 ? 0 : (first < p.tk ? static_cast<int>(first) : p.tk);
}

// The base-2 score scale of query row `row`: softmax scale · log2(e) · τ(position within its document).
__device__ __forceinline__ float flash_row_scale(const FlashParams& p, int row) {
  const int64_t pos = mask::tau_position(p.q_pos0 + row, flash_doc_start(p, row));
  return p.scale_log2 * tau_f32(pos, p.tau_base, p.inv_log_tau_base);
}

// Epilogue for a thread holding rows row0 and row1 (= row0 + 8) of the block and, for each
// 8-column tile j of the head dimension, o[4j .. 4j+3] = (row0: cols 2c, 2c+1; row1: cols 2c, 2c+1)
// with c = c4 (the mma / wgmma accumulator layout). m: running max (base 2), l: per-lane partial sums.
template <int D>
__device__ __forceinline__ void flash_epilogue(const FlashParams& p, int head, int row0, int row1, int c4,
                                               const float (&o)[D / 2], const float (&m)[2], float (&l)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  // Every lane reads the earlier lse of its rows before any lane of the quad overwrites it.
  float lse_old[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row0 : row1;
    if (p.merge && row < p.tq) lse_old[r] = p.lse[head * p.lse_sh + row * p.lse_st];
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = r == 0 ? row0 : row1;
    if (row >= p.tq) continue;
    const bool seen = l[r] > 0.0f;
    if (p.merge && !seen) continue;  // nothing visible in this block: the earlier result stands
    const float lse = seen ? (m[r] + log2f(l[r])) * 0.69314718055994531f : -INFINITY;
    const float inv_l = seen ? 1.0f / l[r] : 0.0f;
    float* orow = p.out + row * p.o_st + head * p.o_sh;
    float w_new = 1.0f, w_old = 0.0f, lse_out = lse;
    if (p.merge && lse_old[r] != -INFINITY) {
      const float mx = fmaxf(lse_old[r], lse);
      const float a = expf(lse_old[r] - mx), b = expf(lse - mx);
      w_old = a / (a + b);
      w_new = b / (a + b);
      lse_out = mx + logf(a + b);
    }
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      float2* dst = reinterpret_cast<float2*>(orow + j * 8 + c4 * 2);
      float2 v = make_float2(o[4 * j + 2 * r] * inv_l * w_new, o[4 * j + 2 * r + 1] * inv_l * w_new);
      if (w_old != 0.0f) {
        const float2 old = *dst;
        v.x += w_old * old.x;
        v.y += w_old * old.y;
      }
      *dst = v;
    }
    if (c4 == 0) p.lse[head * p.lse_sh + row * p.lse_st] = lse_out;
  }
}

}  // namespace hydra::ops::cuda_impl
