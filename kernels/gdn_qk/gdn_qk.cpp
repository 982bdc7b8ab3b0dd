#include "kernels/gdn_qk/gdn_qk.h"

#include <cmath>

#include "kernels/common.h"
#include "kernels/conv/conv.h"
#include "kernels/rope/rope.h"

namespace hydra::ops {
namespace {

void check_params(const GdnQkParams& p, int64_t channels) {
  HYDRA_ASSERT(p.qk_heads >= 0 && p.head_dim > 0 && p.head_dim % 2 == 0 && p.qk_heads * p.head_dim <= channels,
               "gdn_qk: {} q/k heads of dimension {} do not fit {} channels (d must be even)", p.qk_heads, p.head_dim,
               channels);
}

// The L2 norm of each head row of y [T, H, d] in place, its inverse norm into inv_norm [T, H].
template <class T>
void normalise_cpu(const TensorView& y, const TensorView& inv_norm, float eps) {
  const int64_t d = y.size(2);
  for (int64_t t = 0; t < y.size(0); ++t) {
    for (int64_t h = 0; h < y.size(1); ++h) {
      T* row = at<T>(y, {t, h});
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(row[i]) * row[i];
      const T r = T(1) / std::sqrt(static_cast<T>(ss) + static_cast<T>(eps));
      for (int64_t i = 0; i < d; ++i) row[i] *= r;
      *at<T>(inv_norm, {t, h}) = r;
    }
  }
}

// dx = r (dy − y (y·dy)) per head row, in fp64; dy is read before dx is written (dx may alias dy).
template <class T>
void norm_backward_cpu(const TensorView& dx, const TensorView& dy, const TensorView& y, const TensorView& inv_norm) {
  const int64_t d = y.size(2);
  for (int64_t t = 0; t < y.size(0); ++t) {
    for (int64_t h = 0; h < y.size(1); ++h) {
      const T* yr = at<const T>(y, {t, h});
      const T* dyr = at<const T>(dy, {t, h});
      T* dxr = at<T>(dx, {t, h});
      double dot = 0;
      for (int64_t i = 0; i < d; ++i) dot += static_cast<double>(yr[i]) * dyr[i];
      const double r = *at<const T>(inv_norm, {t, h});
      for (int64_t i = 0; i < d; ++i) dxr[i] = static_cast<T>(r * (static_cast<double>(dyr[i]) - yr[i] * dot));
    }
  }
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
  // The reference: the three ops of the unfused path, in turn.
  causal_conv_silu(out, x, w, prefix);
  if (params.qk_heads == 0) return;
  const TensorView qk = out.narrow(1, 0, params.qk_heads * params.head_dim).split_dim(1, params.qk_heads, params.head_dim);
  rope(qk, positions, {params.rope_theta});
  with_host_float({{qk, "gdn conv out"}, {inv_norm, "gdn conv inv_norm"}},
                  [&](auto zero) { normalise_cpu<decltype(zero)>(qk, inv_norm, params.l2_eps); });
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
  with_host_float({{dx, "gdn qk dx"}, {dy, "gdn qk dy"}, {y, "gdn qk y"}, {inv_norm, "gdn qk inv_norm"}},
                  [&](auto zero) { norm_backward_cpu<decltype(zero)>(dx, dy, y, inv_norm); });
  rope(dx, positions, {params.rope_theta, RopeDirection::inverse});
}

}  // namespace hydra::ops
