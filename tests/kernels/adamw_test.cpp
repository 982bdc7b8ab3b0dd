// AdamW on fp32 master weights against a hand-written scalar loop over three steps (weight decay,
// bias corrections, grad_scale), the bf16 model copy, and sum_of_squares.
#include <cmath>
#include <vector>

#include "kernels/adamw/adamw.h"
#include "tests/common/test_util.h"
#include "tests/kernels/device_update_check.h"

namespace hydra::test {
namespace {

TEST(AdamW, ThreeStepsMatchScalarLoop) {
  const int64_t n = 10;
  const ops::AdamWParams base{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f};
  Tensor master = random_tensor({n}, 1), m = Tensor::zeros({n}, DType::f32), v = Tensor::zeros({n}, DType::f32);
  Tensor weight = Tensor::empty({n}, DType::bf16);
  std::vector<double> w_ref(master.data_as<float>(), master.data_as<float>() + n), m_ref(n, 0.0), v_ref(n, 0.0);
  for (int64_t step = 1; step <= 3; ++step) {
    Tensor grad = random_tensor({n}, 10 + step, 2.0f);
    grad.data_as<float>()[0] = 0.0f;  // a zero gradient: only the decay and the momentum move it
    const float grad_scale = step == 2 ? 0.5f : 1.0f;
    ops::AdamWParams p = base;
    p.step = step;
    p.grad_scale = grad_scale;
    ops::adamw_update(master, m, v, grad, weight, p);
    for (int64_t i = 0; i < n; ++i) {
      const double g = grad_scale * static_cast<double>(grad.data_as<float>()[i]);
      m_ref[i] = 0.9 * m_ref[i] + 0.1 * g;
      v_ref[i] = 0.95 * v_ref[i] + 0.05 * g * g;
      const double m_hat = m_ref[i] / (1 - std::pow(0.9, step)), v_hat = v_ref[i] / (1 - std::pow(0.95, step));
      w_ref[i] = w_ref[i] * (1 - 1e-2 * 0.1) - 1e-2 * m_hat / (std::sqrt(v_hat) + 1e-8);
    }
  }
  // fp32 storage of m, v and master between steps against fp64 throughout: ~1e-7 relative.
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(master.data_as<float>()[i], w_ref[i], 1e-6 * (1 + std::abs(w_ref[i]))) << i;
    EXPECT_NEAR(m.data_as<float>()[i], m_ref[i], 1e-6 * (1 + std::abs(m_ref[i]))) << i;
    EXPECT_NEAR(v.data_as<float>()[i], v_ref[i], 1e-6 * (1 + std::abs(v_ref[i]))) << i;
    EXPECT_EQ(bf16_to_float(weight.data_as<bf16>()[i]), round_to_bf16(master.data_as<float>()[i])) << i;
  }
  // The first step moves every weight by about lr (Adam's normalised step) plus the decay.
  EXPECT_GT(std::abs(w_ref[1] - random_tensor({n}, 1).data_as<float>()[1]), 1e-3);
}

TEST(AdamW, WeightMayAliasMasterOrBeAbsent) {
  const int64_t n = 7;
  Tensor grad = random_tensor({n}, 20);
  const ops::AdamWParams p{.lr = 1e-3f, .weight_decay = 0.01f, .step = 1};
  Tensor a = random_tensor({n}, 21), ma = Tensor::zeros({n}, DType::f32), va = Tensor::zeros({n}, DType::f32);
  Tensor b = clone(a), mb = clone(ma), vb = clone(va);
  ops::adamw_update(a, ma, va, grad, a, p);
  ops::adamw_update(b, mb, vb, grad, Tensor(), p);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(a.data_as<float>()[i], b.data_as<float>()[i]);
}

TEST(AdamW, SumOfSquares) {
  Tensor x = random_tensor({1000}, 30);
  double expected = 0;
  for (int64_t i = 0; i < x.numel(); ++i) expected += static_cast<double>(x.data_as<float>()[i]) * x.data_as<float>()[i];
  EXPECT_EQ(ops::sum_of_squares(x), expected);  // the same fp64 sum in the same order
  EXPECT_EQ(ops::sum_of_squares(to(x, Device::host, DType::f64)), expected);
}

TEST(AdamW, SumOfSquaresOfAList) {
  const Tensor a = random_tensor({1000}, 31), b = random_tensor({7, 3}, 32);
  const std::vector<TensorView> both = {a, b};
  EXPECT_EQ(ops::sum_of_squares(both), ops::sum_of_squares(a) + ops::sum_of_squares(b));
  EXPECT_EQ(ops::sum_of_squares(std::span<const TensorView>()), 0.0);
}

// The optimizer's tail as device work (ops::DeviceUpdate) on host tensors: the eager tail bit for bit,
// skipped steps included (tests/kernels/device_update_check.h).
TEST(AdamW, DeviceUpdateIsTheEagerTail) { check_device_update(Device::host, false); }

}  // namespace
}  // namespace hydra::test
