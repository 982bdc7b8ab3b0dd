#include "kernels/conv/conv.h"

#include <cmath>

#include "kernels/common.h"

namespace hydra::ops {

void causal_conv_silu(const TensorView& out, const TensorView& x, const TensorView& w, const TensorView& prefix) {
  expect_shape(x, "conv x", {{"T", -1}, {"C", -1}});
  expect_shape(out, "conv out", {{"T", x.size(0)}, {"C", x.size(1)}});
  expect_shape(w, "conv weight", {{"C", x.size(1)}, {"K", -1}});
  const int64_t t_len = x.size(0), channels = x.size(1), kernel = w.size(1);
  if (prefix.defined()) expect_shape(prefix, "conv prefix", {{"K-1", kernel - 1}, {"C", channels}});
  if (on_cuda({out, x, w, prefix})) {
#if HYDRA_CUDA
    cuda_impl::causal_conv_silu(out, x, w, prefix);
    return;
#endif
  }
  expect_host_f32(out, "conv out");
  expect_host_f32(x, "conv x");
  expect_host_f32(w, "conv weight");
  HYDRA_ASSERT(out.data() != x.data(), "causal_conv_silu cannot run in place");
  const float* wt = w.data_as<const float>();
  const int64_t wstride = w.stride(0);
  for (int64_t i = 0; i < t_len; ++i) {
    float* o = static_cast<float*>(out.element_ptr({i}));
    for (int64_t c = 0; c < channels; ++c) {
      float acc = 0.0f;
      for (int64_t m = 0; m < kernel; ++m) {
        const int64_t src = i - kernel + 1 + m;
        float value = 0.0f;
        if (src >= 0) {
          value = static_cast<const float*>(x.element_ptr({src}))[c];
        } else if (prefix.defined() && src + kernel - 1 >= 0) {
          value = static_cast<const float*>(prefix.element_ptr({src + kernel - 1}))[c];
        }
        acc += wt[c * wstride + m] * value;
      }
      o[c] = acc / (1.0f + std::exp(-acc));
    }
  }
}

}  // namespace hydra::ops
