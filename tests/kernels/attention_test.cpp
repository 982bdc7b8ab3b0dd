// Attention against a naive fp64 softmax loop: causal GQA, τ scaling, position offsets (the ring
// steps' full / diagonal / partial / empty blocks), custom KV maps, and lse merging: attention
// over keys split into blocks and merged equals attention over all keys.
// Tolerance 2e-5: fp32 scores and exp against fp64; errors from a wrong mask or head map are O(1).
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "kernels/attention/attention.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

struct Ref {
  Tensor out, lse;
};

// Naive: per query i (position qp0 + i), keys j (position kp0 + j) visible if causal ⇒ kp ≤ qp.
Ref naive(const TensorView& q, const TensorView& k, const TensorView& v, const ops::AttentionParams& p) {
  const int64_t tq = q.size(0), hq = q.size(1), d = q.size(2), tk = k.size(0), hk = k.size(1), dv = v.size(2);
  Ref r{Tensor::zeros({tq, hq, dv}, DType::f32), Tensor::empty({hq, tq}, DType::f32)};
  const double scale = p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(d));
  auto val = [](const TensorView& t, int64_t a, int64_t b, int64_t c) { return static_cast<double>(*static_cast<const float*>(t.element_ptr({a, b, c}))); };
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t g = p.kv_head_of_query.empty() ? h / (hq / hk) : p.kv_head_of_query[h];
    for (int64_t i = 0; i < tq; ++i) {
      const int64_t qp = p.q_position0 + i;
      const double tau = p.tau_log_base > 0 ? std::log(qp + p.tau_log_base) / std::log(p.tau_log_base) : 1.0;
      std::vector<double> s;
      std::vector<int64_t> js;
      for (int64_t j = 0; j < tk; ++j) {
        if (p.causality == ops::Causality::causal && p.k_position0 + j > qp) continue;
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += val(q, i, h, c) * val(k, j, g, c);
        s.push_back(dot * scale * tau);
        js.push_back(j);
      }
      if (s.empty()) {
        r.lse.data_as<float>()[h * tq + i] = -std::numeric_limits<float>::infinity();
        continue;
      }
      double m = s[0];
      for (double x : s) m = std::max(m, x);
      double l = 0;
      for (double& x : s) l += (x = std::exp(x - m));
      for (size_t n = 0; n < s.size(); ++n)
        for (int64_t c = 0; c < dv; ++c)
          r.out.data_as<float>()[(i * hq + h) * dv + c] += static_cast<float>(s[n] / l * val(v, js[n], g, c));
      r.lse.data_as<float>()[h * tq + i] = static_cast<float>(m + std::log(l));
    }
  }
  return r;
}

struct AttnCase {
  int64_t tq, tk, hq, hk, d, qpos, kpos;
  bool tau;
};
class Attention : public ::testing::TestWithParam<AttnCase> {};
INSTANTIATE_TEST_SUITE_P(
    Blocks, Attention,
    ::testing::Values(AttnCase{1, 1, 1, 1, 8, 0, 0, false},        // single token
                      AttnCase{37, 37, 4, 2, 16, 0, 0, false},     // causal diagonal, GQA
                      AttnCase{70, 70, 3, 3, 16, 100, 100, true},  // diagonal at an offset, τ
                      AttnCase{20, 33, 2, 1, 8, 64, 0, true},      // full block (all keys earlier)
                      AttnCase{65, 65, 4, 1, 32, 0, 1000, false},  // empty block (keys in the future)
                      AttnCase{50, 40, 2, 2, 16, 30, 10, true},    // partial: some queries see some keys
                      AttnCase{129, 129, 2, 1, 128, 524288, 524288, true}),  // d = 128 at 512K
    [](const auto& info) {
      const AttnCase& c = info.param;
      return fmt::format("q{}at{}_k{}at{}_H{}x{}_d{}{}", c.tq, c.qpos, c.tk, c.kpos, c.hq, c.hk, c.d, c.tau ? "_tau" : "");
    });

TEST_P(Attention, MatchesNaiveSoftmax) {
  const AttnCase c = GetParam();
  Tensor q = random_tensor({c.tq, c.hq, c.d}, 1), k = random_tensor({c.tk, c.hk, c.d}, 2), v = random_tensor({c.tk, c.hk, c.d}, 3);
  ops::AttentionParams p{.q_position0 = c.qpos, .k_position0 = c.kpos, .tau_log_base = c.tau ? 362.0 : 0.0};
  Tensor out = Tensor::empty({c.tq, c.hq, c.d}, DType::f32), lse = Tensor::empty({c.hq, c.tq}, DType::f32);
  ops::attention_forward(out, lse, q, k, v, p);
  const Ref r = naive(q, k, v, p);
  ASSERT_EQ(count_non_finite(out), 0);
  expect_close(out, r.out, 2e-5, "attention out");
  for (int64_t i = 0; i < c.hq * c.tq; ++i) {
    const float a = lse.data_as<float>()[i], b = r.lse.data_as<float>()[i];
    if (std::isinf(b)) {
      EXPECT_TRUE(std::isinf(a) && a < 0) << "lse " << i;
    } else {
      EXPECT_NEAR(a, b, 2e-5 * std::max(1.0f, std::abs(b))) << "lse " << i;
    }
  }
}

TEST(Attention, CustomKvMapAndStridedInputs) {
  // FA heads {1, 3, 4} of a 6-head layer with KV heads {0, 2} of 3: map 0→0, 1→1, 2→1.
  const int64_t t = 23, d = 16;
  Tensor proj = random_tensor({t, 3 * d + 2 * d + 2 * d + 5}, 4);
  const TensorView q = proj.view().narrow(1, 0, 3 * d).split_dim(1, 3, d);
  const TensorView k = proj.view().narrow(1, 3 * d, 2 * d).split_dim(1, 2, d);
  const TensorView v = proj.view().narrow(1, 5 * d, 2 * d).split_dim(1, 2, d);
  const std::vector<int> map = {0, 1, 1};
  ops::AttentionParams p{.tau_log_base = 362.0, .kv_head_of_query = map};
  Tensor out = Tensor::empty({t, 3, d}, DType::f32), lse = Tensor::empty({3, t}, DType::f32);
  ops::attention_forward(out, lse, q, k, v, p);
  expect_close(out, naive(q, k, v, p).out, 2e-5, "mapped heads");
}

TEST(Attention, MergingKeyBlocksEqualsOnePass) {
  const int64_t tq = 45, tk = 90, hq = 4, hk = 2, d = 16;
  Tensor q = random_tensor({tq, hq, d}, 5, 2.0f), k = random_tensor({tk, hk, d}, 6), v = random_tensor({tk, hk, d}, 7);
  ops::AttentionParams whole{.q_position0 = 45, .k_position0 = 0, .tau_log_base = 362.0};
  Tensor out = Tensor::empty({tq, hq, d}, DType::f32), lse = Tensor::empty({hq, tq}, DType::f32);
  ops::attention_forward(out, lse, q, k, v, whole);
  // Three key blocks, including one partly in the future, merged in a non-sequential order.
  Tensor acc = Tensor::zeros({tq, hq, d}, DType::f32), acc_lse = Tensor::empty({hq, tq}, DType::f32);
  fill(acc_lse, -std::numeric_limits<float>::infinity());
  for (auto [k0, len] : {std::pair<int64_t, int64_t>{60, 30}, {0, 25}, {25, 35}}) {
    ops::AttentionParams p = whole;
    p.k_position0 = k0;
    Tensor po = Tensor::empty({tq, hq, d}, DType::f32), pl = Tensor::empty({hq, tq}, DType::f32);
    ops::attention_forward(po, pl, q, k.view().narrow(0, k0, len), v.view().narrow(0, k0, len), p);
    ops::attention_merge(acc, acc_lse, po, pl);
  }
  expect_close(acc, out, 2e-5, "merged out");
  expect_close(acc_lse, lse, 2e-5, "merged lse");
}

}  // namespace
}  // namespace hydra::test
