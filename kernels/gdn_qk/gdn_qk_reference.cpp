// The CPU reference of the GDN input pass and its q/k backward (gdn_qk.h): the unfused ops in turn
// (conv + SiLU, RoPE, the per-head L2 norm); called by the entry points (gdn_qk.cpp) for host tensors
// once shapes are checked.
#include "kernels/gdn_qk/gdn_qk_reference.h"

#include <cmath>

#include "kernels/common.h"
#include "kernels/conv/conv.h"
#include "kernels/rope/rope.h"

namespace hydra::ops::reference {
namespace {

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
  with_host_float({{dx, "gdn qk dx"}, {dy, "gdn qk dy"}, {y, "gdn qk y"}, {inv_norm, "gdn qk inv_norm"}},
                  [&](auto zero) { norm_backward_cpu<decltype(zero)>(dx, dy, y, inv_norm); });
  rope(dx, positions, {params.rope_theta, RopeDirection::inverse});
}

}  // namespace hydra::ops::reference
