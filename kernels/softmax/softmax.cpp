#include "kernels/softmax/softmax.h"

#include <algorithm>
#include <cmath>

#include "kernels/common.h"

namespace hydra::ops {
namespace {
// log Σ exp(row) with the max subtracted.
double log_sum_exp(const float* row, int64_t n) {
  float m = row[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, row[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(row[i] - m));
  return m + std::log(s);
}
}  // namespace

void log_softmax(const TensorView& out, const TensorView& logits) {
  expect_shape(logits, "log_softmax logits", {{"T", -1}, {"V", -1}});
  expect_shape(out, "log_softmax out", {{"T", logits.size(0)}, {"V", logits.size(1)}});
  expect_host_f32(out, "log_softmax out");
  expect_host_f32(logits, "log_softmax logits");
  const int64_t v = logits.size(1);
  HYDRA_ASSERT(v > 0, "log_softmax over an empty vocabulary");
  for (int64_t t = 0; t < logits.size(0); ++t) {
    const float* x = static_cast<const float*>(logits.element_ptr({t}));
    float* y = static_cast<float*>(out.element_ptr({t}));
    const double lse = log_sum_exp(x, v);
    for (int64_t i = 0; i < v; ++i) y[i] = static_cast<float>(x[i] - lse);
  }
}

void cross_entropy(const TensorView& nll, const TensorView& logits, const TensorView& targets) {
  expect_shape(logits, "cross_entropy logits", {{"T", -1}, {"V", -1}});
  expect_shape(targets, "cross_entropy targets", {{"T", logits.size(0)}});
  expect_shape(nll, "cross_entropy nll", {{"T", logits.size(0)}});
  expect_dtype(targets, "cross_entropy targets", DType::i32);
  expect_host_f32(nll, "cross_entropy nll");
  expect_host_f32(logits, "cross_entropy logits");
  const int64_t v = logits.size(1);
  const int32_t* target = targets.data_as<const int32_t>();
  float* out = nll.data_as<float>();
  for (int64_t t = 0; t < logits.size(0); ++t) {
    HYDRA_ASSERT(target[t] >= 0 && target[t] < v, "target {} at {} outside [0, {})", target[t], t, v);
    const float* x = static_cast<const float*>(logits.element_ptr({t}));
    out[t] = static_cast<float>(log_sum_exp(x, v) - x[target[t]]);
  }
}

}  // namespace hydra::ops
