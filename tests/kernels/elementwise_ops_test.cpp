// CPU ops against plain-loop fp64 references, over odd shapes. Tolerance 1e-5 relative: fp32
// arithmetic (with fp64 or fp32 sums) against fp64 loops lands near 1e-7; 1e-5 leaves room for
// the exp/log of the activations without hiding an indexing error (those are O(1)).
#include <cmath>

#include <fmt/format.h>

#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/fusion/fusion.h"
#include "kernels/gdn_gates/gdn_gates.h"
#include "kernels/l2norm/l2norm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/row_sum/row_sum.h"
#include "kernels/softmax/softmax.h"
#include "kernels/swiglu/swiglu.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

constexpr double kTol = 1e-5;

struct Shape2 {
  int64_t rows, cols;
};
class RowOps : public ::testing::TestWithParam<Shape2> {};
INSTANTIATE_TEST_SUITE_P(OddShapes, RowOps,
                         ::testing::Values(Shape2{1, 1}, Shape2{3, 7}, Shape2{17, 64}, Shape2{5, 129}, Shape2{64, 33}),
                         [](const auto& info) {
                           return std::to_string(info.param.rows) + "x" + std::to_string(info.param.cols);
                         });

TEST_P(RowOps, RmsNorm) {
  const auto [n, c] = GetParam();
  Tensor x = random_tensor({n, c}, 1, 3.0f), w = random_tensor({c}, 2), out = Tensor::empty({n, c}, DType::f32);
  ops::rms_norm(out, x, w, {1e-6f});
  Tensor ref = Tensor::empty({n, c}, DType::f32);
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t j = 0; j < c; ++j) ss += std::pow(x.data_as<float>()[i * c + j], 2);
    const double inv = 1.0 / std::sqrt(ss / c + 1e-6);
    for (int64_t j = 0; j < c; ++j) ref.data_as<float>()[i * c + j] = static_cast<float>(w.data_as<float>()[j] * x.data_as<float>()[i * c + j] * inv);
  }
  expect_close(out, ref, kTol, "rms_norm");
  ops::rms_norm(x, x, w, {1e-6f});  // in place
  expect_close(x, ref, kTol, "rms_norm in place");
}

TEST_P(RowOps, SwiGluOnColumnBlocks) {
  const auto [n, c] = GetParam();
  Tensor gu = random_tensor({n, 2 * c}, 3, 2.0f), out = Tensor::empty({n, c}, DType::f32);
  ops::swiglu(out, gu.view().narrow(1, 0, c), gu.view().narrow(1, c, c));
  Tensor ref = Tensor::empty({n, c}, DType::f32);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < c; ++j) {
      const double g = gu.data_as<float>()[i * 2 * c + j], u = gu.data_as<float>()[i * 2 * c + c + j];
      ref.data_as<float>()[i * c + j] = static_cast<float>(g / (1 + std::exp(-g)) * u);
    }
  expect_close(out, ref, kTol, "swiglu");
}

TEST_P(RowOps, LogSoftmaxAndCrossEntropy) {
  const auto [n, c] = GetParam();
  Tensor logits = random_tensor({n, c}, 4, 5.0f), out = Tensor::empty({n, c}, DType::f32);
  ops::log_softmax(out, logits);
  Tensor ref = Tensor::empty({n, c}, DType::f32), targets = Tensor::empty({n}, DType::i32);
  Tensor nll = Tensor::empty({n}, DType::f32), nll_ref = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int64_t j = 0; j < c; ++j) s += std::exp(static_cast<double>(logits.data_as<float>()[i * c + j]));
    for (int64_t j = 0; j < c; ++j) ref.data_as<float>()[i * c + j] = static_cast<float>(logits.data_as<float>()[i * c + j] - std::log(s));
    targets.data_as<int32_t>()[i] = static_cast<int32_t>((i * 7 + 3) % c);
    nll_ref.data_as<float>()[i] = -ref.data_as<float>()[i * c + targets.data_as<int32_t>()[i]];
  }
  expect_close(out, ref, kTol, "log_softmax");
  ops::cross_entropy(nll, logits, targets);
  expect_close(nll, nll_ref, kTol, "cross_entropy");
}

TEST_P(RowOps, AddAndSigmoidGate) {
  const auto [n, c] = GetParam();
  Tensor x = random_tensor({n, c}, 5), y = random_tensor({n, c}, 6), g = random_tensor({n, c}, 7, 3.0f);
  Tensor ref = Tensor::empty({n, c}, DType::f32);
  for (int64_t i = 0; i < n * c; ++i) {
    const double a = x.data_as<float>()[i] + static_cast<double>(y.data_as<float>()[i]);
    ref.data_as<float>()[i] = static_cast<float>(a / (1 + std::exp(-static_cast<double>(g.data_as<float>()[i]))));
  }
  ops::add_inplace(x, y);
  Tensor gated = Tensor::empty({n, c}, DType::f32);
  ops::sigmoid_gate(gated, x, g);
  expect_close(gated, ref, kTol, "add + sigmoid gate");
  ops::sigmoid_gate(x, x, g);  // in place
  expect_close(x, ref, kTol, "sigmoid gate in place");
}

TEST(Embedding, GathersRows) {
  Tensor table = random_tensor({11, 5}, 8), ids = Tensor::empty({6}, DType::i32), out = Tensor::empty({6, 5}, DType::f32);
  const int32_t chosen[6] = {0, 10, 3, 3, 7, 1};
  std::copy(chosen, chosen + 6, ids.data_as<int32_t>());
  ops::embedding(out, table, ids);
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 5; ++j) EXPECT_EQ(out.data_as<float>()[i * 5 + j], table.data_as<float>()[chosen[i] * 5 + j]);
}

// The sums a training step's loss head keeps on the device: added to what the accumulator holds,
// the rows one after the other in fp64 (the order of the former host sum), the marked rows apart.
TEST(RowSums, AddTheRowsInOrderAndTheMarkedOnesApart) {
  const Tensor values = random_tensor({37}, 4, 3.0f);
  Tensor marks = Tensor::zeros({37}, DType::i32), sums = Tensor::empty({2}, DType::f64);
  for (int i = 0; i < 37; i += 3) marks.data_as<int32_t>()[i] = 1;
  sums.data_as<double>()[0] = 0.5;
  sums.data_as<double>()[1] = -0.25;
  double all = 0.5, marked = -0.25;
  for (int i = 0; i < 37; ++i) {
    const double v = values.data_as<float>()[i];
    all += v;
    if (i % 3 == 0) marked += v;
  }
  ops::add_row_sums(sums, values, marks);
  EXPECT_EQ(sums.data_as<double>()[0], all);  // the same additions in the same order: the same bits
  EXPECT_EQ(sums.data_as<double>()[1], marked);
  ops::add_row_sums(sums, values.view().narrow(0, 0, 5));  // no marks: the second sum stays
  for (int i = 0; i < 5; ++i) all += values.data_as<float>()[i];
  EXPECT_EQ(sums.data_as<double>()[0], all);
  EXPECT_EQ(sums.data_as<double>()[1], marked);
}

struct HeadShape {
  int64_t t, h, d;
};
class HeadOps : public ::testing::TestWithParam<HeadShape> {};
INSTANTIATE_TEST_SUITE_P(OddShapes, HeadOps,
                         ::testing::Values(HeadShape{1, 1, 2}, HeadShape{9, 3, 16}, HeadShape{13, 2, 128}, HeadShape{5, 7, 6}),
                         [](const auto& info) {
                           return fmt::format("T{}_H{}_d{}", info.param.t, info.param.h, info.param.d);
                         });

TEST_P(HeadOps, RopeRotateHalfAtLargePositions) {
  const auto [t, h, d] = GetParam();
  Tensor x = random_tensor({t, h, d}, 9), ref = clone(x), pos = Tensor::empty({t}, DType::i64);
  for (int64_t i = 0; i < t; ++i) pos.data_as<int64_t>()[i] = i * 37 + (i % 2 ? 524287 : 0);
  const double theta = 1e6;
  for (int64_t i = 0; i < t; ++i)
    for (int64_t k = 0; k < h; ++k)
      for (int64_t j = 0; j < d / 2; ++j) {
        const double ang = pos.data_as<int64_t>()[i] * std::pow(theta, -2.0 * j / d);
        const double a = x.data_as<float>()[(i * h + k) * d + j], b = x.data_as<float>()[(i * h + k) * d + j + d / 2];
        ref.data_as<float>()[(i * h + k) * d + j] = static_cast<float>(a * std::cos(ang) - b * std::sin(ang));
        ref.data_as<float>()[(i * h + k) * d + j + d / 2] = static_cast<float>(b * std::cos(ang) + a * std::sin(ang));
      }
  ops::rope(x, pos, {theta});
  expect_close(x, ref, kTol, "rope");
}

TEST_P(HeadOps, L2NormAndPerHeadRmsNormOnStridedHeads) {
  const auto [t, h, d] = GetParam();
  // Heads are a column block of a wider matrix, as in the fused projection.
  Tensor wide = random_tensor({t, (h + 2) * d}, 10, 2.0f);
  const TensorView x = wide.view().narrow(1, d, h * d).split_dim(1, h, d);
  Tensor copy = clone(x), ref_l2 = clone(x), ref_rms = clone(x), w = random_tensor({d}, 11);
  for (int64_t r = 0; r < t * h; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += std::pow(copy.data_as<float>()[r * d + j], 2);
    for (int64_t j = 0; j < d; ++j) {
      ref_l2.data_as<float>()[r * d + j] = static_cast<float>(copy.data_as<float>()[r * d + j] / std::sqrt(ss + 1e-6));
      ref_rms.data_as<float>()[r * d + j] =
          static_cast<float>(w.data_as<float>()[j] * copy.data_as<float>()[r * d + j] / std::sqrt(ss / d + 1e-6));
    }
  }
  Tensor untouched = clone(wide.view().narrow(1, 0, d));
  ops::rms_norm(copy, copy, w, {1e-6f});
  expect_close(copy, ref_rms, kTol, "per-head rms_norm");
  ops::l2_norm(x, 1e-6f);
  expect_close(x, ref_l2, kTol, "l2_norm");
  expect_close(wide.view().narrow(1, 0, d), untouched, 0.0, "columns outside the head block");
}

// Every fusion variant against its formula (kernels/fusion/fusion.h), the gate's logits a column
// slice of a wider matrix.
TEST_P(HeadOps, HeadFusionVariants) {
  const auto [t, h, d] = GetParam();
  Tensor o = random_tensor({t, h, d}, 12, 4.0f), w = random_tensor({h, d}, 13), gamma = random_tensor({h}, 14);
  Tensor wide = random_tensor({t, h + 3}, 15, 2.0f), bias = random_tensor({h}, 16);
  const TensorView s = wide.view().narrow(1, 1, h);
  for (const ops::Fusion fusion : ops::kFusions) {
    const bool norm = ops::fusion_has_norm(fusion), scaled = ops::fusion_has_gamma(fusion);
    const bool gated = ops::fusion_has_gate(fusion);
    Tensor y = Tensor::empty({t, h, d}, DType::f32), ref = Tensor::empty({t, h, d}, DType::f32);
    for (int64_t i = 0; i < t; ++i)
      for (int64_t k = 0; k < h; ++k) {
        const float* x = o.data_as<float>() + (i * h + k) * d;
        double ss = 0;
        for (int64_t j = 0; j < d; ++j) ss += static_cast<double>(x[j]) * x[j];
        const double logit = static_cast<double>(*static_cast<const float*>(s.element_ptr({i, k}))) + bias.data_as<float>()[k];
        const double c = (scaled ? gamma.data_as<float>()[k] : 1.0) * (gated ? 2.0 / (1.0 + std::exp(-logit)) : 1.0);
        for (int64_t j = 0; j < d; ++j) {
          const double n = norm ? w.data_as<float>()[k * d + j] * x[j] / std::sqrt(ss / d + 1e-6) : x[j];
          ref.data_as<float>()[(i * h + k) * d + j] = static_cast<float>(c * n);
        }
      }
    ops::FusionTensors p;
    if (norm) p.weight = w.view();
    if (scaled) p.gamma = gamma.view();
    if (gated) {
      p.gate = s;
      p.gate_bias = bias.view();
    }
    ops::head_fusion(y, o, p, {1e-6f, fusion});
    expect_close(y, ref, kTol, std::string("head_fusion ") + ops::fusion_name(fusion));
  }
}

TEST(HeadFusion, NamesRoundTripAndUnknownNameIsAUserError) {
  for (const ops::Fusion f : ops::kFusions) EXPECT_EQ(ops::fusion_from_name(ops::fusion_name(f), "test"), f);
  try {
    ops::fusion_from_name("gated", "--fusion");
    FAIL() << "an unknown fusion name was accepted";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()), "--fusion: unknown fusion 'gated' (expected scale_norm, norm, scale, concat or gate)");
  }
}

TEST(GdnGates, MatchFormula) {
  const int64_t t = 19, h = 5;
  Tensor a = random_tensor({t, h}, 15, 10.0f), b = random_tensor({t, h}, 16, 3.0f);
  Tensor alog = uniform_tensor({h}, 17, 0.0f, 2.8f), dtb = random_tensor({h}, 18);
  Tensor beta = Tensor::empty({t, h}, DType::f32), g = Tensor::empty({t, h}, DType::f32);
  Tensor beta_ref = Tensor::empty({t, h}, DType::f32), g_ref = Tensor::empty({t, h}, DType::f32);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t k = 0; k < h; ++k) {
      const double x = a.data_as<float>()[i * h + k] + static_cast<double>(dtb.data_as<float>()[k]);
      const double sp = x > 20 ? x : std::log1p(std::exp(x));
      g_ref.data_as<float>()[i * h + k] = static_cast<float>(-std::exp(static_cast<double>(alog.data_as<float>()[k])) * sp);
      beta_ref.data_as<float>()[i * h + k] = static_cast<float>(1 / (1 + std::exp(-static_cast<double>(b.data_as<float>()[i * h + k]))));
    }
  ops::gdn_gates(beta, g, b, a, alog, dtb);
  expect_close(beta, beta_ref, kTol, "beta");
  expect_close(g, g_ref, kTol, "g");
  for (int64_t i = 0; i < t * h; ++i) EXPECT_LE(g.data_as<float>()[i], 0.0f);
}

}  // namespace
}  // namespace hydra::test
