#include "kernels/rmsnorm/rmsnorm.h"

#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops {

void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params) {
  HYDRA_ASSERT(same_rows(out, x), "rms_norm: out {} vs x {}", out.shape_string(), x.shape_string());
  const int64_t n = row_length(x);
  expect_shape(weight, "rms_norm weight", {{"n", n}});
  if (on_cuda({out, x, weight})) {
#if HYDRA_CUDA
    cuda_impl::rms_norm(out, x, weight, params);
    return;
#endif
  }
  expect_host_f32(out, "rms_norm out");
  expect_host_f32(x, "rms_norm x");
  expect_host_f32(weight, "rms_norm weight");
  const float* w = weight.data_as<const float>();
  std::vector<char*> out_rows;
  out_rows.reserve(static_cast<size_t>(row_count(out)));
  for_each_row(out, [&](int64_t, char* row) { out_rows.push_back(row); });
  for_each_row(x, [&](int64_t r, char* row) {
    const float* xr = reinterpret_cast<const float*>(row);
    float* yr = reinterpret_cast<float*>(out_rows[static_cast<size_t>(r)]);
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(n)) + params.eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
  });
}

}  // namespace hydra::ops
