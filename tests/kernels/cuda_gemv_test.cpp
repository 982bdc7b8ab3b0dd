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
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "kernels/gemv/gemv.h"
#include "kernels/matmul/matmul.h"
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
void check_shape(const GemvShape& s, int64_t m, uint64_t seed) {
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
    const std::string what = fmt::format("{} [{}, {}] at {} rows{}", s.what, s.n, s.k, m, adds ? ", adding" : "");
    Tensor ref = clone(old.view().narrow(1, 0, s.n));
    ops::gemv(ref, x, w, acc);
    Tensor first = gpu(old), second = gpu(old), by_cublas = gpu(old);
    ops::gemv(first.view().narrow(1, 0, s.n), dx, dw, acc);
    ops::gemv(second.view().narrow(1, 0, s.n), dx, dw, acc);
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

}  // namespace
}  // namespace hydra::test
