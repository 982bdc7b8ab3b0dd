#include "kernels/swiglu/swiglu.h"

#include <cmath>

#include "kernels/common.h"

namespace hydra::ops {

void swiglu(const TensorView& out, const TensorView& gate, const TensorView& up) {
  expect_shape(out, "swiglu out", {{"T", -1}, {"I", -1}});
  expect_shape(gate, "swiglu gate", {{"T", out.size(0)}, {"I", out.size(1)}});
  expect_shape(up, "swiglu up", {{"T", out.size(0)}, {"I", out.size(1)}});
  if (on_cuda({out, gate, up})) {
#if HYDRA_CUDA
    cuda_impl::swiglu(out, gate, up);
    return;
#endif
  }
  expect_host_f32(out, "swiglu out");
  expect_host_f32(gate, "swiglu gate");
  expect_host_f32(up, "swiglu up");
  const int64_t n = out.size(1);
  for (int64_t t = 0; t < out.size(0); ++t) {
    float* o = static_cast<float*>(out.element_ptr({t}));
    const float* g = static_cast<const float*>(gate.element_ptr({t}));
    const float* u = static_cast<const float*>(up.element_ptr({t}));
    for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
}

}  // namespace hydra::ops
