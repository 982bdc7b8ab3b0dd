// Every CUDA op against its fp32 CPU reference (the same op on the host). Inputs are rounded to
// bf16 before the reference sees them, so the comparison measures the kernel, not the input
// rounding. NaN/Inf are checked first (expect_close). Tolerances (max |err| / max |ref|):
//  - element-wise ops: 1e-2 — the bf16 output rounding alone is up to 2⁻⁸ ≈ 4e-3;
//  - GEMM: 1e-2 — bf16 inputs, fp32 accumulation, bf16 output;
//  - attention: 2e-2 — P is rounded to bf16 for the PV product (as in FlashAttention);
//  - gated delta rule: 3e-2 — T, P, R = β(V − e^γ K S), V' and the state's copy are bf16 operands
//    of fp32 products; the fp32 state keeps the error from compounding.
// The attention and delta-rule tests run every implementation the device has (the selectors of
// attention.h / delta_rule.h) and print each one's error, so one run tells which kernel fails where.
// Without a GPU every test here reports SKIPPED.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/attention/attention.h"
#include "kernels/conv/conv.h"
#include "kernels/delta_rule/delta_rule.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/fusion/fusion.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/l2norm/l2norm.h"
#include "kernels/matmul/matmul.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {


TEST(CudaRuntime, StridedCopiesAndConversions) {
  HYDRA_REQUIRE_GPU();
  Tensor a = random_tensor({9, 13}, 1);
  Tensor d = gpu(a, DType::f32);
  expect_close(host(d), a, 0.0, "f32 round trip");
  Tensor block = Tensor::empty({9, 5}, DType::bf16, Device::cuda);
  copy_into(block, d.view().narrow(1, 3, 5));  // strided, converting, device to device
  expect_close(host(block), rounded_to_bf16(a.view().narrow(1, 3, 5)), 0.0, "strided f32->bf16");
  Tensor back = Tensor::zeros({9, 13}, DType::f32, Device::cuda);
  copy_into(back.view().narrow(1, 3, 5), block);
  Tensor h = host(back);
  for (int64_t i = 0; i < 9; ++i)
    for (int64_t j = 0; j < 13; ++j) {
      const float v = h.data_as<float>()[i * 13 + j];
      EXPECT_EQ(v, (j >= 3 && j < 8) ? round_to_bf16(a.data_as<float>()[i * 13 + j]) : 0.0f) << i << "," << j;
    }
  // The paths of cuda_convert: rows that merge into one pitched copy ([T, H, d] head views of a wider
  // matrix), converting rows with 16/8-byte accesses (aligned, 4 | cols), with a tail, misaligned,
  // and a view that does not merge into rows (every d-th column block: the element-wise kernel).
  const Tensor wide = rounded_to_bf16(random_tensor({37, 6 * 64}, 2));
  const Tensor gwide = gpu(wide);
  const auto heads = [](const TensorView& m) { return m.narrow(1, 64, 4 * 64).split_dim(1, 4, 64); };
  Tensor hv = Tensor::empty({37, 4, 64}, DType::bf16, Device::cuda);
  copy_into(hv, heads(gwide));
  expect_close(host(hv), heads(wide), 0.0, "head view, pitched copy");
  // Row widths below, at and above one block's 1024 columns (several rows a block step for the
  // narrow ones, several tiles a row for the wide), with and without a tail of < 4.
  for (const int64_t offset : {0, 1}) {
    for (const int64_t cols : {3, 64, 70, 256, 768, 1024, 1030, 2100}) {
      const Tensor big = random_tensor({70, 2110}, 3);
      const TensorView src = big.view().narrow(1, offset, cols);
      Tensor b16 = Tensor::empty({70, cols}, DType::bf16, Device::cuda);
      copy_into(b16, gpu(big, DType::f32).view().narrow(1, offset, cols));
      expect_close(host(b16), rounded_to_bf16(src), 0.0, fmt::format("f32->bf16 rows, offset {} cols {}", offset, cols));
      Tensor f32 = Tensor::empty({70, cols}, DType::f32, Device::cuda);
      copy_into(f32, b16);
      expect_close(host(f32), rounded_to_bf16(src), 0.0, fmt::format("bf16->f32 rows, offset {} cols {}", offset, cols));
    }
  }
  const auto every_other = [](const TensorView& m) { return m.split_dim(1, 6, 64).narrow(2, 0, 32); };  // [37, 6, 32]
  Tensor half_heads = Tensor::empty({37, 6, 32}, DType::f32, Device::cuda);
  copy_into(half_heads, every_other(gwide));
  expect_close(host(half_heads), every_other(wide), 0.0, "non-row view, converting element-wise kernel");
  Tensor same_dtype = Tensor::empty({37, 6, 32}, DType::bf16, Device::cuda);
  copy_into(same_dtype, every_other(gwide));
  expect_close(host(same_dtype), every_other(wide), 0.0, "non-row view, element-wise kernel");
}

TEST(CudaOps, NormsRopeGatesFusionSwigluAdd) {
  HYDRA_REQUIRE_GPU();
  const int64_t t = 37, h = 3, d = 64;
  // RMSNorm over [T, H, d] head rows taken from a wider matrix.
  Tensor wide = rounded_to_bf16(random_tensor({t, (h + 1) * d}, 2, 2.0f)), w = random_tensor({d}, 3);
  const TensorView x = wide.view().narrow(1, d, h * d).split_dim(1, h, d);
  Tensor ref = Tensor::empty({t, h, d}, DType::f32);
  ops::rms_norm(ref, x, w, {1e-6f});
  Tensor gw = gpu(wide);
  Tensor out = Tensor::empty({t, h, d}, DType::bf16, Device::cuda);
  ops::rms_norm(out, gw.view().narrow(1, d, h * d).split_dim(1, h, d), gpu(w, DType::f32), {1e-6f});
  expect_close(host(out), ref, 1e-2, "rms_norm");
  // RoPE at large positions, L2 norm.
  Tensor pos = Tensor::empty({t}, DType::i64);
  for (int64_t i = 0; i < t; ++i) pos.data_as<int64_t>()[i] = 1000003 * (i % 3) + i;
  Tensor r = clone(x), rg = gpu(x);
  ops::rope(r, pos, {1e6});
  ops::rope(rg, to_device(pos, Device::cuda), {1e6});
  expect_close(host(rg), r, 1e-2, "rope");
  ops::l2_norm(r, 1e-6f);
  ops::l2_norm(rg, 1e-6f);
  expect_close(host(rg), r, 1e-2, "l2_norm");
  // Fusion.
  Tensor fw = random_tensor({h, d}, 4), gamma = random_tensor({h}, 5);
  Tensor fy = Tensor::empty({t, h, d}, DType::f32);
  ops::head_fusion(fy, r, {.weight = fw, .gamma = gamma, .gate = {}, .gate_bias = {}}, {1e-6f});
  Tensor fyg = Tensor::empty({t, h, d}, DType::bf16, Device::cuda);
  const Tensor gfw = gpu(fw, DType::f32), ggamma = gpu(gamma, DType::f32);
  ops::head_fusion(fyg, rg, {.weight = gfw, .gamma = ggamma, .gate = {}, .gate_bias = {}}, {1e-6f});
  expect_close(host(fyg), fy, 1e-2, "head_fusion");
  // Gates.
  Tensor ab = rounded_to_bf16(random_tensor({t, 2 * h + 3}, 6, 3.0f)), alog = uniform_tensor({h}, 7, 0.0f, 2.7f),
         dtb = random_tensor({h}, 8);
  Tensor beta = Tensor::empty({t, h}, DType::f32), g = Tensor::empty({t, h}, DType::f32);
  ops::gdn_gates(beta, g, ab.view().narrow(1, h, h), ab.view().narrow(1, 0, h), alog, dtb);
  Tensor abg = gpu(ab), bg = Tensor::empty({t, h}, DType::f32, Device::cuda), gg = Tensor::empty({t, h}, DType::f32, Device::cuda);
  ops::gdn_gates(bg, gg, abg.view().narrow(1, h, h), abg.view().narrow(1, 0, h), gpu(alog, DType::f32), gpu(dtb, DType::f32));
  expect_close(host(bg), beta, 1e-5, "beta");
  expect_close(host(gg), g, 1e-5, "g");
  // SwiGLU, residual add, sigmoid gate from an fp32 accumulator.
  Tensor gu = rounded_to_bf16(random_tensor({t, 2 * d}, 9, 2.0f)), sref = Tensor::empty({t, d}, DType::f32);
  ops::swiglu(sref, gu.view().narrow(1, 0, d), gu.view().narrow(1, d, d));
  Tensor gug = gpu(gu), sg = Tensor::empty({t, d}, DType::bf16, Device::cuda);
  ops::swiglu(sg, gug.view().narrow(1, 0, d), gug.view().narrow(1, d, d));
  expect_close(host(sg), sref, 1e-2, "swiglu");
  Tensor y = rounded_to_bf16(random_tensor({t, d}, 10)), xs = rounded_to_bf16(sref);
  Tensor xg = gpu(xs);
  ops::add_inplace(xs, y);
  ops::add_inplace(xg, gpu(y));
  expect_close(host(xg), xs, 1e-2, "add");
  // fp32 += fp32 (the ring's dK/dV accumulators) exactly as on the host, and fp32 += bf16.
  Tensor xf = random_tensor({t, d}, 14), yf = random_tensor({t, d}, 15);
  Tensor xfg = gpu(xf, DType::f32);
  ops::add_inplace(xfg, gpu(yf, DType::f32));
  ops::add_inplace(xf, yf);
  expect_close(host(xfg), xf, 0.0, "add fp32");
  ops::add_inplace(xfg, gpu(y));
  ops::add_inplace(xf, y);
  expect_close(host(xfg), xf, 0.0, "add fp32 += bf16");
  Tensor acc = random_tensor({t, d}, 11), gate = rounded_to_bf16(random_tensor({t, d}, 12, 3.0f));
  Tensor gref = Tensor::empty({t, d}, DType::f32), gout = Tensor::empty({t, d}, DType::bf16, Device::cuda);
  ops::sigmoid_gate(gref, acc, gate);
  ops::sigmoid_gate(gout, gpu(acc, DType::f32), gpu(gate));
  expect_close(host(gout), gref, 1e-2, "sigmoid_gate");
  // Embedding.
  Tensor table = rounded_to_bf16(random_tensor({50, d}, 13)), ids = Tensor::empty({t}, DType::i32);
  for (int64_t i = 0; i < t; ++i) ids.data_as<int32_t>()[i] = static_cast<int32_t>((i * 7) % 50);
  Tensor eref = Tensor::empty({t, d}, DType::f32), eg = Tensor::empty({t, d}, DType::bf16, Device::cuda);
  ops::embedding(eref, table, ids);
  ops::embedding(eg, gpu(table), to_device(ids, Device::cuda));
  expect_close(host(eg), eref, 0.0, "embedding");
}

TEST(CudaOps, ConvWithHalo) {
  HYDRA_REQUIRE_GPU();
  const int64_t t = 45, c = 96, k = 4;
  Tensor x = rounded_to_bf16(random_tensor({t, c + 8}, 14)), w = random_tensor({c, k}, 15);
  Tensor prefix = rounded_to_bf16(random_tensor({k - 1, c}, 16));
  Tensor ref = Tensor::empty({t, c}, DType::f32), out = Tensor::empty({t, c}, DType::bf16, Device::cuda);
  ops::causal_conv_silu(ref, x.view().narrow(1, 8, c), w, prefix);
  Tensor xg = gpu(x);
  ops::causal_conv_silu(out, xg.view().narrow(1, 8, c), gpu(w, DType::f32), gpu(prefix));
  expect_close(host(out), ref, 1e-2, "conv with halo");
}

TEST(CudaOps, GemmBf16AndFp32) {
  HYDRA_REQUIRE_GPU();
  for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 8, 16}, {37, 200, 72}, {513, 264, 1024}}) {
    Tensor x = rounded_to_bf16(random_tensor({m, k}, 17)), w = rounded_to_bf16(random_tensor({n, k}, 18));
    Tensor y0 = rounded_to_bf16(random_tensor({m, n}, 19));
    Tensor ref = clone(y0);
    ops::linear(ref, x, w, ops::Accumulate::yes);
    Tensor yg = gpu(y0);
    ops::linear(yg, gpu(x), gpu(w), ops::Accumulate::yes);
    expect_close(host(yg), ref, 1e-2, "linear bf16 " + std::to_string(m));
    Tensor logits = Tensor::empty({m, n}, DType::f32, Device::cuda), lref = Tensor::empty({m, n}, DType::f32);
    ops::linear(logits, gpu(x), gpu(w));  // fp32 output from bf16 operands
    ops::linear(lref, x, w);
    expect_close(host(logits), lref, 1e-4, "linear bf16->fp32 " + std::to_string(m));
  }
  Tensor a = random_tensor({64, 64}, 20), b = random_tensor({64, 48}, 21), c = Tensor::empty({64, 48}, DType::f32);
  ops::gemm(c, a, b, {});
  Tensor cg = Tensor::empty({64, 48}, DType::f32, Device::cuda);
  ops::gemm(cg, gpu(a, DType::f32), gpu(b, DType::f32), {});
  expect_close(host(cg), c, 1e-5, "fp32 gemm (no TF32)");
}

// Where two [T, H, d] (or [H, T]) tensors differ most: for a failure message a person can act on.
[[maybe_unused]] std::string worst_element(const Tensor& got, const Tensor& want) {
  int64_t at = 0;
  double worst = -1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double e = std::abs(static_cast<double>(got.data_as<float>()[i]) - want.data_as<float>()[i]);
    if (!(e <= worst)) {  // NaN counts as worst
      worst = e;
      at = i;
    }
  }
  std::string index;
  for (int d = want.rank() - 1, rest = static_cast<int>(at); d >= 0; --d) {
    index = std::to_string(rest % want.size(d)) + (index.empty() ? "" : "," + index);
    rest /= static_cast<int>(want.size(d));
  }
  return "worst at [" + index + "]: got " + std::to_string(got.data_as<float>()[at]) + ", want " +
         std::to_string(want.data_as<float>()[at]);
}

// One attention block as ring attention calls it (positions of the query and key blocks, GQA,
// τ, overwrite or merge into an earlier partial result).
struct AttnCase {
  const char* kind;
  int64_t tq, tk, hq, hk, d, qpos, kpos;
  bool tau = true, merge = false, causal = true, custom_map = false;
};

TEST(CudaOps, FlashAttentionMatchesReference) {
  HYDRA_REQUIRE_GPU();
#if HYDRA_CUDA
  using ops::AttentionKernel;
  const AttnCase cases[] = {
      {"single query", 1, 1, 1, 1, 64, 0, 0, false},
      {"causal odd", 37, 37, 4, 2, 64, 0, 0, false},
      {"causal diagonal", 200, 200, 3, 3, 128, 100, 100},
      {"full block (keys before queries)", 70, 130, 2, 1, 128, 192, 0},
      {"partial block (keys straddle the queries)", 150, 90, 2, 2, 64, 60, 10},
      {"partial block d128", 260, 300, 4, 2, 128, 1000, 900},
      {"zigzag half (later half visible)", 256, 256, 2, 1, 128, 256, 128},
      {"empty block (keys after queries)", 65, 65, 4, 1, 128, 0, 1000, false},
      {"empty block merge (earlier result stands)", 65, 65, 4, 1, 128, 0, 1000, true, true},
      {"diagonal at 512K", 129, 129, 2, 1, 128, 524288, 524288},
      {"diagonal at 1M", 300, 300, 2, 2, 128, 1048576 - 300, 1048576 - 300},
      {"full block at 1M", 200, 256, 2, 1, 128, 1048576 - 200, 1048576 - 1000},
      {"merge, partial", 96, 160, 4, 2, 128, 160, 0, true, true},
      {"merge d64", 100, 100, 2, 1, 64, 50, 0, false, true},
      {"merge at 1M", 130, 250, 2, 1, 128, 1048576 - 130, 1048576 - 250, true, true},
      {"non-causal", 77, 190, 2, 2, 128, 0, 500, true, false, false},
      {"GQA map", 140, 140, 4, 2, 128, 0, 0, true, false, true, true},
      {"many tiles (persistent scheduler)", 3000, 3000, 8, 2, 128, 0, 0},
  };
  for (const AttnCase& c : cases) {
    Tensor q = rounded_to_bf16(random_tensor({c.tq, c.hq, c.d}, 22, 2.0f));
    Tensor k = rounded_to_bf16(random_tensor({c.tk, c.hk, c.d}, 23, 2.0f));
    Tensor v = rounded_to_bf16(random_tensor({c.tk, c.hk, c.d}, 24));
    const std::vector<int> map = {1, 0, 1, 0};
    ops::AttentionParams p{.causality = c.causal ? ops::Causality::causal : ops::Causality::none,
                           .q_position0 = c.qpos, .k_position0 = c.kpos, .tau_log_base = c.tau ? 362.0 : 0.0};
    if (c.custom_map) p.kv_head_of_query = map;
    Tensor out0 = Tensor::zeros({c.tq, c.hq, c.d}, DType::f32), lse0 = Tensor::empty({c.hq, c.tq}, DType::f32);
    if (c.merge) {  // an earlier partial result to merge into, with some rows that saw nothing yet
      out0 = random_tensor({c.tq, c.hq, c.d}, 25);
      lse0 = random_tensor({c.hq, c.tq}, 26, 3.0f);
      for (int64_t i = 0; i < lse0.numel(); i += 7) lse0.data_as<float>()[i] = -std::numeric_limits<float>::infinity();
      p.output = ops::AttentionOutput::merge;
    }
    Tensor out = clone(out0), lse = clone(lse0);
    ops::attention_forward(out, lse, q, k, v, p);
    for (AttentionKernel kernel : {AttentionKernel::hopper, AttentionKernel::mma}) {
      if (!ops::cuda_impl::flash_kernel_supported(kernel, c.d)) continue;
      const std::string what = std::string("attention [") + ops::attention_kernel_name(kernel) + "] " + c.kind +
                               ": tq=" + std::to_string(c.tq) + " tk=" + std::to_string(c.tk) + " q@" +
                               std::to_string(c.qpos) + " k@" + std::to_string(c.kpos) + " d=" + std::to_string(c.d);
      Tensor out_g = gpu(out0, DType::f32), lse_g = gpu(lse0, DType::f32);
      ops::AttentionParams pk = p;
      pk.forward_kernel = kernel;
      ops::cuda_impl::attention_forward(out_g, lse_g, gpu(q), gpu(k), gpu(v), pk);
      Tensor oh = host(out_g), lh = host(lse_g);
      std::printf("%s: out max rel error %.4g\n", what.c_str(), max_rel_error(oh, out));
      expect_close(oh, out, 2e-2, what + " out (" + worst_element(oh, out) + ")");
      int bad = 0;
      for (int64_t i = 0; i < lse.numel() && bad < 5; ++i) {
        const float a = lh.data_as<float>()[i], b = lse.data_as<float>()[i];
        const bool ok = std::isinf(b) ? (std::isinf(a) && a < 0) : std::abs(a - b) <= 2e-2 * std::max(1.0f, std::abs(b));
        if (!ok) {
          ++bad;
          ADD_FAILURE() << what << " lse [head " << i / c.tq << ", row " << i % c.tq << "]: got " << a << ", want " << b;
        }
      }
    }
  }
#endif
}

struct GdnCase {
  int64_t t, h, d;
  int segments = 0;  // the in-GPU split of the fused kernel (0: automatic)
};

TEST(CudaOps, ChunkedDeltaRuleAndSegmentMapMatchReference) {
  HYDRA_REQUIRE_GPU();
#if HYDRA_CUDA
  // 20000 and 40000 tokens split the sequential pass inside the GPU (segment maps + fold) by
  // default; the forced segment counts split short sequences too (uneven last segment included).
  for (const GdnCase c : {GdnCase{1, 1, 64}, GdnCase{63, 2, 64}, GdnCase{64, 1, 128}, GdnCase{65, 2, 128},
                          GdnCase{200, 3, 64}, GdnCase{200, 3, 64, 3}, GdnCase{1000, 2, 128}, GdnCase{1000, 2, 128, 3},
                          GdnCase{3000, 14, 128, 5}, GdnCase{20000, 2, 128}, GdnCase{40000, 1, 64}}) {
    Tensor q = random_tensor({c.t, c.h, c.d}, 30), k = random_tensor({c.t, c.h, c.d}, 31);
    ops::l2_norm(q, 1e-6f);
    ops::l2_norm(k, 1e-6f);
    q = rounded_to_bf16(q);
    k = rounded_to_bf16(k);
    Tensor v = rounded_to_bf16(random_tensor({c.t, c.h, c.d}, 32));
    Tensor g = uniform_tensor({c.t, c.h}, 33, -0.5f, 0.0f), beta = uniform_tensor({c.t, c.h}, 34, 0.0f, 1.0f);
    Tensor s0 = random_tensor({c.h, c.d, c.d}, 35, 0.3f);
    Tensor out = Tensor::empty({c.t, c.h, c.d}, DType::f32), state = clone(s0);
    ops::delta_rule_chunked(out, state, q, k, v, g, beta, {});
    Tensor m = Tensor::empty({c.h, c.d, c.d}, DType::f32), se = Tensor::empty({c.h, c.d, c.d}, DType::f32);
    ops::delta_rule_segment_map(m, se, k, v, g, beta, {});
    {
      const ops::DeltaRuleParams options{.segments = c.segments};
      const std::string what = std::string("delta rule T=") + std::to_string(c.t) + " H=" + std::to_string(c.h) + " d=" + std::to_string(c.d) +
                               " segments=" + (c.segments ? std::to_string(c.segments) : std::string("auto"));
      Tensor out_g = Tensor::empty({c.t, c.h, c.d}, DType::bf16, Device::cuda), state_g = gpu(s0, DType::f32);
      ops::cuda_impl::delta_rule_chunked(out_g, state_g, gpu(q), gpu(k), gpu(v), gpu(g, DType::f32),
                                         gpu(beta, DType::f32), options);
      Tensor oh = host(out_g), sh = host(state_g);
      std::printf("%s: output max rel error %.4g, final state %.4g\n", what.c_str(), max_rel_error(oh, out),
                  max_rel_error(sh, state));
      expect_close(oh, out, 3e-2, what + " output (" + worst_element(oh, out) + ")");
      expect_close(sh, state, 3e-2, what + " final state (" + worst_element(sh, state) + ")");
      Tensor mg = Tensor::empty({c.h, c.d, c.d}, DType::f32, Device::cuda);
      Tensor seg = Tensor::empty({c.h, c.d, c.d}, DType::f32, Device::cuda);
      ops::cuda_impl::delta_rule_segment_map(mg, seg, gpu(k), gpu(v), gpu(g, DType::f32), gpu(beta, DType::f32),
                                             options);
      Tensor mh = host(mg), seh = host(seg);
      std::printf("%s: map M max rel error %.4g, S_ext %.4g\n", what.c_str(), max_rel_error(mh, m),
                  max_rel_error(seh, se));
      expect_close(mh, m, 3e-2, what + " map M (" + worst_element(mh, m) + ")");
      expect_close(seh, se, 3e-2, what + " map S_ext (" + worst_element(seh, se) + ")");
      Tensor folded = gpu(s0, DType::f32);
      ops::delta_rule_apply_map(folded, mg, seg);
      expect_close(host(folded), state, 3e-2, what + " M·S0 + S_ext = final state");
    }
  }
#endif
}

// The one-launch segment fold against a host fold in fp64: with and without the addend, both state
// sizes, and operands that are slices of larger buffers (as segment_map passes M[1..]).
TEST(CudaOps, SegmentFoldMatchesHostFold) {
  HYDRA_REQUIRE_GPU();
#if HYDRA_CUDA
  for (const int64_t d : {64, 128}) {
    for (const bool with_add : {true, false}) {
      const int64_t heads = 3;
      const int steps = 6;
      // Maps near a contraction (entries of size 1/sqrt(d)·0.9), as the decayed segment maps are.
      Tensor m = random_tensor({steps + 1, heads, d, d}, 41, 0.9f / std::sqrt(static_cast<float>(d)));
      Tensor add = random_tensor({steps, heads, d, d}, 42, 0.5f);
      Tensor s0 = random_tensor({heads, d, d}, 43, 1.0f);
      // Host: states[s+1] = M_{s+1} states[s] + add[s] (the device sees M from slice 1 on).
      std::vector<double> ref(static_cast<size_t>(heads * d * d)), next(ref.size());
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = s0.data_as<float>()[i];
      std::vector<std::vector<double>> expected;
      for (int s = 0; s < steps; ++s) {
        const float* ms = m.data_as<float>() + (s + 1) * heads * d * d;
        const float* as = add.data_as<float>() + s * heads * d * d;
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t r = 0; r < d; ++r)
            for (int64_t c = 0; c < d; ++c) {
              double acc = with_add ? as[(h * d + r) * d + c] : 0.0;
              for (int64_t k = 0; k < d; ++k) acc += double(ms[(h * d + r) * d + k]) * ref[static_cast<size_t>((h * d + k) * d + c)];
              next[static_cast<size_t>((h * d + r) * d + c)] = acc;
            }
        ref.swap(next);
        expected.push_back(ref);
      }
      Tensor mg = gpu(m, DType::f32), ag = gpu(add, DType::f32);
      Tensor states = Tensor::zeros({steps + 1, heads, d, d}, DType::f32, Device::cuda);
      copy_into(states.view().select(0, 0), gpu(s0, DType::f32));
      const TensorView a_view = ag.view();
      ops::cuda_impl::delta_rule_fold(mg.view().narrow(0, 1, steps), with_add ? &a_view : nullptr, states, steps);
      Tensor out = host(states);
      double worst = 0, scale = 0;
      for (int s = 0; s < steps; ++s)
        for (size_t i = 0; i < ref.size(); ++i) {
          const double got = out.data_as<float>()[static_cast<size_t>(s + 1) * ref.size() + i];
          worst = std::max(worst, std::abs(got - expected[static_cast<size_t>(s)][i]));
          scale = std::max(scale, std::abs(expected[static_cast<size_t>(s)][i]));
        }
      std::printf("fold d=%lld add=%d: max abs error %.3g (largest value %.3g)\n", static_cast<long long>(d), with_add,
                  worst, scale);
      EXPECT_GT(scale, 0.1);  // the fold did not decay to nothing: the comparison means something
      EXPECT_LT(worst, 2e-5 * scale) << "fold d=" << d << " add=" << with_add;
    }
  }
#endif
}

}  // namespace
}  // namespace hydra::test
