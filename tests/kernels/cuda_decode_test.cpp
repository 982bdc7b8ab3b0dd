// The decode-step CUDA kernels (generation) against their CPU references, on inputs
// rounded to bf16 first (the reference sees what the GPU holds). SKIPPED without a GPU.
// Tolerances (max |err| / max |ref| unless said):
//  - attention_decode: 2e-3 on out, 1e-4 absolute on lse — bf16 q/K/V as on both sides, fp32
//    accumulation and softmax statistics with the approximate exp2 (~2 ulp) on the GPU against fp64
//    on the CPU; out and lse are fp32 (no output rounding);
//  - attention_merge_partials: 1e-5 (fp32 both sides);
//  - delta_rule_step: outputs 1e-2 (bf16 output rounding, 2⁻⁸), state 1e-4 after 24 steps (fp32
//    state, fp32 vs fp64 sums);
//  - gdn_qkv_conv_step: outputs 1e-2 (bf16 output), inverse norms 1e-3, the tail exactly (a copy);
//  - gdn_decode_step (the GDN branch, both GPU kernel choices): the conv outputs and the tail as the
//    conv step's, β and g 1e-5 (fp32 gates against fp64), and the step as delta_rule_step's (its
//    reference fed the GPU's own bf16 q/k/v and fp32 gates, so a bf16 rounding tie in the conv does
//    not move the state's bound);
//  - kv_cache_append, row_argmax: exact.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "kernels/argmax/argmax.h"
#include "kernels/attention/attention_decode.h"
#include "kernels/delta_rule/delta_rule_step.h"
#include "kernels/gdn_decode/gdn_decode.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/gdn_qk/gdn_qk_step.h"
#include "kernels/l2norm/l2norm.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {


double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.data_as<float>()[i], y = b.data_as<float>()[i];
    if (std::isinf(x) && std::isinf(y) && (x < 0) == (y < 0)) continue;
    m = std::max(m, static_cast<double>(std::abs(x - y)));
  }
  return m;
}

struct AttentionCase {
  int64_t d, hq, hk;
  std::vector<int> map;  // empty: h / (Hq / Hk)
  std::vector<int32_t> lengths;
  double tau;
};

// The decode attention kernel at its default split CTAs per SM and at others, with plain and with
// evict-first cache loads (the decode weight prefetch's hint: the same values, bit for bit), each
// with the longest row as the bound and with the cache's capacity as the bound (the CUDA graph's case: chunks past every
// row's end hold no key).
TEST(CudaDecode, AttentionMatchesCpu) {
  HYDRA_REQUIRE_GPU();
  const std::vector<AttentionCase> cases = {
      {128, 2, 1, {}, {1, 37, 5000}, 362.0},           // HydraHead: two FA heads on one KV head, many chunks
      {128, 2, 1, {}, {70001}, 362.0},                 // HydraHead at batch 1, hundreds of chunks to merge
      {128, 16, 8, {}, {300, 4097, 2}, 0.0},           // the teacher's GQA
      {64, 3, 2, {1, 0, 1}, {64, 0, 700}, 362.0},      // d = 64, a custom map, an empty row
      {64, 8, 1, {}, {20000, 1, 999}, 0.0},            // a group of 8 and a long row
      {128, 16, 1, {}, {3000, 129}, 0.0},              // a group of 16
  };
  const std::vector<int> ctas_per_sm = {0, 1, 8};
  for (const AttentionCase& c : cases) {
    const int64_t rows = static_cast<int64_t>(c.lengths.size()), slots = rows + 1;
    const int64_t cap = *std::max_element(c.lengths.begin(), c.lengths.end()) + 3;
    const Tensor q = rounded_to_bf16(random_tensor({rows, c.hq, c.d}, 1));
    const Tensor k = rounded_to_bf16(random_tensor({slots, cap, c.hk, c.d}, 2));
    const Tensor v = rounded_to_bf16(random_tensor({slots, cap, c.hk, c.d}, 3));
    std::vector<int32_t> slot_of(static_cast<size_t>(rows));
    for (int64_t b = 0; b < rows; ++b) slot_of[static_cast<size_t>(b)] = static_cast<int32_t>(slots - 1 - b);  // reversed
    std::vector<int64_t> pos;
    for (const int32_t n : c.lengths) pos.push_back(std::max(n - 1, 0) + 100);
    const Tensor slot_t = int32_vector(slot_of), len_t = int32_vector(c.lengths), pos_t = int64_vector(pos);
    const int64_t longest = *std::max_element(c.lengths.begin(), c.lengths.end());
    const ops::AttentionParams p{.tau_log_base = c.tau, .kv_head_of_query = c.map};
    Tensor ref = Tensor::empty({rows, c.hq, c.d}, DType::f32), ref_lse = Tensor::empty({c.hq, rows}, DType::f32);
    ops::attention_decode(ref, ref_lse, q, k, v, slot_t, len_t, longest, pos_t, p);
    const Tensor gq = gpu(q), gk = gpu(k), gv = gpu(v), gslot = gpu(slot_t, DType::i32), glen = gpu(len_t, DType::i32);
    const Tensor gpos = gpu(pos_t, DType::i64);
    for (const int ctas : ctas_per_sm) {
      for (const int64_t bound : {longest, cap}) {
        Tensor plain_out, plain_lse;  // the plain loads' result, which the hinted loads must give bit for bit
        for (const bool evict_first : {false, true}) {
          ops::AttentionParams pv = p;
          pv.decode_ctas_per_sm = ctas;
          pv.decode_kv_evict_first = evict_first;
          Tensor out = Tensor::empty({rows, c.hq, c.d}, DType::f32, Device::cuda);
          Tensor lse = Tensor::empty({c.hq, rows}, DType::f32, Device::cuda);
          ops::attention_decode(out, lse, gq, gk, gv, gslot, glen, bound, gpos, pv);
          const std::string what = fmt::format("decode attention ({}/SM{}) d={} Hq={} Hk={} longest={} bound={}", ctas,
                                               evict_first ? ", evict-first loads" : "", c.d, c.hq, c.hk, longest, bound);
          const Tensor got_out = host(out), got_lse = host(lse);
          expect_close(got_out, ref, 2e-3, what);
          EXPECT_LE(max_abs_diff(got_lse, ref_lse), 1e-4) << what << " lse";
          for (int64_t b = 0; b < rows; ++b) {
            if (c.lengths[static_cast<size_t>(b)] == 0) {
              for (int64_t h = 0; h < c.hq; ++h) EXPECT_TRUE(std::isinf(got_lse.data_as<float>()[h * rows + b])) << what;
            }
          }
          if (!evict_first) {
            plain_out = got_out;
            plain_lse = got_lse;
          } else {
            EXPECT_EQ(std::memcmp(got_out.data(), plain_out.data(), got_out.nbytes()), 0) << what << ": out differs from plain loads";
            EXPECT_EQ(std::memcmp(got_lse.data(), plain_lse.data(), got_lse.nbytes()), 0) << what << ": lse differs from plain loads";
          }
        }
      }
    }
  }
}

// The merge: a few parts (one with no key, a row no part saw), hundreds of parts (the split
// kernels' count at long context), and the ranks' packed [out | lse] parts of model/kv_cache.cpp
// (strides that are not multiples of four floats: the scalar loads); the same parts merged twice
// give the same bits (every rank merging the gathered parts must agree).
TEST(CudaDecode, MergeAndAppendMatchCpu) {
  HYDRA_REQUIRE_GPU();
  const int64_t n = 5, rows = 3, hq = 4, dv = 64;
  const Tensor parts = random_tensor({n, rows, hq, dv}, 4);
  Tensor part_lse = random_tensor({n, hq, rows}, 5, 3.0f);
  part_lse.data_as<float>()[1] = -std::numeric_limits<float>::infinity();  // a part with no key
  for (int64_t i = 0; i < n; ++i) part_lse.data_as<float>()[i * hq * rows + 2] = -std::numeric_limits<float>::infinity();
  Tensor ref = Tensor::empty({rows, hq, dv}, DType::f32), ref_lse = Tensor::empty({hq, rows}, DType::f32);
  ops::attention_merge_partials(ref, ref_lse, parts, part_lse);
  Tensor out = Tensor::empty({rows, hq, dv}, DType::f32, Device::cuda), lse = Tensor::empty({hq, rows}, DType::f32, Device::cuda);
  ops::attention_merge_partials(out, lse, gpu(parts, DType::f32), gpu(part_lse, DType::f32));
  expect_close(host(out), ref, 1e-5, "merge partials");
  EXPECT_LE(max_abs_diff(host(lse), ref_lse), 1e-5);
  EXPECT_TRUE(std::isinf(host(lse).data_as<float>()[2])) << "a row no part saw keeps lse = -inf";

  {  // Hundreds of parts, dv = 128, every tenth part without keys.
    const int64_t many = 700, r2 = 2, h2 = 3, d2 = 128;
    const Tensor p2 = random_tensor({many, r2, h2, d2}, 14);
    Tensor l2 = random_tensor({many, h2, r2}, 15, 4.0f);
    for (int64_t i = 0; i < many; i += 10) {
      for (int64_t j = 0; j < h2 * r2; ++j) l2.data_as<float>()[i * h2 * r2 + j] = -std::numeric_limits<float>::infinity();
    }
    // The reference merges in float64: the float32 CPU merge adds the 700 parts one after another,
    // rounding lse (~12, ulp 9.5e-7) at each, and is itself ~3e-5 off (the GPU measured 3.1e-5
    // from it on an H100); against float64 the GPU's pairwise sums hold 1e-5.
    Tensor ref2_64 = Tensor::empty({r2, h2, d2}, DType::f64), ref2_lse_64 = Tensor::empty({h2, r2}, DType::f64);
    ops::attention_merge_partials(ref2_64, ref2_lse_64, to(p2, Device::host, DType::f64), to(l2, Device::host, DType::f64));
    const Tensor ref2 = to(ref2_64, Device::host, DType::f32), ref2_lse = to(ref2_lse_64, Device::host, DType::f32);
    const Tensor gp2 = gpu(p2, DType::f32), gl2 = gpu(l2, DType::f32);
    Tensor o2 = Tensor::empty({r2, h2, d2}, DType::f32, Device::cuda), o2_lse = Tensor::empty({h2, r2}, DType::f32, Device::cuda);
    ops::attention_merge_partials(o2, o2_lse, gp2, gl2);
    expect_close(host(o2), ref2, 1e-5, "merge of 700 parts");
    EXPECT_LE(max_abs_diff(host(o2_lse), ref2_lse), 1e-5);
    Tensor again = Tensor::empty({r2, h2, d2}, DType::f32, Device::cuda);
    ops::attention_merge_partials(again, o2_lse, gp2, gl2);
    const Tensor a = host(o2), b = host(again);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), static_cast<size_t>(a.nbytes())), 0) << "the merge is deterministic";
  }
  {  // The ranks' packed parts: [world][out (B·Hq·dv) | lse (Hq·B)], as model/kv_cache.cpp gathers them.
    const int64_t world = 3, r3 = 1, h3 = 2, d3 = 128, n_out = r3 * h3 * d3, stride = n_out + h3 * r3;  // 258: odd strides
    const Tensor packed = random_tensor({world * stride}, 16, 2.0f);
    const auto views = [&](const Tensor& t) {
      const std::array<int64_t, 4> out_shape{world, r3, h3, d3}, out_strides{stride, h3 * d3, d3, 1};
      const std::array<int64_t, 3> lse_shape{world, h3, r3}, lse_strides{stride, r3, 1};
      return std::pair{TensorView(t.data(), DType::f32, t.device(), out_shape, out_strides),
                       TensorView(static_cast<float*>(t.data()) + n_out, DType::f32, t.device(), lse_shape, lse_strides)};
    };
    Tensor ref3 = Tensor::empty({r3, h3, d3}, DType::f32), ref3_lse = Tensor::empty({h3, r3}, DType::f32);
    const auto [host_out, host_lse] = views(packed);
    ops::attention_merge_partials(ref3, ref3_lse, host_out, host_lse);
    const Tensor gpacked = gpu(packed, DType::f32);
    const auto [dev_out, dev_lse] = views(gpacked);
    Tensor o3 = Tensor::empty({r3, h3, d3}, DType::f32, Device::cuda), o3_lse = Tensor::empty({h3, r3}, DType::f32, Device::cuda);
    ops::attention_merge_partials(o3, o3_lse, dev_out, dev_lse);
    expect_close(host(o3), ref3, 1e-5, "merge of the ranks' packed parts");
    EXPECT_LE(max_abs_diff(host(o3_lse), ref3_lse), 1e-5);
  }

  const int64_t hk = 2, d = 64;
  Tensor kc = Tensor::zeros({3, 6, hk, d}, DType::bf16, Device::cuda), vc = Tensor::zeros({3, 6, hk, d}, DType::bf16, Device::cuda);
  Tensor kc_ref = Tensor::zeros({3, 6, hk, d}, DType::f32), vc_ref = Tensor::zeros({3, 6, hk, d}, DType::f32);
  const Tensor kn = rounded_to_bf16(random_tensor({3, hk, d}, 6));
  const Tensor wide = rounded_to_bf16(random_tensor({3, 3 * hk * d}, 7));
  const TensorView vn = wide.view().narrow(1, hk * d, hk * d).split_dim(1, hk, d);
  const Tensor gwide = gpu(wide);
  const Tensor slots = int32_vector({1, 2, 0}), where = int32_vector({5, -1, 0});
  ops::kv_cache_append(kc_ref, vc_ref, kn, vn, slots, where);
  ops::kv_cache_append(kc, vc, gpu(kn), gwide.view().narrow(1, hk * d, hk * d).split_dim(1, hk, d), gpu(slots, DType::i32),
                       gpu(where, DType::i32));
  expect_close(host(kc), kc_ref, 0.0, "append k");
  expect_close(host(vc), vc_ref, 0.0, "append v (strided rows)");
}

TEST(CudaDecode, DeltaRuleStepMatchesCpu) {
  HYDRA_REQUIRE_GPU();
  for (const int64_t d : {int64_t{64}, int64_t{128}}) {
    const int64_t rows = 2, heads = 3, steps = 24;
    Tensor state_ref = random_tensor({rows + 1, heads, d, d}, 8, 0.05f);
    Tensor state = gpu(state_ref, DType::f32);
    const Tensor slots = int32_vector({2, 0});
    double out_err = 0;
    for (int64_t s = 0; s < steps; ++s) {
      Tensor q = random_tensor({rows, heads, d}, 100 + s), k = random_tensor({rows, heads, d}, 200 + s);
      ops::l2_norm(q, 1e-6f);
      ops::l2_norm(k, 1e-6f);
      q = rounded_to_bf16(q);
      k = rounded_to_bf16(k);
      const Tensor v = rounded_to_bf16(random_tensor({rows, heads, d}, 300 + s));
      const Tensor g = uniform_tensor({rows, heads}, 400 + s, -0.5f, 0.0f), beta = uniform_tensor({rows, heads}, 500 + s, 0.0f, 1.0f);
      Tensor ref = Tensor::empty({rows, heads, d}, DType::f32);
      ops::delta_rule_step(ref, state_ref, slots, q, k, v, g, beta, {});
      Tensor out = Tensor::empty({rows, heads, d}, DType::bf16, Device::cuda);
      ops::delta_rule_step(out, state, gpu(slots, DType::i32), gpu(q), gpu(k), gpu(v), gpu(g, DType::f32),
                           gpu(beta, DType::f32), {});
      out_err = std::max(out_err, max_rel_error(host(out), ref));
      expect_close(host(out), ref, 1e-2, fmt::format("delta step d={} step {}", d, s));
    }
    std::printf("delta rule step d=%ld: output max rel error %.3g over %ld steps\n", static_cast<long>(d), out_err,
                static_cast<long>(steps));
    expect_close(host(state), state_ref, 1e-4, fmt::format("delta step state d={}", d));
  }
}

TEST(CudaDecode, ConvStepMatchesCpu) {
  HYDRA_REQUIRE_GPU();
  for (const int64_t d : {int64_t{64}, int64_t{128}}) {
    const int64_t rows = 3, qk_heads = 4, channels = 6 * d, kernel = 4;
    const ops::GdnQkParams params{.qk_heads = qk_heads, .head_dim = d, .rope_theta = 1e6, .l2_eps = 1e-6f};
    const Tensor w = random_tensor({channels, kernel}, 9, 0.5f);
    Tensor tail_ref = rounded_to_bf16(random_tensor({rows + 1, kernel - 1, channels}, 10));
    Tensor tail = gpu(tail_ref);
    const Tensor slots = int32_vector({3, 1, 0});
    for (int64_t s = 0; s < 5; ++s) {
      const Tensor wide = rounded_to_bf16(random_tensor({rows, channels + 64}, 20 + s));  // x: a strided column block
      const TensorView x = wide.view().narrow(1, 64, channels);
      const Tensor pos = int64_vector({s, 1000003 + s, 524288 + s});
      Tensor ref = Tensor::empty({rows, channels}, DType::f32), ref_inv = Tensor::empty({rows, qk_heads}, DType::f32);
      ops::gdn_qkv_conv_step(ref, ref_inv, x, w, tail_ref, slots, pos, params);
      const Tensor gwide = gpu(wide);
      Tensor out = Tensor::empty({rows, channels}, DType::bf16, Device::cuda);
      Tensor inv = Tensor::empty({rows, qk_heads}, DType::f32, Device::cuda);
      ops::gdn_qkv_conv_step(out, inv, gwide.view().narrow(1, 64, channels), gpu(w, DType::f32), tail,
                             gpu(slots, DType::i32), gpu(pos, DType::i64), params);
      const std::string what = fmt::format("conv step d={} step {}", d, s);
      expect_close(host(out), ref, 1e-2, what);
      expect_close(host(inv), ref_inv, 1e-3, what + " inverse norms");
      expect_close(host(tail), tail_ref, 0.0, what + " tail");
    }
  }
}

// The GDN branch of a decode step in one op, with each GPU kernel choice (three launches, or the
// fused cluster kernel) against the three CPU references, over several steps (the state and the
// conv tail carried), at d = 64 and 128 and batches 1, 2 and 8 through a reversed slot map.
TEST(CudaDecode, GdnDecodeStepMatchesCpuForBothKernels) {
  HYDRA_REQUIRE_GPU();
  for (const ops::GdnDecodeKernel kernel : {ops::GdnDecodeKernel::separate, ops::GdnDecodeKernel::fused}) {
    for (const int64_t d : {int64_t{64}, int64_t{128}}) {
      for (const int64_t rows : {int64_t{1}, int64_t{2}, int64_t{8}}) {
        const int64_t heads = 3, channels = 3 * heads * d, taps = 4, slots_n = rows + 1, steps = 6;
        const std::string name = fmt::format("GDN decode ({}) d={} rows={}", ops::gdn_decode_kernel_name(kernel), d, rows);
        const ops::GdnQkParams qk{.qk_heads = 2 * heads, .head_dim = d, .rope_theta = 1e6, .l2_eps = 1e-6f};
        ops::DeltaRuleParams rule;
        rule.decode_kernel = kernel;
        const Tensor w = random_tensor({channels, taps}, 9, 0.5f);
        const Tensor a_log = random_tensor({heads}, 30, 0.5f), dt_bias = random_tensor({heads}, 31, 0.5f);
        Tensor state_ref = random_tensor({slots_n, heads, d, d}, 8, 0.05f);
        Tensor state = gpu(state_ref, DType::f32);
        Tensor tail_ref = rounded_to_bf16(random_tensor({slots_n, taps - 1, channels}, 10));
        Tensor tail = gpu(tail_ref);
        std::vector<int32_t> slot_of(static_cast<size_t>(rows));
        for (int64_t b = 0; b < rows; ++b) slot_of[static_cast<size_t>(b)] = static_cast<int32_t>(slots_n - 1 - b);
        const Tensor slots = int32_vector(slot_of);
        const Tensor gw = gpu(w, DType::f32), ga_log = gpu(a_log, DType::f32), gdt = gpu(dt_bias, DType::f32);
        for (int64_t s = 0; s < steps; ++s) {
          // One projection row per sequence: x, then the b and a logits, as column blocks.
          const Tensor wide = rounded_to_bf16(random_tensor({rows, 64 + channels + 2 * heads}, 20 + s));
          const TensorView x = wide.view().narrow(1, 64, channels);
          const TensorView b_log = wide.view().narrow(1, 64 + channels, heads);
          const TensorView a_logits = wide.view().narrow(1, 64 + channels + heads, heads);
          std::vector<int64_t> pos_of;
          for (int64_t b = 0; b < rows; ++b) pos_of.push_back(s + 1000 * b);
          const Tensor pos = int64_vector(pos_of);
          const Tensor gwide = gpu(wide);
          Tensor out = Tensor::empty({rows, heads, d}, DType::bf16, Device::cuda);
          Tensor conv = Tensor::empty({rows, channels}, DType::bf16, Device::cuda);
          Tensor inv = Tensor::empty({rows, 2 * heads}, DType::f32, Device::cuda);
          Tensor beta = Tensor::empty({rows, heads}, DType::f32, Device::cuda), g = Tensor::empty({rows, heads}, DType::f32, Device::cuda);
          ops::gdn_decode_step({.out = out, .conv_out = conv, .inv_norm = inv, .beta = beta, .g = g, .state = state,
                                .tail = tail, .slots = gpu(slots, DType::i32), .positions = gpu(pos, DType::i64),
                                .x = gwide.view().narrow(1, 64, channels), .conv_w = gw,
                                .b_logits = gwide.view().narrow(1, 64 + channels, heads),
                                .a_logits = gwide.view().narrow(1, 64 + channels + heads, heads), .a_log = ga_log,
                                .dt_bias = gdt},
                               qk, rule);
          const std::string what = fmt::format("{} step {}", name, s);
          Tensor ref_conv = Tensor::empty({rows, channels}, DType::f32), ref_inv = Tensor::empty({rows, 2 * heads}, DType::f32);
          ops::gdn_qkv_conv_step(ref_conv, ref_inv, x, w, tail_ref, slots, pos, qk);
          expect_close(host(conv), ref_conv, 1e-2, what + " conv out");
          expect_close(host(inv), ref_inv, 1e-3, what + " inverse norms");
          expect_close(host(tail), tail_ref, 0.0, what + " tail");
          Tensor ref_beta = Tensor::empty({rows, heads}, DType::f32), ref_g = Tensor::empty({rows, heads}, DType::f32);
          ops::gdn_gates(ref_beta, ref_g, b_log, a_logits, a_log, dt_bias);
          const Tensor got_beta = host(beta), got_g = host(g), got_conv = host(conv);
          expect_close(got_beta, ref_beta, 1e-5, what + " beta");
          expect_close(got_g, ref_g, 1e-5, what + " g");
          // The step's reference reads what the GPU's step read: its bf16 conv output and fp32 gates.
          const auto heads_at = [&](int64_t first) { return got_conv.view().narrow(1, first * d, heads * d).split_dim(1, heads, d); };
          Tensor ref = Tensor::empty({rows, heads, d}, DType::f32);
          ops::delta_rule_step(ref, state_ref, slots, heads_at(0), heads_at(heads), heads_at(2 * heads), got_g, got_beta, {});
          expect_close(host(out), ref, 1e-2, what + " out");
        }
        expect_close(host(state), state_ref, 1e-4, name + " state");
      }
    }
  }
}

// The cluster kernel (8 parts a row) at the vocabulary's width and at odd ones (a width below the
// part count, parts of unequal length, rows not 16-byte aligned: the scalar path), with the cases
// the engine relies on: ties (within a part, across parts, −0 against +0) go to the lowest index,
// and NaN, +inf or −inf anywhere gives −1.
TEST(CudaDecode, RowArgmaxMatchesCpu) {
  HYDRA_REQUIRE_GPU();
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const int64_t v : {int64_t{151936}, int64_t{1}, int64_t{5}, int64_t{33}, int64_t{1001}, int64_t{40003}}) {
    for (const bool aligned : {true, false}) {
      const int64_t rows = 12;
      Tensor logits = random_tensor({rows, v}, 11 + v);
      float* l = logits.data_as<float>();
      const auto at = [&](int64_t r, int64_t i) -> float& { return l[r * v + std::min(i, v - 1)]; };
      at(1, v / 2) = 50.0f;  // row 1: a tie across parts, the lower index wins
      at(1, v - 1) = 50.0f;
      at(2, 5) = nan;  // rows 2-4: non-finite
      at(3, v - 1) = inf;
      at(4, v / 3) = -inf;
      at(5, v / 2 + 1) = 60.0f;  // row 5: a tie inside one part
      at(5, v / 2 + 2) = 60.0f;
      for (int64_t i = 0; i < v; ++i) at(6, i) = -1.0f - static_cast<float>(i % 7);  // row 6: -0 before +0
      at(6, v - 1) = 0.0f;
      at(6, v / 4) = -0.0f;
      for (int64_t i = 0; i < v; ++i) at(7, i) = 3.0f;  // row 7: all equal
      for (int64_t i = 0; i < v; ++i) at(8, i) = -3.0e38f;  // row 8: the lowest finite values, max at the end
      at(8, v - 1) = -2.0e38f;
      // On the device at column offset 1 of a [rows, v + 1] buffer when not aligned: 4-byte aligned
      // rows, the scalar path.
      Tensor wide = Tensor::zeros({rows, v + 1}, DType::f32);
      for (int64_t r = 0; r < rows; ++r) std::memcpy(wide.data_as<float>() + r * (v + 1) + 1, l + r * v, sizeof(float) * v);
      const Tensor dev = aligned ? gpu(logits, DType::f32) : gpu(wide, DType::f32);
      const TensorView on_device = aligned ? dev.view() : dev.view().narrow(1, 1, v);
      Tensor ref = Tensor::empty({rows}, DType::i32), got = Tensor::empty({rows}, DType::i32, Device::cuda);
      ops::row_argmax(ref, logits);
      ops::row_argmax(got, on_device);
      const Tensor g = to(got, Device::host, DType::i32);
      const std::string what = fmt::format("V {} {}", v, aligned ? "aligned" : "unaligned");
      for (int64_t b = 0; b < rows; ++b) EXPECT_EQ(g.data_as<int32_t>()[b], ref.data_as<int32_t>()[b]) << what << " row " << b;
      EXPECT_EQ(ref.data_as<int32_t>()[1], v / 2) << what;
      for (int64_t b : {2, 3, 4}) EXPECT_EQ(ref.data_as<int32_t>()[b], -1) << what;
      EXPECT_EQ(ref.data_as<int32_t>()[7], 0) << what;
    }
  }
}

}  // namespace
}  // namespace hydra::test
