// The CPU reference of the SwiGLU ops (swiglu_reference.cpp), called by their entry points (swiglu.cpp)
// for host tensors once shapes are checked: same arguments and results as the ops of swiglu.h. Internal
// to kernels/swiglu/.
#pragma once

#include "kernels/swiglu/swiglu.h"

namespace hydra::ops::reference {

void swiglu(const TensorView& out, const TensorView& gate, const TensorView& up);
void swiglu_backward(const TensorView& d_gate, const TensorView& d_up, const TensorView& d_out,
                     const TensorView& gate, const TensorView& up);

}  // namespace hydra::ops::reference
