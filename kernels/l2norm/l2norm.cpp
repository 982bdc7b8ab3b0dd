#include "kernels/l2norm/l2norm.h"

#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops {
namespace {

template <class T>
void l2_norm_cpu(const TensorView& x, float eps) {
  const int64_t d = x.size(2);
  for_each_row(x, [&](int64_t, char* row) {
    T* r = reinterpret_cast<T*>(row);
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += static_cast<double>(r[i]) * r[i];
    const T inv = T(1) / std::sqrt(static_cast<T>(ss) + static_cast<T>(eps));
    for (int64_t i = 0; i < d; ++i) r[i] *= inv;
  });
}

}  // namespace

void l2_norm(const TensorView& x, float eps) {
  expect_shape(x, "l2_norm x", {{"T", -1}, {"H", -1}, {"d", -1}});
  if (shapes_only({x})) return;
  if (on_cuda({x})) {
#if HYDRA_CUDA
    cuda_impl::l2_norm(x, eps);
    return;
#endif
  }
  with_host_float({{x, "l2_norm x"}}, [&](auto zero) { l2_norm_cpu<decltype(zero)>(x, eps); });
}

}  // namespace hydra::ops
