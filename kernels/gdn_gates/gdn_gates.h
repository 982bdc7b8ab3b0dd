// The GDN write strength and decay per token and head (DESIGN.md §1.2):
//   β_i = sigmoid(b_i),  g_i = −exp(A_log) · softplus(a_i + dt_bias)   (g ≤ 0 is a log-decay),
// from the projections a_i = w_a·x̂_i and b_i = w_b·x̂_i.
#pragma once

#include <cmath>

#include "runtime/tensor.h"

namespace hydra::ops {

// beta, g: [T, H] outputs; b_logits, a_logits: [T, H]; a_log, dt_bias: [H].
void gdn_gates(const TensorView& beta, const TensorView& g, const TensorView& b_logits, const TensorView& a_logits,
               const TensorView& a_log, const TensorView& dt_bias);

// Backward: d_b_logits = d_beta ⊙ β(1 − β); with s = softplus(a + dt_bias) and σ = sigmoid(a + dt_bias)
// (σ = 1 on softplus's linear branch, a + dt_bias > 20), d_a_logits = −d_g ⊙ exp(A_log) σ,
// d_dt_bias += Σ_t d_a_logits, d_a_log += Σ_t d_g ⊙ g.
// d_b_logits, d_a_logits [T, H] (overwritten; may be column blocks of the fused projection's
// gradient); d_a_log, d_dt_bias [H] fp32 accumulate (undefined: not needed); d_beta, d_g [T, H] fp32.
void gdn_gates_backward(const TensorView& d_b_logits, const TensorView& d_a_logits, const TensorView& d_a_log,
                        const TensorView& d_dt_bias, const TensorView& d_beta, const TensorView& d_g,
                        const TensorView& b_logits, const TensorView& a_logits, const TensorView& a_log,
                        const TensorView& dt_bias);

// softplus(x) = log(1 + e^x), with PyTorch's linear branch above 20 (where its derivative is 1).
template <class T>
inline T softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}

#if HYDRA_CUDA
namespace cuda_impl {  // gdn_gates.cu; called by the dispatcher for CUDA views
void gdn_gates(const TensorView& beta, const TensorView& g, const TensorView& b_logits, const TensorView& a_logits,
               const TensorView& a_log, const TensorView& dt_bias);
void gdn_gates_backward(const TensorView& d_b_logits, const TensorView& d_a_logits, const TensorView& d_a_log,
                        const TensorView& d_dt_bias, const TensorView& d_beta, const TensorView& d_g,
                        const TensorView& b_logits, const TensorView& a_logits, const TensorView& a_log,
                        const TensorView& dt_bias);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
