#include "kernels/softmax/softmax.h"

#include <algorithm>
#include <cmath>

#include "kernels/common.h"

namespace hydra::ops {
namespace {
// log Σ exp(row) with the max subtracted.
template <class T>
double log_sum_exp(const T* row, int64_t n) {
  T m = row[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, row[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(row[i] - m));
  return m + std::log(s);
}

template <class T>
void log_softmax_cpu(const TensorView& out, const TensorView& logits) {
  const int64_t v = logits.size(1);
  for (int64_t t = 0; t < logits.size(0); ++t) {
    const T* x = at<const T>(logits, {t});
    T* y = at<T>(out, {t});
    const double lse = log_sum_exp(x, v);
    for (int64_t i = 0; i < v; ++i) y[i] = static_cast<T>(x[i] - lse);
  }
}

template <class T>
void cross_entropy_cpu(const TensorView& nll, const TensorView& logits, const TensorView& targets) {
  const int64_t v = logits.size(1);
  const int32_t* target = targets.data_as<const int32_t>();
  T* out = nll.data_as<T>();
  for (int64_t t = 0; t < logits.size(0); ++t) {
    HYDRA_ASSERT(target[t] >= 0 && target[t] < v, "target {} at {} outside [0, {})", target[t], t, v);
    const T* x = at<const T>(logits, {t});
    out[t] = static_cast<T>(log_sum_exp(x, v) - x[target[t]]);
  }
}
}  // namespace

void log_softmax(const TensorView& out, const TensorView& logits) {
  expect_shape(logits, "log_softmax logits", {{"T", -1}, {"V", -1}});
  expect_shape(out, "log_softmax out", {{"T", logits.size(0)}, {"V", logits.size(1)}});
  HYDRA_ASSERT(logits.size(1) > 0, "log_softmax over an empty vocabulary");
  with_host_float({{out, "log_softmax out"}, {logits, "log_softmax logits"}},
                  [&](auto zero) { log_softmax_cpu<decltype(zero)>(out, logits); });
}

void cross_entropy(const TensorView& nll, const TensorView& logits, const TensorView& targets) {
  expect_shape(logits, "cross_entropy logits", {{"T", -1}, {"V", -1}});
  expect_shape(targets, "cross_entropy targets", {{"T", logits.size(0)}});
  expect_shape(nll, "cross_entropy nll", {{"T", logits.size(0)}});
  expect_dtype(targets, "cross_entropy targets", DType::i32);
  with_host_float({{nll, "cross_entropy nll"}, {logits, "cross_entropy logits"}},
                  [&](auto zero) { cross_entropy_cpu<decltype(zero)>(nll, logits, targets); });
}

}  // namespace hydra::ops
