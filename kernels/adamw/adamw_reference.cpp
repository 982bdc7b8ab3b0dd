// The CPU reference of the AdamW step and of the sum of squares (fp64 per element), called by the
// entry points (adamw.cpp) for host tensors once shapes are checked.
#include "kernels/adamw/adamw_reference.h"

#include <cmath>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

// The step in fp64 per element; m, v and master are stored back in T, the model copy in its own
// dtype (f32, f64 or bf16, converted by copy_into).
template <class T>
void adamw_cpu(const TensorView& master, const TensorView& m, const TensorView& v, const TensorView& grad,
               const TensorView& weight, const AdamWParams& p) {
  const int64_t n = master.numel();
  T* w = master.data_as<T>();
  T* m1 = m.data_as<T>();
  T* m2 = v.data_as<T>();
  const T* g = grad.data_as<const T>();
  const double b1 = p.beta1, b2 = p.beta2;
  const double c1 = 1.0 - std::pow(b1, static_cast<double>(p.step));
  const double c2 = 1.0 - std::pow(b2, static_cast<double>(p.step));
  const double lr = p.lr, decay = 1.0 - static_cast<double>(p.lr) * p.weight_decay;
  for (int64_t i = 0; i < n; ++i) {
    const double gi = static_cast<double>(p.grad_scale) * g[i];
    const double mi = b1 * m1[i] + (1.0 - b1) * gi;
    const double vi = b2 * m2[i] + (1.0 - b2) * gi * gi;
    m1[i] = static_cast<T>(mi);
    m2[i] = static_cast<T>(vi);
    w[i] = static_cast<T>(w[i] * decay - lr * (mi / c1) / (std::sqrt(vi / c2) + p.eps));
  }
  if (weight.defined() && weight.data() != master.data()) copy_into(weight, master);
}

template <class T>
double sum_of_squares_cpu(const TensorView& x) {
  const T* p = x.data_as<const T>();
  double s = 0;
  for (int64_t i = 0; i < x.numel(); ++i) s += static_cast<double>(p[i]) * p[i];
  return s;
}
}  // namespace

void adamw_update(const TensorView& master, const TensorView& m, const TensorView& v, const TensorView& grad,
                  const TensorView& weight, const AdamWParams& params) {
  HYDRA_ASSERT(!weight.defined() || (weight.on_host() && weight.dtype() != DType::i32 && weight.dtype() != DType::i64),
               "adamw weight must be a host float tensor");
  with_host_float({{master, "master"}, {m, "m"}, {v, "v"}, {grad, "grad"}},
                  [&](auto zero) { adamw_cpu<decltype(zero)>(master, m, v, grad, weight, params); });
}

double sum_of_squares(const TensorView& x) {
  double s = 0;
  with_host_float({{x, "sum_of_squares x"}}, [&](auto zero) { s = sum_of_squares_cpu<decltype(zero)>(x); });
  return s;
}

}  // namespace hydra::ops::reference
