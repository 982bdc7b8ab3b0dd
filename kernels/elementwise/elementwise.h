// Small element-wise ops of the layer: residual add and the sigmoid output gate.
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// x += y; x, y: [N, n] (same shape).
void add_inplace(const TensorView& x, const TensorView& y);

// x ⊙= sigmoid(gate); x, gate: [T, n] (the FA heads' auxiliary output gate, SPEC 1.2).
void sigmoid_gate(const TensorView& x, const TensorView& gate);

}  // namespace hydra::ops
