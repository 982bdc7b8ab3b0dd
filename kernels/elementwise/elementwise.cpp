// The elementwise ops' entry points: shape checks, then the CUDA kernels (tensors on the GPU,
// elementwise.cu) or the CPU reference (host tensors, elementwise_reference.cpp).
#include "kernels/elementwise/elementwise.h"

#include "kernels/common.h"
#include "kernels/elementwise/elementwise_reference.h"

namespace hydra::ops {

void add_inplace(const TensorView& x, const TensorView& y) {
  HYDRA_ASSERT(x.rank() == 2 && same_rows(x, y), "add: x {} vs y {}", x.shape_string(), y.shape_string());
  if (shapes_only({x, y})) return;
  if (on_cuda({x, y})) {
#if HYDRA_CUDA
    cuda_impl::add_inplace(x, y);
    return;
#endif
  }
  reference::add_inplace(x, y);
}

void sigmoid_gate(const TensorView& out, const TensorView& x, const TensorView& gate) {
  HYDRA_ASSERT(x.rank() == 2 && same_rows(x, gate) && same_rows(out, x), "sigmoid_gate: out {}, x {}, gate {}",
               out.shape_string(), x.shape_string(), gate.shape_string());
  if (shapes_only({out, x, gate})) return;
  if (on_cuda({out, x, gate})) {
#if HYDRA_CUDA
    cuda_impl::sigmoid_gate(out, x, gate);
    return;
#endif
  }
  reference::sigmoid_gate(out, x, gate);
}

void sigmoid_gate_backward(const TensorView& dx, const TensorView& d_gate, const TensorView& d_out,
                           const TensorView& x, const TensorView& gate) {
  HYDRA_ASSERT(x.rank() == 2 && same_rows(x, gate) && same_rows(d_out, x) && same_rows(dx, x) &&
                   same_rows(d_gate, x),
               "sigmoid_gate_backward: dx {}, d_gate {}, d_out {}, x {}, gate {}", dx.shape_string(),
               d_gate.shape_string(), d_out.shape_string(), x.shape_string(), gate.shape_string());
  if (shapes_only({dx, d_gate, d_out, x, gate})) return;
  if (on_cuda({dx, d_gate, d_out, x, gate})) {
#if HYDRA_CUDA
    cuda_impl::sigmoid_gate_backward(dx, d_gate, d_out, x, gate);
    return;
#endif
  }
  reference::sigmoid_gate_backward(dx, d_gate, d_out, x, gate);
}

}  // namespace hydra::ops
