// The sequence-parallel backward ops (distributed fine-tuning) against the single-process backward of the same
// global inputs, under mpirun with P = 1..4 (zigzag layout, segments that cross chunk boundaries):
//  - ring attention: dK/dV accumulators travel the ring and must arrive home after P hops holding
//    every rank's contribution; the lengths mix full, partial (zigzag halves), diagonal and empty
//    block pairs, with GQA and τ;
//  - the GDN reverse fold: each segment's incoming state gradient is the suffix fold of the later
//    segments' local terms through their transposed maps;
//  - the conv halo: the gradient of the K−1 halo rows returns to the previous segment's owner.
// fp32 on the host; only summation order differs between the layouts: 1e-5 relative of the
// largest reference value (a missing hop, a wrong fold order or a lost halo row is O(1)).
#include "kernels/attention/attention.h"
#include "kernels/conv/conv.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/l2norm/l2norm.h"
#include "parallel/gdn_scan.h"
#include "parallel/ring_attention.h"
#include "tests/common/test_util.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {
namespace {

constexpr double kTol = 1e-5;

TEST(RingAttentionBackward, EqualsSingleProcessBackward) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  const int64_t hq = 4, hk = 2, d = 16;
  const std::vector<int> map = {0, 0, 1, 1};
  for (int64_t t : admissible_lengths(p, {3, 37, 70})) {
    const std::string what = "ring backward T=" + std::to_string(t);
    Tensor q = random_tensor({t, hq, d}, 11), k = random_tensor({t, hk, d}, 12), v = random_tensor({t, hk, d}, 13);
    Tensor d_out = random_tensor({t, hq, d}, 14);
    const ops::AttentionParams params{.tau_log_base = 362.0, .kv_head_of_query = map};
    // One process: the whole sequence as one block pair.
    Tensor out = Tensor::empty({t, hq, d}, DType::f32), lse = Tensor::empty({hq, t}, DType::f32);
    ops::attention_forward(out, lse, q, k, v, params);
    Tensor delta = Tensor::empty({hq, t}, DType::f32);
    ops::attention_backward_prepare(delta, d_out, out);
    Tensor dq = Tensor::zeros({t, hq, d}, DType::f32), dk = Tensor::zeros({t, hk, d}, DType::f32);
    Tensor dv = Tensor::zeros({t, hk, d}, DType::f32);
    ops::attention_backward(dq, dk, dv, d_out, q, k, v, lse, delta, params);
    // P ranks: the ring forward (merged lse), then the ring backward.
    const SequenceLayout layout = SequenceLayout::zigzag(t, p, comm.rank());
    const int64_t tl = layout.local_length();
    const Tensor ql = local_rows(layout, q), kl = local_rows(layout, k), vl = local_rows(layout, v);
    Tensor outl = Tensor::empty({tl, hq, d}, DType::f32), lsel = Tensor::empty({hq, tl}, DType::f32);
    ring_attention(comm, layout, outl, lsel, ql, kl, vl, params);
    Tensor dql = Tensor::empty({tl, hq, d}, DType::f32), dkl = Tensor::empty({tl, hk, d}, DType::f32);
    Tensor dvl = Tensor::empty({tl, hk, d}, DType::f32);
    ring_attention_backward(comm, layout, dql, dkl, dvl, local_rows(layout, d_out), ql, kl, vl, outl, lsel, params);
    expect_close(dql, local_rows(layout, dq), kTol, what + " dq");
    expect_close(dkl, local_rows(layout, dk), kTol, what + " dk (home after P hops)");
    expect_close(dvl, local_rows(layout, dv), kTol, what + " dv (home after P hops)");
  }
}

TEST(GdnScanBackward, ReverseFoldEqualsSingleProcessChunkedBackward) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  const int64_t h = 2, dk = 16, dv = 24;
  for (int64_t t : admissible_lengths(p, {3, 37, 70})) {
    const std::string what = "GDN backward T=" + std::to_string(t);
    Tensor q = random_tensor({t, h, dk}, 21), k = random_tensor({t, h, dk}, 22), v = random_tensor({t, h, dv}, 23);
    ops::l2_norm(q, 1e-6f);
    ops::l2_norm(k, 1e-6f);
    Tensor g = uniform_tensor({t, h}, 24, -0.3f, 0.0f), beta = uniform_tensor({t, h}, 25, 0.0f, 1.0f);
    Tensor d_out = random_tensor({t, h, dv}, 26);
    // One process: the whole sequence from a zero state; nothing reads the final state.
    Tensor dq = Tensor::empty({t, h, dk}, DType::f32), dkk = Tensor::empty({t, h, dk}, DType::f32);
    Tensor dvv = Tensor::empty({t, h, dv}, DType::f32), dg = Tensor::empty({t, h}, DType::f32);
    Tensor dbeta = Tensor::empty({t, h}, DType::f32), d_state = Tensor::zeros({h, dk, dv}, DType::f32);
    const Tensor state0 = Tensor::zeros({h, dk, dv}, DType::f32);
    ops::delta_rule_chunked_backward(dq, dkk, dvv, dg, dbeta, d_state, d_out, q, k, v, g, beta, state0, {});
    // P ranks: the forward keeps the maps and initial states; the backward folds the suffix.
    const SequenceLayout layout = SequenceLayout::zigzag(t, p, comm.rank());
    const int64_t tl = layout.local_length();
    const Tensor ql = local_rows(layout, q), kl = local_rows(layout, k), vl = local_rows(layout, v);
    const Tensor gl = local_rows(layout, g), bl = local_rows(layout, beta);
    Tensor out = Tensor::empty({tl, h, dv}, DType::f32);
    GdnSaved saved;
    gdn_sequence_parallel(comm, layout, out, ql, kl, vl, gl, bl, {}, nullptr, &saved);
    Tensor pdq = Tensor::empty({tl, h, dk}, DType::f32), pdk = Tensor::empty({tl, h, dk}, DType::f32);
    Tensor pdv = Tensor::empty({tl, h, dv}, DType::f32), pdg = Tensor::empty({tl, h}, DType::f32);
    Tensor pdb = Tensor::empty({tl, h}, DType::f32);
    gdn_sequence_parallel_backward(comm, layout, saved, pdq, pdk, pdv, pdg, pdb, local_rows(layout, d_out), ql, kl, vl,
                                   gl, bl, {});
    expect_close(pdq, local_rows(layout, dq), kTol, what + " dq");
    expect_close(pdk, local_rows(layout, dkk), kTol, what + " dk");
    expect_close(pdv, local_rows(layout, dvv), kTol, what + " dv");
    expect_close(pdg, local_rows(layout, dg), kTol, what + " dg");
    expect_close(pdb, local_rows(layout, dbeta), kTol, what + " dbeta");
  }
}

TEST(ConvHaloBackward, HaloGradientReturnsToThePreviousOwner) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  const int64_t c = 10;
  for (int64_t t : admissible_lengths(p, {3, 37})) {
    const std::string what = "conv backward T=" + std::to_string(t);
    Tensor x = random_tensor({t, c}, 31), w = random_tensor({c, 4}, 32), d_out = random_tensor({t, c}, 33);
    Tensor dx = Tensor::empty({t, c}, DType::f32), dw = Tensor::zeros({c, 4}, DType::f32);
    ops::causal_conv_silu_backward(dx, dw, TensorView(), d_out, x, w, TensorView());
    const SequenceLayout layout = SequenceLayout::zigzag(t, p, comm.rank());
    Tensor pdx = Tensor::empty({layout.local_length(), c}, DType::f32), pdw = Tensor::zeros({c, 4}, DType::f32);
    causal_conv_sequence_parallel_backward(comm, layout, pdx, pdw, local_rows(layout, d_out), local_rows(layout, x), w);
    expect_close(pdx, local_rows(layout, dx), kTol, what + " dx");
    // Each rank holds its tokens' share of dw; the sum over ranks is the whole sequence's.
    comm.all_reduce_sum(pdw);
    expect_close(pdw, dw, kTol, what + " dw (summed over ranks)");
  }
}

}  // namespace
}  // namespace hydra::test
