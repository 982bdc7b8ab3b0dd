// The chunked training losses (kernels/loss): float64 finite differences of the summed row losses
// (gradcheck.h), ignored targets, grad_scale, large logits (no overflow, shift invariance), and
// agreement with the existing per-token cross_entropy.
#include <cmath>
#include <cstring>

#include "kernels/loss/loss.h"
#include "kernels/softmax/softmax.h"
#include "tests/common/test_util.h"
#include "tests/kernels/gradcheck.h"

namespace hydra::test {
namespace {

double sum_of(const Tensor& row_loss) {
  const Tensor d = to(row_loss, Device::host, DType::f64);
  double s = 0;
  for (int64_t i = 0; i < d.numel(); ++i) s += d.data_as<double>()[i];
  return s;
}

Tensor targets_of(std::initializer_list<int32_t> values) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::i32);
  std::copy(values.begin(), values.end(), t.data_as<int32_t>());
  return t;
}

TEST(Loss, CrossEntropyGradientAndIgnoredRows) {
  const int64_t n = 6, vocab = 11;
  Tensor logits = random64({n, vocab}, 1, 3.0);
  Tensor targets = targets_of({4, 0, -1, 10, 4, -100});
  auto loss = [&] {
    Tensor work = clone(logits), rows = Tensor::empty({n}, DType::f64);
    ops::cross_entropy_with_grad(work, rows, targets, 1.0f);
    return sum_of(rows);
  };
  Tensor grad = clone(logits), rows = Tensor::empty({n}, DType::f64);
  ops::cross_entropy_with_grad(grad, rows, targets, 1.0f);
  expect_gradient(grad, logits, loss, "cross_entropy d_logits");
  for (int64_t r : {2, 5}) {
    EXPECT_EQ(rows.data_as<double>()[r], 0.0) << "ignored row " << r;
    EXPECT_EQ(max_abs(grad.view().select(0, r)), 0.0) << "ignored row " << r;
  }
  // The row losses equal the existing per-token cross-entropy on the rows with targets.
  Tensor valid = Tensor::empty({4, vocab}, DType::f64), nll = Tensor::empty({4}, DType::f64);
  const int64_t kept[] = {0, 1, 3, 4};
  for (int i = 0; i < 4; ++i) copy_into(valid.view().select(0, i), logits.view().select(0, kept[i]));
  ops::cross_entropy(nll, valid, targets_of({4, 0, 10, 4}));
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(rows.data_as<double>()[kept[i]], nll.data_as<double>()[i], 1e-13);
  // grad_scale scales the gradient only.
  Tensor scaled = clone(logits), rows_scaled = Tensor::empty({n}, DType::f64);
  ops::cross_entropy_with_grad(scaled, rows_scaled, targets, 0.25f);
  EXPECT_LE(relative_error(rows_scaled, rows), 0.0);
  for (int64_t i = 0; i < grad.numel(); ++i) {
    EXPECT_NEAR(scaled.data_as<double>()[i], 0.25 * grad.data_as<double>()[i], 1e-16);
  }
  // The scale read "at run time" from a [1] f32 tensor (a captured step's device scalar) in place of
  // the value argument: the same bits as passing it by value.
  Tensor at_run_time = clone(logits), rows_run_time = Tensor::empty({n}, DType::f64);
  Tensor scale = Tensor::empty({1}, DType::f32);
  scale.data_as<float>()[0] = 0.25f;
  ops::cross_entropy_with_grad(at_run_time, rows_run_time, targets, 7.0f, TensorView(), scale);
  EXPECT_EQ(std::memcmp(at_run_time.data(), scaled.data(), scaled.nbytes()), 0);
  EXPECT_EQ(std::memcmp(rows_run_time.data(), rows_scaled.data(), rows_scaled.nbytes()), 0);
}

TEST(Loss, CrossEntropyLargeLogitsDoNotOverflow) {
  // fp32 logits around ±3e4: exp would overflow without the max subtracted. The loss is invariant
  // under a shift of the row, so it must equal the loss of the unshifted logits.
  const int64_t n = 3, vocab = 50;
  Tensor base = random_tensor({n, vocab}, 2, 4.0f), shifted = clone(base);
  const float shifts[] = {3e4f, -3e4f, 1e3f};
  for (int64_t r = 0; r < n; ++r)
    for (int64_t v = 0; v < vocab; ++v) shifted.data_as<float>()[r * vocab + v] += shifts[r];
  Tensor targets = targets_of({1, 49, 7});
  Tensor rows_base = Tensor::empty({n}, DType::f32), rows_shift = Tensor::empty({n}, DType::f32);
  ops::cross_entropy_with_grad(base, rows_base, targets, 1.0f);
  ops::cross_entropy_with_grad(shifted, rows_shift, targets, 1.0f);
  // Tolerance: the shifted logits carry fp32 rounding of 3e4 + x (ulp 2e-3), so the loss agrees to ~1e-2.
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_TRUE(std::isfinite(rows_shift.data_as<float>()[r]));
    EXPECT_NEAR(rows_shift.data_as<float>()[r], rows_base.data_as<float>()[r], 1e-2) << "row " << r;
  }
  expect_close(shifted, base, 1e-2, "gradient of shifted logits");
}

TEST(Loss, KlDivergence) {
  const int64_t n = 5, vocab = 13;
  Tensor student = random64({n, vocab}, 3, 2.0), teacher = random64({n, vocab}, 4, 2.0);
  auto loss = [&] {
    Tensor work = clone(student), rows = Tensor::empty({n}, DType::f64);
    ops::kl_divergence_with_grad(work, rows, teacher, 1.0f);
    return sum_of(rows);
  };
  Tensor grad = clone(student), rows = Tensor::empty({n}, DType::f64);
  ops::kl_divergence_with_grad(grad, rows, teacher, 1.0f);
  for (int64_t r = 0; r < n; ++r) EXPECT_GT(rows.data_as<double>()[r], 0.0) << "KL of different rows";
  expect_gradient(grad, student, loss, "kl_divergence d_student");
  // KL(p ‖ p) = 0 with a zero gradient; grad_scale scales the gradient.
  Tensor same = clone(teacher), rows_same = Tensor::empty({n}, DType::f64);
  ops::kl_divergence_with_grad(same, rows_same, teacher, 1.0f);
  EXPECT_LE(max_abs(rows_same), 1e-15);
  EXPECT_LE(max_abs(same), 1e-16);
  Tensor scaled = clone(student), rows_scaled = Tensor::empty({n}, DType::f64);
  ops::kl_divergence_with_grad(scaled, rows_scaled, teacher, 0.5f);
  for (int64_t i = 0; i < grad.numel(); ++i) {
    EXPECT_NEAR(scaled.data_as<double>()[i], 0.5 * grad.data_as<double>()[i], 1e-16);
  }
}

TEST(Loss, KlDivergenceLargeAndPeakedLogits) {
  // Teacher logits spread over ±1e4 (probabilities that underflow to 0 in fp64) and a student
  // shifted by 2e4: finite loss, equal to the unshifted student's (shift invariance).
  const int64_t n = 2, vocab = 20;
  Tensor teacher = random64({n, vocab}, 5, 1e4), student = random64({n, vocab}, 6, 3.0);
  Tensor shifted = clone(student);
  for (int64_t i = 0; i < shifted.numel(); ++i) shifted.data_as<double>()[i] += 2e4;
  Tensor rows = Tensor::empty({n}, DType::f64), rows_shift = Tensor::empty({n}, DType::f64);
  ops::kl_divergence_with_grad(student, rows, teacher, 1.0f);
  ops::kl_divergence_with_grad(shifted, rows_shift, teacher, 1.0f);
  for (int64_t r = 0; r < n; ++r) {
    EXPECT_TRUE(std::isfinite(rows.data_as<double>()[r]));
    EXPECT_NEAR(rows_shift.data_as<double>()[r], rows.data_as<double>()[r], 1e-9 * std::abs(rows.data_as<double>()[r]));
  }
  EXPECT_LE(relative_error(shifted, student), 1e-9);
}

TEST(Loss, SquaredError) {
  const int64_t n = 4, dim = 6;
  Tensor a = random64({n, dim}, 7), b = random64({n, dim}, 8);
  auto loss = [&] {
    Tensor d = Tensor::empty({n, dim}, DType::f64), rows = Tensor::empty({n}, DType::f64);
    ops::squared_error_with_grad(d, rows, a, b, 1.0f);
    return sum_of(rows);
  };
  Tensor da = Tensor::empty({n, dim}, DType::f64), rows = Tensor::empty({n}, DType::f64);
  ops::squared_error_with_grad(da, rows, a, b, 1.0f);
  expect_gradient(da, a, loss, "squared_error d_a");
  // In place over a, with a grad_scale.
  Tensor in_place = clone(a), rows2 = Tensor::empty({n}, DType::f64);
  ops::squared_error_with_grad(in_place, rows2, in_place, b, 0.125f);
  EXPECT_EQ(relative_error(rows2, rows), 0.0);
  for (int64_t i = 0; i < da.numel(); ++i) {
    EXPECT_NEAR(in_place.data_as<double>()[i], 0.125 * da.data_as<double>()[i], 1e-16);
  }
}

}  // namespace
}  // namespace hydra::test
