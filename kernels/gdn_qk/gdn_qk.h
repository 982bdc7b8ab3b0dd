// The GDN branch's input pass, fused (DESIGN.md §1.2): the causal short conv + SiLU of the q | k | v
// columns, then RoPE and the L2 norm of every q and k head, in one pass over the projection:
//   c = SiLU(conv(x)),  q̂ = rope(c_q) / ‖rope(c_q)‖,  k̂ likewise,  v = c_v,
// with the norm's inverse r = 1/sqrt(Σ rope(c)² + eps) kept per (row, q/k head) for the backward.
// The same result as causal_conv_silu, rope and l2_norm applied in turn (the CPU path composes
// exactly those), but on the GPU one read of x and one write of the outputs, fp32 in between
// (the unfused path rounded to bf16 after each step).
//
// Backward of the q/k finish: with y = q̂ (the forward's output) and r its inverse norm,
//   d(rope(c)) = r (dy − y (y·dy)),   dc = rope⁻¹(d(rope(c))),
// the L2 norm's backward written with y and r instead of its input, then the inverse rotation.
#pragma once

#include "kernels/rope/rope.h"
#include "runtime/tensor.h"

namespace hydra::ops {

struct GdnQkParams {
  int64_t qk_heads = 0;  // q and k heads together: the first qk_heads · d columns of the conv output
  int64_t head_dim = 0;  // d
  double rope_theta = kDefaultRopeTheta;
  float l2_eps = 1e-6f;
};

// out [T, C] (C = qk_heads·d + v columns; must not alias x), x [T, C], w [C, K], prefix [K−1, C] or
// undefined (zeros), positions [T] int64 (the rows' positions), inv_norm [T, qk_heads] (written, in
// acc precision: fp32 on the GPU).
void gdn_qkv_conv(const TensorView& out, const TensorView& inv_norm, const TensorView& x, const TensorView& w,
                  const TensorView& prefix, const TensorView& positions, const GdnQkParams& params);

// dx, dy, y: [T, H, d] (dx may alias dy); inv_norm [T, H] (the forward's r of these heads);
// positions [T]. dx is overwritten with the gradient w.r.t. the conv output of these heads.
void gdn_qk_backward(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& inv_norm,
                     const TensorView& positions, const GdnQkParams& params);

#if HYDRA_CUDA
namespace cuda_impl {  // gdn_qk.cu; called by the dispatcher for CUDA views
void gdn_qkv_conv(const TensorView& out, const TensorView& inv_norm, const TensorView& x, const TensorView& w,
                  const TensorView& prefix, const TensorView& positions, const GdnQkParams& params);
void gdn_qk_backward(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& inv_norm,
                     const TensorView& positions, const GdnQkParams& params);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
