// Small element-wise ops: the layer's residual add and sigmoid output gate, and the loss head's
// scaling by a factor read from a device scalar (a captured training step, model/train/objective.h).
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

// out = x · scale[0], the factor read when the op runs, not when it is launched: a step replayed as
// a CUDA graph scales its loss gradient by this step's 1 / (counted targets) from a device buffer.
// out [N, n] bf16 or f32, x [N, n] f32 (out may alias x), scale [1] f32; one device. One rounding:
// the f32 product, then (bf16 out) round to nearest even, as the loss kernels store a scaled gradient.
void scale_into(const TensorView& out, const TensorView& x, const TensorView& scale);

#if HYDRA_CUDA
namespace cuda_impl {  // elementwise.cu; called by the dispatcher for CUDA views
void add_inplace(const TensorView& x, const TensorView& y);
void scale_into(const TensorView& out, const TensorView& x, const TensorView& scale);
void sigmoid_gate(const TensorView& out, const TensorView& x, const TensorView& gate);
void sigmoid_gate_backward(const TensorView& dx, const TensorView& d_gate, const TensorView& d_out,
                           const TensorView& x, const TensorView& gate);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
