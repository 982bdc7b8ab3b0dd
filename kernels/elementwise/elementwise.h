// Small element-wise ops: the layer's residual add and sigmoid output gate.
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// x += y; x, y: [N, n] (same shape).
void add_inplace(const TensorView& x, const TensorView& y);

// out = x ⊙ sigmoid(gate): the FA heads' auxiliary output gate (DESIGN.md §1.2). out, x, gate: [T, n];
// x may be the fp32 attention accumulator while out is the bf16 head buffer; out may alias x.
void sigmoid_gate(const TensorView& out, const TensorView& x, const TensorView& gate);

// Backward of sigmoid_gate: dx = d_out ⊙ σ(gate), d_gate = d_out ⊙ x ⊙ σ(gate)(1 − σ(gate)).
// dx, d_gate, d_out, x, gate: [T, n]; dx may be fp32 (the attention gradient) while d_gate is bf16.
void sigmoid_gate_backward(const TensorView& dx, const TensorView& d_gate, const TensorView& d_out,
                           const TensorView& x, const TensorView& gate);

#if HYDRA_CUDA
namespace cuda_impl {  // elementwise.cu; called by the dispatcher for CUDA views
void add_inplace(const TensorView& x, const TensorView& y);
void sigmoid_gate(const TensorView& out, const TensorView& x, const TensorView& gate);
void sigmoid_gate_backward(const TensorView& dx, const TensorView& d_gate, const TensorView& d_out,
                           const TensorView& x, const TensorView& gate);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
