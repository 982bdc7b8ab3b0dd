#include "tests/kernels/gradcheck.h"

#include <array>
#include <cmath>
#include <cstdio>

#include <gtest/gtest.h>

#include "tests/common/test_util.h"

namespace hydra::test {
namespace {
// Visits every element of a host float64 view in row-major order.
template <class F>
void for_each_f64(const TensorView& v, F&& f) {
  EXPECT_EQ(v.dtype(), DType::f64);
  std::array<int64_t, kMaxRank> idx{};
  const double* base = static_cast<const double*>(v.data());
  for (int64_t i = 0; i < v.numel(); ++i) {
    int64_t offset = 0;
    for (int d = 0; d < v.rank(); ++d) offset += idx[d] * v.stride(d);
    f(i, base[offset]);
    for (int d = v.rank() - 1; d >= 0; --d) {
      if (++idx[d] < v.size(d)) break;
      idx[d] = 0;
    }
  }
}

std::vector<double> flatten(const TensorView& v) {
  std::vector<double> out(static_cast<size_t>(v.numel()));
  for_each_f64(v, [&](int64_t i, double x) { out[static_cast<size_t>(i)] = x; });
  return out;
}
}  // namespace

Tensor random64(std::initializer_list<int64_t> shape, uint64_t seed, double scale) {
  return to(random_tensor(shape, seed, static_cast<float>(scale)), Device::host, DType::f64);
}

Tensor uniform64(std::initializer_list<int64_t> shape, uint64_t seed, double lo, double hi) {
  return to(uniform_tensor(shape, seed, static_cast<float>(lo), static_cast<float>(hi)), Device::host, DType::f64);
}

double weighted_sum(const TensorView& y, const TensorView& r) {
  const std::vector<double> a = flatten(y), b = flatten(r);
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += a[i] * b[i];
  return s;
}

Tensor numerical_gradient(const TensorView& x, const std::function<double()>& loss, double step) {
  EXPECT_TRUE(x.dtype() == DType::f64 && x.is_contiguous()) << "finite differences need a contiguous float64 input";
  Tensor grad = Tensor::empty(x.shape(), DType::f64);
  double* p = static_cast<double*>(x.data());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double saved = p[i];
    p[i] = saved + step;
    const double up = loss();
    p[i] = saved - step;
    const double down = loss();
    p[i] = saved;
    grad.data_as<double>()[i] = (up - down) / (2 * step);
  }
  return grad;
}

double relative_error(const TensorView& a, const TensorView& b) {
  const std::vector<double> x = flatten(a), y = flatten(b);
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

double max_abs(const TensorView& x) {
  double m = 0;
  for_each_f64(x, [&](int64_t, double v) { m = std::max(m, std::abs(v)); });
  return m;
}

void expect_gradient(const TensorView& analytic, const TensorView& x, const std::function<double()>& loss,
                     const std::string& what, double tolerance) {
  ASSERT_EQ(analytic.numel(), x.numel()) << what;
  const Tensor numeric = numerical_gradient(x, loss);
  ASSERT_GT(max_abs(numeric), 0.0) << what << ": the loss does not depend on this input";
  for_each_f64(analytic, [&](int64_t i, double v) { ASSERT_TRUE(std::isfinite(v)) << what << "[" << i << "]"; });
  const double err = relative_error(analytic, numeric);
  std::printf("[gradcheck] %-40s rel err %.2e\n", what.c_str(), err);
  EXPECT_LE(err, tolerance) << what << ": analytic vs finite-difference gradient";
}

}  // namespace hydra::test
