// CPU reference of the chunked training losses: every row's statistics are taken with the maximum
// subtracted and summed in fp64, so logits in the thousands neither overflow nor lose the small
// probabilities; the gradient is written over the logits only after the row's loss is known. Called by
// the entry points (loss.cpp) for host tensors once shapes are checked.
#include "kernels/loss/loss_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

// max and log Σ exp of a row, in fp64.
template <class T>
double log_sum_exp(const T* row, int64_t n) {
  double m = row[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, static_cast<double>(row[i]));
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(static_cast<double>(row[i]) - m);
  return m + std::log(s);
}

template <class T>
void cross_entropy_cpu(const TensorView& logits, const TensorView& row_loss, const TensorView& targets,
                       float grad_scale) {
  const int64_t vocab = logits.size(1);
  const int32_t* target = targets.data_as<const int32_t>();
  for (int64_t r = 0; r < logits.size(0); ++r) {
    T* x = at<T>(logits, {r});
    T* loss = at<T>(row_loss, {r});
    if (target[r] < 0) {  // ignored row
      *loss = T(0);
      std::fill_n(x, vocab, T(0));
      continue;
    }
    const double lse = log_sum_exp(x, vocab);
    *loss = static_cast<T>(lse - static_cast<double>(x[target[r]]));
    for (int64_t i = 0; i < vocab; ++i) {
      const double p = std::exp(static_cast<double>(x[i]) - lse);
      x[i] = static_cast<T>(grad_scale * (p - (i == target[r] ? 1.0 : 0.0)));
    }
  }
}

template <class T>
void kl_divergence_cpu(const TensorView& student, const TensorView& row_loss, const TensorView& teacher,
                       float grad_scale, const TensorView& targets) {
  const int64_t vocab = student.size(1);
  for (int64_t r = 0; r < student.size(0); ++r) {
    T* s = at<T>(student, {r});
    if (targets.defined() && *at<const int32_t>(targets, {r}) < 0) {  // ignored row: loss 0, gradient 0
      std::fill(s, s + vocab, T(0));
      *at<T>(row_loss, {r}) = T(0);
      continue;
    }
    const T* t = at<const T>(teacher, {r});
    const double lse_s = log_sum_exp(s, vocab), lse_t = log_sum_exp(t, vocab);
    double kl = 0;
    for (int64_t i = 0; i < vocab; ++i) {
      const double log_pt = static_cast<double>(t[i]) - lse_t, log_ps = static_cast<double>(s[i]) - lse_s;
      const double pt = std::exp(log_pt);
      kl += pt * (log_pt - log_ps);  // p_t = 0 (underflow) contributes 0: both logs are finite
      s[i] = static_cast<T>(grad_scale * (std::exp(log_ps) - pt));
    }
    *at<T>(row_loss, {r}) = static_cast<T>(kl);
  }
}

// Element k of a row is read from a and b before d_a is written, so d_a may alias a.
template <class T>
void squared_error_cpu(const TensorView& d_a, const TensorView& row_loss, const TensorView& a, const TensorView& b,
                       float grad_scale) {
  for (int64_t r = 0; r < a.size(0); ++r) {
    const T* ar = at<const T>(a, {r});
    const T* br = at<const T>(b, {r});
    T* dr = at<T>(d_a, {r});
    double sum = 0;
    for (int64_t k = 0; k < a.size(1); ++k) {
      const double diff = static_cast<double>(ar[k]) - br[k];
      sum += diff * diff;
      dr[k] = static_cast<T>(grad_scale * 2.0 * diff);
    }
    *at<T>(row_loss, {r}) = static_cast<T>(sum);
  }
}

// The CPU path computes in place; a separate `grad` receives a copy.
void copy_gradient(const TensorView& grad, const TensorView& logits) {
  if (grad.defined() && grad.data() != logits.data()) copy_into(grad, logits);
}

}  // namespace

void cross_entropy_with_grad(const TensorView& logits, const TensorView& row_loss, const TensorView& targets,
                             float grad_scale, const TensorView& grad) {
  HYDRA_ASSERT(logits.stride(1) == 1, "cross_entropy logits rows must be contiguous");
  const int32_t* target = targets.data_as<const int32_t>();
  for (int64_t r = 0; r < targets.size(0); ++r) {
    HYDRA_ASSERT(target[r] < logits.size(1), "target {} at row {} outside [0, {})", target[r], r, logits.size(1));
  }
  with_host_float({{logits, "cross_entropy logits"}, {row_loss, "cross_entropy row_loss"}},
                  [&](auto zero) { cross_entropy_cpu<decltype(zero)>(logits, row_loss, targets, grad_scale); });
  copy_gradient(grad, logits);
}

void kl_divergence_with_grad(const TensorView& student_logits, const TensorView& row_loss,
                             const TensorView& teacher_logits, float grad_scale, const TensorView& grad,
                             const TensorView& targets) {
  HYDRA_ASSERT(student_logits.stride(1) == 1 && teacher_logits.stride(1) == 1, "kl logits rows must be contiguous");
  with_host_float(
      {{student_logits, "kl student logits"}, {row_loss, "kl row_loss"}, {teacher_logits, "kl teacher logits"}},
      [&](auto zero) {
        kl_divergence_cpu<decltype(zero)>(student_logits, row_loss, teacher_logits, grad_scale, targets);
      });
  copy_gradient(grad, student_logits);
}

void squared_error_with_grad(const TensorView& d_a, const TensorView& row_loss, const TensorView& a,
                             const TensorView& b, float grad_scale) {
  HYDRA_ASSERT(a.stride(1) == 1 && b.stride(1) == 1 && d_a.stride(1) == 1, "squared_error rows must be contiguous");
  with_host_float({{d_a, "squared_error d_a"}, {row_loss, "squared_error row_loss"}, {a, "squared_error a"},
                   {b, "squared_error b"}},
                  [&](auto zero) { squared_error_cpu<decltype(zero)>(d_a, row_loss, a, b, grad_scale); });
}

}  // namespace hydra::ops::reference
