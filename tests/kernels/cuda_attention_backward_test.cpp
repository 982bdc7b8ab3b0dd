// GPU flash attention backward (kernels/attention/attention_backward.cu) against the fp32 CPU
// reference (the same ops on host tensors), inputs rounded to bf16 before the reference sees them.
// Every ring block kind is covered through positions: causal diagonal blocks, full blocks (all keys
// before all queries), partial blocks (zigzag halves), empty blocks (all keys after all queries:
// the accumulators must not move), non-causal, offsets near 1M, GQA with the default and a custom
// head map, τ on and off, d = 64 and 128, T not a multiple of 64 and T < 64.
//
// Tolerances (NaN/Inf checked first): RMS of the error / RMS of the reference ≤ 1e-2 and max |err| /
// max |ref| ≤ 4e-2 for dq, dk, dv. The kernel rounds P and dS to bf16 for its tensor-core products
// (as FlashAttention does), a relative error of 2⁻⁹ per entry; flash-linear-attention holds its
// kernels to an RMS ratio of 8e-3, and FlashAttention-3 to twice a bf16 reference's error.
// delta = rowsum(dO ⊙ O) is fp32 from bf16 dO: 1e-5 relative. Without a GPU: SKIPPED.
// d = 128 runs both kernels: the warp-specialised TMA one (the default on Hopper,
// AttentionBackwardKernel::ws) and the mma.sync one (AttentionBackwardKernel::mma), each in
// its own test so a failure names its kernel; d = 64 runs the mma.sync kernel with 128-key blocks
// (mma) and with 64-key blocks (mma-k64, the default with packed documents), the latter on the
// small-model step's shape too (64 documents of 256 tokens, 8 query heads on 4 KV heads). Each case is announced before it runs (stdout is
// line-buffered in the tests), so a crash names its case too.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/attention/attention.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {


// `actual` may live on the device: it is copied to the host before anything reads it.
void expect_gradient(const TensorView& actual, const TensorView& expected, const std::string& what) {
  const Tensor got = host(actual);
  expect_close(got, expected, 4e-2, what);
  const double rms = rms_ratio(got, expected);
  std::printf("  %-60s rms ratio %.2e  max rel %.2e\n", what.c_str(), rms, max_rel_error(got, expected));
  EXPECT_LE(rms, 1e-2) << what << ": RMS error ratio " << rms;
}

struct BwdCase {
  int64_t tq, tk, hq, hk, d, qpos, kpos;
  bool causal, tau;
  std::vector<int> kv_map;  // empty: h / (Hq / Hk)
};

std::string name_of(const BwdCase& c) {
  return "tq=" + std::to_string(c.tq) + " tk=" + std::to_string(c.tk) + " hq=" + std::to_string(c.hq) +
         " hk=" + std::to_string(c.hk) + " d=" + std::to_string(c.d) + " qpos=" + std::to_string(c.qpos) +
         " kpos=" + std::to_string(c.kpos) + (c.causal ? "" : " full") + (c.tau ? " tau" : "");
}

// The backward kernel a test names (AttentionParams::backward_kernel).
ops::AttentionBackwardKernel kernel_named(const std::string& kernel) {
  return kernel == "ws"        ? ops::AttentionBackwardKernel::ws
         : kernel == "mma-k64" ? ops::AttentionBackwardKernel::mma_k64
                               : ops::AttentionBackwardKernel::mma;
}

// only_d: run the cases of this head dimension only (0: all).
void every_block_kind(const std::string& kernel, int64_t only_d = 0) {
  const BwdCase cases[] = {
      {1, 1, 1, 1, 64, 0, 0, true, false, {}},            // one token
      {37, 37, 4, 2, 64, 0, 0, true, false, {}},          // T < 64, GQA
      {200, 200, 3, 3, 128, 100, 100, true, true, {}},    // causal diagonal, T % 64 != 0
      {70, 130, 2, 1, 128, 192, 0, true, true, {}},       // full block: every key before every query
      {65, 65, 4, 1, 128, 0, 1000, true, false, {}},      // empty block: every key after every query
      {150, 90, 2, 2, 64, 60, 10, true, true, {}},        // partial block
      {129, 129, 2, 1, 128, 524288, 524288, true, true, {}},   // diagonal at 512K
      {96, 160, 4, 2, 128, 160, 0, true, true, {}},       // zigzag: later half against an earlier block
      {128, 128, 2, 2, 128, 256, 192, true, true, {}},    // zigzag: half-overlapping positions
      {300, 200, 2, 1, 128, 1000000, 999950, true, true, {}},  // partial at 1M
      {100, 100, 2, 1, 64, 50, 0, false, false, {}},      // non-causal
      {80, 80, 3, 2, 128, 0, 0, true, true, {1, 0, 1}},   // custom GQA map
      {513, 513, 2, 1, 128, 0, 0, true, true, {}},        // several key blocks and query blocks
  };
  for (const BwdCase& c : cases) {
    if (only_d != 0 && c.d != only_d) continue;
    const std::string what = "[" + kernel + "] " + name_of(c);
    std::printf("case %s\n", what.c_str());
    Tensor q = rounded_to_bf16(random_tensor({c.tq, c.hq, c.d}, 40, 2.0f));
    Tensor k = rounded_to_bf16(random_tensor({c.tk, c.hk, c.d}, 41, 2.0f));
    Tensor v = rounded_to_bf16(random_tensor({c.tk, c.hk, c.d}, 42));
    Tensor dout = rounded_to_bf16(random_tensor({c.tq, c.hq, c.d}, 43));
    ops::AttentionParams p{.causality = c.causal ? ops::Causality::causal : ops::Causality::none,
                           .q_position0 = c.qpos,
                           .k_position0 = c.kpos,
                           .tau_log_base = c.tau ? 362.0 : 0.0,
                           .kv_head_of_query = c.kv_map,
                           .backward_kernel = kernel_named(kernel)};
    // The forward on the CPU gives the final output and lse (this key block is the whole key range).
    Tensor out = Tensor::empty({c.tq, c.hq, c.d}, DType::f32), lse = Tensor::empty({c.hq, c.tq}, DType::f32);
    ops::attention_forward(out, lse, q, k, v, p);
    Tensor delta = Tensor::empty({c.hq, c.tq}, DType::f32);
    ops::attention_backward_prepare(delta, dout, out);
    Tensor dq = Tensor::zeros({c.tq, c.hq, c.d}, DType::f32), dk = Tensor::zeros({c.tk, c.hk, c.d}, DType::f32),
           dv = Tensor::zeros({c.tk, c.hk, c.d}, DType::f32);
    ops::attention_backward(dq, dk, dv, dout, q, k, v, lse, delta, p);

    Tensor dout_g = gpu(dout), out_g = gpu(out, DType::f32), lse_g = gpu(lse, DType::f32);
    Tensor delta_g = Tensor::empty({c.hq, c.tq}, DType::f32, Device::cuda);
    ops::attention_backward_prepare(delta_g, dout_g, out_g);
    expect_close(host(delta_g), delta, 1e-5, what + " delta");
    Tensor dq_g = Tensor::zeros({c.tq, c.hq, c.d}, DType::f32, Device::cuda);
    Tensor dk_g = Tensor::zeros({c.tk, c.hk, c.d}, DType::f32, Device::cuda);
    Tensor dv_g = Tensor::zeros({c.tk, c.hk, c.d}, DType::f32, Device::cuda);
    Tensor q_g = gpu(q), k_g = gpu(k), v_g = gpu(v);
    ops::attention_backward(dq_g, dk_g, dv_g, dout_g, q_g, k_g, v_g, lse_g, delta_g, p);
    expect_gradient(dq_g, dq, what + " dq");
    expect_gradient(dk_g, dk, what + " dk");
    expect_gradient(dv_g, dv, what + " dv");
    // The outputs are accumulators: a second call adds the same again (dq up to the order of its atomics).
    const Tensor dq1 = host(dq_g), dk1 = host(dk_g), dv1 = host(dv_g);
    ops::attention_backward(dq_g, dk_g, dv_g, dout_g, q_g, k_g, v_g, lse_g, delta_g, p);
    for (auto [now, once, name] : {std::tuple{&dq_g, &dq1, "dq"}, {&dk_g, &dk1, "dk"}, {&dv_g, &dv1, "dv"}}) {
      Tensor twice = clone(*once);
      for (int64_t i = 0; i < twice.numel(); ++i) twice.data_as<float>()[i] *= 2.0f;
      expect_close(host(*now), twice, 1e-5, what + " second call accumulates " + name);
    }
  }
}

TEST(CudaAttentionBackward, WarpSpecializedKernelMatchesCpuReferenceOnEveryBlockKind) {
  HYDRA_REQUIRE_GPU();
  every_block_kind("ws");  // the default; d = 64 cases run the mma.sync kernel
}

TEST(CudaAttentionBackward, MmaKernelMatchesCpuReferenceOnEveryBlockKind) {
  HYDRA_REQUIRE_GPU();
  every_block_kind("mma");
}

TEST(CudaAttentionBackward, MmaK64KernelMatchesCpuReferenceOnEveryBlockKind) {
  HYDRA_REQUIRE_GPU();
  every_block_kind("mma-k64", 64);  // the 64-key kernel is d = 64 only (d = 128 would run mma)
}

// delta = rowsum(dO ⊙ O) from bf16 dO and O, as the model passes them: the 16-byte-chunk kernel for
// d = 64 and 128 (row counts not a multiple of a warp's rows, strided views of a fused buffer), and
// the warp-a-row kernel for rows it cannot take (a stride not a multiple of 8 elements). Tolerance:
// fp32 sums of 64-128 products in another order, 1e-5 relative to the largest.
TEST(CudaAttentionBackward, DeltaOfBf16RowsMatchesCpuReference) {
  HYDRA_REQUIRE_GPU();
  struct DeltaCase {
    int64_t t, h, d, pad;  // pad: extra elements per token row of the fused buffer
  };
  for (const DeltaCase& c : {DeltaCase{37, 3, 64, 0}, DeltaCase{1000, 8, 64, 0}, DeltaCase{129, 2, 128, 0},
                             DeltaCase{77, 4, 64, 16}, DeltaCase{50, 2, 128, 8}, DeltaCase{45, 3, 64, 3}}) {
    const std::string what = "delta t=" + std::to_string(c.t) + " h=" + std::to_string(c.h) + " d=" + std::to_string(c.d) +
                             " pad=" + std::to_string(c.pad);
    const int64_t width = c.h * c.d + c.pad;
    Tensor both = rounded_to_bf16(random_tensor({c.t, 2 * width}, 70, 1.5f));  // dO | pad | O | pad
    const TensorView dout = both.view().narrow(1, 0, c.h * c.d).split_dim(1, c.h, c.d);
    const TensorView out = both.view().narrow(1, width, c.h * c.d).split_dim(1, c.h, c.d);
    Tensor delta = Tensor::empty({c.h, c.t}, DType::f32);
    ops::attention_backward_prepare(delta, dout, out);
    Tensor both_g = gpu(both);
    Tensor delta_g = Tensor::empty({c.h, c.t}, DType::f32, Device::cuda);
    ops::attention_backward_prepare(delta_g, both_g.view().narrow(1, 0, c.h * c.d).split_dim(1, c.h, c.d),
                                    both_g.view().narrow(1, width, c.h * c.d).split_dim(1, c.h, c.d));
    expect_close(host(delta_g), delta, 1e-5, what);
  }
}

// Strided views (column blocks of a fused projection), as the model passes them (both kernels; the
// warp-specialised one's TMA maps and bulk dq rows see the strides).
void strided_views(const char* kernel) {
  const int64_t t = 100, h = 2, d = 128;
  Tensor qkv = rounded_to_bf16(random_tensor({t, 3 * h * d + 8 * d}, 44, 1.5f));  // q | k | v | other
  const TensorView q = qkv.view().narrow(1, 0, h * d).split_dim(1, h, d);
  const TensorView k = qkv.view().narrow(1, h * d, h * d).split_dim(1, h, d);
  const TensorView v = qkv.view().narrow(1, 2 * h * d, h * d).split_dim(1, h, d);
  Tensor dout = rounded_to_bf16(random_tensor({t, h, d}, 45));
  ops::AttentionParams p;
  p.tau_log_base = 362.0;
  p.backward_kernel = kernel_named(kernel);
  Tensor out = Tensor::empty({t, h, d}, DType::f32), lse = Tensor::empty({h, t}, DType::f32);
  ops::attention_forward(out, lse, q, k, v, p);
  Tensor delta = Tensor::empty({h, t}, DType::f32);
  ops::attention_backward_prepare(delta, dout, out);
  // Gradients land in a fused [T, 3·H·d] accumulator as well.
  Tensor grads = Tensor::zeros({t, 3 * h * d}, DType::f32);
  auto part = [&](const Tensor& g, int i) { return g.view().narrow(1, i * h * d, h * d).split_dim(1, h, d); };
  ops::attention_backward(part(grads, 0), part(grads, 1), part(grads, 2), dout, q, k, v, lse, delta, p);

  Tensor qkv_g = gpu(qkv), grads_g = Tensor::zeros({t, 3 * h * d}, DType::f32, Device::cuda);
  auto gpart = [&](const Tensor& x, int i) { return x.view().narrow(1, i * h * d, h * d).split_dim(1, h, d); };
  Tensor delta_g = Tensor::empty({h, t}, DType::f32, Device::cuda), dout_g = gpu(dout);
  ops::attention_backward_prepare(delta_g, dout_g, gpu(out, DType::f32));
  ops::attention_backward(gpart(grads_g, 0), gpart(grads_g, 1), gpart(grads_g, 2), dout_g, gpart(qkv_g, 0),
                          gpart(qkv_g, 1), gpart(qkv_g, 2), gpu(lse, DType::f32), delta_g, p);
  expect_gradient(grads_g, grads, std::string("[") + kernel + "] strided fused dq|dk|dv");
}

TEST(CudaAttentionBackward, StridedViews) {
  HYDRA_REQUIRE_GPU();
  strided_views("ws");
  strided_views("mma");
}

// Packed documents (attention_mask.h): the mma.sync forward and backward with per-row document
// starts against the CPU reference, for a whole sequence (P = 1) and for a zigzag-style pair whose
// keys lie before the queries (the ring's case): documents of 1 token, boundaries inside and on the
// edges of 64-row tiles, τ at the position within the document, d = 64 and 128. The calls with
// documents run the mma.sync kernels whatever the kernel options say (both are asked for).
void packed_documents(int64_t d, ops::AttentionBackwardKernel asked) {
  struct DocCase {
    int64_t tq, tk, qpos, kpos;
    std::vector<int64_t> starts;  // document starts (global positions) covering [min(kpos, qpos), end)
  };
  const DocCase cases[] = {
      {200, 200, 0, 0, {0, 1, 37, 64, 65, 128, 190, 199}},
      {150, 150, 300, 300, {0, 310, 330, 384, 449}},
      {128, 160, 400, 200, {0, 250, 360, 420, 500}},  // keys before the queries: some blocks wholly hidden
  };
  for (const DocCase& c : cases) {
    const std::string what = "[docs d=" + std::to_string(d) + "] tq=" + std::to_string(c.tq) + " q@" +
                             std::to_string(c.qpos) + " k@" + std::to_string(c.kpos);
    std::printf("case %s\n", what.c_str());
    auto bounds = [&](int64_t pos0, int64_t n, bool end) {
      Tensor t = Tensor::empty({n}, DType::i64);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t pos = pos0 + i;
        const auto it = std::upper_bound(c.starts.begin(), c.starts.end(), pos);
        t.data_as<int64_t>()[i] = end ? (it == c.starts.end() ? int64_t{1} << 40 : *it) : *(it - 1);
      }
      return t;
    };
    const Tensor qdoc = bounds(c.qpos, c.tq, false), kend = bounds(c.kpos, c.tk, true);
    const int64_t hq = 2, hk = 1;
    Tensor q = rounded_to_bf16(random_tensor({c.tq, hq, d}, 60, 2.0f)), k = rounded_to_bf16(random_tensor({c.tk, hk, d}, 61, 2.0f));
    Tensor v = rounded_to_bf16(random_tensor({c.tk, hk, d}, 62)), dout = rounded_to_bf16(random_tensor({c.tq, hq, d}, 63));
    ops::AttentionParams p{.q_position0 = c.qpos, .k_position0 = c.kpos, .tau_log_base = 362.0,
                           .forward_kernel = ops::AttentionKernel::hopper, .backward_kernel = asked};
    p.q_document_start = qdoc;
    p.k_document_end = kend;
    Tensor out = Tensor::empty({c.tq, hq, d}, DType::f32), lse = Tensor::empty({hq, c.tq}, DType::f32);
    ops::attention_forward(out, lse, q, k, v, p);
    Tensor delta = Tensor::empty({hq, c.tq}, DType::f32);
    ops::attention_backward_prepare(delta, dout, out);
    Tensor dq = Tensor::zeros({c.tq, hq, d}, DType::f32), dk = Tensor::zeros({c.tk, hk, d}, DType::f32),
           dv = Tensor::zeros({c.tk, hk, d}, DType::f32);
    ops::attention_backward(dq, dk, dv, dout, q, k, v, lse, delta, p);

    ops::AttentionParams pg = p;
    const Tensor qdoc_g = to_device(qdoc, Device::cuda), kend_g = to_device(kend, Device::cuda);
    pg.q_document_start = qdoc_g;
    pg.k_document_end = kend_g;
    Tensor out_g = Tensor::empty({c.tq, hq, d}, DType::f32, Device::cuda), lse_g = Tensor::empty({hq, c.tq}, DType::f32, Device::cuda);
    Tensor q_g = gpu(q), k_g = gpu(k), v_g = gpu(v), dout_g = gpu(dout);
    ops::attention_forward(out_g, lse_g, q_g, k_g, v_g, pg);
    expect_close(host(out_g), out, 2e-2, what + " out");
    const Tensor lh = host(lse_g);
    for (int64_t i = 0; i < lh.numel(); ++i) {
      const float a = lh.data_as<float>()[i], b = lse.data_as<float>()[i];
      if (std::isinf(b)) {
        EXPECT_TRUE(std::isinf(a) && a < 0) << what << " lse " << i << ": " << a;
      } else {
        EXPECT_NEAR(a, b, 2e-2 * std::max(1.0f, std::abs(b))) << what << " lse " << i;
      }
    }
    Tensor delta_g = Tensor::empty({hq, c.tq}, DType::f32, Device::cuda);
    ops::attention_backward_prepare(delta_g, dout_g, gpu(out, DType::f32));
    Tensor dq_g = Tensor::zeros({c.tq, hq, d}, DType::f32, Device::cuda), dk_g = Tensor::zeros({c.tk, hk, d}, DType::f32, Device::cuda),
           dv_g = Tensor::zeros({c.tk, hk, d}, DType::f32, Device::cuda);
    ops::attention_backward(dq_g, dk_g, dv_g, dout_g, q_g, k_g, v_g, gpu(lse, DType::f32), delta_g, pg);
    expect_gradient(dq_g, dq, what + " dq");
    expect_gradient(dk_g, dk, what + " dk");
    expect_gradient(dv_g, dv, what + " dv");
  }
}

TEST(CudaAttentionBackward, PackedDocumentsMatchCpuReference) {
  HYDRA_REQUIRE_GPU();
  packed_documents(64, ops::AttentionBackwardKernel::mma);
  packed_documents(64, ops::AttentionBackwardKernel::mma_k64);
  packed_documents(64, ops::AttentionBackwardKernel::automatic);  // mma-k64
  packed_documents(128, ops::AttentionBackwardKernel::ws);
}

// The small-model step's attention (qwen3-synth: 16384 tokens as 64 documents of 256, 8 query heads
// on 4 KV heads, d = 64, causal, τ off) through both d = 64 kernels and the automatic choice, against
// one CPU reference; the model's bf16 output feeds the delta pass as in training.
TEST(CudaAttentionBackward, SmallModelPackedShapeMatchesCpuReference) {
  HYDRA_REQUIRE_GPU();
  const int64_t t = 64 * 256, doc = 256, hq = 8, hk = 4, d = 64;
  Tensor qdoc = Tensor::empty({t}, DType::i64), kend = Tensor::empty({t}, DType::i64);
  for (int64_t i = 0; i < t; ++i) {
    qdoc.data_as<int64_t>()[i] = i / doc * doc;
    kend.data_as<int64_t>()[i] = i / doc * doc + doc;
  }
  Tensor q = rounded_to_bf16(random_tensor({t, hq, d}, 80, 2.0f)), k = rounded_to_bf16(random_tensor({t, hk, d}, 81, 2.0f));
  Tensor v = rounded_to_bf16(random_tensor({t, hk, d}, 82)), dout = rounded_to_bf16(random_tensor({t, hq, d}, 83));
  ops::AttentionParams p;
  p.q_document_start = qdoc;
  p.k_document_end = kend;
  Tensor out = Tensor::empty({t, hq, d}, DType::f32), lse = Tensor::empty({hq, t}, DType::f32);
  ops::attention_forward(out, lse, q, k, v, p);
  const Tensor out_bf16 = rounded_to_bf16(out);
  Tensor delta = Tensor::empty({hq, t}, DType::f32);
  ops::attention_backward_prepare(delta, dout, out_bf16);
  Tensor dq = Tensor::zeros({t, hq, d}, DType::f32), dk = Tensor::zeros({t, hk, d}, DType::f32),
         dv = Tensor::zeros({t, hk, d}, DType::f32);
  ops::attention_backward(dq, dk, dv, dout, q, k, v, lse, delta, p);

  const Tensor qdoc_g = to_device(qdoc, Device::cuda), kend_g = to_device(kend, Device::cuda);
  Tensor q_g = gpu(q), k_g = gpu(k), v_g = gpu(v), dout_g = gpu(dout), lse_g = gpu(lse, DType::f32);
  Tensor delta_g = Tensor::empty({hq, t}, DType::f32, Device::cuda);
  ops::attention_backward_prepare(delta_g, dout_g, gpu(out_bf16));
  expect_close(host(delta_g), delta, 1e-5, "64 x 256 docs delta");
  for (const ops::AttentionBackwardKernel kernel :
       {ops::AttentionBackwardKernel::mma_k64, ops::AttentionBackwardKernel::mma, ops::AttentionBackwardKernel::automatic}) {
    const std::string what = std::string("[") + ops::attention_backward_kernel_name(kernel) + "] 64 x 256 docs hq=8 hk=4 d=64";
    std::printf("case %s\n", what.c_str());
    ops::AttentionParams pg = p;
    pg.q_document_start = qdoc_g;
    pg.k_document_end = kend_g;
    pg.backward_kernel = kernel;
    Tensor dq_g = Tensor::zeros({t, hq, d}, DType::f32, Device::cuda), dk_g = Tensor::zeros({t, hk, d}, DType::f32, Device::cuda),
           dv_g = Tensor::zeros({t, hk, d}, DType::f32, Device::cuda);
    ops::attention_backward(dq_g, dk_g, dv_g, dout_g, q_g, k_g, v_g, lse_g, delta_g, pg);
    expect_gradient(dq_g, dq, what + " dq");
    expect_gradient(dk_g, dk, what + " dk");
    expect_gradient(dv_g, dv, what + " dv");
  }
}

}  // namespace
}  // namespace hydra::test
