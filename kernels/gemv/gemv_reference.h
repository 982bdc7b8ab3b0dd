// The CPU reference of the decode GEMV (gemv_reference.cpp), called by its entry point (gemv.cpp) for
// host tensors once shapes are checked: same arguments and results as gemv of gemv.h. Internal to
// kernels/gemv/.
#pragma once

#include "kernels/gemv/gemv.h"

namespace hydra::ops::reference {

void gemv(const TensorView& out, const TensorView& x, const TensorView& w, Accumulate accumulate);

}  // namespace hydra::ops::reference
