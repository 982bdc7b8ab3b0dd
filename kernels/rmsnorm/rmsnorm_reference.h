// The CPU reference of the RMS norm ops (rmsnorm_reference.cpp), called by their entry points
// (rmsnorm.cpp) for host tensors once shapes are checked: same arguments and results as the ops of
// rmsnorm.h. Internal to kernels/rmsnorm/.
#pragma once

#include "kernels/rmsnorm/rmsnorm.h"

namespace hydra::ops::reference {

void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params);
void rms_norm_backward(const TensorView& dx, const TensorView& d_weight, const TensorView& dy, const TensorView& x,
                       const TensorView& weight, const RmsNormParams& params, Accumulate accumulate);

}  // namespace hydra::ops::reference
