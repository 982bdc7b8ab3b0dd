// Causal depthwise convolution with SiLU (the GDN short conv, SPEC 1.2):
//   out[i][c] = SiLU(Σ_{m=0}^{K−1} w[c][m] · x[i − K + 1 + m][c]),
// where rows before the first row of x come from `prefix` (the previous segment's last K−1 rows,
// the sequence-parallel halo) or are zero at the start of a sequence.
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// out, x: [T, C] (out must not alias x); w [C, K]; prefix [K−1, C] or an undefined view (zeros).
void causal_conv_silu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix);

#if HYDRA_CUDA
namespace cuda_impl {  // conv.cu; called by the dispatcher for CUDA views
void causal_conv_silu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
