// Causal depthwise convolution with SiLU (the GDN short conv, DESIGN.md §1.2):
//   out[i][c] = SiLU(Σ_{m=0}^{K−1} w[c][m] · x[i − K + 1 + m][c]),
// where rows before the first row of x come from `prefix` (the previous segment's last K−1 rows,
// the sequence-parallel halo) or are zero at the start of a sequence.
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// out, x: [T, C] (out must not alias x); w [C, K]; prefix [K−1, C] or an undefined view (zeros).
void causal_conv_silu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix);

// Backward, with a_i = Σ_m w[c][m] x[i−K+1+m] the pre-activation and d_a = d_out ⊙ SiLU'(a):
//   dx[j] = Σ_m w[c][m] d_a[j+K−1−m] (rows of this segment), dw[c][m] += Σ_i d_a[i] x[i−K+1+m],
//   d_prefix[K−1, C] = the gradient of the halo rows (it belongs to the previous segment's owner).
// dx [T, C] is overwritten; dw [C, K] fp32 accumulates; d_prefix is overwritten, or undefined when
// the prefix is zeros or its gradient is not needed. x, w, prefix are the forward's inputs.
void causal_conv_silu_backward(const TensorView& dx, const TensorView& dw, const TensorView& d_prefix,
                               const TensorView& d_out, const TensorView& x, const TensorView& w,
                               const TensorView& prefix);

#if HYDRA_CUDA
namespace cuda_impl {  // conv.cu; called by the dispatcher for CUDA views
void causal_conv_silu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix);
void causal_conv_silu_backward(const TensorView& dx, const TensorView& dw, const TensorView& d_prefix,
                               const TensorView& d_out, const TensorView& x, const TensorView& w,
                               const TensorView& prefix);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
