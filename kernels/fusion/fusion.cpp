#include "kernels/fusion/fusion.h"

#include <cmath>

#include "kernels/common.h"

namespace hydra::ops {

void head_fusion(const TensorView& y, const TensorView& o, const TensorView& weight, const TensorView& gamma,
                 const HeadFusionParams& params) {
  expect_shape(o, "fusion o", {{"T", -1}, {"H", -1}, {"d", -1}});
  const int64_t t_len = o.size(0), heads = o.size(1), d = o.size(2);
  expect_shape(y, "fusion y", {{"T", t_len}, {"H", heads}, {"d", d}});
  expect_shape(weight, "fusion weight", {{"H", heads}, {"d", d}});
  expect_shape(gamma, "fusion gamma", {{"H", heads}});
  for (const auto& [view, name] : {std::pair{y, "y"}, {o, "o"}, {weight, "weight"}, {gamma, "gamma"}}) {
    if (on_cuda({y, o, weight, gamma})) {
#if HYDRA_CUDA
      cuda_impl::head_fusion(y, o, weight, gamma, params);
      return;
#endif
    }
    expect_host_f32(view, name);
  }
  const float* gm = gamma.data_as<const float>();
  for (int64_t t = 0; t < t_len; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const float* x = static_cast<const float*>(o.element_ptr({t, h}));
      float* out = static_cast<float*>(y.element_ptr({t, h}));
      const float* w = static_cast<const float*>(weight.element_ptr({h}));
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(x[i]) * x[i];
      const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(d)) + params.eps);
      for (int64_t i = 0; i < d; ++i) out[i] = gm[h] * (w[i] * (x[i] * inv));
    }
  }
}

}  // namespace hydra::ops
