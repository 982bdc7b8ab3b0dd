// The GPU backward of every small op against its CPU reference (the same op on host fp32 views).
// Inputs are rounded to bf16 wherever the device reads bf16, so the comparison measures the kernel,
// not the input rounding; views are column blocks of wider matrices (row stride ≠ width) where the
// model passes such views. NaN/Inf are checked first (expect_close). Tolerances, max |err| / max |ref|:
//  - fp32 outputs of element-wise and row ops: 1e-4 — identical fp32 inputs; the kernels differ from
//    the reference only in summation order, rsqrtf/expf (a few ulp) and FMA contraction;
//    1e-5 where nothing is summed (the gates' logit gradients, the sigmoid gate's dx);
//  - bf16 outputs: 1e-2 — the output rounding alone is up to 2⁻⁹ of each element;
//  - weight and embedding gradients: 1e-4 — fp32 sums over up to a few thousand rows, in another order;
//  - linear_backward: dx bf16 1e-2, dx/dw fp32 1e-4 (bf16 operands, fp32 accumulation in cuBLAS).
// Weight gradients must also have the same bits in two runs (deterministic reductions, no atomics).
// Without a GPU every test here reports SKIPPED.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/conv/conv.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/fusion/fusion.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/gdn_qk/gdn_qk.h"
#include "kernels/matmul/matmul.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/small_rows.h"
#include "kernels/swiglu/swiglu.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {


// Two results (device or host, bf16 or fp32) hold the same values bit for bit.
void expect_same_bits(const TensorView& a, const TensorView& b, const std::string& what) {
  const Tensor ha = host(a), hb = host(b);
  ASSERT_EQ(ha.numel(), hb.numel()) << what;
  EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.nbytes()), 0) << what << ": two runs differ";
}

struct NormCase {
  int64_t rows, heads, n;  // heads == 0: [rows, n]; else per-head rows [rows, heads, n]
  int64_t offset = 8;      // columns of the wide matrices before the view (8: 16-byte aligned bf16 rows)
};

// Forward and backward of one case on the GPU against the CPU reference, with the current kernel
// choice (the default or, under a SmallRowKernelsScope, the small-row kernels); returns the outputs
// of the accumulating backward and the forward for comparisons between the choices.
struct NormOutputs {
  Tensor y, dx, dw;  // device: forward bf16, dx bf16 accumulated, d_weight fp32
};
NormOutputs check_rms_norm(const NormCase& c) {
  const ops::RmsNormParams eps{1e-6f};
  const std::string what = std::string(ops::small_row_kernels_enabled() ? "small rows: " : "") +
                           "rms_norm_backward rows=" + std::to_string(c.rows) + " heads=" + std::to_string(c.heads) +
                           " n=" + std::to_string(c.n);
  const int64_t width = std::max<int64_t>(c.heads, 1) * c.n;
  const std::vector<int64_t> shape = c.heads > 0 ? std::vector<int64_t>{c.rows, c.heads, c.n}
                                                 : std::vector<int64_t>{c.rows, c.n};
  // x and dy: column blocks of wider matrices, split into heads when per-head.
  const auto rows_of = [&](const TensorView& wide) {
    const TensorView v = wide.narrow(1, c.offset, width);
    return c.heads > 0 ? v.split_dim(1, c.heads, c.n) : v;
  };
  const Tensor xw = rounded_to_bf16(random_tensor({c.rows, width + 8}, 40, 2.0f));
  const Tensor dyw = rounded_to_bf16(random_tensor({c.rows, width + 8}, 41));
  // The forward on the same rows.
  Tensor y_ref = Tensor::empty(shape, DType::f32), gy = Tensor::empty(shape, DType::bf16, Device::cuda);
  ops::rms_norm(y_ref, rows_of(xw), random_tensor({c.n}, 42), eps);
  const Tensor w = random_tensor({c.n}, 42), dw0 = random_tensor({c.n}, 43);
  const Tensor dx0 = rounded_to_bf16(random_tensor(shape, 44));
  const Tensor gxw = gpu(xw), gdyw = gpu(dyw), gw = gpu(w, DType::f32);
  ops::rms_norm(gy, rows_of(gxw), gw, eps);
  expect_close(host(gy), y_ref, 1e-2, what + " forward");

  // bf16 dy and dx, dx accumulated onto what it holds, with the weight gradient.
  Tensor dx_ref = clone(dx0), dw_ref = clone(dw0);
  ops::rms_norm_backward(dx_ref, dw_ref, rows_of(dyw), rows_of(xw), w, eps, ops::Accumulate::yes);
  Tensor gdx = gpu(dx0), gdw = gpu(dw0, DType::f32);
  ops::rms_norm_backward(gdx, gdw, rows_of(gdyw), rows_of(gxw), gw, eps, ops::Accumulate::yes);
  expect_close(host(gdx), dx_ref, 1e-2, what + " dx bf16 accumulated");
  expect_close(host(gdw), dw_ref, 1e-4, what + " d_weight");

  // fp32 dy and dx (the attention path's accumulators), no weight gradient.
  const Tensor dy32 = random_tensor(shape, 45);
  Tensor dxf_ref = Tensor::empty(shape, DType::f32);
  ops::rms_norm_backward(dxf_ref, TensorView(), dy32, rows_of(xw), w, eps);
  Tensor gdxf = Tensor::empty(shape, DType::f32, Device::cuda);
  ops::rms_norm_backward(gdxf, TensorView(), gpu(dy32, DType::f32), rows_of(gxw), gw, eps);
  expect_close(host(gdxf), dxf_ref, 1e-4, what + " dx fp32");

  // dx written over dy; twice, for the same bits.
  const Tensor dyb = rounded_to_bf16(dy32);
  Tensor dxa_ref = Tensor::empty(shape, DType::f32), dwa_ref = clone(dw0);
  ops::rms_norm_backward(dxa_ref, dwa_ref, dyb, rows_of(xw), w, eps);
  Tensor run1 = gpu(dyb), run2 = gpu(dyb), dw1 = gpu(dw0, DType::f32), dw2 = gpu(dw0, DType::f32);
  ops::rms_norm_backward(run1, dw1, run1, rows_of(gxw), gw, eps);
  ops::rms_norm_backward(run2, dw2, run2, rows_of(gxw), gw, eps);
  expect_close(host(run1), dxa_ref, 1e-2, what + " dx over dy");
  expect_close(host(dw1), dwa_ref, 1e-4, what + " d_weight (dx over dy)");
  expect_same_bits(run1, run2, what + " dx");
  expect_same_bits(dw1, dw2, what + " d_weight");
  return {std::move(gy), std::move(gdx), std::move(gdw)};
}

TEST(CudaBackward, RmsNorm) {
  HYDRA_REQUIRE_GPU();
  // Vector path (n = 8·G·V, aligned rows): G = 8 (n = 64), 16 with heads (the FA q/k norms),
  // 64 (two warps per row), 256 (the hidden size, block-wide sums), V = 2 (n = 4096), row counts
  // that do not fill the last block. Scalar path: n = 200, and n = 2048 on rows not 16-byte aligned.
  for (const NormCase c : {NormCase{37, 0, 64}, NormCase{3000, 0, 200}, NormCase{517, 4, 128}, NormCase{1, 3, 32},
                           NormCase{45, 0, 512}, NormCase{301, 0, 2048}, NormCase{70, 0, 4096},
                           NormCase{33, 0, 2048, 3}}) {
    check_rms_norm(c);
  }
}

// The small-row kernels (HYDRA_SMALL_ROWS=1, kernels/small_rows.h) against the CPU reference with
// the bounds above, and against the default kernels: the forward bit for bit (the same sums in the
// same order: the decode GEMV's fused norm is held to those bits), the backward's dx (bf16) within
// 1e-2 and d_weight within 1e-4 (another order of the same fp32 sums). Shapes: qwen3-synth's step
// (16384 rows of 256, its q and k norms' 8 and 4 heads of 64 on 16384 tokens), rows that leave the
// last group, warp or CTA part-empty (1, 33, 37, 517, 1001), every group size G = 1 … 32 (n = 8 …
// 256), one warp holding 2 or 4 runs (n = 512, 1024; 1024's backward is the default kernel's),
// and widths the small path does not take (n = 200; unaligned rows of 2048), which fall back.
TEST(CudaBackward, RmsNormSmallRows) {
  HYDRA_REQUIRE_GPU();
  for (const NormCase c : {NormCase{16384, 0, 256}, NormCase{16384, 8, 64}, NormCase{16384, 4, 64},
                           NormCase{37, 0, 64}, NormCase{1001, 0, 8}, NormCase{33, 0, 16}, NormCase{517, 4, 128},
                           NormCase{1, 3, 32}, NormCase{45, 0, 512}, NormCase{301, 0, 1024}, NormCase{3000, 0, 200},
                           NormCase{33, 0, 2048, 3}}) {
    const NormOutputs plain = check_rms_norm(c);
    const ops::SmallRowKernelsScope small(true);
    const NormOutputs fast = check_rms_norm(c);
    const std::string what = "small rows vs default, rows=" + std::to_string(c.rows) + " heads=" +
                             std::to_string(c.heads) + " n=" + std::to_string(c.n);
    expect_same_bits(fast.y, plain.y, what + " forward");
    expect_close(host(fast.dx), host(plain.dx), 1e-2, what + " dx");
    expect_close(host(fast.dw), host(plain.dw), 1e-4, what + " d_weight");
  }
}

// Three heads of 64 (H·d = 192: the row kernel and the column reduction); 4 × 64 and 16 × 128 (the
// 1.7B preset's 2048: the one-pass vector kernel with per-head statistics). o is a column slice of a
// wider matrix, as in the model's head buffer.
TEST(CudaBackward, HeadFusion) {
  HYDRA_REQUIRE_GPU();
  struct Case {
    int64_t t, h, d;
  };
  for (const Case c : {Case{300, 3, 64}, Case{300, 4, 64}, Case{700, 16, 128}}) {
    const int64_t t = c.t, h = c.h, d = c.d;
    const std::string what = "fusion T=" + std::to_string(t) + " H=" + std::to_string(h) + " d=" + std::to_string(d);
    const ops::HeadFusionParams eps{1e-6f};
    const Tensor ow = rounded_to_bf16(random_tensor({t, (h + 1) * d}, 50, 2.0f));
    const auto heads_of = [&](const TensorView& wide) { return wide.narrow(1, d, h * d).split_dim(1, h, d); };
    // The fusion's tensors without a gate.
    const auto ungated = [](const TensorView& weight, const TensorView& gamma) {
      ops::FusionTensors t;
      t.weight = weight;
      t.gamma = gamma;
      return t;
    };
    const Tensor dy = rounded_to_bf16(random_tensor({t, h, d}, 51));
    const Tensor w = random_tensor({h, d}, 52), gamma = random_tensor({h}, 53);
    const Tensor dw0 = random_tensor({h, d}, 54), dg0 = random_tensor({h}, 55);
    Tensor do_ref = Tensor::empty({t, h, d}, DType::f32), dw_ref = clone(dw0), dg_ref = clone(dg0);
    ops::head_fusion_backward(do_ref, ungated(dw_ref, dg_ref), dy, heads_of(ow), ungated(w, gamma), eps);

    const Tensor gow = gpu(ow), gw = gpu(w, DType::f32), gg = gpu(gamma, DType::f32);
    // fp32 d_o.
    Tensor gdo = Tensor::empty({t, h, d}, DType::f32, Device::cuda), gdw = gpu(dw0, DType::f32),
           gdg = gpu(dg0, DType::f32);
    ops::head_fusion_backward(gdo, ungated(gdw, gdg), gpu(dy), heads_of(gow), ungated(gw, gg), eps);
    expect_close(host(gdo), do_ref, 1e-4, what + " d_o fp32");
    expect_close(host(gdw), dw_ref, 1e-4, what + " d_weight");
    expect_close(host(gdg), dg_ref, 1e-4, what + " d_gamma");
    // bf16 d_o written over d_y: the parameter gradients read d_y first, so they have the same bits.
    Tensor gdy = gpu(dy), gdw2 = gpu(dw0, DType::f32), gdg2 = gpu(dg0, DType::f32);
    ops::head_fusion_backward(gdy, ungated(gdw2, gdg2), gdy, heads_of(gow), ungated(gw, gg), eps);
    expect_close(host(gdy), do_ref, 1e-2, what + " d_o over d_y");
    expect_same_bits(gdw, gdw2, what + " d_weight");
    expect_same_bits(gdg, gdg2, what + " d_gamma");
    // Without parameter gradients (a frozen fusion): d_o alone.
    Tensor gdo3 = Tensor::empty({t, h, d}, DType::f32, Device::cuda);
    ops::head_fusion_backward(gdo3, {}, gpu(dy), heads_of(gow), ungated(gw, gg), eps);
    expect_same_bits(gdo, gdo3, what + " d_o without parameter gradients");
  }
}

// Every fusion variant's forward and backward against the CPU path on the same bf16-rounded inputs:
// o a column slice of a wider matrix (as the model's head buffer), the gate's logits a column slice
// of a wider bf16 matrix (the projection). Tolerances: the forward 1e-2 (bf16 output); d_o in fp32
// and the fp32 parameter gradients 1e-4 (fp32 sums against the CPU's fp64); the gate's logit
// gradient 1e-2 (stored in bf16, as in the projection's gradient); d_o over d_y (bf16) 1e-2, and
// the parameter gradients then have the same bits (read before d_o is written). Three heads of 64,
// and 16 × 128 (the 1.7B preset's heads).
TEST(CudaFusion, VariantsMatchCpu) {
  HYDRA_REQUIRE_GPU();
  for (const ops::Fusion fusion : ops::kFusions) {
    struct Case {
      int64_t t, h, d;
    };
    for (const Case c : {Case{300, 3, 64}, Case{700, 16, 128}}) {
      const int64_t t = c.t, h = c.h, d = c.d;
      const std::string what = fmt::format("fusion {} T={} H={} d={}", ops::fusion_name(fusion), t, h, d);
      const ops::HeadFusionParams params{1e-6f, fusion};
      const Tensor ow = rounded_to_bf16(random_tensor({t, (h + 1) * d}, 60, 2.0f));
      const auto heads_of = [&](const TensorView& wide) { return wide.narrow(1, d, h * d).split_dim(1, h, d); };
      const Tensor sw = rounded_to_bf16(random_tensor({t, h + 5}, 61, 2.0f));
      const auto gate_of = [&](const TensorView& wide) { return wide.narrow(1, 3, h); };
      const Tensor dy = rounded_to_bf16(random_tensor({t, h, d}, 62));
      const Tensor w = random_tensor({h, d}, 63), gamma = random_tensor({h}, 64), bias = random_tensor({h}, 65);
      const auto tensors = [&](const TensorView& ww, const TensorView& gg, const TensorView& s, const TensorView& b) {
        ops::FusionTensors p;
        if (ops::fusion_has_norm(fusion)) p.weight = ww;
        if (ops::fusion_has_gamma(fusion)) p.gamma = gg;
        if (ops::fusion_has_gate(fusion)) p.gate = s, p.gate_bias = b;
        return p;
      };
      const ops::FusionTensors cpu_p = tensors(w, gamma, gate_of(sw), bias);
      const Tensor gow = gpu(ow), gsw = gpu(sw), gw = gpu(w, DType::f32), gg = gpu(gamma, DType::f32),
                   gb = gpu(bias, DType::f32);
      const ops::FusionTensors gpu_p = tensors(gw, gg, gate_of(gsw), gb);
      // Forward.
      Tensor y_ref = Tensor::empty({t, h, d}, DType::f32), gy = Tensor::empty({t, h, d}, DType::bf16, Device::cuda);
      ops::head_fusion(y_ref, heads_of(ow), cpu_p, params);
      ops::head_fusion(gy, heads_of(gow), gpu_p, params);
      expect_close(host(gy), y_ref, 1e-2, what + " forward");
      // Backward: fp32 d_o, every gradient the variant has, starting from non-zero accumulators.
      const Tensor dw0 = random_tensor({h, d}, 66), dg0 = random_tensor({h}, 67), db0 = random_tensor({h}, 68);
      Tensor do_ref = Tensor::empty({t, h, d}, DType::f32), dw_ref = clone(dw0), dg_ref = clone(dg0), db_ref = clone(db0);
      Tensor ds_ref = Tensor::zeros({t, h + 5}, DType::f32);
      ops::head_fusion_backward(do_ref, tensors(dw_ref, dg_ref, gate_of(ds_ref), db_ref), dy, heads_of(ow), cpu_p, params);
      Tensor gdo = Tensor::empty({t, h, d}, DType::f32, Device::cuda), gdw = gpu(dw0, DType::f32),
             gdg = gpu(dg0, DType::f32), gdb = gpu(db0, DType::f32);
      Tensor gds = Tensor::zeros({t, h + 5}, DType::bf16, Device::cuda);
      ops::head_fusion_backward(gdo, tensors(gdw, gdg, gate_of(gds), gdb), gpu(dy), heads_of(gow), gpu_p, params);
      expect_close(host(gdo), do_ref, 1e-4, what + " d_o fp32");
      if (ops::fusion_has_norm(fusion)) expect_close(host(gdw), dw_ref, 1e-4, what + " d_weight");
      if (ops::fusion_has_gamma(fusion)) expect_close(host(gdg), dg_ref, 1e-4, what + " d_gamma");
      if (ops::fusion_has_gate(fusion)) {
        expect_close(host(gds), ds_ref, 1e-2, what + " d_gate (the logits' columns; the others stay 0)");
        expect_close(host(gdb), db_ref, 1e-4, what + " d_gate_bias");
      }
      // bf16 d_o written over d_y.
      Tensor gdy = gpu(dy), gdw2 = gpu(dw0, DType::f32), gdg2 = gpu(dg0, DType::f32), gdb2 = gpu(db0, DType::f32);
      Tensor gds2 = Tensor::zeros({t, h + 5}, DType::bf16, Device::cuda);
      ops::head_fusion_backward(gdy, tensors(gdw2, gdg2, gate_of(gds2), gdb2), gdy, heads_of(gow), gpu_p, params);
      expect_close(host(gdy), do_ref, 1e-2, what + " d_o over d_y");
      if (ops::fusion_has_norm(fusion)) expect_same_bits(gdw, gdw2, what + " d_weight");
      if (ops::fusion_has_gamma(fusion)) expect_same_bits(gdg, gdg2, what + " d_gamma");
      if (ops::fusion_has_gate(fusion)) expect_same_bits(gdb, gdb2, what + " d_gate_bias");
    }
  }
}

// The fused GDN input pass (conv + SiLU, then RoPE and the L2 norm of the q/k heads) and its q/k
// backward, against the CPU path (which runs the three unfused ops in turn). A half-warp per head
// with E = d/32 elements per lane per half: 1 (d = 16, half the lanes idle), 2, 4 (the model's
// d = 128) and 8; tiles of 4 to 16 rows with T not a multiple of them; more heads than one block
// holds (21: blocks of 12, the last with idle lanes); positions past 1M.
struct QkCase {
  int64_t t, d, gdn_heads;
  bool prefix;
};

Tensor spread_positions(int64_t t) {
  Tensor pos = Tensor::empty({t}, DType::i64);
  for (int64_t i = 0; i < t; ++i) pos.data_as<int64_t>()[i] = 1000003 * (i % 3) + i;
  return pos;
}

TEST(CudaBackward, GdnQkvConv) {
  HYDRA_REQUIRE_GPU();
  for (const QkCase q : {QkCase{45, 128, 2, true}, QkCase{1, 128, 1, false}, QkCase{130, 16, 3, true},
                         QkCase{1000, 128, 2, false}, QkCase{77, 64, 3, true}, QkCase{50, 128, 7, true},
                         QkCase{21, 256, 1, true}}) {
    const std::string what = "gdn_qkv_conv T=" + std::to_string(q.t) + " d=" + std::to_string(q.d);
    const int64_t c = 3 * q.gdn_heads * q.d, k = 4;
    const ops::GdnQkParams params{.qk_heads = 2 * q.gdn_heads, .head_dim = q.d, .rope_theta = 1e6, .l2_eps = 1e-6f};
    const Tensor xw = rounded_to_bf16(random_tensor({q.t, c + 8}, 60));
    const auto x_of = [&](const TensorView& v) { return v.narrow(1, 8, c); };
    const Tensor w = random_tensor({c, k}, 61);
    const Tensor prefix = q.prefix ? rounded_to_bf16(random_tensor({k - 1, c}, 62)) : Tensor();
    const Tensor pos = spread_positions(q.t);
    Tensor ref = Tensor::empty({q.t, c}, DType::f32), ref_r = Tensor::empty({q.t, 2 * q.gdn_heads}, DType::f32);
    ops::gdn_qkv_conv(ref, ref_r, x_of(xw), w, prefix, pos, params);
    const Tensor gxw = gpu(xw);
    Tensor out = Tensor::empty({q.t, c}, DType::bf16, Device::cuda);
    Tensor r = Tensor::empty({q.t, 2 * q.gdn_heads}, DType::f32, Device::cuda);
    ops::gdn_qkv_conv(out, r, x_of(gxw), gpu(w, DType::f32), q.prefix ? gpu(prefix) : Tensor(),
                      to_device(pos, Device::cuda), params);
    expect_close(host(out), ref, 1e-2, what + " out");
    expect_close(host(r), ref_r, 1e-4, what + " inv_norm");
  }
}

TEST(CudaBackward, GdnQkBackward) {
  HYDRA_REQUIRE_GPU();
  for (const QkCase q : {QkCase{70, 128, 3, false}, QkCase{5, 128, 1, false}, QkCase{33, 16, 2, false},
                         QkCase{40, 64, 9, false}, QkCase{19, 128, 17, false}, QkCase{9, 256, 2, false}}) {
    const std::string what = "gdn_qk_backward T=" + std::to_string(q.t) + " d=" + std::to_string(q.d);
    const int64_t h = q.gdn_heads, c = 3 * h * q.d;
    const ops::GdnQkParams params{.qk_heads = 2 * h, .head_dim = q.d, .rope_theta = 1e6, .l2_eps = 1e-6f};
    // y and its inverse norms from the forward (the k heads of a conv output: a strided head view).
    Tensor conv = Tensor::empty({q.t, c}, DType::f32), r = Tensor::empty({q.t, 2 * h}, DType::f32);
    const Tensor pos = spread_positions(q.t);
    ops::gdn_qkv_conv(conv, r, rounded_to_bf16(random_tensor({q.t, c}, 63)), random_tensor({c, 4}, 64), Tensor(), pos,
                      params);
    conv = rounded_to_bf16(conv);
    const auto k_heads = [&](const TensorView& m) { return m.narrow(1, h * q.d, h * q.d).split_dim(1, h, q.d); };
    const TensorView y = k_heads(conv), rk = r.view().narrow(1, h, h);
    const Tensor dy = rounded_to_bf16(random_tensor({q.t, h, q.d}, 65));
    Tensor ref_wide = Tensor::zeros({q.t, c}, DType::f32);
    ops::gdn_qk_backward(k_heads(ref_wide), dy, y, rk, pos, params);
    const Tensor gconv = gpu(conv), gr = gpu(r, DType::f32), gpos = to_device(pos, Device::cuda);
    Tensor dx_wide = Tensor::zeros({q.t, c}, DType::bf16, Device::cuda);
    ops::gdn_qk_backward(k_heads(dx_wide), gpu(dy), k_heads(gconv), gr.view().narrow(1, h, h), gpos, params);
    expect_close(host(dx_wide), ref_wide, 1e-2, what + " into a head view");
    Tensor in_place = gpu(dy);  // dx written over dy
    ops::gdn_qk_backward(in_place, in_place, k_heads(gconv), gr.view().narrow(1, h, h), gpos, params);
    expect_close(host(in_place), host(k_heads(dx_wide)), 0.0, what + " in place");
  }
}

TEST(CudaBackward, RopeInverse) {
  HYDRA_REQUIRE_GPU();
  const int64_t t = 37, h = 3, d = 64;
  Tensor pos = Tensor::empty({t}, DType::i64);
  for (int64_t i = 0; i < t; ++i) pos.data_as<int64_t>()[i] = 1000003 * (i % 3) + i;
  const Tensor gpos = to_device(pos, Device::cuda);
  const ops::RopeParams forward{.theta = 1e6}, inverse{.theta = 1e6, .direction = ops::RopeDirection::inverse};
  const Tensor x = random_tensor({t, h, d}, 62);
  // fp32 (the attention backward's dq/dk): the angle is reduced mod 2π in fp64 and then rounded to
  // fp32 (≤ 4e-7 rad) before sincosf, hence 1e-5.
  Tensor ref = clone(x), g = gpu(x, DType::f32);
  ops::rope(ref, pos, inverse);
  ops::rope(g, gpos, inverse);
  expect_close(host(g), ref, 1e-5, "rope inverse fp32");
  ops::rope(g, gpos, forward);
  expect_close(host(g), x, 1e-5, "rope forward ∘ inverse = identity");
  // bf16.
  const Tensor xb = rounded_to_bf16(x);
  Tensor refb = clone(xb), gb = gpu(xb);
  ops::rope(refb, pos, inverse);
  ops::rope(gb, gpos, inverse);
  expect_close(host(gb), refb, 1e-2, "rope inverse bf16");
}

TEST(CudaBackward, SwigluAndSigmoidGate) {
  HYDRA_REQUIRE_GPU();
  const int64_t t = 37, n = 200;
  const Tensor gu = rounded_to_bf16(random_tensor({t, 2 * n}, 63, 2.0f)),
               dy = rounded_to_bf16(random_tensor({t, n}, 64));
  const auto gate_of = [&](const TensorView& v) { return v.narrow(1, 0, n); };
  const auto up_of = [&](const TensorView& v) { return v.narrow(1, n, n); };
  Tensor ref = Tensor::empty({t, 2 * n}, DType::f32);
  ops::swiglu_backward(gate_of(ref), up_of(ref), dy, gate_of(gu), up_of(gu));
  // bf16 gradients into column blocks of one fused buffer.
  const Tensor ggu = gpu(gu);
  Tensor gd = Tensor::empty({t, 2 * n}, DType::bf16, Device::cuda);
  ops::swiglu_backward(gate_of(gd), up_of(gd), gpu(dy), gate_of(ggu), up_of(ggu));
  const Tensor hd = host(gd);
  expect_close(gate_of(hd), gate_of(ref), 1e-2, "swiglu d_gate bf16");
  expect_close(up_of(hd), up_of(ref), 1e-2, "swiglu d_up bf16");
  // fp32 d_out, gradients written over gate and up.
  Tensor over = gpu(gu);
  ops::swiglu_backward(gate_of(over), up_of(over), gpu(dy, DType::f32), gate_of(over), up_of(over));
  const Tensor ho = host(over);
  expect_close(gate_of(ho), gate_of(ref), 1e-2, "swiglu d_gate over gate");
  expect_close(up_of(ho), up_of(ref), 1e-2, "swiglu d_up over up");
  // The forward on rows of eight (16-byte aligned column blocks) and on a width that is not (7 ∤ 8).
  for (const int64_t width : {n, int64_t{7}}) {
    Tensor sref = Tensor::empty({t, width}, DType::f32);
    ops::swiglu(sref, gu.view().narrow(1, 0, width), gu.view().narrow(1, n, width));
    Tensor sg = Tensor::empty({t, width}, DType::bf16, Device::cuda);
    ops::swiglu(sg, ggu.view().narrow(1, 0, width), ggu.view().narrow(1, n, width));
    expect_close(host(sg), sref, 1e-2, "swiglu width " + std::to_string(width));
  }

  // Sigmoid gate: x the fp32 attention accumulator, gate logits a column block, fp32 dx, bf16 d_gate.
  const Tensor acc = random_tensor({t, n}, 65), glog = rounded_to_bf16(random_tensor({t, n + 5}, 66, 3.0f));
  Tensor dx_ref = Tensor::empty({t, n}, DType::f32), dg_ref = Tensor::empty({t, n}, DType::f32);
  ops::sigmoid_gate_backward(dx_ref, dg_ref, dy, acc, glog.view().narrow(1, 5, n));
  const Tensor gglog = gpu(glog);
  Tensor gdx = Tensor::empty({t, n}, DType::f32, Device::cuda), gdg = Tensor::empty({t, n}, DType::bf16, Device::cuda);
  ops::sigmoid_gate_backward(gdx, gdg, gpu(dy), gpu(acc, DType::f32), gglog.view().narrow(1, 5, n));
  expect_close(host(gdx), dx_ref, 1e-5, "sigmoid gate dx fp32");
  expect_close(host(gdg), dg_ref, 1e-2, "sigmoid gate d_gate bf16");
}

TEST(CudaBackward, GdnGates) {
  HYDRA_REQUIRE_GPU();
  const int64_t h = 3, width = 2 * h + 3;
  for (const int64_t t : {int64_t{37}, int64_t{5000}}) {
    const std::string what = "gdn_gates_backward T=" + std::to_string(t);
    // a and b logits: column blocks of the fused projection's output, as in the model.
    const Tensor ab = rounded_to_bf16(random_tensor({t, width}, 70, 3.0f));
    const auto a_of = [&](const TensorView& v) { return v.narrow(1, 0, h); };
    const auto b_of = [&](const TensorView& v) { return v.narrow(1, h, h); };
    const Tensor alog = uniform_tensor({h}, 71, 0.0f, 2.7f), dtb = random_tensor({h}, 72);
    const Tensor dbeta = random_tensor({t, h}, 73), dg = random_tensor({t, h}, 74);
    const Tensor dalog0 = random_tensor({h}, 75), ddtb0 = random_tensor({h}, 76);
    Tensor ref = Tensor::zeros({t, width}, DType::f32), dalog_ref = clone(dalog0), ddtb_ref = clone(ddtb0);
    ops::gdn_gates_backward(b_of(ref), a_of(ref), dalog_ref, ddtb_ref, dbeta, dg, b_of(ab), a_of(ab), alog, dtb);

    const Tensor gab = gpu(ab), galog = gpu(alog, DType::f32), gdtb = gpu(dtb, DType::f32);
    const Tensor gdbeta = gpu(dbeta, DType::f32), gdg = gpu(dg, DType::f32);
    // bf16 logit gradients into column blocks of the fused projection's gradient, with the sums.
    Tensor gd = Tensor::zeros({t, width}, DType::bf16, Device::cuda);
    Tensor gdalog = gpu(dalog0, DType::f32), gddtb = gpu(ddtb0, DType::f32);
    ops::gdn_gates_backward(b_of(gd), a_of(gd), gdalog, gddtb, gdbeta, gdg, b_of(gab), a_of(gab), galog, gdtb);
    expect_close(host(gd), ref, 1e-2, what + " logit gradients bf16");
    expect_close(host(gdalog), dalog_ref, 1e-4, what + " d_A_log");
    expect_close(host(gddtb), ddtb_ref, 1e-4, what + " d_dt_bias");
    // fp32 logit gradients; the parameter sums again, for the same bits.
    Tensor gdb32 = Tensor::empty({t, h}, DType::f32, Device::cuda),
           gda32 = Tensor::empty({t, h}, DType::f32, Device::cuda);
    Tensor gdalog2 = gpu(dalog0, DType::f32), gddtb2 = gpu(ddtb0, DType::f32);
    ops::gdn_gates_backward(gdb32, gda32, gdalog2, gddtb2, gdbeta, gdg, b_of(gab), a_of(gab), galog, gdtb);
    expect_close(host(gdb32), b_of(ref), 1e-5, what + " d_b_logits fp32");
    expect_close(host(gda32), a_of(ref), 1e-5, what + " d_a_logits fp32");
    expect_same_bits(gdalog, gdalog2, what + " d_A_log");
    expect_same_bits(gddtb, gddtb2, what + " d_dt_bias");
  }
}

struct ConvCase {
  int64_t t;
  bool prefix;
};

TEST(CudaBackward, CausalConvSilu) {
  HYDRA_REQUIRE_GPU();
  const int64_t c = 96, k = 4;
  // T < K−1, one split, several splits (64-row splits from T = 65 on; more than the scalar path's
  // 128 at T = 20000), with and without a halo.
  for (const ConvCase cc : {ConvCase{45, true}, ConvCase{2, true}, ConvCase{1, false}, ConvCase{130, true},
                            ConvCase{1000, false}, ConvCase{20000, true}}) {
    const std::string what = "conv backward T=" + std::to_string(cc.t) + (cc.prefix ? " with halo" : "");
    const Tensor xw = rounded_to_bf16(random_tensor({cc.t, c + 8}, 80));
    const auto x_of = [&](const TensorView& v) { return v.narrow(1, 8, c); };
    const Tensor w = random_tensor({c, k}, 81), dw0 = random_tensor({c, k}, 82);
    const Tensor prefix = cc.prefix ? rounded_to_bf16(random_tensor({k - 1, c}, 83)) : Tensor();
    const Tensor dy = rounded_to_bf16(random_tensor({cc.t, c}, 84));
    Tensor dx_ref = Tensor::empty({cc.t, c}, DType::f32), dw_ref = clone(dw0);
    Tensor dp_ref = cc.prefix ? Tensor::empty({k - 1, c}, DType::f32) : Tensor();
    ops::causal_conv_silu_backward(dx_ref, dw_ref, dp_ref, dy, x_of(xw), w, prefix);

    const Tensor gxw = gpu(xw), gw = gpu(w, DType::f32);
    const Tensor gprefix = cc.prefix ? gpu(prefix) : Tensor();
    Tensor gdx = Tensor::empty({cc.t, c}, DType::f32, Device::cuda), gdw = gpu(dw0, DType::f32);
    Tensor gdp = cc.prefix ? Tensor::empty({k - 1, c}, DType::f32, Device::cuda) : Tensor();
    ops::causal_conv_silu_backward(gdx, gdw, gdp, gpu(dy), x_of(gxw), gw, gprefix);
    expect_close(host(gdx), dx_ref, 1e-4, what + " dx fp32");
    expect_close(host(gdw), dw_ref, 1e-4, what + " dw");
    if (cc.prefix) expect_close(host(gdp), dp_ref, 1e-4, what + " d_prefix");
    // bf16 dx from an fp32 d_out holding the same values: the same dw bits.
    Tensor gdxb = Tensor::empty({cc.t, c}, DType::bf16, Device::cuda), gdw2 = gpu(dw0, DType::f32);
    Tensor gdpb = cc.prefix ? Tensor::empty({k - 1, c}, DType::bf16, Device::cuda) : Tensor();
    ops::causal_conv_silu_backward(gdxb, gdw2, gdpb, gpu(dy, DType::f32), x_of(gxw), gw, gprefix);
    expect_close(host(gdxb), dx_ref, 1e-2, what + " dx bf16");
    if (cc.prefix) expect_close(host(gdpb), dp_ref, 1e-2, what + " d_prefix bf16");
    expect_same_bits(gdw, gdw2, what + " dw");
    // bf16 dx, d_out and x with 16-byte aligned rows (the model's case): the vector path, twice
    // for the same bits.
    Tensor vdx = Tensor::empty({cc.t, c}, DType::bf16, Device::cuda), vdx2 = Tensor::empty({cc.t, c}, DType::bf16, Device::cuda);
    Tensor vdw = gpu(dw0, DType::f32), vdw2 = gpu(dw0, DType::f32);
    Tensor vdp = cc.prefix ? Tensor::empty({k - 1, c}, DType::f32, Device::cuda) : Tensor();
    const Tensor gdy = gpu(dy);
    ops::causal_conv_silu_backward(vdx, vdw, vdp, gdy, x_of(gxw), gw, gprefix);
    ops::causal_conv_silu_backward(vdx2, vdw2, Tensor(), gdy, x_of(gxw), gw, gprefix);
    expect_close(host(vdx), dx_ref, 1e-2, what + " dx bf16 (vector path)");
    expect_close(host(vdw), dw_ref, 1e-4, what + " dw (vector path)");
    if (cc.prefix) expect_close(host(vdp), dp_ref, 1e-4, what + " d_prefix (vector path)");
    expect_same_bits(vdx, vdx2, what + " dx (vector path)");
    expect_same_bits(vdw, vdw2, what + " dw (vector path)");
  }
}

TEST(CudaBackward, Embedding) {
  HYDRA_REQUIRE_GPU();
  const int64_t vocab = 50, dim = 70, t = 300;
  Tensor ids = Tensor::empty({t}, DType::i32);
  for (int64_t i = 0; i < t; ++i) ids.data_as<int32_t>()[i] = static_cast<int32_t>(i % 3 == 0 ? 7 : (i * 13) % vocab);
  const Tensor gids = to_device(ids, Device::cuda), table0 = random_tensor({vocab, dim}, 90);
  // bf16 d_out.
  const Tensor dy = rounded_to_bf16(random_tensor({t, dim}, 91));
  Tensor ref = clone(table0), g = gpu(table0, DType::f32);
  ops::embedding_backward(ref, dy, ids);
  ops::embedding_backward(g, gpu(dy), gids);
  expect_close(host(g), ref, 1e-4, "embedding_backward bf16 d_out");
  // fp32 d_out, a column block of a wider matrix; twice, for the same bits.
  const Tensor dyw = random_tensor({t, dim + 6}, 92);
  Tensor ref2 = clone(table0), g1 = gpu(table0, DType::f32), g2 = gpu(table0, DType::f32);
  ops::embedding_backward(ref2, dyw.view().narrow(1, 3, dim), ids);
  const Tensor gdyw = gpu(dyw, DType::f32);
  ops::embedding_backward(g1, gdyw.view().narrow(1, 3, dim), gids);
  ops::embedding_backward(g2, gdyw.view().narrow(1, 3, dim), gids);
  expect_close(host(g1), ref2, 1e-4, "embedding_backward fp32 d_out");
  expect_same_bits(g1, g2, "embedding_backward");
}

// The embedding backward's chunked runs (kernels/embedding/embedding.cu) over the id patterns that
// stress them: a skewed small vocabulary (qwen3-synth's shape: runs thousands of positions long,
// crossing many chunks), one id for every token (one run over all chunks), runs of exactly a chunk
// or ending on a chunk's end, a large vocabulary at a length whose chunks are 64 positions, and ids
// outside [0, V) (skipped). The 4-column vector path (fp32 and bf16 d_out) and the scalar one (odd
// D); twice each for the same bits.
enum class IdPattern { skewed, one_id, blocks_of_32, blocks_of_40, random, out_of_range };
struct EmbeddingCase {
  int64_t vocab, dim, t;
  IdPattern ids;
  DType d_out;
};

std::vector<int32_t> embedding_ids(const EmbeddingCase& c) {
  std::vector<int32_t> ids(c.t);
  const Tensor u = uniform_tensor({c.t}, 95, 0.0f, 1.0f);
  for (int64_t i = 0; i < c.t; ++i) {
    const float x = u.data_as<float>()[i];
    switch (c.ids) {
      case IdPattern::skewed: ids[i] = static_cast<int32_t>(c.vocab * x * x * x * x); break;  // id 0 ~ 1/4 ^ 4 of tokens
      case IdPattern::one_id: ids[i] = static_cast<int32_t>(c.vocab / 2); break;
      case IdPattern::blocks_of_32: ids[i] = static_cast<int32_t>((i / 32) % c.vocab); break;
      case IdPattern::blocks_of_40: ids[i] = static_cast<int32_t>((i / 40) % c.vocab); break;
      case IdPattern::random: ids[i] = static_cast<int32_t>(c.vocab * x); break;
      case IdPattern::out_of_range: ids[i] = i % 5 == 0 ? (i % 2 ? -1 : static_cast<int32_t>(c.vocab)) : static_cast<int32_t>(c.vocab * x * x); break;
    }
    // vocab · x may round up to vocab in fp32.
    if (c.ids != IdPattern::out_of_range) ids[i] = std::min(ids[i], static_cast<int32_t>(c.vocab - 1));
  }
  return ids;
}

TEST(CudaBackward, EmbeddingChunkedRuns) {
  HYDRA_REQUIRE_GPU();
  const EmbeddingCase cases[] = {
      {512, 256, 16384, IdPattern::skewed, DType::f32},     {512, 256, 16384, IdPattern::skewed, DType::bf16},
      {7, 64, 5000, IdPattern::one_id, DType::f32},         {9, 20, 2048, IdPattern::blocks_of_32, DType::f32},
      {11, 12, 3000, IdPattern::blocks_of_40, DType::bf16}, {151936, 8, 140000, IdPattern::random, DType::bf16},
      {300, 36, 140000, IdPattern::skewed, DType::f32},     {40, 33, 777, IdPattern::skewed, DType::f32},
      {64, 16, 1000, IdPattern::out_of_range, DType::f32},
  };
  for (const EmbeddingCase& c : cases) {
    const std::string what = fmt::format("embedding_backward V={} D={} T={} pattern {} d_out {}", c.vocab, c.dim, c.t,
                                         static_cast<int>(c.ids), dtype_name(c.d_out));
    const std::vector<int32_t> id_values = embedding_ids(c);
    Tensor ids = Tensor::empty({c.t}, DType::i32);
    std::copy(id_values.begin(), id_values.end(), ids.data_as<int32_t>());
    const Tensor table0 = random_tensor({c.vocab, c.dim}, 96);
    Tensor dy = random_tensor({c.t, c.dim}, 97);
    if (c.d_out == DType::bf16) dy = rounded_to_bf16(dy);
    // The reference skips ids outside [0, V) as the kernel does (callers validate user ids).
    Tensor valid_ids = clone(ids), dy_valid = clone(dy);
    for (int64_t i = 0; i < c.t; ++i) {
      int32_t& id = valid_ids.data_as<int32_t>()[i];
      if (id < 0 || id >= c.vocab) {
        id = 0;
        std::fill_n(dy_valid.data_as<float>() + i * c.dim, c.dim, 0.0f);
      }
    }
    Tensor ref = clone(table0);
    ops::embedding_backward(ref, dy_valid, valid_ids);
    const Tensor gids = to_device(ids, Device::cuda), gdy = gpu(dy, c.d_out);
    Tensor g1 = gpu(table0, DType::f32), g2 = gpu(table0, DType::f32);
    ops::embedding_backward(g1, gdy, gids);
    ops::embedding_backward(g2, gdy, gids);
    expect_close(host(g1), ref, 1e-4, what);
    expect_same_bits(g1, g2, what);
  }
}

struct LinearCase {
  int64_t m, n, k;
};

TEST(CudaBackward, LinearBackward) {
  HYDRA_REQUIRE_GPU();
  for (const LinearCase c : {LinearCase{1, 8, 16}, LinearCase{37, 200, 72}, LinearCase{513, 264, 1024}}) {
    const std::string what = "linear_backward M=" + std::to_string(c.m) + " N=" + std::to_string(c.n) + " K=" +
                             std::to_string(c.k);
    // x and dy are column blocks of wider matrices.
    const Tensor xw = rounded_to_bf16(random_tensor({c.m, c.k + 16}, 93));
    const Tensor dyw = rounded_to_bf16(random_tensor({c.m, c.n + 8}, 94));
    const Tensor w = rounded_to_bf16(random_tensor({c.n, c.k}, 95));
    const auto x_of = [&](const TensorView& v) { return v.narrow(1, 16, c.k); };
    const auto dy_of = [&](const TensorView& v) { return v.narrow(1, 8, c.n); };
    const Tensor dx0 = rounded_to_bf16(random_tensor({c.m, c.k}, 96)), dw0 = random_tensor({c.n, c.k}, 97);
    Tensor dx_ref = clone(dx0), dw_ref = clone(dw0);
    ops::linear_backward(dx_ref, dw_ref, dy_of(dyw), x_of(xw), w, ops::Accumulate::yes);
    const Tensor gxw = gpu(xw), gdyw = gpu(dyw), gw = gpu(w);
    Tensor gdx = gpu(dx0), gdw = gpu(dw0, DType::f32);
    ops::linear_backward(gdx, gdw, dy_of(gdyw), x_of(gxw), gw, ops::Accumulate::yes);
    expect_close(host(gdx), dx_ref, 1e-2, what + " dx bf16 accumulated");
    expect_close(host(gdw), dw_ref, 1e-4, what + " dw fp32 accumulated");
    // fp32 dx overwritten, no dw.
    Tensor dxf_ref = Tensor::empty({c.m, c.k}, DType::f32), gdxf = Tensor::empty({c.m, c.k}, DType::f32, Device::cuda);
    ops::linear_backward(dxf_ref, TensorView(), dy_of(dyw), x_of(xw), w);
    ops::linear_backward(gdxf, TensorView(), dy_of(gdyw), x_of(gxw), gw);
    expect_close(host(gdxf), dxf_ref, 1e-4, what + " dx fp32");
  }
}

}  // namespace
}  // namespace hydra::test
