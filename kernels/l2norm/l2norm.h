// L2 normalisation of each head vector (GDN q and k, DESIGN.md §1.2): x ← x · rsqrt(Σx² + eps).
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// x [T, H, d] in place.
void l2_norm(const TensorView& x, float eps);

// Backward of y = x r, r = 1/sqrt(Σx² + eps): dx = r dy − x r³ (x·dy), per head vector.
// dx, dy, x: [T, H, d]; x is the input of the forward (before normalisation); dx may alias dy.
void l2_norm_backward(const TensorView& dx, const TensorView& dy, const TensorView& x, float eps);

#if HYDRA_CUDA
namespace cuda_impl {  // l2norm.cu; called by the dispatcher for CUDA views
void l2_norm(const TensorView& x, float eps);
void l2_norm_backward(const TensorView& dx, const TensorView& dy, const TensorView& x, float eps);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
