// The CPU reference of the conv ops (conv_reference.cpp), called by their entry points (conv.cpp) for
// host tensors once shapes are checked: same arguments and results as the ops of conv.h. Internal to
// kernels/conv/.
#pragma once

#include "kernels/conv/conv.h"

namespace hydra::ops::reference {

void causal_conv_silu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix);
void causal_conv_silu_backward(const TensorView& dx, const TensorView& dw, const TensorView& d_prefix,
                               const TensorView& d_out, const TensorView& x, const TensorView& w,
                               const TensorView& prefix);

}  // namespace hydra::ops::reference
