// Attention backward (FlashAttention-2 recomputation from the final lse and delta) against float64
// finite differences of the CPU forward (gradcheck.h), on the block pairs ring attention produces:
// causal diagonal, full, partially visible (zigzag halves, rows that see no key) and empty, with GQA,
// custom KV maps, τ on and off, no mask, and more than one 64-row query block. Summing the backward
// over two key blocks with the merged forward's lse/delta equals the one-block backward.
#include <cmath>
#include <vector>

#include "kernels/attention/attention.h"
#include "tests/common/test_util.h"
#include "tests/kernels/gradcheck.h"

namespace hydra::test {
namespace {

struct Grads {
  Tensor dq, dk, dv;
};

Grads backward_of(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& d_out, const ops::AttentionParams& p) {
  const DType t = q.dtype();
  Tensor out = Tensor::empty({q.size(0), q.size(1), v.size(2)}, t), lse = Tensor::empty({q.size(1), q.size(0)}, t);
  ops::attention_forward(out, lse, q, k, v, p);
  Tensor delta = Tensor::empty({q.size(1), q.size(0)}, t);
  ops::attention_backward_prepare(delta, d_out, out);
  Grads g{Tensor::zeros(q.shape(), t), Tensor::zeros(k.shape(), t), Tensor::zeros(v.shape(), t)};
  ops::attention_backward(g.dq, g.dk, g.dv, d_out, q, k, v, lse, delta, p);
  return g;
}

struct Case {
  const char* name;
  int64_t tq, tk, hq, hk, d, qpos, kpos;
  bool tau, causal;
  std::vector<int> kv_map;
};
class AttentionBackward : public ::testing::TestWithParam<Case> {};
INSTANTIATE_TEST_SUITE_P(
    Blocks, AttentionBackward,
    ::testing::Values(Case{"single_token", 1, 1, 1, 1, 4, 0, 0, false, true, {}},
                      Case{"diagonal_gqa", 9, 9, 4, 2, 8, 0, 0, false, true, {}},
                      Case{"diagonal_tau_two_query_blocks", 70, 70, 2, 1, 4, 100, 100, true, true, {}},
                      Case{"full_tau", 5, 7, 2, 1, 8, 20, 0, true, true, {}},
                      Case{"zigzag_partial", 6, 8, 2, 1, 8, 3, 0, true, true, {}},
                      Case{"rows_without_keys", 8, 6, 2, 2, 4, 0, 3, false, true, {}},
                      Case{"no_mask", 5, 6, 3, 1, 8, 0, 0, true, false, {}},
                      Case{"custom_kv_map", 6, 6, 3, 2, 4, 10, 10, true, true, {1, 0, 1}}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_P(AttentionBackward, MatchesFiniteDifferences) {
  const Case c = GetParam();
  Tensor q = random64({c.tq, c.hq, c.d}, 1), k = random64({c.tk, c.hk, c.d}, 2), v = random64({c.tk, c.hk, c.d}, 3);
  Tensor r = random64({c.tq, c.hq, c.d}, 4);
  const ops::AttentionParams p{.causality = c.causal ? ops::Causality::causal : ops::Causality::none,
                               .q_position0 = c.qpos,
                               .k_position0 = c.kpos,
                               .tau_log_base = c.tau ? 362.0 : 0.0,
                               .kv_head_of_query = c.kv_map};
  auto loss = [&] {
    Tensor out = Tensor::empty({c.tq, c.hq, c.d}, DType::f64), lse = Tensor::empty({c.hq, c.tq}, DType::f64);
    ops::attention_forward(out, lse, q, k, v, p);
    return weighted_sum(out, r);
  };
  const Grads g = backward_of(q, k, v, r, p);
  const std::string name = std::string("attention ") + c.name;
  if (c.tq * c.tk > 1) expect_gradient(g.dq, q, loss, name + " dq");  // one key: softmax is constant in q
  if (c.tq * c.tk > 1) expect_gradient(g.dk, k, loss, name + " dk");
  expect_gradient(g.dv, v, loss, name + " dv");
  if (c.tq * c.tk == 1) {
    EXPECT_LE(max_abs(g.dq) + max_abs(g.dk), 1e-15);
  }
}

TEST(AttentionBackward, EmptyBlockGivesNoGradient) {
  // Keys at positions 10.. are all in the future of queries 0..3: the forward writes lse = −inf
  // and out = 0; the backward must add nothing (and not turn exp(s − (−inf)) into inf).
  Tensor q = random64({4, 2, 8}, 5), k = random64({5, 1, 8}, 6), v = random64({5, 1, 8}, 7), r = random64({4, 2, 8}, 8);
  const Grads g = backward_of(q, k, v, r, {.q_position0 = 0, .k_position0 = 10, .tau_log_base = 362.0});
  EXPECT_EQ(max_abs(g.dq), 0.0);
  EXPECT_EQ(max_abs(g.dk), 0.0);
  EXPECT_EQ(max_abs(g.dv), 0.0);
}

TEST(AttentionBackward, SumOverKeyBlocksEqualsOneBlock) {
  // Queries at positions 40..109 against keys 0..89 split at 37: the first block is full for every
  // query, the second partially visible. Forward: overwrite then merge; backward: both blocks
  // accumulate into dq and their own rows of dk/dv, with the merged lse and delta.
  const int64_t tq = 70, tk = 90, hq = 4, hk = 2, d = 8, split = 37, qpos = 40;
  Tensor q = random64({tq, hq, d}, 9), k = random64({tk, hk, d}, 10), v = random64({tk, hk, d}, 11);
  Tensor r = random64({tq, hq, d}, 12);
  ops::AttentionParams p{.q_position0 = qpos, .k_position0 = 0, .tau_log_base = 362.0};
  const Grads one = backward_of(q, k, v, r, p);

  Tensor out = Tensor::empty({tq, hq, d}, DType::f64), lse = Tensor::empty({hq, tq}, DType::f64);
  ops::AttentionParams pa = p, pb = p;
  pb.k_position0 = split;
  pb.output = ops::AttentionOutput::merge;
  const TensorView ka = k.view().narrow(0, 0, split), va = v.view().narrow(0, 0, split);
  const TensorView kb = k.view().narrow(0, split, tk - split), vb = v.view().narrow(0, split, tk - split);
  ops::attention_forward(out, lse, q, ka, va, pa);
  ops::attention_forward(out, lse, q, kb, vb, pb);
  Tensor delta = Tensor::empty({hq, tq}, DType::f64);
  ops::attention_backward_prepare(delta, r, out);
  Grads two{Tensor::zeros(q.shape(), DType::f64), Tensor::zeros(k.shape(), DType::f64),
            Tensor::zeros(v.shape(), DType::f64)};
  ops::attention_backward(two.dq, two.dk.view().narrow(0, 0, split), two.dv.view().narrow(0, 0, split), r, q, ka, va,
                          lse, delta, pa);
  ops::attention_backward(two.dq, two.dk.view().narrow(0, split, tk - split), two.dv.view().narrow(0, split, tk - split),
                          r, q, kb, vb, lse, delta, pb);
  // Float64 sums in a different order: agreement to ~1e-15 relative; 1e-12 bounds it.
  EXPECT_LE(relative_error(two.dq, one.dq), 1e-12);
  EXPECT_LE(relative_error(two.dk, one.dk), 1e-12);
  EXPECT_LE(relative_error(two.dv, one.dv), 1e-12);
  EXPECT_GT(max_abs(two.dk.view().narrow(0, split, tk - split)), 0.0);
}

TEST(AttentionBackward, Float32MatchesFloat64) {
  // The fp32 instantiation (the reference the GPU kernel is compared with) against float64 on the
  // same inputs: fp32 scores, exp and BLAS sums give ~1e-6 relative; 1e-4 bounds it.
  const int64_t tq = 67, tk = 67, hq = 2, hk = 1, d = 16;
  Tensor q = random_tensor({tq, hq, d}, 13), k = random_tensor({tk, hk, d}, 14), v = random_tensor({tk, hk, d}, 15);
  Tensor r = random_tensor({tq, hq, d}, 16);
  const ops::AttentionParams p{.q_position0 = 5, .k_position0 = 5, .tau_log_base = 362.0};
  const Grads g32 = backward_of(q, k, v, r, p);
  auto f64 = [](const Tensor& t) { return to(t, Device::host, DType::f64); };
  const Grads g64 = backward_of(f64(q), f64(k), f64(v), f64(r), p);
  EXPECT_LE(relative_error(f64(g32.dq), g64.dq), 1e-4);
  EXPECT_LE(relative_error(f64(g32.dk), g64.dk), 1e-4);
  EXPECT_LE(relative_error(f64(g32.dv), g64.dv), 1e-4);
}

}  // namespace
}  // namespace hydra::test
