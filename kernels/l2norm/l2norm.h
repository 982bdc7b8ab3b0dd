// L2 normalisation of each head vector (GDN q and k, DESIGN.md §1.2): x ← x · rsqrt(Σx² + eps).
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// x [T, H, d] in place.
void l2_norm(const TensorView& x, float eps);

// The model's q/k norm is fused into ops::gdn_qkv_conv (its backward: ops::gdn_qk_backward); this op
// normalises the inputs of the delta-rule tests and benchmarks.

#if HYDRA_CUDA
namespace cuda_impl {  // l2norm.cu; called by the dispatcher for CUDA views
void l2_norm(const TensorView& x, float eps);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
