#include "kernels/fusion/fusion.h"

#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops {
namespace {

void check_shapes(const TensorView& o, const TensorView& weight, const TensorView& gamma,
                  std::initializer_list<Named> like_o) {
  expect_shape(o, "fusion o", {{"T", -1}, {"H", -1}, {"d", -1}});
  const int64_t t_len = o.size(0), heads = o.size(1), d = o.size(2);
  expect_shape(weight, "fusion weight", {{"H", heads}, {"d", d}});
  expect_shape(gamma, "fusion gamma", {{"H", heads}});
  for (const Named& v : like_o) expect_shape(v.view, v.what, {{"T", t_len}, {"H", heads}, {"d", d}});
}

template <class T>
void head_fusion_cpu(const TensorView& y, const TensorView& o, const TensorView& weight, const TensorView& gamma,
                     const HeadFusionParams& params) {
  const int64_t t_len = o.size(0), heads = o.size(1), d = o.size(2);
  const T* gm = gamma.data_as<const T>();
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const T* x = at<const T>(o, {t, h});
      T* out = at<T>(y, {t, h});
      const T* w = at<const T>(weight, {h});
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
      const T inv = T(1) / std::sqrt(static_cast<T>(ss / static_cast<double>(d)) + static_cast<T>(params.eps));
      for (int64_t i = 0; i < d; ++i) out[i] = gm[h] * (w[i] * (x[i] * inv));
    }
  }
}

// Per (token, head), in fp64, with r = 1/sqrt(mean(o²) + eps) and d_n = γ d_y:
//   d_γ += d_y · (w ⊙ o r),  d_w += d_n ⊙ o r,  d_o = r w ⊙ d_n − o r³ mean(o ⊙ w ⊙ d_n).
// The row's sums are taken before d_o is written, so d_o may alias d_y.
template <class T>
void head_fusion_backward_cpu(const TensorView& d_o, const TensorView& d_weight, const TensorView& d_gamma,
                              const TensorView& d_y, const TensorView& o, const TensorView& weight,
                              const TensorView& gamma, const HeadFusionParams& params) {
  const int64_t t_len = o.size(0), heads = o.size(1), d = o.size(2);
  const T* gm = gamma.data_as<const T>();
  std::vector<double> dw(static_cast<size_t>(heads * d), 0.0), dgamma(static_cast<size_t>(heads), 0.0);
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const T* x = at<const T>(o, {t, h});
      const T* dy = at<const T>(d_y, {t, h});
      const T* w = at<const T>(weight, {h});
      T* dx = at<T>(d_o, {t, h});
      double* dwh = dw.data() + h * d;
      const double g = gm[h];
      double ss = 0, ydn = 0, s = 0;
      for (int64_t i = 0; i < d; ++i) {
        ss += static_cast<double>(x[i]) * x[i];
        ydn += static_cast<double>(dy[i]) * w[i] * x[i];  // d_y · (w ⊙ o), times r below
        s += static_cast<double>(x[i]) * w[i] * g * dy[i];
      }
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(d) + static_cast<double>(params.eps));
      const double c = inv * inv * inv * s / static_cast<double>(d);
      dgamma[static_cast<size_t>(h)] += ydn * inv;
      for (int64_t i = 0; i < d; ++i) {
        const double dn = g * dy[i], xi = x[i];
        dwh[i] += dn * xi * inv;
        dx[i] = static_cast<T>(inv * w[i] * dn - xi * c);
      }
    }
  }
  if (d_weight.defined()) {
    for (int64_t h = 0; h < heads; ++h) {
      T* dwr = at<T>(d_weight, {h});
      for (int64_t i = 0; i < d; ++i) dwr[i] += static_cast<T>(dw[static_cast<size_t>(h * d + i)]);
    }
  }
  if (d_gamma.defined()) {
    for (int64_t h = 0; h < heads; ++h) *at<T>(d_gamma, {h}) += static_cast<T>(dgamma[static_cast<size_t>(h)]);
  }
}

}  // namespace

void head_fusion(const TensorView& y, const TensorView& o, const TensorView& weight, const TensorView& gamma,
                 const HeadFusionParams& params) {
  check_shapes(o, weight, gamma, {{y, "fusion y"}});
  if (on_cuda({y, o, weight, gamma})) {
#if HYDRA_CUDA
    cuda_impl::head_fusion(y, o, weight, gamma, params);
    return;
#endif
  }
  with_host_float({{y, "y"}, {o, "o"}, {weight, "weight"}, {gamma, "gamma"}},
                  [&](auto zero) { head_fusion_cpu<decltype(zero)>(y, o, weight, gamma, params); });
}

void head_fusion_backward(const TensorView& d_o, const TensorView& d_weight, const TensorView& d_gamma,
                          const TensorView& d_y, const TensorView& o, const TensorView& weight,
                          const TensorView& gamma, const HeadFusionParams& params) {
  check_shapes(o, weight, gamma, {{d_o, "fusion d_o"}, {d_y, "fusion d_y"}});
  if (d_weight.defined()) expect_shape(d_weight, "fusion d_weight", {{"H", o.size(1)}, {"d", o.size(2)}});
  if (d_gamma.defined()) expect_shape(d_gamma, "fusion d_gamma", {{"H", o.size(1)}});
  if (on_cuda({d_o, d_weight, d_gamma, d_y, o, weight, gamma})) {
#if HYDRA_CUDA
    cuda_impl::head_fusion_backward(d_o, d_weight, d_gamma, d_y, o, weight, gamma, params);
    return;
#endif
  }
  with_host_float({{d_o, "d_o"}, {d_weight, "d_weight"}, {d_gamma, "d_gamma"}, {d_y, "d_y"}, {o, "o"},
                   {weight, "weight"}, {gamma, "gamma"}},
                  [&](auto zero) {
                    head_fusion_backward_cpu<decltype(zero)>(d_o, d_weight, d_gamma, d_y, o, weight, gamma, params);
                  });
}

}  // namespace hydra::ops
