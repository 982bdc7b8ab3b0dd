// The CPU reference of the elementwise ops (elementwise_reference.cpp), called by their entry points
// (elementwise.cpp) for host tensors once shapes are checked: same arguments and results as the ops of
// elementwise.h. Internal to kernels/elementwise/.
#pragma once

#include "kernels/elementwise/elementwise.h"

namespace hydra::ops::reference {

void add_inplace(const TensorView& x, const TensorView& y);
void sigmoid_gate(const TensorView& out, const TensorView& x, const TensorView& gate);
void sigmoid_gate_backward(const TensorView& dx, const TensorView& d_gate, const TensorView& d_out,
                           const TensorView& x, const TensorView& gate);

}  // namespace hydra::ops::reference
