// The CPU reference of the elementwise ops (elementwise.h): the in-place add and the sigmoid gate with
// its backward, the scaling by a scalar read at run time; called by the entry points (elementwise.cpp) for host tensors once shapes are checked.
#include "kernels/elementwise/elementwise_reference.h"

#include <cmath>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

template <class T>
void add_inplace_cpu(const TensorView& x, const TensorView& y) {
  for (int64_t t = 0; t < x.size(0); ++t) {
    T* a = at<T>(x, {t});
    const T* b = at<const T>(y, {t});
    for (int64_t i = 0; i < x.size(1); ++i) a[i] += b[i];
  }
}

template <class T>
void sigmoid_gate_cpu(const TensorView& out, const TensorView& x, const TensorView& gate) {
  for (int64_t t = 0; t < x.size(0); ++t) {
    T* o = at<T>(out, {t});
    const T* a = at<const T>(x, {t});
    const T* g = at<const T>(gate, {t});
    for (int64_t i = 0; i < x.size(1); ++i) o[i] = a[i] / (T(1) + std::exp(-g[i]));
  }
}

// Element i of every row is read before it is written, so dx or d_gate may alias d_out.
template <class T>
void sigmoid_gate_backward_cpu(const TensorView& dx, const TensorView& d_gate, const TensorView& d_out,
                               const TensorView& x, const TensorView& gate) {
  for (int64_t t = 0; t < x.size(0); ++t) {
    T* dxr = at<T>(dx, {t});
    T* dgr = at<T>(d_gate, {t});
    const T* dor = at<const T>(d_out, {t});
    const T* xr = at<const T>(x, {t});
    const T* gr = at<const T>(gate, {t});
    for (int64_t i = 0; i < x.size(1); ++i) {
      const T s = sigmoid(gr[i]), dy = dor[i], xi = xr[i];
      dxr[i] = dy * s;
      dgr[i] = dy * xi * s * (T(1) - s);
    }
  }
}

}  // namespace

void add_inplace(const TensorView& x, const TensorView& y) {
  with_host_float({{x, "add x"}, {y, "add y"}}, [&](auto zero) { add_inplace_cpu<decltype(zero)>(x, y); });
}

void sigmoid_gate(const TensorView& out, const TensorView& x, const TensorView& gate) {
  with_host_float({{out, "gate out"}, {x, "gate x"}, {gate, "gate logits"}},
                  [&](auto zero) { sigmoid_gate_cpu<decltype(zero)>(out, x, gate); });
}

void sigmoid_gate_backward(const TensorView& dx, const TensorView& d_gate, const TensorView& d_out,
                           const TensorView& x, const TensorView& gate) {
  with_host_float({{dx, "gate dx"}, {d_gate, "gate d_gate"}, {d_out, "gate d_out"}, {x, "gate x"}, {gate, "gate logits"}},
                  [&](auto zero) { sigmoid_gate_backward_cpu<decltype(zero)>(dx, d_gate, d_out, x, gate); });
}

}  // namespace hydra::ops::reference
