// The GDN input pass (gdn_qk.h) for a decode step: one new row per sequence, its conv reading the
// sequence's last K−1 pre-conv rows from a cache (model/kv_cache.h), which the step then advances.
// Row b of the step uses slot slots[b] of the tail cache:
//   out[b] = gdn_qkv_conv(x[b] with prefix tail[slots[b]]),   tail[slots[b]] ← (tail[1:], x[b]).
// The same math as gdn_qkv_conv over the whole sequence, one row at a time: the conv of position i
// reads positions i−K+1 .. i, which the tail holds (zeros before a sequence's first token).
// CPU: the reference is gdn_qkv_conv on each row with its tail as prefix. CUDA (gdn_qk_step.cu):
// x, out, tail bf16, w and inv_norm fp32, even d ≤ 256, one CTA per (row, head).
#pragma once

#include "kernels/gdn_qk/gdn_qk.h"
#include "runtime/tensor.h"

namespace hydra::ops {

// out [B, C] (must not alias x), inv_norm [B, qk_heads], x [B, C], w [C, K], tail [S, K−1, C] (in/out;
// undefined when K = 1), slots [B] int32 (distinct; undefined: row b uses slot b), positions [B] int64.
void gdn_qkv_conv_step(const TensorView& out, const TensorView& inv_norm, const TensorView& x, const TensorView& w,
                       const TensorView& tail, const TensorView& slots, const TensorView& positions,
                       const GdnQkParams& params);

#if HYDRA_CUDA
namespace cuda_impl {  // gdn_qk_step.cu
void gdn_qkv_conv_step(const TensorView& out, const TensorView& inv_norm, const TensorView& x, const TensorView& w,
                       const TensorView& tail, const TensorView& slots, const TensorView& positions,
                       const GdnQkParams& params);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
