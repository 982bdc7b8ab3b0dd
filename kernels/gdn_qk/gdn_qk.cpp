// The GDN input pass's entry points: shape checks, then the fused CUDA kernels (tensors on the GPU,
// gdn_qk.cu) or the CPU reference (host tensors, gdn_qk_reference.cpp).
#include "kernels/gdn_qk/gdn_qk.h"

#include "kernels/common.h"
#include "kernels/gdn_qk/gdn_qk_reference.h"

namespace hydra::ops {
namespace {

void check_params(const GdnQkParams& p, int64_t channels) {
  HYDRA_ASSERT(p.qk_heads >= 0 && p.head_dim > 0 && p.head_dim % 2 == 0 && p.qk_heads * p.head_dim <= channels,
               "gdn_qk: {} q/k heads of dimension {} do not fit {} channels (d must be even)", p.qk_heads, p.head_dim,
               channels);
}

}  // namespace

void gdn_qkv_conv(const TensorView& out, const TensorView& inv_norm, const TensorView& x, const TensorView& w,
                  const TensorView& prefix, const TensorView& positions, const GdnQkParams& params) {
  expect_shape(x, "gdn conv x", {{"T", -1}, {"C", -1}});
  expect_shape(out, "gdn conv out", {{"T", x.size(0)}, {"C", x.size(1)}});
  expect_shape(inv_norm, "gdn conv inv_norm", {{"T", x.size(0)}, {"H_qk", params.qk_heads}});
  expect_shape(positions, "gdn conv positions", {{"T", x.size(0)}});
  expect_dtype(positions, "gdn conv positions", DType::i64);
  check_params(params, x.size(1));
  if (shapes_only({out, inv_norm, x, w, prefix, positions})) return;
  if (on_cuda({out, inv_norm, x, w, prefix, positions})) {
#if HYDRA_CUDA
    cuda_impl::gdn_qkv_conv(out, inv_norm, x, w, prefix, positions, params);
    return;
#endif
  }
  reference::gdn_qkv_conv(out, inv_norm, x, w, prefix, positions, params);
}

void gdn_qk_backward(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& inv_norm,
                     const TensorView& positions, const GdnQkParams& params) {
  expect_shape(y, "gdn qk y", {{"T", -1}, {"H", -1}, {"d", params.head_dim}});
  expect_shape(dy, "gdn qk dy", {{"T", y.size(0)}, {"H", y.size(1)}, {"d", y.size(2)}});
  expect_shape(dx, "gdn qk dx", {{"T", y.size(0)}, {"H", y.size(1)}, {"d", y.size(2)}});
  expect_shape(inv_norm, "gdn qk inv_norm", {{"T", y.size(0)}, {"H", y.size(1)}});
  expect_shape(positions, "gdn qk positions", {{"T", y.size(0)}});
  expect_dtype(positions, "gdn qk positions", DType::i64);
  HYDRA_ASSERT(params.head_dim % 2 == 0, "gdn_qk_backward needs an even head dim, got {}", params.head_dim);
  if (shapes_only({dx, dy, y, inv_norm, positions})) return;
  if (on_cuda({dx, dy, y, inv_norm, positions})) {
#if HYDRA_CUDA
    cuda_impl::gdn_qk_backward(dx, dy, y, inv_norm, positions, params);
    return;
#endif
  }
  reference::gdn_qk_backward(dx, dy, y, inv_norm, positions, params);
}

}  // namespace hydra::ops
