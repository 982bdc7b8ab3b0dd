// The arithmetic of one row of the RMSNorm forward's vector path (rms_vector.h), written once for
// the two kernels that must produce the same bits: rms_norm_vector_kernel (rmsnorm.cu) and the
// decode GEMV's fused input norm (kernels/gemv/gemv.cu), which recomputes the norm inside each CTA
// and is held to rms_norm → bf16 → GEMV bit for bit. Every rounding is spelled out (__fmaf_rn), so
// the compiler's contraction choices cannot make the two differ.
//
// A row's statistic: each thread's sum of squares over its V runs of eight (runs in order, then the
// eight in order), then the sums of the G threads of the row's group: a butterfly of xor shuffles
// over offsets min(G, 32)/2 … 1, and for G > 32 the warps' results added in warp order from 0.
#pragma once

#include "kernels/cuda/common.cuh"

namespace hydra::ops::cuda_impl::rms_row {

// ss + Σ v[e]², the eight in order.
__device__ __forceinline__ float add_squares(float ss, const float (&v)[8]) {
#pragma unroll
  for (int e = 0; e < 8; ++e) ss = __fmaf_rn(v[e], v[e], ss);
  return ss;
}

// 1/n of a row of n elements, as both kernels compute it.
__device__ __forceinline__ float inverse_length(int64_t n) { return 1.0f / float(n); }

// r = 1/sqrt(mean(x²) + eps) from the row's sum of squares.
__device__ __forceinline__ float inverse_rms(float ss, float inv_n, float eps) {
  return rsqrtf(__fmaf_rn(ss, inv_n, eps));
}

// The normed value before its rounding to bf16: w ⊙ (x r).
__device__ __forceinline__ float normed(float w, float x, float r) { return __fmul_rn(w, __fmul_rn(x, r)); }

}  // namespace hydra::ops::cuda_impl::rms_row
