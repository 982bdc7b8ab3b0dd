// L2 normalisation of each head vector (GDN q and k, SPEC 1.2): x ← x · rsqrt(Σx² + eps).
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// x [T, H, d] in place.
void l2_norm(const TensorView& x, float eps);

}  // namespace hydra::ops
