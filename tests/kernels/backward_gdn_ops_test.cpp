// Float64 gradient checks (gradcheck.h) of the GDN branch's small ops and the head fusion: the
// causal conv + SiLU (with and without the halo prefix, T shorter than the kernel, the halo's own
// gradient), the L2 norm, the β/g gates (including softplus's linear branch) and the per-head
// fusion RMSNorm·γ.
#include <cmath>

#include <fmt/format.h>

#include "kernels/conv/conv.h"
#include "kernels/fusion/fusion.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/l2norm/l2norm.h"
#include "tests/common/test_util.h"
#include "tests/kernels/gradcheck.h"

namespace hydra::test {
namespace {

struct ConvCase {
  int64_t t, channels, kernel;
  bool prefix;
};
class ConvBackward : public ::testing::TestWithParam<ConvCase> {};
INSTANTIATE_TEST_SUITE_P(Shapes, ConvBackward,
                         ::testing::Values(ConvCase{1, 3, 4, true}, ConvCase{2, 3, 4, false}, ConvCase{3, 5, 4, true},
                                           ConvCase{37, 5, 4, true}, ConvCase{37, 4, 4, false}, ConvCase{9, 2, 1, false}),
                         [](const auto& info) {
                           const ConvCase& c = info.param;
                           return fmt::format("T{}_C{}_K{}{}", c.t, c.channels, c.kernel, c.prefix ? "_prefix" : "_zeros");
                         });

TEST_P(ConvBackward, MatchesFiniteDifferences) {
  const ConvCase c = GetParam();
  Tensor x = random64({c.t, c.channels}, 1), w = random64({c.channels, c.kernel}, 2, 0.7);
  Tensor prefix = c.prefix && c.kernel > 1 ? random64({c.kernel - 1, c.channels}, 3) : Tensor();
  Tensor r = random64({c.t, c.channels}, 4);
  auto loss = [&] {
    Tensor out = Tensor::empty({c.t, c.channels}, DType::f64);
    ops::causal_conv_silu(out, x, w, prefix);
    return weighted_sum(out, r);
  };
  Tensor dx = Tensor::empty({c.t, c.channels}, DType::f64), dw = Tensor::zeros({c.channels, c.kernel}, DType::f64);
  Tensor d_prefix = c.kernel > 1 ? Tensor::empty({c.kernel - 1, c.channels}, DType::f64) : Tensor();
  ops::causal_conv_silu_backward(dx, dw, d_prefix, r, x, w, prefix);
  const std::string name = "conv T=" + std::to_string(c.t) + (c.prefix ? " prefix" : " zeros");
  expect_gradient(dx, x, loss, name + " dx");
  expect_gradient(dw, w, loss, name + " dw");
  if (prefix.defined()) expect_gradient(d_prefix, prefix, loss, name + " d_prefix");
  if (c.kernel > 1 && !prefix.defined()) {
    // The gradient w.r.t. a zero halo is still its gradient: compare with a zero prefix passed in.
    Tensor zeros = Tensor::zeros({c.kernel - 1, c.channels}, DType::f64);
    auto loss_zero = [&] {
      Tensor out = Tensor::empty({c.t, c.channels}, DType::f64);
      ops::causal_conv_silu(out, x, w, zeros);
      return weighted_sum(out, r);
    };
    expect_gradient(d_prefix, zeros, loss_zero, name + " d_prefix of the zero halo");
  }
  // dw accumulates; dx may overwrite d_out.
  Tensor dw2 = clone(dw), in_place = clone(r);
  ops::causal_conv_silu_backward(in_place, dw2, Tensor(), in_place, x, w, prefix);
  EXPECT_EQ(relative_error(in_place, dx), 0.0);
  for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_NEAR(dw2.data_as<double>()[i], 2 * dw.data_as<double>()[i], 1e-13);
}

TEST(Backward, L2Norm) {
  Tensor x = random64({4, 3, 8}, 5), r = random64({4, 3, 8}, 6);
  const float eps = 1e-2f;  // large enough that a dropped eps shows in the gradient
  auto loss = [&] {
    Tensor y = clone(x);
    ops::l2_norm(y, eps);
    return weighted_sum(y, r);
  };
  Tensor dx = Tensor::empty({4, 3, 8}, DType::f64);
  ops::l2_norm_backward(dx, r, x, eps);
  expect_gradient(dx, x, loss, "l2_norm dx");
  Tensor in_place = clone(r);
  ops::l2_norm_backward(in_place, in_place, x, eps);
  EXPECT_EQ(relative_error(in_place, dx), 0.0);
}

TEST(Backward, GdnGates) {
  const int64_t t = 7, h = 3;
  Tensor b = random64({t, h}, 7, 2.0), a = random64({t, h}, 8, 2.0);
  Tensor a_log = uniform64({h}, 9, 0.0, 2.7), dt_bias = random64({h}, 10);
  a.data_as<double>()[1] = 24.0;  // a + dt_bias > 20: softplus's linear branch
  Tensor r_beta = random64({t, h}, 11), r_g = random64({t, h}, 12);
  auto loss = [&] {
    Tensor beta = Tensor::empty({t, h}, DType::f64), g = Tensor::empty({t, h}, DType::f64);
    ops::gdn_gates(beta, g, b, a, a_log, dt_bias);
    return weighted_sum(beta, r_beta) + weighted_sum(g, r_g);
  };
  Tensor db = Tensor::empty({t, h}, DType::f64), da = Tensor::empty({t, h}, DType::f64);
  Tensor d_alog = Tensor::zeros({h}, DType::f64), d_dt = Tensor::zeros({h}, DType::f64);
  ops::gdn_gates_backward(db, da, d_alog, d_dt, r_beta, r_g, b, a, a_log, dt_bias);
  expect_gradient(db, b, loss, "gdn_gates d_b_logits");
  expect_gradient(da, a, loss, "gdn_gates d_a_logits");
  expect_gradient(d_alog, a_log, loss, "gdn_gates d_A_log");
  expect_gradient(d_dt, dt_bias, loss, "gdn_gates d_dt_bias");
}

TEST(Backward, HeadFusion) {
  const int64_t t = 5, h = 3, d = 8;
  Tensor o = random64({t, h, d}, 13), w = uniform64({h, d}, 14, 0.5, 1.5), gamma = uniform64({h}, 15, 0.2, 2.0);
  Tensor r = random64({t, h, d}, 16);
  const ops::HeadFusionParams params{.eps = 1e-3f};
  auto loss = [&] {
    Tensor y = Tensor::empty({t, h, d}, DType::f64);
    ops::head_fusion(y, o, w, gamma, params);
    return weighted_sum(y, r);
  };
  Tensor d_o = Tensor::empty({t, h, d}, DType::f64), dw = Tensor::zeros({h, d}, DType::f64);
  Tensor dgamma = Tensor::zeros({h}, DType::f64);
  ops::head_fusion_backward(d_o, dw, dgamma, r, o, w, gamma, params);
  expect_gradient(d_o, o, loss, "head_fusion d_o");
  expect_gradient(dw, w, loss, "head_fusion d_weight");
  expect_gradient(dgamma, gamma, loss, "head_fusion d_gamma");
  Tensor in_place = clone(r);
  ops::head_fusion_backward(in_place, Tensor(), Tensor(), in_place, o, w, gamma, params);
  EXPECT_EQ(relative_error(in_place, d_o), 0.0);
}

}  // namespace
}  // namespace hydra::test
