// SwiGLU's entry points: shape checks, then the CUDA kernels (tensors on the GPU, swiglu.cu) or the CPU
// reference (host tensors, swiglu_reference.cpp).
#include "kernels/swiglu/swiglu.h"

#include "kernels/common.h"
#include "kernels/swiglu/swiglu_reference.h"

namespace hydra::ops {

void swiglu(const TensorView& out, const TensorView& gate, const TensorView& up) {
  expect_shape(out, "swiglu out", {{"T", -1}, {"I", -1}});
  expect_shape(gate, "swiglu gate", {{"T", out.size(0)}, {"I", out.size(1)}});
  expect_shape(up, "swiglu up", {{"T", out.size(0)}, {"I", out.size(1)}});
  if (shapes_only({out, gate, up})) return;
  if (on_cuda({out, gate, up})) {
#if HYDRA_CUDA
    cuda_impl::swiglu(out, gate, up);
    return;
#endif
  }
  reference::swiglu(out, gate, up);
}

void swiglu_backward(const TensorView& d_gate, const TensorView& d_up, const TensorView& d_out,
                     const TensorView& gate, const TensorView& up) {
  expect_shape(gate, "swiglu gate", {{"T", -1}, {"I", -1}});
  const int64_t t_len = gate.size(0), inter = gate.size(1);
  expect_shape(up, "swiglu up", {{"T", t_len}, {"I", inter}});
  expect_shape(d_out, "swiglu d_out", {{"T", t_len}, {"I", inter}});
  expect_shape(d_gate, "swiglu d_gate", {{"T", t_len}, {"I", inter}});
  expect_shape(d_up, "swiglu d_up", {{"T", t_len}, {"I", inter}});
  if (shapes_only({d_gate, d_up, d_out, gate, up})) return;
  if (on_cuda({d_gate, d_up, d_out, gate, up})) {
#if HYDRA_CUDA
    cuda_impl::swiglu_backward(d_gate, d_up, d_out, gate, up);
    return;
#endif
  }
  reference::swiglu_backward(d_gate, d_up, d_out, gate, up);
}

}  // namespace hydra::ops
