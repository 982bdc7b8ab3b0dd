// What the float64 gradient tests of the training objectives share (masked_loss_test.cpp,
// objective_gradient_test.cpp): a token sequence, float64 parameters, and the check of a gradient
// against central finite differences of the loss.
// Tolerance: central differences with h = 1e-5 in float64 have truncation error O(h²·f''') ≈ 1e-9
// and rounding error ≈ 1e-16/h ≈ 1e-11 relative to the loss; 1e-6 relative to the tensor's largest
// gradient entry leaves room for both and still catches a wrong scale, a missing term or a sign
// (errors of order 1e-2).
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/params.h"
#include "runtime/random.h"
#include "tests/common/test_util.h"

namespace hydra::test {

// Token ids (i·131 + 7) mod vocab: every id class appears, no two neighbours alike.
inline std::vector<int32_t> sequence(int64_t t, int64_t vocab) {
  std::vector<int32_t> ids(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 131 + 7) % vocab);
  return ids;
}

inline NamedTensors f64_parameters(const ModelConfig& c, uint64_t seed) {
  NamedTensors out;
  for (auto& [name, t] : random_parameters(c, seed)) out.emplace(name, to(t, Device::host, DType::f64));
  return out;
}

// grads (checkpoint names, float64) against (loss(θ + h e_i) − loss(θ − h e_i)) / 2h at `per_tensor`
// entries i of each tensor of `names`, drawn from `pick`. Each tensor's gradient must be finite and
// not all zero (a tensor off the loss's path would pass trivially).
inline void expect_gradients_match_finite_differences(const NamedTensors& params, const NamedTensors& grads,
                                                      const std::vector<std::string>& names, int per_tensor,
                                                      const RandomStream& pick,
                                                      const std::function<double(const NamedTensors&)>& loss) {
  const double h = 1e-5;
  int checked = 0;
  for (const std::string& name : names) {
    ASSERT_TRUE(params.count(name) && grads.count(name)) << name;
    const Tensor& grad = grads.at(name);
    ASSERT_EQ(count_non_finite(grad), 0) << name;
    double scale = 0;
    for (int64_t i = 0; i < grad.numel(); ++i) scale = std::max(scale, std::abs(grad.data_as<double>()[i]));
    ASSERT_GT(scale, 0.0) << name << ": no gradient at all";
    for (int k = 0; k < per_tensor; ++k) {
      const int64_t i = static_cast<int64_t>(pick.bits(static_cast<uint64_t>(checked)) % static_cast<uint64_t>(grad.numel()));
      NamedTensors plus = params, minus = params;
      plus[name] = clone(params.at(name));
      minus[name] = clone(params.at(name));
      plus[name].data_as<double>()[i] += h;
      minus[name].data_as<double>()[i] -= h;
      const double fd = (loss(plus) - loss(minus)) / (2 * h);
      EXPECT_NEAR(grad.data_as<double>()[i], fd, 1e-6 * std::max(scale, 1e-3)) << name << "[" << i << "]";
      ++checked;
    }
  }
}

}  // namespace hydra::test
