// The GEMV's CPU reference (kernels/gemv/gemv_reference.cpp) against OpenBLAS's ops::linear on the same host
// views (column blocks of wider buffers, accumulation, every row count it takes), and the rules
// gemv_supported applies to GPU views (checked on views of made-up device addresses: nothing is
// read). Tolerance 1e-5: fp32 sums (OpenBLAS) against float64 (the reference) over K ≤ 300. The
// fused norm's reference (gemv_rms_norm on the host: rms_norm, then gemv) against the same product
// written out in float64 here, and the GPU views it takes (the RMSNorm vector kernel's widths).
#include <cmath>

#include <fmt/format.h>

#include "kernels/gemv/gemv.h"
#include "kernels/matmul/matmul.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "runtime/error.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

TEST(Gemv, ReferenceEqualsLinearForEveryRowCount) {
  for (int64_t m = 1; m <= ops::kGemvMaxRows; ++m) {
    for (const auto& [n, k] : {std::pair<int64_t, int64_t>{1, 1}, {37, 300}, {64, 33}}) {
      Tensor xbuf = random_tensor({m, k + 3}, 1), wbuf = random_tensor({n, k + 5}, 2), obuf = random_tensor({m, n + 2}, 3);
      const TensorView x = xbuf.view().narrow(1, 3, k), w = wbuf.view().narrow(1, 1, k);
      for (const ops::Accumulate acc : {ops::Accumulate::no, ops::Accumulate::yes}) {
        Tensor want_buf = clone(obuf), got_buf = clone(obuf);
        const TensorView want = want_buf.view().narrow(1, 2, n), got = got_buf.view().narrow(1, 2, n);
        ops::linear(want, x, w, acc);
        ops::gemv(got, x, w, acc);
        const std::string what = fmt::format("gemv m={} n={} k={} accumulate={}", m, n, k, acc == ops::Accumulate::yes);
        expect_close(clone(got), clone(want), 1e-5, what);
        expect_close(got_buf.view().narrow(1, 0, 2), obuf.view().narrow(1, 0, 2), 0.0, what + ": columns left of the block");
      }
    }
  }
}

TEST(Gemv, RefusesMoreRowsThanItTakes) {
  const Tensor x = random_tensor({ops::kGemvMaxRows + 1, 8}, 4), w = random_tensor({4, 8}, 5);
  Tensor out = Tensor::empty({ops::kGemvMaxRows + 1, 4}, DType::f32);
  EXPECT_FALSE(ops::gemv_supported(out, x, w));
  try {
    ops::gemv(out, x, w);
    ADD_FAILURE() << "9 rows were taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemv takes 1 to 8 rows, got 9"), std::string::npos) << e.what();
  }
}

// GPU views: bf16 everywhere, at most 8 rows, x and w rows starting 16-byte aligned (the kernel's
// 16-byte copies); K and N need no alignment (a row stride that is a multiple of 8 elements may hold
// any width), and out's row stride is free (2-byte stores).
TEST(Gemv, SupportsTheGpuViewsItsKernelTakes) {
  const auto device = [](uintptr_t address, DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides) {
    return TensorView(reinterpret_cast<void*>(address), dtype, Device::cuda, shape, strides);
  };
  const uintptr_t base = uintptr_t{1} << 20;  // 16-byte aligned
  const int64_t m = 8, n = 6144 + 3, k = 2048 + 5, ldk = 2048 + 8;
  const TensorView x = device(base, DType::bf16, {m, k}, {ldk, 1}), w = device(base, DType::bf16, {n, k}, {ldk, 1});
  const TensorView out = device(base, DType::bf16, {m, n}, {n + 1, 1});
  EXPECT_TRUE(ops::gemv_supported(out, x, w)) << "odd K and N with aligned row starts";
  EXPECT_FALSE(ops::gemv_supported(out, device(base + 2, DType::bf16, {m, k}, {ldk, 1}), w)) << "x's start off 16 bytes";
  EXPECT_FALSE(ops::gemv_supported(out, x, device(base, DType::bf16, {n, k}, {k, 1}))) << "w's rows off 16 bytes (odd stride)";
  EXPECT_FALSE(ops::gemv_supported(device(base, DType::f32, {m, n}, {n, 1}), x, w)) << "fp32 output";
  EXPECT_FALSE(ops::gemv_supported(out, x, device(base, DType::bf16, {n, k}, {1, n}))) << "a transposed w";
  const TensorView x9 = device(base, DType::bf16, {9, k}, {ldk, 1}), out9 = device(base, DType::bf16, {9, n}, {n, 1});
  EXPECT_FALSE(ops::gemv_supported(out9, x9, w)) << "9 rows";
  EXPECT_FALSE(ops::gemv_supported(out, x, device(base, DType::bf16, {n, k - 1}, {ldk, 1}))) << "mismatched K";
}

// out = (γ ⊙ h / sqrt(mean(h²) + eps)) · wᵀ in float64, against gemv_rms_norm's host path (float32
// norm, float64 sums): 1e-5 of the output's magnitude Σ|xn w| (the norm's fp32 rounding, 2⁻²⁴ a value).
TEST(Gemv, FusedNormReferenceIsTheNormedProduct) {
  const float eps = 1e-6f;
  for (int64_t m = 1; m <= ops::kGemvMaxRows; m += 3) {
    const int64_t n = 19, k = 40;
    const Tensor hbuf = random_tensor({m, k + 8}, 20 + m, 2.0f), w = random_tensor({n, k}, 21), gamma = random_tensor({k}, 22);
    const TensorView h = hbuf.view().narrow(1, 8, k);
    Tensor out = Tensor::empty({m, n}, DType::f32);
    ASSERT_TRUE(ops::gemv_rms_norm_supported(h, gamma, w));
    ops::gemv_rms_norm(out, h, {gamma, {eps}}, w);
    for (int64_t i = 0; i < m; ++i) {
      const float* hr = h.data_as<const float>() + i * h.stride(0);
      double ss = 0;
      for (int64_t j = 0; j < k; ++j) ss += static_cast<double>(hr[j]) * hr[j];
      const double inv = 1.0 / std::sqrt(ss / static_cast<double>(k) + eps);
      for (int64_t o = 0; o < n; ++o) {
        double sum = 0, mag = 0;
        for (int64_t j = 0; j < k; ++j) {
          const double term = gamma.data_as<float>()[j] * hr[j] * inv * w.data_as<float>()[o * k + j];
          sum += term;
          mag += std::abs(term);
        }
        EXPECT_NEAR(out.data_as<float>()[i * n + o], sum, 1e-5 * mag) << "row " << i << " output " << o;
      }
    }
  }
  const Tensor h = random_tensor({2, 8}, 23), w = random_tensor({3, 8}, 24), short_gamma = random_tensor({7}, 25);
  Tensor out = Tensor::empty({2, 3}, DType::f32);
  EXPECT_FALSE(ops::gemv_rms_norm_supported(h, short_gamma, w));
  EXPECT_THROW(ops::gemv_rms_norm(out, h, {short_gamma, {eps}}, w), Error) << "a γ of 7 for rows of 8";
}

// GPU views: what gemv asks of x and w, γ fp32, contiguous and 16-byte aligned, and K one of the
// widths the RMSNorm's vector kernel takes (8·2^j up to 2048, and 4096), whose arithmetic it repeats.
TEST(Gemv, FusedNormSupportsTheGpuViewsItsKernelTakes) {
  const auto device = [](uintptr_t address, DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides) {
    return TensorView(reinterpret_cast<void*>(address), dtype, Device::cuda, shape, strides);
  };
  const uintptr_t base = uintptr_t{1} << 20;
  const auto takes = [&](int64_t k, uintptr_t x_at = uintptr_t{1} << 20, uintptr_t gamma_at = uintptr_t{1} << 20,
                         DType gamma_dtype = DType::f32) {
    const TensorView x = device(x_at, DType::bf16, {4, k}, {k + 8, 1}), w = device(base, DType::bf16, {100, k}, {k, 1});
    return ops::gemv_rms_norm_supported(x, device(gamma_at, gamma_dtype, {k}, {1}), w);
  };
  for (const int64_t k : {8, 16, 64, 256, 1024, 2048, 4096}) EXPECT_TRUE(takes(k)) << "K = " << k;
  for (const int64_t k : {24, 2056, 3072, 8192}) EXPECT_FALSE(takes(k)) << "K = " << k << " (not a vector-kernel width)";
  EXPECT_FALSE(takes(2048, base + 2)) << "h's start off 16 bytes";
  EXPECT_FALSE(takes(2048, base, base + 4)) << "γ off 16 bytes";
  EXPECT_FALSE(takes(2048, base, base, DType::bf16)) << "a bf16 γ";
  const TensorView x9 = device(base, DType::bf16, {9, 2048}, {2048, 1}), w = device(base, DType::bf16, {100, 2048}, {2048, 1});
  EXPECT_FALSE(ops::gemv_rms_norm_supported(x9, device(base, DType::f32, {2048}, {1}), w)) << "9 rows";
  EXPECT_FALSE(ops::gemv_rms_norm_supported(device(base, DType::bf16, {4, 2048}, {2048, 1}), device(base, DType::f32, {2048}, {2}), w))
      << "a strided γ";
}

// HYDRA_GEMV_TUNING's text (and --gemv-tunings' entries): any subset of the settings, the rest
// default; the printed name parses back to the same tuning; anything else is a UserError naming it.
TEST(GemvTuning, ParsesSettingsAndRefusesOthers) {
  EXPECT_EQ(ops::parse_gemv_tuning(""), ops::GemvTuning{});
  EXPECT_EQ(ops::parse_gemv_tuning("default"), ops::GemvTuning{});
  const ops::GemvTuning t = ops::parse_gemv_tuning("warps=4,ahead=8,prefetch=tile");
  EXPECT_EQ(t.warps, 4);
  EXPECT_EQ(t.ahead, 8);
  EXPECT_EQ(t.prefetch, ops::GemvPrefetch::tile);
  EXPECT_EQ(ops::parse_gemv_tuning("ahead=8"), (ops::GemvTuning{.warps = 0, .ahead = 8}));
  EXPECT_EQ(ops::parse_gemv_tuning(ops::gemv_tuning_name(t)), t);
  for (const char* bad : {"warps=5", "ahead=2", "prefetch=all", "speed=9", "warps", "warps=8,,ahead=4"}) {
    try {
      ops::parse_gemv_tuning(bad);
      ADD_FAILURE() << "'" << bad << "' was taken";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace hydra::test
