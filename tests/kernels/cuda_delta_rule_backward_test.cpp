// GPU gated-delta-rule backward (kernels/delta_rule/delta_rule_backward*.cu) against the fp32 CPU
// reference (the same ops on host tensors), inputs rounded to bf16 before the reference sees them:
// the chunked backward (dq, dk, dv, dβ, dg and the initial-state gradient, with a gradient arriving
// at the final state), the state-gradient pass alone, and the transposed map fold.
// Shapes cross chunk boundaries, include T < 64, T not a multiple of 64 and many chunks.
//
// Tolerances (NaN/Inf checked first), as RMS of the error / RMS of the reference:
//  - dq, dk, dv: 2e-2;  dβ, dg, d_state: 4e-2.
// flash-linear-attention holds its Triton backward to 8e-3 (dq/dk/dv) and 2e-2 (dβ/dg) against an
// fp32 reference; this backward has a few more bf16 operands (T, the chunk states and their
// gradients, dT and Tᵀ dT are rounded to bf16 before their products), hence the factor of ~2.
// The measured ratios are printed. Without a GPU: SKIPPED.
#include <cmath>
#include <cstdio>

#include "kernels/delta_rule/delta_rule.h"
#include "kernels/l2norm/l2norm.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {


void expect_rms(const TensorView& actual, const TensorView& expected, double tolerance, const std::string& what) {
  const Tensor a = host(actual);
  ASSERT_EQ(count_non_finite(a), 0) << what << ": non-finite values";
  ASSERT_EQ(count_non_finite(expected), 0) << what << ": non-finite reference values";
  const double rms = rms_ratio(a, expected);
  std::printf("  %-44s rms ratio %.2e  max rel %.2e\n", what.c_str(), rms, max_rel_error(a, expected));
  EXPECT_LE(rms, tolerance) << what << ": RMS error ratio " << rms;
}

struct GdnCase {
  int64_t t, h, d;
  bool bf16_grads;  // dq/dk/dv as bf16 (else fp32)
};

struct Inputs {
  Tensor q, k, v, g, beta, s0, ds, dout;
};

Inputs make_inputs(const GdnCase& c) {
  Inputs in;
  in.q = random_tensor({c.t, c.h, c.d}, 50);
  in.k = random_tensor({c.t, c.h, c.d}, 51);
  ops::l2_norm(in.q, 1e-6f);
  ops::l2_norm(in.k, 1e-6f);
  in.q = rounded_to_bf16(in.q);
  in.k = rounded_to_bf16(in.k);
  in.v = rounded_to_bf16(random_tensor({c.t, c.h, c.d}, 52));
  in.g = uniform_tensor({c.t, c.h}, 53, -0.5f, 0.0f);
  in.beta = uniform_tensor({c.t, c.h}, 54, 0.0f, 1.0f);
  in.s0 = random_tensor({c.h, c.d, c.d}, 55, 0.3f);
  in.ds = random_tensor({c.h, c.d, c.d}, 56, 0.3f);  // a gradient arriving at the final state
  in.dout = rounded_to_bf16(random_tensor({c.t, c.h, c.d}, 57));
  return in;
}

std::string name_of(const GdnCase& c) {
  return "T=" + std::to_string(c.t) + " H=" + std::to_string(c.h) + " d=" + std::to_string(c.d) +
         (c.bf16_grads ? " bf16" : " f32");
}

TEST(CudaDeltaRuleBackward, ChunkedBackwardMatchesCpuReference) {
  HYDRA_REQUIRE_GPU();
  for (const GdnCase c : {GdnCase{1, 1, 64, false}, GdnCase{63, 2, 64, false}, GdnCase{64, 1, 128, false},
                          GdnCase{65, 2, 128, true}, GdnCase{200, 3, 64, false}, GdnCase{1000, 2, 128, false},
                          GdnCase{4100, 1, 128, true}}) {
    const std::string what = name_of(c);
    const Inputs in = make_inputs(c);
    Tensor dq = Tensor::empty({c.t, c.h, c.d}, DType::f32), dk = Tensor::empty({c.t, c.h, c.d}, DType::f32),
           dv = Tensor::empty({c.t, c.h, c.d}, DType::f32);
    Tensor dg = Tensor::empty({c.t, c.h}, DType::f32), db = Tensor::empty({c.t, c.h}, DType::f32);
    Tensor ds = clone(in.ds);
    ops::delta_rule_chunked_backward(dq, dk, dv, dg, db, ds, in.dout, in.q, in.k, in.v, in.g, in.beta, in.s0, {});

    const DType gt = c.bf16_grads ? DType::bf16 : DType::f32;
    Tensor dq_g = Tensor::empty({c.t, c.h, c.d}, gt, Device::cuda), dk_g = Tensor::empty({c.t, c.h, c.d}, gt, Device::cuda),
           dv_g = Tensor::empty({c.t, c.h, c.d}, gt, Device::cuda);
    Tensor dg_g = Tensor::empty({c.t, c.h}, DType::f32, Device::cuda), db_g = Tensor::empty({c.t, c.h}, DType::f32, Device::cuda);
    Tensor ds_g = gpu(in.ds, DType::f32);
    ops::delta_rule_chunked_backward(dq_g, dk_g, dv_g, dg_g, db_g, ds_g, gpu(in.dout), gpu(in.q), gpu(in.k), gpu(in.v),
                                     gpu(in.g, DType::f32), gpu(in.beta, DType::f32), gpu(in.s0, DType::f32), {});
    expect_rms(dq_g, dq, 2e-2, what + " dq");
    expect_rms(dk_g, dk, 2e-2, what + " dk");
    expect_rms(dv_g, dv, 2e-2, what + " dv");
    expect_rms(db_g, db, 4e-2, what + " dbeta");
    expect_rms(dg_g, dg, 4e-2, what + " dg");
    expect_rms(ds_g, ds, 4e-2, what + " d_state (initial)");
  }
}

TEST(CudaDeltaRuleBackward, StateBackwardAndTransposedFold) {
  HYDRA_REQUIRE_GPU();
  for (const GdnCase c : {GdnCase{50, 2, 64, false}, GdnCase{300, 2, 128, false}}) {
    const std::string what = name_of(c);
    const Inputs in = make_inputs(c);
    // The state-gradient pass alone, from a nonzero final-state gradient.
    Tensor ds = clone(in.ds);
    ops::delta_rule_state_backward(ds, in.dout, in.q, in.k, in.g, in.beta, {});
    Tensor ds_g = gpu(in.ds, DType::f32);
    ops::delta_rule_state_backward(ds_g, gpu(in.dout), gpu(in.q), gpu(in.k), gpu(in.g, DType::f32),
                                   gpu(in.beta, DType::f32), {});
    expect_rms(ds_g, ds, 4e-2, what + " state backward");
    // dS_in = Mᵀ dS_out + dS_loc, with M the segment map's linear part.
    Tensor m = Tensor::empty({c.h, c.d, c.d}, DType::f32), se = Tensor::empty({c.h, c.d, c.d}, DType::f32);
    ops::delta_rule_segment_map(m, se, in.k, in.v, in.g, in.beta, {});
    Tensor loc = random_tensor({c.h, c.d, c.d}, 58, 0.3f), fold = clone(in.ds);
    ops::delta_rule_apply_map_transposed(fold, m, loc);
    Tensor fold_g = gpu(in.ds, DType::f32);
    ops::delta_rule_apply_map_transposed(fold_g, gpu(m, DType::f32), gpu(loc, DType::f32));
    expect_close(host(fold_g), fold, 1e-5, what + " transposed fold (fp32 GEMM)");
  }
}

}  // namespace
}  // namespace hydra::test
