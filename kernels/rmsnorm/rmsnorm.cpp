// The RMS norm's entry points: shape checks, then the CUDA kernels (tensors on the GPU, rmsnorm.cu) or
// the CPU reference (host tensors, rmsnorm_reference.cpp).
#include "kernels/rmsnorm/rmsnorm.h"

#include "kernels/common.h"
#include "kernels/rmsnorm/rmsnorm_reference.h"

namespace hydra::ops {

void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params) {
  HYDRA_ASSERT(same_rows(out, x), "rms_norm: out {} vs x {}", out.shape_string(), x.shape_string());
  const int64_t n = row_length(x);
  expect_shape(weight, "rms_norm weight", {{"n", n}});
  if (shapes_only({out, x, weight})) return;
  if (on_cuda({out, x, weight})) {
#if HYDRA_CUDA
    cuda_impl::rms_norm(out, x, weight, params);
    return;
#endif
  }
  reference::rms_norm(out, x, weight, params);
}

void rms_norm_backward(const TensorView& dx, const TensorView& d_weight, const TensorView& dy, const TensorView& x,
                       const TensorView& weight, const RmsNormParams& params, Accumulate accumulate) {
  HYDRA_ASSERT(same_rows(dx, x) && same_rows(dy, x), "rms_norm_backward: dx {}, dy {}, x {}", dx.shape_string(),
               dy.shape_string(), x.shape_string());
  const int64_t n = row_length(x);
  expect_shape(weight, "rms_norm weight", {{"n", n}});
  if (d_weight.defined()) {
    expect_shape(d_weight, "rms_norm d_weight", {{"n", n}});
    HYDRA_ASSERT(d_weight.is_contiguous(), "rms_norm d_weight must be contiguous");
  }
  if (shapes_only({dx, d_weight, dy, x, weight})) return;
  if (on_cuda({dx, d_weight, dy, x, weight})) {
#if HYDRA_CUDA
    cuda_impl::rms_norm_backward(dx, d_weight, dy, x, weight, params, accumulate);
    return;
#endif
  }
  reference::rms_norm_backward(dx, d_weight, dy, x, weight, params, accumulate);
}

}  // namespace hydra::ops
