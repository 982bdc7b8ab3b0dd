// The decode step's GEMV (kernels/gemv/gemv.cu) against its CPU reference and against cuBLAS
// (ops::linear) at the projections of hydrahead-1.7b and qwen3-1.7b (in_proj, o_proj, mlp_in,
// mlp_down) and at odd shapes (N not a multiple of the 16-row tile, K not a multiple of the 32-wide
// slice, K < 32, strided rows), for M = 1, 2, 8 rows (every M from 1 to 8 on the odd shapes), with
// and without the residual add. SKIPPED without a GPU.
//
// Bound, per output: |gpu − ref| ≤ 2⁻⁸·|ref| + 2·γ, γ = (K + 2)·2⁻²³·(Σ_k |x_k w_k| + |old|), where
// ref is the float64 sum on the same bf16 values (plus the old value when adding): the GPU's fp32
// sum over K terms (tensor-core accumulation, at most one fp32 ulp lost per addition) is within γ of
// ref, and its one rounding to bf16 moves it by at most 2⁻⁸ of its magnitude (8 significant bits).
// cuBLAS's result obeys the same bound, so the two differ by at most twice it. Two runs give the
// same bits (a fixed reduction order, no atomics), and the output's columns outside its view are
// untouched.
//
// The GEMV with the input norm fused (ops::gemv_rms_norm) must give exactly the bits of
// ops::rms_norm into a bf16 buffer then ops::gemv on the GPU (it repeats the norm kernel's
// arithmetic and order), at every width the fused norm takes (K = 8·2^j, 4096) and M = 1..8, on rows
// with a stride. Against the CPU (float64 norm, rounded to bf16, then the float64 GEMV): the bound
// above plus 2⁻⁷·Σ_k |xn_k w_k| — the GPU's normed values (rsqrtf) may round to the neighbouring
// bf16 of the CPU's, one ulp, at most 2⁻⁷ of the value.
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kernels/gemv/gemv.h"
#include "kernels/matmul/matmul.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "model/config.h"
#include "model/weight_layout.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

struct GemvShape {
  std::string what;
  int64_t n, k;
  int64_t ldk;  // row stride of x and w (≥ k, a multiple of 8)
};

// The four projections of layer 0 of a preset.
std::vector<GemvShape> model_shapes(const std::string& preset) {
  const ModelConfig c = preset_config(preset);
  const LayerLayout l = layer_layout(c, 0);
  std::vector<GemvShape> out;
  for (const Slot slot : {Slot::in_proj, Slot::o_proj, Slot::mlp_in, Slot::mlp_down}) {
    const std::vector<int64_t> s = l.shape(slot, c);
    out.push_back({fmt::format("{} {}", preset, runtime_name(0, slot)), s[0], s[1], s[1]});
  }
  return out;
}

Tensor absolute(const TensorView& t) {
  Tensor out = clone(t);
  for (int64_t i = 0; i < out.numel(); ++i) out.data_as<float>()[i] = std::abs(out.data_as<float>()[i]);
  return out;
}

// One shape at m rows, both epilogues.
void check_shape(const GemvShape& s, int64_t m, uint64_t seed, const ops::GemvTuning& tuning = {}) {
  const int64_t pad = 3;  // output columns right of the view
  const Tensor xbuf = rounded_to_bf16(random_tensor({m, s.ldk}, seed));
  const Tensor wbuf = rounded_to_bf16(random_tensor({s.n, s.ldk}, seed + 1));
  const Tensor old = rounded_to_bf16(random_tensor({m, s.n + pad}, seed + 2, 4.0f));
  const TensorView x = xbuf.view().narrow(1, 0, s.k), w = wbuf.view().narrow(1, 0, s.k);
  const Tensor gx = gpu(xbuf), gw = gpu(wbuf);
  const TensorView dx = gx.view().narrow(1, 0, s.k), dw = gw.view().narrow(1, 0, s.k);
  ASSERT_TRUE(ops::gemv_supported(gpu(old).view().narrow(1, 0, s.n), dx, dw)) << s.what;
  // Σ|x w| per output, for the bound.
  Tensor magnitude = Tensor::empty({m, s.n}, DType::f32);
  ops::gemv(magnitude, absolute(x), absolute(w));
  for (const ops::Accumulate acc : {ops::Accumulate::no, ops::Accumulate::yes}) {
    const bool adds = acc == ops::Accumulate::yes;
    const std::string what = fmt::format("{} [{}, {}] at {} rows{} ({})", s.what, s.n, s.k, m, adds ? ", adding" : "",
                                         ops::gemv_tuning_name(tuning));
    Tensor ref = clone(old.view().narrow(1, 0, s.n));
    ops::gemv(ref, x, w, acc);
    Tensor first = gpu(old), second = gpu(old), by_cublas = gpu(old);
    ops::gemv(first.view().narrow(1, 0, s.n), dx, dw, acc, tuning);
    ops::gemv(second.view().narrow(1, 0, s.n), dx, dw, acc, tuning);
    ops::linear(by_cublas.view().narrow(1, 0, s.n), dx, dw, acc);
    const Tensor got = host(first), again = host(second), cublas = host(by_cublas);
    ASSERT_EQ(count_non_finite(got), 0) << what;
    ASSERT_EQ(std::memcmp(got.data(), again.data(), got.nbytes()), 0) << what << ": two runs differ";
    int64_t bad_ref = 0, bad_cublas = 0;
    double worst = 0;
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < s.n + pad; ++j) {
        const float g = got.data_as<float>()[i * (s.n + pad) + j], o = old.data_as<float>()[i * (s.n + pad) + j];
        if (j >= s.n) {  // outside the view
          EXPECT_EQ(g, o) << what << ": column " << j << " written";
          continue;
        }
        const double r = ref.data_as<float>()[i * s.n + j];
        const double gamma = static_cast<double>(s.k + 2) * std::ldexp(1.0, -23) *
                             (magnitude.data_as<float>()[i * s.n + j] + (adds ? std::abs(o) : 0.0));
        const double bound = std::ldexp(std::abs(r), -8) + 2 * gamma;
        const double err = std::abs(g - r);
        worst = std::max(worst, err / bound);
        if (err > bound && bad_ref++ < 5) ADD_FAILURE() << what << " (" << i << ", " << j << "): " << g << " vs " << r << ", bound " << bound;
        const double c = cublas.data_as<float>()[i * (s.n + pad) + j];
        if (std::abs(g - c) > 2 * bound && bad_cublas++ < 5) {
          ADD_FAILURE() << what << " (" << i << ", " << j << "): " << g << " vs cuBLAS " << c << ", bound " << 2 * bound;
        }
      }
    }
    EXPECT_EQ(bad_ref, 0) << what << ": outputs past the bound";
    EXPECT_EQ(bad_cublas, 0) << what << ": outputs past twice the bound from cuBLAS";
    std::printf("%s: worst error %.2f of the bound\n", what.c_str(), worst);
  }
}

TEST(CudaGemv, ModelProjectionsMatchCpuAndCublas) {
  HYDRA_REQUIRE_GPU();
  std::vector<GemvShape> shapes = model_shapes("hydrahead-1.7b");
  shapes.push_back(model_shapes("qwen3-1.7b")[0]);  // the teacher's in_proj (q|k|v); the rest are equal
  uint64_t seed = 10;
  for (const GemvShape& s : shapes) {
    for (const int64_t m : {1, 2, 8}) check_shape(s, m, seed += 3);
  }
}

TEST(CudaGemv, OddShapesMatchCpuAndCublasAtEveryRowCount) {
  HYDRA_REQUIRE_GPU();
  const std::vector<GemvShape> shapes = {
      {"partial tile and slice", 1003, 2053, 2056},  // N % 16 = 11, K % 32 = 5
      {"strided rows", 37, 300, 304},
      {"K below one slice", 5, 7, 8},
      {"one row, one k", 1, 1, 8},
      {"one tile", 16, 96, 96},
  };
  uint64_t seed = 100;
  for (const GemvShape& s : shapes) {
    for (int64_t m = 1; m <= ops::kGemvMaxRows; ++m) check_shape(s, m, seed += 3);
  }
}

// One (K, M) of the fused norm: h [M, K] in a wider buffer (row stride ldk), γ random around 1.
void check_fused_norm(int64_t n, int64_t k, int64_t ldk, int64_t m, uint64_t seed, const ops::GemvTuning& tuning = {}) {
  const std::string what = fmt::format("fused norm [{}, {}] at {} rows ({})", n, k, m, ops::gemv_tuning_name(tuning));
  const Tensor hbuf = rounded_to_bf16(random_tensor({m, ldk}, seed, 3.0f));
  const Tensor wbuf = rounded_to_bf16(random_tensor({n, k}, seed + 1));
  Tensor gamma = random_tensor({k}, seed + 2, 0.5f);
  for (int64_t i = 0; i < k; ++i) gamma.data_as<float>()[i] += 1.0f;
  const ops::RmsNormParams params{1e-6f};
  const Tensor gh = gpu(hbuf), gw = gpu(wbuf), ggamma = gpu(gamma, DType::f32);
  const TensorView dh = gh.view().narrow(1, 0, k);
  ASSERT_TRUE(ops::gemv_rms_norm_supported(dh, ggamma, gw)) << what;
  Tensor fused = Tensor::empty({m, n}, DType::bf16, Device::cuda), again = Tensor::empty({m, n}, DType::bf16, Device::cuda);
  Tensor separate = Tensor::empty({m, n}, DType::bf16, Device::cuda), normed = Tensor::empty({m, k}, DType::bf16, Device::cuda);
  ops::gemv_rms_norm(fused, dh, {ggamma, params}, gw, tuning);
  ops::gemv_rms_norm(again, dh, {ggamma, params}, gw, tuning);
  ops::rms_norm(normed, dh, ggamma, params);
  ops::gemv(separate, normed, gw, ops::Accumulate::no, tuning);
  const Tensor got = host(fused), twice = host(again), want = host(separate);
  ASSERT_EQ(count_non_finite(got), 0) << what;
  ASSERT_EQ(std::memcmp(got.data(), twice.data(), got.nbytes()), 0) << what << ": two runs differ";
  int64_t differ = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    if (got.data_as<float>()[i] != want.data_as<float>()[i] && differ++ < 5) {
      ADD_FAILURE() << what << ": output " << i << " is " << got.data_as<float>()[i] << ", norm then GEMV "
                    << want.data_as<float>()[i];
    }
  }
  EXPECT_EQ(differ, 0) << what << ": outputs that differ from rms_norm then the GEMV";
  // The CPU: the same definition in float64 sums, the normed rows rounded to bf16 as the GPU holds them.
  const TensorView h = hbuf.view().narrow(1, 0, k);
  Tensor cpu_normed = Tensor::empty({m, k}, DType::f32);
  ops::rms_norm(cpu_normed, h, gamma, params);
  cpu_normed = rounded_to_bf16(cpu_normed);
  Tensor ref = Tensor::empty({m, n}, DType::f32), by_cpu_op = Tensor::empty({m, n}, DType::f32);
  ops::gemv(ref, cpu_normed, wbuf);
  ops::gemv_rms_norm(by_cpu_op, h, {gamma, params}, wbuf);  // the op's own host path: rms_norm then gemv, unrounded
  Tensor magnitude = Tensor::empty({m, n}, DType::f32);
  ops::gemv(magnitude, absolute(cpu_normed), absolute(wbuf));
  int64_t bad = 0;
  double worst = 0;
  for (int64_t i = 0; i < m * n; ++i) {
    const double r = ref.data_as<float>()[i], g = got.data_as<float>()[i], mag = magnitude.data_as<float>()[i];
    const double bound = std::ldexp(std::abs(r), -8) + 2 * (k + 2) * std::ldexp(mag, -23) + std::ldexp(mag, -7);
    worst = std::max(worst, std::abs(g - r) / bound);
    if (std::abs(g - r) > bound && bad++ < 5) ADD_FAILURE() << what << " output " << i << ": " << g << " vs CPU " << r;
    // The host op skips the bf16 rounding of the normed rows: within 2⁻⁸ of Σ|xn w| of the rounded reference.
    EXPECT_LE(std::abs(by_cpu_op.data_as<float>()[i] - r), 1.01 * std::ldexp(mag, -8) + std::ldexp(std::abs(r), -22) + 1e-6)
        << what << " host op, output " << i;
  }
  EXPECT_EQ(bad, 0) << what << ": outputs past the bound from the CPU";
  std::printf("%s: equal to norm then GEMV; worst error from the CPU %.2f of the bound\n", what.c_str(), worst);
}

TEST(CudaGemv, FusedNormEqualsNormThenGemvBitForBit) {
  HYDRA_REQUIRE_GPU();
  uint64_t seed = 500;
  // hydrahead-1.7b's in_proj and mlp_in read D = 2048 (one run of eight a thread, 256 threads a row).
  const ModelConfig c = preset_config("hydrahead-1.7b");
  const LayerLayout l = layer_layout(c, 0);
  for (const Slot slot : {Slot::in_proj, Slot::mlp_in}) {
    const std::vector<int64_t> s = l.shape(slot, c);
    for (const int64_t m : {1, 2, 8}) check_fused_norm(s[0], s[1], s[1], m, seed += 3);
  }
  // Every other width the fused norm takes: groups of 1 to 128 threads (shuffles within a warp, and
  // warps added in order), two runs a thread (4096); N past whole tiles; rows with a stride.
  for (const int64_t k : {8, 16, 32, 64, 128, 256, 512, 1024, 4096}) {
    for (const int64_t m : {1, 3, 8}) check_fused_norm(37, k, k + 8, m, seed += 3);
  }
}

// The launch shapes `hydra bench --op gemv` compares (ops::GemvTuning): each within the bound of the
// CPU and of cuBLAS on the model's projections (one and eight rows) and on the odd shapes (every M),
// and with the norm fused equal to the norm then the GEMV at the same tuning (16 warps with 8 slices
// ahead: the most shared memory, 213 KB at K = 4096).
const std::vector<ops::GemvTuning> kTunings = {
    {.warps = 4, .ahead = 8, .prefetch = ops::GemvPrefetch::tile},
    {.warps = 8, .ahead = 4, .prefetch = ops::GemvPrefetch::tile},
    {.warps = 16, .ahead = 8, .prefetch = ops::GemvPrefetch::first_slices},
    {.warps = 0, .ahead = 8, .prefetch = ops::GemvPrefetch::tile},
};

TEST(CudaGemv, TuningsMatchCpuAndCublas) {
  HYDRA_REQUIRE_GPU();
  uint64_t seed = 700;
  for (const ops::GemvTuning& t : kTunings) {
    for (const GemvShape& s : model_shapes("hydrahead-1.7b")) {
      for (const int64_t m : {1, 8}) check_shape(s, m, seed += 3, t);
    }
    for (const GemvShape& s : std::vector<GemvShape>{{"partial tile and slice", 1003, 2053, 2056}, {"K below one slice", 5, 7, 8}}) {
      for (int64_t m = 1; m <= ops::kGemvMaxRows; ++m) check_shape(s, m, seed += 3, t);
    }
    for (const int64_t k : {2048, 4096}) check_fused_norm(301, k, k + 8, 5, seed += 3, t);
  }
}

// Slices ahead and the prefetch do not change the order of any sum: at the default warp count every
// choice gives the default kernel's bits (plain and with the norm fused, the residual add too).
TEST(CudaGemv, AheadAndPrefetchKeepTheBits) {
  HYDRA_REQUIRE_GPU();
  const ModelConfig c = preset_config("hydrahead-1.7b");
  const LayerLayout l = layer_layout(c, 0);
  uint64_t seed = 900;
  for (const GemvShape& s : model_shapes("hydrahead-1.7b")) {
    for (const int64_t m : {1, 3, 8}) {
      const Tensor x = gpu(random_tensor({m, s.k}, seed += 3)), w = gpu(random_tensor({s.n, s.k}, seed + 1));
      const Tensor old = gpu(random_tensor({m, s.n}, seed + 2));
      Tensor want = clone(old);
      ops::gemv(want, x, w, ops::Accumulate::yes);
      const Tensor want_host = host(want);
      for (const int ahead : {4, 8}) {
        for (const ops::GemvPrefetch p : {ops::GemvPrefetch::first_slices, ops::GemvPrefetch::tile}) {
          const ops::GemvTuning t{.warps = 0, .ahead = ahead, .prefetch = p};
          Tensor got = clone(old);
          ops::gemv(got, x, w, ops::Accumulate::yes, t);
          const Tensor got_host = host(got);
          EXPECT_EQ(std::memcmp(got_host.data(), want_host.data(), got_host.nbytes()), 0)
              << s.what << " at " << m << " rows (" << ops::gemv_tuning_name(t) << ") differs from the default";
        }
      }
    }
  }
  for (const Slot slot : {Slot::in_proj, Slot::mlp_in}) {
    const std::vector<int64_t> s = l.shape(slot, c);
    const Tensor h = gpu(random_tensor({2, s[1]}, seed += 3, 3.0f)), w = gpu(random_tensor({s[0], s[1]}, seed + 1));
    const Tensor gamma = gpu(random_tensor({s[1]}, seed + 2), DType::f32);
    const ops::GemvInputNorm norm{gamma, ops::RmsNormParams{1e-6f}};
    Tensor want = Tensor::empty({2, s[0]}, DType::bf16, Device::cuda), got = Tensor::empty({2, s[0]}, DType::bf16, Device::cuda);
    ops::gemv_rms_norm(want, h, norm, w);
    ops::gemv_rms_norm(got, h, norm, w, {.warps = 0, .ahead = 8, .prefetch = ops::GemvPrefetch::tile});
    const Tensor a = host(want), b = host(got);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << "fused norm " << s[0] << " x " << s[1];
  }
}

}  // namespace
}  // namespace hydra::test
