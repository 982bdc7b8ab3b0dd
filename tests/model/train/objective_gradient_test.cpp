// The align and distill objectives' gradients (model/train/objective.h) held to central finite
// differences of the same losses in float64, on a tiny HydraHead student (mixed FA/GDN layers) with a
// tiny Qwen3 teacher of the same shape. Before this, these objectives were only checked by "the loss
// goes down".
//  - align: L = Σ_l Σ_t ‖y_s,l(t) − y_t,l(t)‖² / D, scaled by 1/T; every layer's backward stops at
//    its input, so each student layer's weights see only their own layer's term.
//  - distill: KL(p_teacher ‖ p_student) over the counted rows, scaled by 1/count; through
//    distillation_head (the chunked KL head) and the whole student backward; and the head alone
//    (distillation_head's d_hidden and lm_head gradient on given hidden states).
// Tolerance: finite_differences.h. The align head passes its scale as float (grad_scale / D): ≈ 6e-8
// relative, inside the tolerance.
#include <cmath>

#include "model/model.h"
#include "model/params.h"
#include "model/train/objective.h"
#include "parallel/layout.h"
#include "parallel/self_communicator.h"
#include "runtime/random.h"
#include "tests/common/test_util.h"
#include "tests/model/train/finite_differences.h"

namespace hydra::test {
namespace {

class ObjectiveGradient : public ::testing::Test {
 protected:
  static constexpr int64_t kTokens = 24;
  ObjectiveGradient()
      : student_config_(preset_config("hydrahead-tiny")),
        teacher_(preset_config("qwen3-tiny"), f64_parameters(preset_config("qwen3-tiny"), 21), Device::host, DType::f64),
        params_(f64_parameters(student_config_, 22)),
        ids_(sequence(kTokens, student_config_.vocab_size)),
        layout_(SequenceLayout::zigzag(kTokens, 1, 0)),
        rows_(layout_.token_rows(ids_)) {}

  // The mean loss and (with grads) its gradient in checkpoint names.
  enum class Which { align, distill };
  double mean_loss(Which which, const NamedTensors& params, NamedTensors* grads_out = nullptr) const {
    const Model student(student_config_, params, Device::host, DType::f64);
    SelfCommunicator self;
    ForwardContext context{self, layout_};
    ModelTensors grads = student.zeros_like_weights(DType::f64);
    ModelTensors* g = grads_out ? &grads : nullptr;
    train::LossSums sums;
    if (which == Which::align) {
      sums = train::alignment_gradients(context, student, teacher_, rows_.ids, 1.0 / kTokens, g);
      EXPECT_EQ(sums.tokens, kTokens);
    } else {
      sums = train::sequence_gradients(context, student, rows_, train::Objective::distillation,
                                       1.0 / (kTokens - 1), g, &teacher_);
      EXPECT_EQ(sums.tokens, kTokens - 1);  // the last token has no target
    }
    if (grads_out) *grads_out = student.unpack(grads);
    return sums.loss / static_cast<double>(sums.tokens);
  }

  void check_against_finite_differences(Which which, const std::vector<std::string>& names) const {
    NamedTensors grads;
    const double loss = mean_loss(which, params_, &grads);
    ASSERT_TRUE(std::isfinite(loss));
    ASSERT_GT(loss, 0.0);
    expect_gradients_match_finite_differences(params_, grads, names, 2, RandomStream{31, 4},
                                              [&](const NamedTensors& p) { return mean_loss(which, p); });
  }

  ModelConfig student_config_;
  Model teacher_;
  NamedTensors params_;
  std::vector<int32_t> ids_;
  SequenceLayout layout_;
  TokenRows rows_;
};

TEST_F(ObjectiveGradient, AlignMatchesFiniteDifferences) {
  // The attention block of both layers (GDN gates and conv, the fused projections, FA's gate and q/k
  // norm, the fusion's γ, W_o) and the MLP and norms, which the per-layer output also depends on.
  check_against_finite_differences(
      Which::align, {"model.layers.0.self_attn.gdn_A_log", "model.layers.0.self_attn.gdn_k_conv.weight",
                     "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.fa_gate_proj.weight",
                     "model.layers.0.self_attn.o_proj.weight", "model.layers.1.mlp.down_proj.weight",
                     "model.layers.0.post_attention_layernorm.weight"});
}

TEST_F(ObjectiveGradient, AlignStopsEveryLayerAtItsInput) {
  // Layer l's student input is the teacher's: the student's embedding and final norm do not enter the
  // loss, and their gradient is exactly zero.
  NamedTensors grads;
  mean_loss(Which::align, params_, &grads);
  for (const char* name : {"model.embed_tokens.weight", "model.norm.weight"}) {
    const Tensor& g = grads.at(name);
    for (int64_t i = 0; i < g.numel(); ++i) ASSERT_EQ(g.data_as<double>()[i], 0.0) << name << "[" << i << "]";
  }
}

TEST_F(ObjectiveGradient, DistillMatchesFiniteDifferences) {
  check_against_finite_differences(
      Which::distill, {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.gdn_A_log",
                       "model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.down_proj.weight",
                       "model.layers.1.self_attn.fa_gate_proj.weight"});
}

// distillation_head alone: d_hidden and lm_head's (here the tied embedding's or lm_head's) gradient
// against finite differences of the summed KL on given hidden states, with an uncounted row.
TEST_F(ObjectiveGradient, DistillationHeadMatchesFiniteDifferences) {
  const Model student(student_config_, params_, Device::host, DType::f64);
  const int64_t t = 9, D = student_config_.hidden_size;
  const Tensor hidden = to(random_tensor({t, D}, 41), Device::host, DType::f64);
  const Tensor teacher_hidden = to(random_tensor({t, D}, 42), Device::host, DType::f64);
  Tensor targets = Tensor::empty({t}, DType::i32);
  for (int64_t i = 0; i < t; ++i) targets.data_as<int32_t>()[i] = i == 4 ? -1 : static_cast<int32_t>(i);
  const double scale = 0.25;
  auto kl_sum = [&](const Tensor& h) {
    ModelTensors none;  // no parameter gradient: the loss only
    return train::distillation_head(student, teacher_, h, teacher_hidden, targets, scale, TensorView(), none).loss;
  };
  Tensor d_hidden = Tensor::empty({t, D}, DType::f64);
  ModelTensors grads = student.zeros_like_weights(DType::f64);
  const train::LossSums sums =
      train::distillation_head(student, teacher_, hidden, teacher_hidden, targets, scale, d_hidden, grads);
  EXPECT_EQ(sums.tokens, t - 1);
  EXPECT_NEAR(sums.loss, kl_sum(hidden), 1e-12 * std::abs(sums.loss));
  const double h = 1e-5;
  double top = 0;
  for (int64_t i = 0; i < t * D; ++i) top = std::max(top, std::abs(d_hidden.data_as<double>()[i]));
  ASSERT_GT(top, 0.0);
  for (int64_t i = 0; i < t * D; i += 7) {
    Tensor plus = clone(hidden), minus = clone(hidden);
    plus.data_as<double>()[i] += h;
    minus.data_as<double>()[i] -= h;
    const double fd = scale * (kl_sum(plus) - kl_sum(minus)) / (2 * h);
    EXPECT_NEAR(d_hidden.data_as<double>()[i], fd, 1e-6 * top) << "d_hidden[" << i << "]";
    if (i / D == 4) {
      EXPECT_EQ(d_hidden.data_as<double>()[i], 0.0) << "an uncounted row has no gradient";
    }
  }
  // The output projection's gradient, in checkpoint names (lm_head, or the tied embedding).
  const std::string head = student_config_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  expect_gradients_match_finite_differences(
      params_, student.unpack(grads), {head}, 6, RandomStream{43, 1}, [&](const NamedTensors& p) {
        const Model perturbed(student_config_, p, Device::host, DType::f64);
        ModelTensors none;  // no parameter gradient: the loss only
        return scale * train::distillation_head(perturbed, teacher_, hidden, teacher_hidden, targets, scale,
                                                TensorView(), none).loss;
      });
}

}  // namespace
}  // namespace hydra::test
