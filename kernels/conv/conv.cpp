// The conv ops' entry points: shape checks, then the CUDA kernels (tensors on the GPU, conv.cu) or
// the CPU reference (host tensors, conv_reference.cpp).
#include "kernels/conv/conv.h"

#include "kernels/common.h"
#include "kernels/conv/conv_reference.h"

namespace hydra::ops {
namespace {

void check_shapes(const TensorView& x, const TensorView& w, const TensorView& prefix) {
  expect_shape(x, "conv x", {{"T", -1}, {"C", -1}});
  expect_shape(w, "conv weight", {{"C", x.size(1)}, {"K", -1}});
  if (prefix.defined()) expect_shape(prefix, "conv prefix", {{"K-1", w.size(1) - 1}, {"C", x.size(1)}});
}

}  // namespace

void causal_conv_silu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix) {
  check_shapes(x, w, prefix);
  expect_shape(out, "conv out", {{"T", x.size(0)}, {"C", x.size(1)}});
  if (shapes_only({out, x, w, prefix})) return;
  if (on_cuda({out, x, w, prefix})) {
#if HYDRA_CUDA
    cuda_impl::causal_conv_silu(out, x, w, prefix);
    return;
#endif
  }
  reference::causal_conv_silu(out, x, w, prefix);
}

void causal_conv_silu_backward(const TensorView& dx, const TensorView& dw, const TensorView& d_prefix,
                               const TensorView& d_out, const TensorView& x, const TensorView& w,
                               const TensorView& prefix) {
  check_shapes(x, w, prefix);
  const int64_t t_len = x.size(0), channels = x.size(1), kernel = w.size(1);
  expect_shape(dx, "conv dx", {{"T", t_len}, {"C", channels}});
  expect_shape(d_out, "conv d_out", {{"T", t_len}, {"C", channels}});
  if (dw.defined()) expect_shape(dw, "conv dw", {{"C", channels}, {"K", kernel}});
  if (d_prefix.defined()) expect_shape(d_prefix, "conv d_prefix", {{"K-1", kernel - 1}, {"C", channels}});
  if (shapes_only({dx, dw, d_prefix, d_out, x, w, prefix})) return;
  if (on_cuda({dx, dw, d_prefix, d_out, x, w, prefix})) {
#if HYDRA_CUDA
    cuda_impl::causal_conv_silu_backward(dx, dw, d_prefix, d_out, x, w, prefix);
    return;
#endif
  }
  reference::causal_conv_silu_backward(dx, dw, d_prefix, d_out, x, w, prefix);
}

}  // namespace hydra::ops
