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

// Per head vector, in fp64: r = 1/sqrt(Σx² + eps), dx = r dy − x r³ (x·dy). The sums are taken
// before dx is written, so dx may alias dy.
template <class T>
void l2_norm_backward_cpu(const TensorView& dx, const TensorView& dy, const TensorView& x, float eps) {
  const int64_t d = x.size(2);
  const std::vector<char*> dx_rows = row_pointers(dx), dy_rows = row_pointers(dy);
  for_each_row(x, [&](int64_t r, char* row) {
    const T* xr = reinterpret_cast<const T*>(row);
    const T* dyr = reinterpret_cast<const T*>(dy_rows[static_cast<size_t>(r)]);
    T* dxr = reinterpret_cast<T*>(dx_rows[static_cast<size_t>(r)]);
    double ss = 0, xdy = 0;
    for (int64_t i = 0; i < d; ++i) {
      ss += static_cast<double>(xr[i]) * xr[i];
      xdy += static_cast<double>(xr[i]) * dyr[i];
    }
    const double inv = 1.0 / std::sqrt(ss + static_cast<double>(eps));
    const double c = inv * inv * inv * xdy;
    for (int64_t i = 0; i < d; ++i) dxr[i] = static_cast<T>(inv * dyr[i] - static_cast<double>(xr[i]) * c);
  });
}

}  // namespace

void l2_norm(const TensorView& x, float eps) {
  expect_shape(x, "l2_norm x", {{"T", -1}, {"H", -1}, {"d", -1}});
  if (on_cuda({x})) {
#if HYDRA_CUDA
    cuda_impl::l2_norm(x, eps);
    return;
#endif
  }
  with_host_float({{x, "l2_norm x"}}, [&](auto zero) { l2_norm_cpu<decltype(zero)>(x, eps); });
}

void l2_norm_backward(const TensorView& dx, const TensorView& dy, const TensorView& x, float eps) {
  expect_shape(x, "l2_norm x", {{"T", -1}, {"H", -1}, {"d", -1}});
  expect_shape(dy, "l2_norm dy", {{"T", x.size(0)}, {"H", x.size(1)}, {"d", x.size(2)}});
  expect_shape(dx, "l2_norm dx", {{"T", x.size(0)}, {"H", x.size(1)}, {"d", x.size(2)}});
  if (on_cuda({dx, dy, x})) {
#if HYDRA_CUDA
    cuda_impl::l2_norm_backward(dx, dy, x, eps);
    return;
#endif
  }
  with_host_float({{dx, "l2_norm dx"}, {dy, "l2_norm dy"}, {x, "l2_norm x"}},
                  [&](auto zero) { l2_norm_backward_cpu<decltype(zero)>(dx, dy, x, eps); });
}

}  // namespace hydra::ops
