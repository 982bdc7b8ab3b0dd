// Gradient checks by central finite differences in float64, for the CPU backward of every op.
//
// Each test builds loss = Σ r ⊙ forward(inputs) with a fixed random r, runs the op's backward with
// r as the output gradient, and compares every input and weight gradient with
//   ∂loss/∂x_i ≈ (loss(x + h e_i) − loss(x − h e_i)) / 2h,  h = 1e-5.
// In float64 the difference quotient is accurate to ~1e-9 relative here (truncation h²·f'''/6 and
// rounding 1e-16·|loss|/h), so a bound of 1e-6 on max|analytic − numeric| / max|numeric| leaves
// three orders of margin while a wrong term (a missing factor, a sign, an off-by-one mask) gives
// errors of 1e-2 or more.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>

#include "runtime/tensor.h"

namespace hydra::test {

constexpr double kFiniteDifferenceStep = 1e-5;
constexpr double kGradientTolerance = 1e-6;

// Host float64 tensors: random_tensor / uniform_tensor's values, widened.
Tensor random64(std::initializer_list<int64_t> shape, uint64_t seed, double scale = 1.0);
Tensor uniform64(std::initializer_list<int64_t> shape, uint64_t seed, double lo, double hi);

// Σ r ⊙ y over every element (host float64 views of one shape, any strides).
double weighted_sum(const TensorView& y, const TensorView& r);

// Central differences of `loss` with respect to every element of x (host float64, contiguous),
// which is perturbed in place and restored.
Tensor numerical_gradient(const TensorView& x, const std::function<double()>& loss,
                          double step = kFiniteDifferenceStep);

// max|a − b| / max|b| (host float64 views of one shape, any strides); max|a − b| when b is all zero.
double relative_error(const TensorView& a, const TensorView& b);
// Largest |x| of a host float64 view.
double max_abs(const TensorView& x);

// Checks `analytic` against the finite differences of `loss` w.r.t. x: the numeric gradient must be
// nonzero (the check is not vacuous) and within `tolerance` relative. Prints the measured error.
void expect_gradient(const TensorView& analytic, const TensorView& x, const std::function<double()>& loss,
                     const std::string& what, double tolerance = kGradientTolerance);

}  // namespace hydra::test
