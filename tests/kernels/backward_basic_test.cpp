// Float64 gradient checks (gradcheck.h) of the token-local ops: the sigmoid output gate, SwiGLU,
// the embedding, RMSNorm ([N, n] and per-head [N, H, n], accumulate flags), RoPE (inverse
// direction) and the linear layer (accumulate flags, undefined outputs skipped).
#include <cmath>

#include <fmt/format.h>

#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/matmul/matmul.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/swiglu/swiglu.h"
#include "tests/common/test_util.h"
#include "tests/kernels/gradcheck.h"

namespace hydra::test {
namespace {

Tensor empty64(std::span<const int64_t> shape) { return Tensor::empty(shape, DType::f64); }
Tensor zeros64(std::span<const int64_t> shape) { return Tensor::zeros(shape, DType::f64); }

TEST(Backward, SigmoidGate) {
  Tensor x = random64({5, 7}, 1), gate = random64({5, 7}, 2, 2.0), r = random64({5, 7}, 3);
  auto loss = [&] {
    Tensor out = empty64(x.shape());
    ops::sigmoid_gate(out, x, gate);
    return weighted_sum(out, r);
  };
  Tensor dx = empty64(x.shape()), dgate = empty64(x.shape());
  ops::sigmoid_gate_backward(dx, dgate, r, x, gate);
  expect_gradient(dx, x, loss, "sigmoid_gate dx");
  expect_gradient(dgate, gate, loss, "sigmoid_gate d_gate");
}

TEST(Backward, SwiGLU) {
  Tensor gate = random64({6, 9}, 4, 2.0), up = random64({6, 9}, 5), r = random64({6, 9}, 6);
  auto loss = [&] {
    Tensor out = empty64(gate.shape());
    ops::swiglu(out, gate, up);
    return weighted_sum(out, r);
  };
  Tensor dgate = empty64(gate.shape()), dup = empty64(gate.shape());
  ops::swiglu_backward(dgate, dup, r, gate, up);
  expect_gradient(dgate, gate, loss, "swiglu d_gate");
  expect_gradient(dup, up, loss, "swiglu d_up");
  // In place over gate and up (the fused projection's buffers) gives the same values.
  Tensor g2 = clone(gate), u2 = clone(up);
  ops::swiglu_backward(g2, u2, r, g2, u2);
  EXPECT_EQ(relative_error(g2, dgate), 0.0);
  EXPECT_EQ(relative_error(u2, dup), 0.0);
}

TEST(Backward, EmbeddingScattersAndSumsRepeatedIds) {
  const int64_t vocab = 7, dim = 5;
  Tensor table = random64({vocab, dim}, 7);
  Tensor ids = Tensor::empty({9}, DType::i32);
  const int32_t id_values[] = {3, 0, 3, 6, 1, 3, 0, 5, 6};  // 2 and 4 unused, 3 three times
  std::copy(std::begin(id_values), std::end(id_values), ids.data_as<int32_t>());
  Tensor r = random64({9, dim}, 8);
  auto loss = [&] {
    Tensor out = empty64(std::array<int64_t, 2>{9, dim});
    ops::embedding(out, table, ids);
    return weighted_sum(out, r);
  };
  Tensor d_table = zeros64(table.shape());
  ops::embedding_backward(d_table, r, ids);
  // Unused rows have a zero gradient: check the used ones by finite differences, the rest exactly.
  for (int64_t row : {2, 4}) EXPECT_EQ(max_abs(d_table.view().select(0, row)), 0.0) << "row " << row;
  expect_gradient(d_table, table, loss, "embedding d_table", kGradientTolerance);
  // It accumulates: a second call doubles the gradient.
  Tensor twice = clone(d_table);
  ops::embedding_backward(twice, r, ids);
  for (int64_t i = 0; i < twice.numel(); ++i) EXPECT_EQ(twice.data_as<double>()[i], 2 * d_table.data_as<double>()[i]);
}

struct NormCase {
  std::vector<int64_t> shape;  // [N, n] or [N, H, n]
};
class RmsNormBackward : public ::testing::TestWithParam<NormCase> {};
INSTANTIATE_TEST_SUITE_P(Shapes, RmsNormBackward,
                         ::testing::Values(NormCase{{5, 12}}, NormCase{{1, 3}}, NormCase{{4, 3, 8}}),
                         [](const auto& info) {
                           std::string s = "N";
                           for (int64_t d : info.param.shape) s += fmt::format("_{}", d);
                           return s;
                         });

TEST_P(RmsNormBackward, MatchesFiniteDifferences) {
  const std::vector<int64_t>& shape = GetParam().shape;
  const int64_t n = shape.back();
  Tensor x = to(random_tensor(shape, 10), Device::host, DType::f64);
  Tensor w = uniform64({n}, 11, 0.5, 1.5), r = to(random_tensor(shape, 12), Device::host, DType::f64);
  const ops::RmsNormParams params{.eps = 1e-3f};  // large enough to matter in the gradient
  auto loss = [&] {
    Tensor out = empty64(shape);
    ops::rms_norm(out, x, w, params);
    return weighted_sum(out, r);
  };
  Tensor dx = empty64(shape), dw = zeros64(w.shape());
  ops::rms_norm_backward(dx, dw, r, x, w, params);
  expect_gradient(dx, x, loss, "rms_norm dx " + x.shape_string());
  expect_gradient(dw, w, loss, "rms_norm d_weight " + x.shape_string());

  // Accumulate: dx += grad, d_weight += grad; dx may alias dy when overwriting.
  Tensor base = to(random_tensor(shape, 13), Device::host, DType::f64), acc = clone(base), dw2 = clone(dw);
  ops::rms_norm_backward(acc, dw2, r, x, w, params, ops::Accumulate::yes);
  for (int64_t i = 0; i < acc.numel(); ++i) {
    EXPECT_NEAR(acc.data_as<double>()[i], base.data_as<double>()[i] + dx.data_as<double>()[i], 1e-14);
  }
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(dw2.data_as<double>()[i], 2 * dw.data_as<double>()[i], 1e-13);
  Tensor in_place = clone(r);
  ops::rms_norm_backward(in_place, Tensor(), in_place, x, w, params);
  EXPECT_EQ(relative_error(in_place, dx), 0.0);
}

TEST(Backward, RopeInverseIsTheTransposeAndTheGradient) {
  const int64_t t = 5, h = 2, d = 8;
  Tensor x = random64({t, h, d}, 14), r = random64({t, h, d}, 15);
  Tensor pos = Tensor::empty({t}, DType::i64);
  const int64_t positions[] = {0, 1, 37, 4096, 524289};
  std::copy(std::begin(positions), std::end(positions), pos.data_as<int64_t>());
  const ops::RopeParams fwd{.theta = 1e6};
  auto loss = [&] {
    Tensor y = clone(x);
    ops::rope(y, pos, fwd);
    return weighted_sum(y, r);
  };
  Tensor dx = clone(r);
  ops::rope(dx, pos, {.theta = 1e6, .direction = ops::RopeDirection::inverse});
  expect_gradient(dx, x, loss, "rope dx (inverse rotation of dy)");
  // Forward then inverse is the identity (to rounding).
  Tensor y = clone(x);
  ops::rope(y, pos, fwd);
  EXPECT_GT(relative_error(y, x), 1e-2);  // the rotation did something
  ops::rope(y, pos, {.theta = 1e6, .direction = ops::RopeDirection::inverse});
  EXPECT_LE(relative_error(y, x), 1e-15);
}

TEST(Backward, Linear) {
  const int64_t m = 5, k = 7, n = 4;
  Tensor x = random64({m, k}, 16), w = random64({n, k}, 17), r = random64({m, n}, 18);
  auto loss = [&] {
    Tensor y = empty64(std::array<int64_t, 2>{m, n});
    ops::linear(y, x, w);
    return weighted_sum(y, r);
  };
  Tensor dx = empty64(x.shape()), dw = zeros64(w.shape());
  ops::linear_backward(dx, dw, r, x, w);
  expect_gradient(dx, x, loss, "linear dx");
  expect_gradient(dw, w, loss, "linear dw");
  // dx accumulates on request, dw always; an undefined output is skipped.
  Tensor base = random64({m, k}, 19), acc = clone(base), dw2 = clone(dw);
  ops::linear_backward(acc, Tensor(), r, x, w, ops::Accumulate::yes);
  ops::linear_backward(Tensor(), dw2, r, x, w);
  for (int64_t i = 0; i < acc.numel(); ++i) {
    EXPECT_NEAR(acc.data_as<double>()[i], base.data_as<double>()[i] + dx.data_as<double>()[i], 1e-14);
  }
  for (int64_t i = 0; i < dw.numel(); ++i) EXPECT_NEAR(dw2.data_as<double>()[i], 2 * dw.data_as<double>()[i], 1e-14);
}

}  // namespace
}  // namespace hydra::test
