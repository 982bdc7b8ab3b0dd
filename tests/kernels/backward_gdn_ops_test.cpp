// Float64 gradient checks (gradcheck.h) of the GDN branch's small ops and the head fusion: the
// causal conv + SiLU (with and without the halo prefix, T shorter than the kernel, the halo's own
// gradient), the fused conv + RoPE + L2 norm of q/k (gdn_qk.h), the β/g gates (including
// softplus's linear branch) and the per-head fusion RMSNorm·γ.
#include <cmath>

#include <fmt/format.h>

#include "kernels/conv/conv.h"
#include "kernels/fusion/fusion.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/gdn_qk/gdn_qk.h"
#include "kernels/l2norm/l2norm.h"
#include "kernels/rope/rope.h"
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

// The fused GDN input pass (conv + SiLU, RoPE and L2 norm of the q/k heads): its backward —
// gdn_qk_backward on the q/k heads, then the conv's backward of all channels — against finite
// differences of the forward, with the halo prefix and positions far from zero.
TEST(Backward, GdnQkvConv) {
  const int64_t t = 6, d = 8, qk_heads = 2, channels = 3 * d;  // heads: q, k (finished), v (plain)
  const ops::GdnQkParams params{.qk_heads = qk_heads, .head_dim = d, .rope_theta = 1e4, .l2_eps = 1e-2f};
  Tensor x = random64({t, channels}, 5), w = random64({channels, 4}, 6, 0.7), prefix = random64({3, channels}, 7);
  Tensor positions = Tensor::empty({t}, DType::i64);
  for (int64_t i = 0; i < t; ++i) positions.data_as<int64_t>()[i] = 1000003 + 5 * i;
  Tensor r = random64({t, channels}, 8);
  auto forward = [&](Tensor& out, Tensor& inv_norm) {
    out = Tensor::empty({t, channels}, DType::f64);
    inv_norm = Tensor::empty({t, qk_heads}, DType::f64);
    ops::gdn_qkv_conv(out, inv_norm, x, w, prefix, positions, params);
  };
  auto loss = [&] {
    Tensor out, inv_norm;
    forward(out, inv_norm);
    return weighted_sum(out, r);
  };
  Tensor out, inv_norm;
  forward(out, inv_norm);
  Tensor d_conv = clone(r);  // the q/k columns become the gradient w.r.t. their conv output, in place
  const TensorView dqk = d_conv.view().narrow(1, 0, qk_heads * d).split_dim(1, qk_heads, d);
  ops::gdn_qk_backward(dqk, dqk, out.view().narrow(1, 0, qk_heads * d).split_dim(1, qk_heads, d), inv_norm, positions,
                       params);
  Tensor dx = Tensor::empty({t, channels}, DType::f64), dw = Tensor::zeros({channels, 4}, DType::f64);
  Tensor d_prefix = Tensor::empty({3, channels}, DType::f64);
  ops::causal_conv_silu_backward(dx, dw, d_prefix, d_conv, x, w, prefix);
  expect_gradient(dx, x, loss, "gdn_qkv_conv dx");
  expect_gradient(dw, w, loss, "gdn_qkv_conv dw");
  expect_gradient(d_prefix, prefix, loss, "gdn_qkv_conv d_prefix");
}

// The fused pass is the three unfused ops in turn, and its inverse norms are those of the rotated rows.
TEST(Backward, GdnQkvConvIsConvRopeL2) {
  const int64_t t = 5, d = 4, channels = 4 * d;
  const ops::GdnQkParams params{.qk_heads = 3, .head_dim = d, .rope_theta = 1e6, .l2_eps = 1e-6f};
  Tensor x = random64({t, channels}, 9), w = random64({channels, 4}, 10, 0.7);
  Tensor positions = Tensor::empty({t}, DType::i64);
  for (int64_t i = 0; i < t; ++i) positions.data_as<int64_t>()[i] = 7 * i;
  Tensor fused = Tensor::empty({t, channels}, DType::f64), inv_norm = Tensor::empty({t, 3}, DType::f64);
  ops::gdn_qkv_conv(fused, inv_norm, x, w, Tensor(), positions, params);
  Tensor ref = Tensor::empty({t, channels}, DType::f64);
  ops::causal_conv_silu(ref, x, w, Tensor());
  const TensorView qk = ref.view().narrow(1, 0, 3 * d).split_dim(1, 3, d);
  ops::rope(qk, positions, {params.rope_theta});
  Tensor rotated = clone(qk);
  ops::l2_norm(qk, params.l2_eps);
  EXPECT_LT(relative_error(fused, ref), 1e-15);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t h = 0; h < 3; ++h) {
      double ss = 0;
      for (int64_t j = 0; j < d; ++j) ss += std::pow(rotated.data_as<double>()[(i * 3 + h) * d + j], 2);
      EXPECT_NEAR(inv_norm.data_as<double>()[i * 3 + h], 1.0 / std::sqrt(ss + 1e-6), 1e-12);
    }
  }
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

// Every fusion variant (kernels/fusion/fusion.h): d_o and each of its tensors' gradients against
// finite differences; the gate's logits a column slice of a wider matrix, as in the model's
// projection. d_o written over d_y gives the same values.
class BackwardFusion : public ::testing::TestWithParam<ops::Fusion> {};

TEST_P(BackwardFusion, HeadFusion) {
  const ops::Fusion fusion = GetParam();
  const int64_t t = 5, h = 3, d = 8;
  Tensor o = random64({t, h, d}, 13), r = random64({t, h, d}, 16);
  Tensor w = uniform64({h, d}, 14, 0.5, 1.5), gamma = uniform64({h}, 15, 0.2, 2.0);
  Tensor wide = random64({t, h + 4}, 17), bias = random64({h}, 18);
  ops::FusionTensors p;
  if (ops::fusion_has_norm(fusion)) p.weight = w.view();
  if (ops::fusion_has_gamma(fusion)) p.gamma = gamma.view();
  if (ops::fusion_has_gate(fusion)) {
    p.gate = wide.view().narrow(1, 2, h);
    p.gate_bias = bias.view();
  }
  const ops::HeadFusionParams params{.eps = 1e-3f, .fusion = fusion};
  auto loss = [&] {
    Tensor y = Tensor::empty({t, h, d}, DType::f64);
    ops::head_fusion(y, o, p, params);
    return weighted_sum(y, r);
  };
  Tensor d_o = Tensor::empty({t, h, d}, DType::f64), dw = Tensor::zeros({h, d}, DType::f64);
  Tensor dgamma = Tensor::zeros({h}, DType::f64), dbias = Tensor::zeros({h}, DType::f64);
  Tensor dwide = Tensor::zeros({t, h + 4}, DType::f64);
  ops::FusionTensors g;
  if (p.weight.defined()) g.weight = dw.view();
  if (p.gamma.defined()) g.gamma = dgamma.view();
  if (p.gate.defined()) {
    g.gate = dwide.view().narrow(1, 2, h);
    g.gate_bias = dbias.view();
  }
  ops::head_fusion_backward(d_o, g, r, o, p, params);
  const std::string name = std::string("head_fusion ") + ops::fusion_name(fusion);
  expect_gradient(d_o, o, loss, name + " d_o");
  if (p.weight.defined()) expect_gradient(dw, w, loss, name + " d_weight");
  if (p.gamma.defined()) expect_gradient(dgamma, gamma, loss, name + " d_gamma");
  if (p.gate.defined()) {
    expect_gradient(dwide, wide, loss, name + " d_gate (the logits' columns; the others stay 0)");
    expect_gradient(dbias, bias, loss, name + " d_gate_bias");
  }
  Tensor in_place = clone(r);
  ops::head_fusion_backward(in_place, {}, in_place, o, p, params);
  EXPECT_EQ(relative_error(in_place, d_o), 0.0);
}

INSTANTIATE_TEST_SUITE_P(Variants, BackwardFusion, ::testing::ValuesIn(ops::kFusions),
                         [](const ::testing::TestParamInfo<ops::Fusion>& info) {
                           return std::string(ops::fusion_name(info.param));
                         });

}  // namespace
}  // namespace hydra::test
