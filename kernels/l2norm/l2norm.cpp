#include "kernels/l2norm/l2norm.h"

#include <cmath>

#include "kernels/common.h"

namespace hydra::ops {

void l2_norm(const TensorView& x, float eps) {
  expect_shape(x, "l2_norm x", {{"T", -1}, {"H", -1}, {"d", -1}});
  if (on_cuda({x})) {
#if HYDRA_CUDA
    cuda_impl::l2_norm(x, eps);
    return;
#endif
  }
  expect_host_f32(x, "l2_norm x");
  const int64_t d = x.size(2);
  for_each_row(x, [&](int64_t, char* row) {
    float* r = reinterpret_cast<float*>(row);
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(r[i]) * r[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss) + eps);
    for (int64_t i = 0; i < d; ++i) r[i] *= inv;
  });
}

}  // namespace hydra::ops
