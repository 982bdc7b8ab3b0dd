#include "kernels/gdn_gates/gdn_gates.h"

#include <cmath>

#include "kernels/common.h"

namespace hydra::ops {

void gdn_gates(const TensorView& beta, const TensorView& g, const TensorView& b_logits, const TensorView& a_logits,
               const TensorView& a_log, const TensorView& dt_bias) {
  expect_shape(b_logits, "gdn b logits", {{"T", -1}, {"H", -1}});
  const int64_t t_len = b_logits.size(0), heads = b_logits.size(1);
  expect_shape(a_logits, "gdn a logits", {{"T", t_len}, {"H", heads}});
  expect_shape(beta, "gdn beta", {{"T", t_len}, {"H", heads}});
  expect_shape(g, "gdn g", {{"T", t_len}, {"H", heads}});
  expect_shape(a_log, "gdn A_log", {{"H", heads}});
  expect_shape(dt_bias, "gdn dt_bias", {{"H", heads}});
  for (const auto& [view, name] : {std::pair{beta, "beta"}, {g, "g"}, {b_logits, "b"}, {a_logits, "a"},
                                   {a_log, "A_log"}, {dt_bias, "dt_bias"}}) {
    if (on_cuda({beta, g, b_logits, a_logits, a_log, dt_bias})) {
#if HYDRA_CUDA
      cuda_impl::gdn_gates(beta, g, b_logits, a_logits, a_log, dt_bias);
      return;
#endif
    }
    expect_host_f32(view, name);
  }
  const float* alog = a_log.data_as<const float>();
  const float* dtb = dt_bias.data_as<const float>();
  for (int64_t t = 0; t < t_len; ++t) {
    const float* b = static_cast<const float*>(b_logits.element_ptr({t}));
    const float* a = static_cast<const float*>(a_logits.element_ptr({t}));
    float* bo = static_cast<float*>(beta.element_ptr({t}));
    float* go = static_cast<float*>(g.element_ptr({t}));
    for (int64_t h = 0; h < heads; ++h) {
      bo[h] = 1.0f / (1.0f + std::exp(-b[h]));
      go[h] = -std::exp(alog[h]) * softplus(a[h] + dtb[h]);
    }
  }
}

}  // namespace hydra::ops
