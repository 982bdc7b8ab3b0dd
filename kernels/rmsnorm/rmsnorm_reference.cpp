// The CPU reference of the RMS norm and its backward (rmsnorm.h), called by the entry points
// (rmsnorm.cpp) for host tensors once shapes are checked.
#include "kernels/rmsnorm/rmsnorm_reference.h"

#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

template <class T>
void rms_norm_cpu(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params) {
  const int64_t n = row_length(x);
  const T* w = weight.data_as<const T>();
  const std::vector<char*> out_rows = row_pointers(out);
  for_each_row(x, [&](int64_t r, char* row) {
    const T* xr = reinterpret_cast<const T*>(row);
    T* yr = reinterpret_cast<T*>(out_rows[static_cast<size_t>(r)]);
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const T inv = T(1) / std::sqrt(static_cast<T>(ss / static_cast<double>(n)) + static_cast<T>(params.eps));
    for (int64_t i = 0; i < n; ++i) yr[i] = w[i] * (xr[i] * inv);
  });
}

// Per row, in fp64: r = 1/sqrt(mean(x²) + eps), s = Σ x ⊙ w ⊙ dy, dx = r w ⊙ dy − x r³ s / n. Each row's
// sums are taken before its dx is written, so dx may alias dy.
template <class T>
void rms_norm_backward_cpu(const TensorView& dx, const TensorView& d_weight, const TensorView& dy, const TensorView& x,
                           const TensorView& weight, const RmsNormParams& params, Accumulate accumulate) {
  const int64_t n = row_length(x);
  const T* w = weight.data_as<const T>();
  const std::vector<char*> dx_rows = row_pointers(dx), dy_rows = row_pointers(dy);
  std::vector<double> dw(static_cast<size_t>(n), 0.0);
  for_each_row(x, [&](int64_t r, char* row) {
    const T* xr = reinterpret_cast<const T*>(row);
    const T* dyr = reinterpret_cast<const T*>(dy_rows[static_cast<size_t>(r)]);
    T* dxr = reinterpret_cast<T*>(dx_rows[static_cast<size_t>(r)]);
    double ss = 0, s = 0;
    for (int64_t i = 0; i < n; ++i) {
      ss += static_cast<double>(xr[i]) * xr[i];
      s += static_cast<double>(xr[i]) * w[i] * dyr[i];
    }
    const double inv = 1.0 / std::sqrt(ss / static_cast<double>(n) + static_cast<double>(params.eps));
    const double c = inv * inv * inv * s / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) {
      const double xi = xr[i], dyi = dyr[i];
      dw[static_cast<size_t>(i)] += dyi * xi * inv;
      const double g = inv * w[i] * dyi - xi * c;
      dxr[i] = static_cast<T>(accumulate == Accumulate::yes ? dxr[i] + g : g);
    }
  });
  if (d_weight.defined()) {
    T* dwp = d_weight.data_as<T>();
    for (int64_t i = 0; i < n; ++i) dwp[i] += static_cast<T>(dw[static_cast<size_t>(i)]);
  }
}

}  // namespace

void rms_norm(const TensorView& out, const TensorView& x, const TensorView& weight, const RmsNormParams& params) {
  with_host_float({{out, "rms_norm out"}, {x, "rms_norm x"}, {weight, "rms_norm weight"}},
                  [&](auto zero) { rms_norm_cpu<decltype(zero)>(out, x, weight, params); });
}

void rms_norm_backward(const TensorView& dx, const TensorView& d_weight, const TensorView& dy, const TensorView& x,
                       const TensorView& weight, const RmsNormParams& params, Accumulate accumulate) {
  with_host_float({{dx, "rms_norm dx"}, {d_weight, "rms_norm d_weight"}, {dy, "rms_norm dy"}, {x, "rms_norm x"},
                   {weight, "rms_norm weight"}},
                  [&](auto zero) {
                    rms_norm_backward_cpu<decltype(zero)>(dx, d_weight, dy, x, weight, params, accumulate);
                  });
}

}  // namespace hydra::ops::reference
