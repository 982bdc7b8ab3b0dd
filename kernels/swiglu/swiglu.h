// SwiGLU activation of the MLP: out = SiLU(gate) ⊙ up, SiLU(x) = x · sigmoid(x).
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// out, gate, up: [T, I] (gate/up may be column blocks of one fused projection).
void swiglu(const TensorView& out, const TensorView& gate, const TensorView& up);

// Backward: d_gate = d_out ⊙ up ⊙ σ(gate)(1 + gate (1 − σ(gate))), d_up = d_out ⊙ SiLU(gate).
// d_gate, d_up: [T, I] (may be column blocks of one fused gradient, and may alias gate/up).
void swiglu_backward(const TensorView& d_gate, const TensorView& d_up, const TensorView& d_out,
                     const TensorView& gate, const TensorView& up);

#if HYDRA_CUDA
namespace cuda_impl {  // swiglu.cu; called by the dispatcher for CUDA views
void swiglu(const TensorView& out, const TensorView& gate, const TensorView& up);
void swiglu_backward(const TensorView& d_gate, const TensorView& d_up, const TensorView& d_out,
                     const TensorView& gate, const TensorView& up);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
