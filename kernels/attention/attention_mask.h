// Which keys a query sees, stated once for the CPU reference, the CUDA kernels (mma.sync forward and
// backward) and the ring's block skipping (DESIGN.md §3.2, §3.6).
//
// Positions are global (a rank's rows carry their place in the whole sequence). Key position k is
// visible to query position q iff
//     (causal: k ≤ q)  and  k ≥ s(q),
// s(q) the position of the first token of q's document (0 when the sequence is one document). The
// FA heads' τ is taken at q − s(q), the query's position within its document.
// Within a block of consecutive query positions [q_lo, q_hi] s(q) does not decrease, and the
// intervals [s(q), q] of consecutive queries overlap or touch, so the keys some query of the block
// sees are [s(q_lo), q_hi], and every pair of the block is visible iff s(q_hi) ≤ k_lo and k_hi ≤ q_lo.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HYDRA_ATTENTION_HD __host__ __device__ __forceinline__
#else
#define HYDRA_ATTENTION_HD inline
#endif

namespace hydra::ops::mask {

HYDRA_ATTENTION_HD bool visible(int64_t q_pos, int64_t k_pos, int64_t q_doc_start, bool causal) {
  return (!causal || k_pos <= q_pos) && k_pos >= q_doc_start;
}

// The position τ(·) is evaluated at.
HYDRA_ATTENTION_HD int64_t tau_position(int64_t q_pos, int64_t q_doc_start) { return q_pos - q_doc_start; }

// Blocks of query positions [q_lo, q_hi] (document starts s_lo = s(q_lo), s_hi = s(q_hi)) and key
// positions [k_lo, k_hi]: whether some pair is visible, and whether every pair is.
HYDRA_ATTENTION_HD bool block_any(int64_t q_lo, int64_t q_hi, int64_t s_lo, int64_t k_lo, int64_t k_hi, bool causal) {
  (void)q_lo;
  return k_hi >= s_lo && (!causal || k_lo <= q_hi);
}
HYDRA_ATTENTION_HD bool block_all(int64_t q_lo, int64_t s_hi, int64_t k_lo, int64_t k_hi, bool causal) {
  return k_lo >= s_hi && (!causal || k_hi <= q_lo);
}

}  // namespace hydra::ops::mask
