// GEMM against fp64 loops: transposes, strided operands (column blocks), accumulation, K = 0.
// Tolerance 1e-5: fp32 GEMM with K ≤ 300 accumulates ~K·2⁻²⁴ relative error at worst.
#include "kernels/matmul/matmul.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

struct GemmCase {
  int64_t m, n, k;
  bool ta, tb;
};
class Gemm : public ::testing::TestWithParam<GemmCase> {};
INSTANTIATE_TEST_SUITE_P(Shapes, Gemm,
                         ::testing::Values(GemmCase{1, 1, 1, false, false}, GemmCase{7, 5, 3, false, true},
                                           GemmCase{33, 17, 65, true, false}, GemmCase{64, 64, 64, true, true},
                                           GemmCase{3, 129, 300, false, true}),
                         [](const auto& info) {
                           const GemmCase& c = info.param;
                           return std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
                                  (c.ta ? "_ta" : "") + (c.tb ? "_tb" : "");
                         });

double at(const TensorView& m, int64_t i, int64_t j) { return *static_cast<const float*>(m.element_ptr({i, j})); }

TEST_P(Gemm, MatchesLoopsWithBetaAndStrides) {
  const auto [m, n, k, ta, tb] = GetParam();
  // Operands live inside wider buffers so leading dimensions differ from widths.
  Tensor abuf = random_tensor({ta ? k : m, (ta ? m : k) + 3}, 1), bbuf = random_tensor({tb ? n : k, (tb ? k : n) + 5}, 2);
  const TensorView a = abuf.view().narrow(1, 2, ta ? m : k), b = bbuf.view().narrow(1, 1, tb ? k : n);
  Tensor cbuf = random_tensor({m, n + 4}, 3);
  const TensorView c = cbuf.view().narrow(1, 4, n);
  Tensor ref = Tensor::empty({m, n}, DType::f32);
  const float alpha = 0.75f, beta = -1.5f;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += (ta ? at(a, p, i) : at(a, i, p)) * (tb ? at(b, j, p) : at(b, p, j));
      ref.data_as<float>()[i * n + j] = static_cast<float>(alpha * s + beta * at(c, i, j));
    }
  Tensor untouched = clone(cbuf.view().narrow(1, 0, 4));
  ops::gemm(c, a, b, {ta ? ops::Transpose::yes : ops::Transpose::no, tb ? ops::Transpose::yes : ops::Transpose::no, alpha, beta});
  expect_close(c, ref, 1e-5, "gemm");
  expect_close(cbuf.view().narrow(1, 0, 4), untouched, 0.0, "columns left of the output block");
}

TEST(Linear, AccumulatesIntoOutput) {
  Tensor x = random_tensor({9, 20}, 4), w = random_tensor({6, 20}, 5), y = random_tensor({9, 6}, 6);
  Tensor ref = clone(y);
  for (int64_t i = 0; i < 9; ++i)
    for (int64_t j = 0; j < 6; ++j) {
      double s = 0;
      for (int64_t p = 0; p < 20; ++p) s += static_cast<double>(x.data_as<float>()[i * 20 + p]) * w.data_as<float>()[j * 20 + p];
      ref.data_as<float>()[i * 6 + j] += static_cast<float>(s);
    }
  ops::linear(y, x, w, ops::Accumulate::yes);
  expect_close(y, ref, 1e-5, "linear accumulate");
}

TEST(Gemm, EmptyInnerDimensionClearsOutput) {
  Tensor a = Tensor::empty({4, 0}, DType::f32), b = Tensor::empty({0, 3}, DType::f32), c = random_tensor({4, 3}, 7);
  ops::gemm(c, a, b, {});
  for (int64_t i = 0; i < 12; ++i) EXPECT_EQ(c.data_as<float>()[i], 0.0f);
}

}  // namespace
}  // namespace hydra::test
