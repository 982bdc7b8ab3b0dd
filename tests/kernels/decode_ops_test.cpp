// The decode-step ops (generation) on the CPU against the sequence forms they replace:
//   delta_rule_step      T steps = delta_rule_recurrent over T tokens (outputs and final state);
//   attention_decode     = attention_forward of the same query at its position (causal, τ), for a
//                          cache whose rows are permuted and spread over slots;
//   attention_merge_partials of disjoint key sets = attention over their union;
//   kv_cache_append      rows land in their slot/row, −1 rows are skipped;
//   gdn_qkv_conv_step    T steps = gdn_qkv_conv over T tokens (outputs, inverse norms, tail).
// Tolerances: 1e-5 relative (fp32 storage; the step and the sequence form sum in different orders).
#include <algorithm>
#include <limits>
#include <numeric>

#include "kernels/attention/attention_decode.h"
#include "kernels/delta_rule/delta_rule_step.h"
#include "kernels/gdn_qk/gdn_qk_step.h"
#include "kernels/l2norm/l2norm.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

constexpr double kTol = 1e-5;

TEST(DeltaRuleStep, StepsEqualTheRecurrentForm) {
  const int64_t t = 9, h = 3, dk = 8, dv = 12;
  Tensor q = random_tensor({t, h, dk}, 1), k = random_tensor({t, h, dk}, 2), v = random_tensor({t, h, dv}, 3);
  ops::l2_norm(q, 1e-6f);
  ops::l2_norm(k, 1e-6f);
  Tensor g = uniform_tensor({t, h}, 4, -0.4f, 0.0f), beta = uniform_tensor({t, h}, 5, 0.0f, 1.0f);
  Tensor state0 = random_tensor({h, dk, dv}, 6, 0.1f);
  Tensor ref = Tensor::empty({t, h, dv}, DType::f32), ref_state = clone(state0);
  ops::delta_rule_recurrent(ref, ref_state, q, k, v, g, beta, {});
  // Two sequences in slots 2 and 0 of a 3-slot state: row 0 of each step is the sequence under
  // test, row 1 another (its own random tokens), so a wrong slot map would mix them.
  Tensor states = Tensor::zeros({3, h, dk, dv}, DType::f32);
  copy_into(states.view().select(0, 2), state0);
  const Tensor slots = int32_vector({2, 0});
  Tensor other_q = random_tensor({t, h, dk}, 7), other_k = random_tensor({t, h, dk}, 8), other_v = random_tensor({t, h, dv}, 9);
  ops::l2_norm(other_k, 1e-6f);
  Tensor out = Tensor::empty({t, h, dv}, DType::f32);
  for (int64_t i = 0; i < t; ++i) {
    auto pair = [&](const Tensor& a, const Tensor& b, std::initializer_list<int64_t> row_shape) {
      std::vector<int64_t> shape{2};
      shape.insert(shape.end(), row_shape.begin(), row_shape.end());
      Tensor r = Tensor::empty(shape, DType::f32);
      copy_into(r.view().select(0, 0), a.view().select(0, i));
      copy_into(r.view().select(0, 1), b.view().select(0, i));
      return r;
    };
    Tensor qs = pair(q, other_q, {h, dk}), ks = pair(k, other_k, {h, dk}), vs = pair(v, other_v, {h, dv});
    Tensor gs = pair(g, g, {h}), bs = pair(beta, beta, {h});
    Tensor o = Tensor::empty({2, h, dv}, DType::f32);
    ops::delta_rule_step(o, states, slots, qs, ks, vs, gs, bs, {});
    copy_into(out.view().select(0, i), o.view().select(0, 0));
  }
  expect_close(out, ref, kTol, "delta rule step outputs");
  expect_close(clone(states.view().select(0, 2)), ref_state, kTol, "delta rule step final state");
  EXPECT_EQ(max_rel_error(clone(states.view().select(0, 1)), Tensor::zeros({h, dk, dv}, DType::f32)), 0.0)
      << "an untouched slot changed";
}

// A cache of `n` keys of one sequence scattered over slot `slot` of a 2-slot cache in permuted row
// order; returns the caches.
struct ScatteredCache {
  Tensor k, v;
};
ScatteredCache scatter(const Tensor& k, const Tensor& v, int64_t n, int64_t slot, int64_t cap) {
  const int64_t hk = k.size(1), d = k.size(2);
  ScatteredCache c{random_tensor({2, cap, hk, d}, 77), random_tensor({2, cap, hk, d}, 78)};  // junk beyond n
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  std::reverse(perm.begin(), perm.end());
  if (n > 2) std::swap(perm[0], perm[2]);
  for (int64_t j = 0; j < n; ++j) {
    copy_into(c.k.view().select(0, slot).select(0, j), k.view().select(0, perm[static_cast<size_t>(j)]));
    copy_into(c.v.view().select(0, slot).select(0, j), v.view().select(0, perm[static_cast<size_t>(j)]));
  }
  return c;
}

TEST(AttentionDecode, EqualsAttentionAtThePosition) {
  const int64_t hq = 4, hk = 2, d = 16, cap = 40;
  const std::vector<int> map = {1, 0, 1, 0};
  for (const double tau : {0.0, 362.0}) {
    for (const int64_t n : {int64_t{1}, int64_t{7}, int64_t{33}}) {
      Tensor q = random_tensor({n, hq, d}, 10), k = random_tensor({n, hk, d}, 11), v = random_tensor({n, hk, d}, 12);
      const ops::AttentionParams params{.tau_log_base = tau, .kv_head_of_query = map};
      Tensor ref = Tensor::empty({n, hq, d}, DType::f32), ref_lse = Tensor::empty({hq, n}, DType::f32);
      ops::attention_forward(ref, ref_lse, q, k, v, params);
      // The last query (position n − 1) against all n keys, stored in slot 1 in another order.
      const ScatteredCache c = scatter(k, v, n, 1, cap);
      Tensor out = Tensor::empty({1, hq, d}, DType::f32), lse = Tensor::empty({hq, 1}, DType::f32);
      ops::attention_decode(out, lse, clone(q.view().narrow(0, n - 1, 1)), c.k, c.v, int32_vector({1}),
                            int32_vector({static_cast<int32_t>(n)}), n, int64_vector({n - 1}), params);
      const std::string what = "decode n=" + std::to_string(n) + " tau=" + std::to_string(tau);
      expect_close(out, clone(ref.view().narrow(0, n - 1, 1)), kTol, what);
      expect_close(lse, clone(ref_lse.view().narrow(1, n - 1, 1)), kTol, what + " lse");
    }
  }
}

TEST(AttentionDecode, PartialsOverDisjointKeysMergeToTheWhole) {
  const int64_t hq = 2, hk = 1, d = 8, n = 21, pos = 20;
  Tensor q = random_tensor({1, hq, d}, 20), k = random_tensor({n, hk, d}, 21), v = random_tensor({n, hk, d}, 22);
  const ops::AttentionParams params{.tau_log_base = 362.0};
  auto decode = [&](int64_t begin, int64_t count, const TensorView& out, const TensorView& lse) {
    Tensor kc = Tensor::zeros({1, std::max<int64_t>(count, 1), hk, d}, DType::f32);
    Tensor vc = Tensor::zeros({1, std::max<int64_t>(count, 1), hk, d}, DType::f32);
    if (count > 0) {
      copy_into(kc.view().select(0, 0).narrow(0, 0, count), k.view().narrow(0, begin, count));
      copy_into(vc.view().select(0, 0).narrow(0, 0, count), v.view().narrow(0, begin, count));
    }
    ops::attention_decode(out, lse, q, kc, vc, TensorView(), int32_vector({static_cast<int32_t>(count)}), count,
                          int64_vector({pos}), params);
  };
  Tensor whole = Tensor::empty({1, hq, d}, DType::f32), whole_lse = Tensor::empty({hq, 1}, DType::f32);
  decode(0, n, whole, whole_lse);
  // Four parts, one of them empty (a rank holding no key): it must contribute nothing.
  const std::vector<std::pair<int64_t, int64_t>> parts = {{0, 5}, {5, 0}, {5, 9}, {14, 7}};
  const int64_t np = static_cast<int64_t>(parts.size());
  Tensor part_out = Tensor::empty({np, 1, hq, d}, DType::f32), part_lse = Tensor::empty({np, hq, 1}, DType::f32);
  for (int64_t i = 0; i < np; ++i) decode(parts[i].first, parts[i].second, part_out.view().select(0, i), part_lse.view().select(0, i));
  EXPECT_TRUE(std::isinf(part_lse.data_as<float>()[2 * 1]) && part_lse.data_as<float>()[2] < 0) << "empty part's lse";
  Tensor out = Tensor::empty({1, hq, d}, DType::f32), lse = Tensor::empty({hq, 1}, DType::f32);
  ops::attention_merge_partials(out, lse, part_out, part_lse);
  expect_close(out, whole, kTol, "merged partials");
  expect_close(lse, whole_lse, kTol, "merged lse");
}

TEST(KvCacheAppend, RowsLandInTheirSlotAndSkippedRowsDoNot) {
  const int64_t hk = 2, d = 4;
  Tensor kc = Tensor::zeros({3, 5, hk, d}, DType::f32), vc = Tensor::zeros({3, 5, hk, d}, DType::f32);
  Tensor kn = random_tensor({3, hk, d}, 30), vn = random_tensor({3, hk, d}, 31);
  // A strided v (a column block of a wider matrix), as the layer passes it.
  Tensor wide = random_tensor({3, 3 * hk * d}, 32);
  const TensorView v_strided = wide.view().narrow(1, hk * d, hk * d).split_dim(1, hk, d);
  ops::kv_cache_append(kc, vc, kn, v_strided, int32_vector({2, 0, 1}), int32_vector({4, -1, 0}));
  expect_close(clone(kc.view().select(0, 2).select(0, 4)), clone(kn.view().select(0, 0)), 0.0, "k row 0");
  expect_close(clone(vc.view().select(0, 2).select(0, 4)), clone(v_strided.select(0, 0)), 0.0, "v row 0");
  expect_close(clone(kc.view().select(0, 1).select(0, 0)), clone(kn.view().select(0, 2)), 0.0, "k row 2");
  EXPECT_EQ(max_rel_error(clone(kc.view().select(0, 0)), Tensor::zeros({5, hk, d}, DType::f32)), 0.0) << "skipped row written";
}

TEST(GdnConvStep, StepsEqualTheSequenceConv) {
  const int64_t t = 7, qk_heads = 4, d = 8, channels = 6 * d, kernel = 4;  // q|k (2+2 heads) | v (2 heads)
  const ops::GdnQkParams params{.qk_heads = qk_heads, .head_dim = d, .rope_theta = 1e4, .l2_eps = 1e-6f};
  Tensor x = random_tensor({t, channels}, 40), w = random_tensor({channels, kernel}, 41, 0.5f);
  std::vector<int64_t> pos(static_cast<size_t>(t));
  std::iota(pos.begin(), pos.end(), int64_t{100});  // positions continue a longer sequence
  const Tensor positions = int64_vector(pos);
  // The reference: the conv over the sequence with the K − 1 inputs before it as prefix.
  Tensor before = random_tensor({kernel - 1, channels}, 42);
  Tensor ref = Tensor::empty({t, channels}, DType::f32), ref_inv = Tensor::empty({t, qk_heads}, DType::f32);
  ops::gdn_qkv_conv(ref, ref_inv, x, w, before, positions, params);
  // Steps: slot 1 of a 2-slot tail cache starts with those inputs.
  Tensor tail = Tensor::zeros({2, kernel - 1, channels}, DType::f32);
  copy_into(tail.view().select(0, 1), before);
  Tensor out = Tensor::empty({t, channels}, DType::f32), inv = Tensor::empty({t, qk_heads}, DType::f32);
  for (int64_t i = 0; i < t; ++i) {
    ops::gdn_qkv_conv_step(out.view().narrow(0, i, 1), inv.view().narrow(0, i, 1), clone(x.view().narrow(0, i, 1)), w,
                           tail, int32_vector({1}), int64_vector({pos[static_cast<size_t>(i)]}), params);
  }
  expect_close(out, ref, kTol, "conv step outputs");
  expect_close(inv, ref_inv, kTol, "conv step inverse norms");
  expect_close(clone(tail.view().select(0, 1)), clone(x.view().narrow(0, t - (kernel - 1), kernel - 1)), 0.0,
               "tail = the last K-1 inputs");
  EXPECT_EQ(max_rel_error(clone(tail.view().select(0, 0)), Tensor::zeros({kernel - 1, channels}, DType::f32)), 0.0);
}

}  // namespace
}  // namespace hydra::test
