#include "kernels/elementwise/elementwise.h"

#include <cmath>

#include "kernels/common.h"

namespace hydra::ops {

void add_inplace(const TensorView& x, const TensorView& y) {
  HYDRA_ASSERT(x.rank() == 2 && same_rows(x, y), "add: x {} vs y {}", x.shape_string(), y.shape_string());
  if (on_cuda({x, y})) {
#if HYDRA_CUDA
    cuda_impl::add_inplace(x, y);
    return;
#endif
  }
  expect_host_f32(x, "add x");
  expect_host_f32(y, "add y");
  for (int64_t t = 0; t < x.size(0); ++t) {
    float* a = static_cast<float*>(x.element_ptr({t}));
    const float* b = static_cast<const float*>(y.element_ptr({t}));
    for (int64_t i = 0; i < x.size(1); ++i) a[i] += b[i];
  }
}

void sigmoid_gate(const TensorView& out, const TensorView& x, const TensorView& gate) {
  HYDRA_ASSERT(x.rank() == 2 && same_rows(x, gate) && same_rows(out, x), "sigmoid_gate: out {}, x {}, gate {}",
               out.shape_string(), x.shape_string(), gate.shape_string());
  if (on_cuda({out, x, gate})) {
#if HYDRA_CUDA
    cuda_impl::sigmoid_gate(out, x, gate);
    return;
#endif
  }
  expect_host_f32(out, "gate out");
  expect_host_f32(x, "gate x");
  expect_host_f32(gate, "gate logits");
  for (int64_t t = 0; t < x.size(0); ++t) {
    float* o = static_cast<float*>(out.element_ptr({t}));
    const float* a = static_cast<const float*>(x.element_ptr({t}));
    const float* g = static_cast<const float*>(gate.element_ptr({t}));
    for (int64_t i = 0; i < x.size(1); ++i) o[i] = a[i] / (1.0f + std::exp(-g[i]));
  }
}

}  // namespace hydra::ops
