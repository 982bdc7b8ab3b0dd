// The CPU reference of the GDN gates and their backward (gdn_gates.h), in fp64 per element; called by
// the entry points (gdn_gates.cpp) for host tensors once shapes are checked.
#include "kernels/gdn_gates/gdn_gates_reference.h"

#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

template <class T>
void gdn_gates_cpu(const TensorView& beta, const TensorView& g, const TensorView& b_logits, const TensorView& a_logits,
                   const TensorView& a_log, const TensorView& dt_bias) {
  const T* alog = a_log.data_as<const T>();
  const T* dtb = dt_bias.data_as<const T>();
  for (int64_t t = 0; t < b_logits.size(0); ++t) {
    const T* b = at<const T>(b_logits, {t});
    const T* a = at<const T>(a_logits, {t});
    T* bo = at<T>(beta, {t});
    T* go = at<T>(g, {t});
    for (int64_t h = 0; h < b_logits.size(1); ++h) {
      bo[h] = T(1) / (T(1) + std::exp(-b[h]));
      go[h] = -std::exp(alog[h]) * softplus(a[h] + dtb[h]);
    }
  }
}

// In fp64 per (token, head); the [H] gradients are summed over tokens, then added once.
template <class T>
void gdn_gates_backward_cpu(const TensorView& d_b_logits, const TensorView& d_a_logits, const TensorView& d_a_log,
                            const TensorView& d_dt_bias, const TensorView& d_beta, const TensorView& d_g,
                            const TensorView& b_logits, const TensorView& a_logits, const TensorView& a_log,
                            const TensorView& dt_bias) {
  const int64_t heads = b_logits.size(1);
  const T* alog = a_log.data_as<const T>();
  const T* dtb = dt_bias.data_as<const T>();
  std::vector<double> sum_da(static_cast<size_t>(heads), 0.0), sum_dalog(static_cast<size_t>(heads), 0.0);
  for (int64_t t = 0; t < b_logits.size(0); ++t) {
    const T* b = at<const T>(b_logits, {t});
    const T* a = at<const T>(a_logits, {t});
    const T* dbeta = at<const T>(d_beta, {t});
    const T* dg = at<const T>(d_g, {t});
    T* db_out = at<T>(d_b_logits, {t});
    T* da_out = at<T>(d_a_logits, {t});
    for (int64_t h = 0; h < heads; ++h) {
      const double beta = 1.0 / (1.0 + std::exp(-static_cast<double>(b[h])));
      const double x = static_cast<double>(a[h]) + dtb[h];
      const double decay_rate = std::exp(static_cast<double>(alog[h]));
      const double slope = x > 20.0 ? 1.0 : 1.0 / (1.0 + std::exp(-x));  // softplus'(x)
      const double gh = -decay_rate * softplus(x);
      const double da = -static_cast<double>(dg[h]) * decay_rate * slope;
      db_out[h] = static_cast<T>(dbeta[h] * beta * (1.0 - beta));
      da_out[h] = static_cast<T>(da);
      sum_da[static_cast<size_t>(h)] += da;
      sum_dalog[static_cast<size_t>(h)] += dg[h] * gh;
    }
  }
  for (int64_t h = 0; h < heads; ++h) {
    if (d_dt_bias.defined()) *at<T>(d_dt_bias, {h}) += static_cast<T>(sum_da[static_cast<size_t>(h)]);
    if (d_a_log.defined()) *at<T>(d_a_log, {h}) += static_cast<T>(sum_dalog[static_cast<size_t>(h)]);
  }
}

}  // namespace

void gdn_gates(const TensorView& beta, const TensorView& g, const TensorView& b_logits, const TensorView& a_logits,
               const TensorView& a_log, const TensorView& dt_bias) {
  with_host_float({{beta, "beta"}, {g, "g"}, {b_logits, "b"}, {a_logits, "a"}, {a_log, "A_log"}, {dt_bias, "dt_bias"}},
                  [&](auto zero) { gdn_gates_cpu<decltype(zero)>(beta, g, b_logits, a_logits, a_log, dt_bias); });
}

void gdn_gates_backward(const TensorView& d_b_logits, const TensorView& d_a_logits, const TensorView& d_a_log,
                        const TensorView& d_dt_bias, const TensorView& d_beta, const TensorView& d_g,
                        const TensorView& b_logits, const TensorView& a_logits, const TensorView& a_log,
                        const TensorView& dt_bias) {
  with_host_float({{d_b_logits, "d_b"}, {d_a_logits, "d_a"}, {d_a_log, "d_A_log"}, {d_dt_bias, "d_dt_bias"},
                   {d_beta, "d_beta"}, {d_g, "d_g"}, {b_logits, "b"}, {a_logits, "a"}, {a_log, "A_log"},
                   {dt_bias, "dt_bias"}},
                  [&](auto zero) {
                    gdn_gates_backward_cpu<decltype(zero)>(d_b_logits, d_a_logits, d_a_log, d_dt_bias, d_beta, d_g,
                                                           b_logits, a_logits, a_log, dt_bias);
                  });
}

}  // namespace hydra::ops::reference
