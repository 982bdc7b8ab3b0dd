// The three forms of the gated delta rule must agree (DESIGN.md §1.2):
//  recurrent (fp64 oracle) vs chunked (WY/UT) on odd lengths and chunk sizes; the segment map
//  reproduces the chunked final state for any initial state; splitting a sequence anywhere and
//  carrying the state reproduces the unsplit run; maps compose.
// Tolerance 1e-5 relative: the chunked form runs in fp32 and its errors are ~1e-7 here (measured);
// a wrong decay or a missing β gives O(1) differences.
#include <cmath>

#include <fmt/format.h>

#include "kernels/delta_rule/delta_rule.h"
#include "kernels/l2norm/l2norm.h"
#include "kernels/matmul/matmul.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

struct Inputs {
  Tensor q, k, v, g, beta, state;
};

Inputs make_inputs(int64_t t, int64_t h, int64_t dk, int64_t dv, uint64_t seed, float decay_scale = 1.0f) {
  Inputs in{random_tensor({t, h, dk}, seed), random_tensor({t, h, dk}, seed + 1), random_tensor({t, h, dv}, seed + 2),
            uniform_tensor({t, h}, seed + 3, -decay_scale, 0.0f), uniform_tensor({t, h}, seed + 4, 0.0f, 1.0f),
            random_tensor({h, dk, dv}, seed + 5, 0.5f)};
  ops::l2_norm(in.q, 1e-6f);
  ops::l2_norm(in.k, 1e-6f);
  return in;
}

struct Case {
  int64_t t, h, dk, dv, chunk;
};
class DeltaRule : public ::testing::TestWithParam<Case> {};
INSTANTIATE_TEST_SUITE_P(OddLengths, DeltaRule,
                         ::testing::Values(Case{1, 1, 8, 8, 64}, Case{5, 2, 16, 16, 64}, Case{63, 1, 16, 16, 64},
                                           Case{64, 2, 16, 16, 64}, Case{65, 3, 16, 8, 64}, Case{130, 2, 32, 32, 64},
                                           Case{200, 1, 16, 24, 64}, Case{77, 2, 16, 16, 16}, Case{50, 1, 8, 8, 7},
                                           Case{300, 1, 128, 128, 64}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return fmt::format("T{}_H{}_dk{}_dv{}_chunk{}", c.t, c.h, c.dk, c.dv, c.chunk);
                         });

TEST_P(DeltaRule, ChunkedMatchesRecurrent) {
  const Case c = GetParam();
  Inputs in = make_inputs(c.t, c.h, c.dk, c.dv, 100 + c.t);
  Tensor s_rec = clone(in.state), s_chk = clone(in.state);
  Tensor o_rec = Tensor::empty({c.t, c.h, c.dv}, DType::f32), o_chk = Tensor::empty({c.t, c.h, c.dv}, DType::f32);
  ops::delta_rule_recurrent(o_rec, s_rec, in.q, in.k, in.v, in.g, in.beta, {});
  ops::delta_rule_chunked(o_chk, s_chk, in.q, in.k, in.v, in.g, in.beta, {.chunk = c.chunk});
  expect_close(o_chk, o_rec, 1e-5, "chunked output");
  expect_close(s_chk, s_rec, 1e-5, "chunked final state");
}

TEST_P(DeltaRule, SegmentMapGivesFinalStateForAnyInitialState) {
  const Case c = GetParam();
  Inputs in = make_inputs(c.t, c.h, c.dk, c.dv, 200 + c.t);
  Tensor m = Tensor::empty({c.h, c.dk, c.dk}, DType::f32), s_ext = Tensor::empty({c.h, c.dk, c.dv}, DType::f32);
  ops::delta_rule_segment_map(m, s_ext, in.k, in.v, in.g, in.beta, {.chunk = c.chunk});
  for (uint64_t trial = 0; trial < 2; ++trial) {
    Tensor s_in = trial == 0 ? Tensor::zeros({c.h, c.dk, c.dv}, DType::f32) : random_tensor({c.h, c.dk, c.dv}, 7 + trial);
    Tensor expected = clone(s_in), out = Tensor::empty({c.t, c.h, c.dv}, DType::f32);
    ops::delta_rule_recurrent(out, expected, in.q, in.k, in.v, in.g, in.beta, {});
    Tensor mapped = clone(s_in);
    ops::delta_rule_apply_map(mapped, m, s_ext);
    expect_close(mapped, expected, 1e-5, "M·S_in + S_ext");
  }
}

TEST(DeltaRule, SplittingAnywhereAndCarryingStateReproducesUnsplit) {
  const int64_t t = 150, h = 2, dk = 16, dv = 16;
  Inputs in = make_inputs(t, h, dk, dv, 300);
  Tensor whole = Tensor::empty({t, h, dv}, DType::f32), s_whole = clone(in.state);
  ops::delta_rule_chunked(whole, s_whole, in.q, in.k, in.v, in.g, in.beta, {});
  for (int64_t split : {1, 17, 63, 64, 65, 100, 149}) {
    Tensor parts = Tensor::empty({t, h, dv}, DType::f32), s = clone(in.state);
    for (auto [t0, len] : {std::pair<int64_t, int64_t>{0, split}, {split, t - split}}) {
      ops::delta_rule_chunked(parts.view().narrow(0, t0, len), s, in.q.view().narrow(0, t0, len),
                              in.k.view().narrow(0, t0, len), in.v.view().narrow(0, t0, len),
                              in.g.view().narrow(0, t0, len), in.beta.view().narrow(0, t0, len), {});
    }
    expect_close(parts, whole, 1e-5, "split at " + std::to_string(split));
    expect_close(s, s_whole, 1e-5, "state split at " + std::to_string(split));
  }
}

TEST(DeltaRule, MapsOfConsecutiveSegmentsCompose) {
  // Mild decay so M stays O(1) over 120 tokens (with strong decay M underflows towards 0 and a
  // relative comparison measures only rounding noise).
  const int64_t t = 120, h = 1, dk = 8, dv = 12, split = 53;
  Inputs in = make_inputs(t, h, dk, dv, 400, 0.02f);
  auto map_of = [&](int64_t t0, int64_t len) {
    std::pair<Tensor, Tensor> r{Tensor::empty({h, dk, dk}, DType::f32), Tensor::empty({h, dk, dv}, DType::f32)};
    ops::delta_rule_segment_map(r.first, r.second, in.k.view().narrow(0, t0, len), in.v.view().narrow(0, t0, len),
                                in.g.view().narrow(0, t0, len), in.beta.view().narrow(0, t0, len), {});
    return r;
  };
  const auto [m_all, s_all] = map_of(0, t);
  const auto [m_a, s_a] = map_of(0, split);
  const auto [m_b, s_b] = map_of(split, t - split);
  // (M_b M_a, M_b S_a + S_b)
  Tensor m_ab = Tensor::empty({dk, dk}, DType::f32), s_ab = clone(s_b.view().select(0, 0));
  ops::gemm(m_ab, m_b.view().select(0, 0), m_a.view().select(0, 0), {});
  ops::gemm(s_ab, m_b.view().select(0, 0), s_a.view().select(0, 0), {.beta = 1.0f});
  expect_close(m_ab, m_all.view().select(0, 0), 1e-5, "composed M");
  expect_close(s_ab, s_all.view().select(0, 0), 1e-5, "composed S_ext");
}

TEST(DeltaRule, StrongDecayStaysFinite) {
  // Decays down to e^-60 per token: within-chunk factors underflow to 0, never to NaN.
  const int64_t t = 97, h = 2, dk = 16, dv = 16;
  Inputs in = make_inputs(t, h, dk, dv, 500, 60.0f);
  Tensor o_rec = Tensor::empty({t, h, dv}, DType::f32), o_chk = Tensor::empty({t, h, dv}, DType::f32);
  Tensor s_rec = clone(in.state), s_chk = clone(in.state);
  ops::delta_rule_recurrent(o_rec, s_rec, in.q, in.k, in.v, in.g, in.beta, {});
  ops::delta_rule_chunked(o_chk, s_chk, in.q, in.k, in.v, in.g, in.beta, {});
  expect_close(o_chk, o_rec, 1e-5, "strong decay output");
}

}  // namespace
}  // namespace hydra::test
