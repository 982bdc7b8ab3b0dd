// The CPU reference of SwiGLU and its backward (swiglu.h), called by the entry points (swiglu.cpp) for
// host tensors once shapes are checked.
#include "kernels/swiglu/swiglu_reference.h"

#include <cmath>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

template <class T>
void swiglu_cpu(const TensorView& out, const TensorView& gate, const TensorView& up) {
  const int64_t n = out.size(1);
  for (int64_t t = 0; t < out.size(0); ++t) {
    T* o = at<T>(out, {t});
    const T* g = at<const T>(gate, {t});
    const T* u = at<const T>(up, {t});
    for (int64_t i = 0; i < n; ++i) o[i] = g[i] / (T(1) + std::exp(-g[i])) * u[i];
  }
}

// Element i of a row is read (gate, up, d_out) before d_gate and d_up are written, so the
// gradients may overwrite gate and up in place.
template <class T>
void swiglu_backward_cpu(const TensorView& d_gate, const TensorView& d_up, const TensorView& d_out,
                         const TensorView& gate, const TensorView& up) {
  const int64_t n = gate.size(1);
  for (int64_t t = 0; t < gate.size(0); ++t) {
    T* dg = at<T>(d_gate, {t});
    T* du = at<T>(d_up, {t});
    const T* dout = at<const T>(d_out, {t});
    const T* g = at<const T>(gate, {t});
    const T* u = at<const T>(up, {t});
    for (int64_t i = 0; i < n; ++i) {
      const T gi = g[i], ui = u[i], dy = dout[i];
      const T s = T(1) / (T(1) + std::exp(-gi));
      dg[i] = dy * ui * s * (T(1) + gi * (T(1) - s));
      du[i] = dy * gi * s;
    }
  }
}

}  // namespace

void swiglu(const TensorView& out, const TensorView& gate, const TensorView& up) {
  with_host_float({{out, "swiglu out"}, {gate, "swiglu gate"}, {up, "swiglu up"}},
                  [&](auto zero) { swiglu_cpu<decltype(zero)>(out, gate, up); });
}

void swiglu_backward(const TensorView& d_gate, const TensorView& d_up, const TensorView& d_out,
                     const TensorView& gate, const TensorView& up) {
  with_host_float({{d_gate, "swiglu d_gate"}, {d_up, "swiglu d_up"}, {d_out, "swiglu d_out"}, {gate, "swiglu gate"},
                   {up, "swiglu up"}},
                  [&](auto zero) { swiglu_backward_cpu<decltype(zero)>(d_gate, d_up, d_out, gate, up); });
}

}  // namespace hydra::ops::reference
