// The CPU reference of RoPE (rope.h): angles in fp64, rounded to the element type; called by the entry
// point (rope.cpp) for host tensors once shapes are checked.
#include "kernels/rope/rope_reference.h"

#include <cmath>
#include <vector>

#include "kernels/common.h"

namespace hydra::ops::reference {
namespace {

template <class T>
void rope_cpu(const TensorView& x, const TensorView& positions, const RopeParams& params) {
  const int64_t d = x.size(2), half = d / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = 1.0 / std::pow(params.theta, static_cast<double>(2 * i) / d);
  const bool inverse = params.direction == RopeDirection::inverse;
  const int64_t* pos = positions.data_as<const int64_t>();
  std::vector<T> c(static_cast<size_t>(half)), s(static_cast<size_t>(half));
  for (int64_t t = 0; t < x.size(0); ++t) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(pos[t]) * inv_freq[i];
      c[i] = static_cast<T>(std::cos(angle));
      const T sine = static_cast<T>(std::sin(angle));
      s[i] = inverse ? -sine : sine;  // rotation by −angle: the transpose
    }
    for (int64_t h = 0; h < x.size(1); ++h) {
      T* row = at<T>(x, {t, h});
      for (int64_t i = 0; i < half; ++i) {
        const T a = row[i], b = row[i + half];
        row[i] = a * c[i] - b * s[i];
        row[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace

void rope(const TensorView& x, const TensorView& positions, const RopeParams& params) {
  HYDRA_ASSERT(x.size(2) % 2 == 0, "rope needs an even head dim, got {}", x.size(2));
  with_host_float({{x, "rope x"}}, [&](auto zero) { rope_cpu<decltype(zero)>(x, positions, params); });
}

}  // namespace hydra::ops::reference
