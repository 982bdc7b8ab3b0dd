// Chunked gated-delta-rule backward against float64 finite differences of the chunked forward
// (gradcheck.h): loss = Σ r ⊙ out + Σ r_S ⊙ S_final, so the incoming state gradient is nonzero, from a
// nonzero initial state, at lengths below, at and across chunk boundaries (last chunk short). The
// state-gradient pass alone equals the full backward's d_state, and the reverse fold of sequence
// parallelism holds: dS_in = Mᵀ dS_out + dS_loc with dS_loc the state pass from zeros.
#include <cmath>

#include <fmt/format.h>

#include "kernels/delta_rule/delta_rule.h"
#include "kernels/l2norm/l2norm.h"
#include "tests/common/test_util.h"
#include "tests/kernels/gradcheck.h"

namespace hydra::test {
namespace {

struct Inputs {
  Tensor q, k, v, g, beta, state0;
};

// q, k L2-normalised as the model feeds them; decays in [−0.5, 0); β in (0, 1).
Inputs make_inputs(int64_t t, int64_t h, int64_t dk, int64_t dv, uint64_t seed, DType dtype = DType::f64) {
  Inputs in{random_tensor({t, h, dk}, seed), random_tensor({t, h, dk}, seed + 1), random_tensor({t, h, dv}, seed + 2),
            uniform_tensor({t, h}, seed + 3, -0.5f, 0.0f), uniform_tensor({t, h}, seed + 4, 0.05f, 1.0f),
            random_tensor({h, dk, dv}, seed + 5, 0.5f)};
  ops::l2_norm(in.q, 1e-6f);
  ops::l2_norm(in.k, 1e-6f);
  for (Tensor* x : {&in.q, &in.k, &in.v, &in.g, &in.beta, &in.state0}) *x = to(*x, Device::host, dtype);
  return in;
}

struct Grads {
  Tensor dq, dk, dv, dg, dbeta, d_state;
};

Grads backward_of(const Inputs& in, const TensorView& d_out, const TensorView& d_state_final, int64_t chunk) {
  const DType t = in.q.dtype();
  Grads g{Tensor::empty(in.q.shape(), t), Tensor::empty(in.k.shape(), t), Tensor::empty(in.v.shape(), t),
          Tensor::empty(in.g.shape(), t), Tensor::empty(in.beta.shape(), t), clone(d_state_final)};
  ops::delta_rule_chunked_backward(g.dq, g.dk, g.dv, g.dg, g.dbeta, g.d_state, d_out, in.q, in.k, in.v, in.g, in.beta,
                                   in.state0, {.chunk = chunk});
  return g;
}

struct Case {
  int64_t t, h, dk, dv, chunk;
};
class DeltaRuleBackward : public ::testing::TestWithParam<Case> {};
INSTANTIATE_TEST_SUITE_P(Lengths, DeltaRuleBackward,
                         ::testing::Values(Case{1, 2, 4, 4, 64}, Case{37, 2, 6, 4, 64}, Case{64, 1, 4, 4, 64},
                                           Case{65, 1, 4, 5, 64}, Case{130, 1, 4, 4, 64}, Case{37, 2, 4, 4, 16},
                                           Case{23, 1, 5, 3, 7}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return fmt::format("T{}_H{}_dk{}_dv{}_chunk{}", c.t, c.h, c.dk, c.dv, c.chunk);
                         });

TEST_P(DeltaRuleBackward, MatchesFiniteDifferences) {
  const Case c = GetParam();
  Inputs in = make_inputs(c.t, c.h, c.dk, c.dv, 100 + c.t);
  Tensor r = random64({c.t, c.h, c.dv}, 1), r_state = random64({c.h, c.dk, c.dv}, 2);
  auto loss = [&] {
    Tensor out = Tensor::empty({c.t, c.h, c.dv}, DType::f64), s = clone(in.state0);
    ops::delta_rule_chunked(out, s, in.q, in.k, in.v, in.g, in.beta, {.chunk = c.chunk});
    return weighted_sum(out, r) + weighted_sum(s, r_state);
  };
  const Grads g = backward_of(in, r, r_state, c.chunk);
  const std::string name = "delta rule T=" + std::to_string(c.t) + " chunk=" + std::to_string(c.chunk);
  expect_gradient(g.dq, in.q, loss, name + " dq");
  expect_gradient(g.dk, in.k, loss, name + " dk");
  expect_gradient(g.dv, in.v, loss, name + " dv");
  expect_gradient(g.dg, in.g, loss, name + " dg");
  expect_gradient(g.dbeta, in.beta, loss, name + " dbeta");
  expect_gradient(g.d_state, in.state0, loss, name + " d_state0");
}

TEST_P(DeltaRuleBackward, StatePassEqualsFullBackwardsStateGradient) {
  const Case c = GetParam();
  for (DType dtype : {DType::f64, DType::f32}) {
    Inputs in = make_inputs(c.t, c.h, c.dk, c.dv, 200 + c.t, dtype);
    Tensor r = to(random_tensor({c.t, c.h, c.dv}, 3), Device::host, dtype);
    Tensor r_state = to(random_tensor({c.h, c.dk, c.dv}, 4), Device::host, dtype);
    const Grads g = backward_of(in, r, r_state, c.chunk);
    Tensor ds = clone(r_state);
    ops::delta_rule_state_backward(ds, r, in.q, in.k, in.g, in.beta, {.chunk = c.chunk});
    // The same chunk quantities and the same step in both: equal to the bit.
    const Tensor a = to(ds, Device::host, DType::f64), b = to(g.d_state, Device::host, DType::f64);
    EXPECT_EQ(relative_error(a, b), 0.0) << dtype_name(dtype);
    EXPECT_GT(max_abs(b), 0.0);
  }
}

TEST(DeltaRuleBackward, ReverseFoldOfSegmentMaps) {
  // dS_in = Mᵀ dS_out + dS_loc for a segment with map (M, S_ext), dS_loc from zeros in.
  const int64_t t = 90, h = 2, dk = 6, dv = 5;
  Inputs in = make_inputs(t, h, dk, dv, 300);
  for (int64_t i = 0; i < in.g.numel(); ++i) in.g.data_as<double>()[i] *= 0.05;  // M stays O(1) over 90 tokens
  Tensor r = random64({t, h, dv}, 5), ds_out = random64({h, dk, dv}, 6);
  const Grads full = backward_of(in, r, ds_out, 64);
  Tensor d_loc = Tensor::zeros({h, dk, dv}, DType::f64);
  ops::delta_rule_state_backward(d_loc, r, in.q, in.k, in.g, in.beta, {});
  Tensor m = Tensor::empty({h, dk, dk}, DType::f64), s_ext = Tensor::empty({h, dk, dv}, DType::f64);
  ops::delta_rule_segment_map(m, s_ext, in.k, in.v, in.g, in.beta, {});
  Tensor folded = clone(ds_out);
  ops::delta_rule_apply_map_transposed(folded, m, d_loc);
  EXPECT_GT(max_abs(folded) , 0.0);
  EXPECT_LE(relative_error(folded, full.d_state), 1e-12);
}

TEST(DeltaRuleBackward, ApplyMapTransposedIsExplicitProduct) {
  const int64_t h = 3, dk = 5, dv = 4;
  Tensor m = random64({h, dk, dk}, 7), x = random64({h, dk, dv}, 8), loc = random64({h, dk, dv}, 9);
  Tensor out = clone(x);
  ops::delta_rule_apply_map_transposed(out, m, loc);
  for (int64_t a = 0; a < h; ++a)
    for (int64_t i = 0; i < dk; ++i)
      for (int64_t j = 0; j < dv; ++j) {
        double e = loc.data_as<double>()[(a * dk + i) * dv + j];
        for (int64_t l = 0; l < dk; ++l) {
          e += m.data_as<double>()[(a * dk + l) * dk + i] * x.data_as<double>()[(a * dk + l) * dv + j];
        }
        EXPECT_NEAR(out.data_as<double>()[(a * dk + i) * dv + j], e, 1e-14) << a << "," << i << "," << j;
      }
}

TEST(DeltaRuleBackward, Float32MatchesFloat64) {
  // The fp32 instantiation (the GPU kernel's reference) against float64: fp32 BLAS and exp give
  // ~1e-6 relative on these well-conditioned inputs; 1e-4 bounds it.
  const int64_t t = 150, h = 2, dk = 16, dv = 16;
  Inputs in32 = make_inputs(t, h, dk, dv, 400, DType::f32), in64 = make_inputs(t, h, dk, dv, 400);
  Tensor r = random_tensor({t, h, dv}, 10), rs = random_tensor({h, dk, dv}, 11);
  auto f64 = [](const TensorView& x) { return to(x, Device::host, DType::f64); };
  const Grads g32 = backward_of(in32, r, rs, 64), g64 = backward_of(in64, f64(r), f64(rs), 64);
  EXPECT_LE(relative_error(f64(g32.dq), g64.dq), 1e-4);
  EXPECT_LE(relative_error(f64(g32.dk), g64.dk), 1e-4);
  EXPECT_LE(relative_error(f64(g32.dv), g64.dv), 1e-4);
  EXPECT_LE(relative_error(f64(g32.dg), g64.dg), 1e-4);
  EXPECT_LE(relative_error(f64(g32.dbeta), g64.dbeta), 1e-4);
  EXPECT_LE(relative_error(f64(g32.d_state), g64.d_state), 1e-4);
}

}  // namespace
}  // namespace hydra::test
