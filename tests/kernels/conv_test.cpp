// Causal depthwise conv + SiLU against a loop; the halo prefix makes a split sequence equal the
// unsplit one. Tolerance 1e-6: K multiply-adds in fp32.
#include <cmath>

#include <fmt/format.h>

#include "kernels/conv/conv.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

struct ConvCase {
  int64_t t, c, k;
};
class Conv : public ::testing::TestWithParam<ConvCase> {};
INSTANTIATE_TEST_SUITE_P(Shapes, Conv,
                         ::testing::Values(ConvCase{1, 1, 4}, ConvCase{2, 5, 4}, ConvCase{37, 48, 4}, ConvCase{20, 7, 1},
                                           ConvCase{33, 16, 3}),
                         [](const auto& info) {
                           return fmt::format("T{}_C{}_K{}", info.param.t, info.param.c, info.param.k);
                         });

TEST_P(Conv, MatchesLoopAndSplitsWithHalo) {
  const auto [t, c, k] = GetParam();
  Tensor x = random_tensor({t, c}, 1), w = random_tensor({c, k}, 2), out = Tensor::empty({t, c}, DType::f32);
  Tensor ref = Tensor::empty({t, c}, DType::f32);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t ch = 0; ch < c; ++ch) {
      double acc = 0;
      for (int64_t m = 0; m < k; ++m) {
        const int64_t src = i - k + 1 + m;
        if (src >= 0) acc += static_cast<double>(w.data_as<float>()[ch * k + m]) * x.data_as<float>()[src * c + ch];
      }
      ref.data_as<float>()[i * c + ch] = static_cast<float>(acc / (1 + std::exp(-acc)));
    }
  ops::causal_conv_silu(out, x, w, TensorView());
  expect_close(out, ref, 1e-6, "conv");
  if (t > k) {
    const int64_t split = t / 2 >= k - 1 ? t / 2 : k - 1;
    Tensor parts = Tensor::empty({t, c}, DType::f32);
    ops::causal_conv_silu(parts.view().narrow(0, 0, split), x.view().narrow(0, 0, split), w, TensorView());
    const TensorView halo = k > 1 ? x.view().narrow(0, split - (k - 1), k - 1) : TensorView();
    ops::causal_conv_silu(parts.view().narrow(0, split, t - split), x.view().narrow(0, split, t - split), w, halo);
    expect_close(parts, ref, 1e-6, "conv split with halo");
  }
}

}  // namespace
}  // namespace hydra::test
