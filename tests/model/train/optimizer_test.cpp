// The optimizer's schedule and groups (model/train/optimizer.h, DESIGN.md §1.5): the learning rate of
// every step (linear warmup, cosine to min_lr, clamped after the last step; a constant rate is
// min_lr = lr), and which parameters take weight decay, seen through one AdamW step on a tiny
// HydraHead model with zero gradients — Adam's part of the update is then exactly zero, so a decayed
// parameter becomes w·(1 − lr·wd) and any other stays bit-identical. The expected groups are spelled
// out here by name, independently of model/weight_layout.cpp's list.
#include <cmath>
#include <numbers>

#include "model/model.h"
#include "model/params.h"
#include "model/train/optimizer.h"
#include "model/weight_layout.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

using train::learning_rate;
using train::OptimizerConfig;

TEST(LearningRate, WarmsUpLinearlyThenFollowsTheCosineToMinLr) {
  const OptimizerConfig c{.lr = 1e-3, .min_lr = 1e-4, .warmup = 10, .total_steps = 110};
  // Warmup: lr·s/warmup, the peak exactly at the last warmup step.
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 1e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 5), 5e-4);
  EXPECT_DOUBLE_EQ(learning_rate(c, 10), 1e-3);
  // Cosine over the 100 steps after warmup: a quarter, half and the end of the half period.
  const double span = c.lr - c.min_lr;
  EXPECT_NEAR(learning_rate(c, 35), c.min_lr + 0.5 * span * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_NEAR(learning_rate(c, 60), c.min_lr + 0.5 * span, 1e-15);
  EXPECT_NEAR(learning_rate(c, 110), c.min_lr, 1e-15);
  // Past the last step (a resumed run with more steps than planned): stays at min_lr.
  EXPECT_NEAR(learning_rate(c, 500), c.min_lr, 1e-15);
  // Monotone: up through warmup, down after it.
  for (int64_t s = 1; s < 10; ++s) EXPECT_LT(learning_rate(c, s), learning_rate(c, s + 1)) << s;
  for (int64_t s = 10; s < 110; ++s) EXPECT_GT(learning_rate(c, s), learning_rate(c, s + 1)) << s;
}

TEST(LearningRate, WithoutWarmupTheCosineStartsAtThePeak) {
  const OptimizerConfig c{.lr = 2e-3, .min_lr = 0, .warmup = 0, .total_steps = 4};
  EXPECT_NEAR(learning_rate(c, 0), 2e-3, 1e-18);
  EXPECT_NEAR(learning_rate(c, 2), 1e-3, 1e-18);
  EXPECT_NEAR(learning_rate(c, 4), 0.0, 1e-18);
  // One step in all (hydra train --steps 1): the one step runs at min_lr, nothing divides by zero.
  const OptimizerConfig one{.lr = 2e-3, .min_lr = 5e-4, .warmup = 0, .total_steps = 1};
  EXPECT_NEAR(learning_rate(one, 1), 5e-4, 1e-18);
}

TEST(LearningRate, MinLrEqualToLrIsConstant) {
  const OptimizerConfig c{.lr = 3e-4, .min_lr = 3e-4, .warmup = 5, .total_steps = 50};
  EXPECT_DOUBLE_EQ(learning_rate(c, 1), 3e-4 / 5);  // warmup still applies
  for (int64_t s = 5; s <= 60; ++s) EXPECT_DOUBLE_EQ(learning_rate(c, s), 3e-4) << s;
}

// Whether a checkpoint parameter takes weight decay, as DESIGN.md §1.5 states it: not the norms
// (RMSNorm weights, q/k norms, the fusion norm), not the gates (the FA output gate, the GDN β and
// decay projections, the fusion gate's u and b), not A_log, dt_bias and γ; every other matrix (and
// the embedding) does.
bool expected_to_decay(const std::string& name) {
  for (const char* no : {"norm.weight", "fa_gate_proj.weight", "gdn_a_proj.weight", "gdn_b_proj.weight",
                         "gdn_A_log", "gdn_dt_bias", "fuse_gamma", "fuse_gate.weight", "fuse_gate.bias"}) {
    const std::string suffix(no);
    if (name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) return false;
  }
  return true;
}

// One AdamW step with zero gradients on `preset`; checks every parameter against its group.
void check_decay_groups(const ModelConfig& c, const std::function<bool(const std::string&)>& trainable) {
  const NamedTensors before = random_parameters(c, 7);
  Model model(c, before, Device::host, DType::f32);
  const OptimizerConfig oc{.lr = 0.1, .min_lr = 0.1, .warmup = 0, .total_steps = 1, .weight_decay = 0.5};
  train::AdamW adamw(model, oc, trainable);
  adamw.zero_grads();
  const train::StepStats stats = adamw.step(1, 0.0);
  ASSERT_DOUBLE_EQ(stats.lr, 0.1);
  const NamedTensors after = model.unpack(model.weights());
  ASSERT_EQ(after.size(), before.size());
  const double factor = 1.0 - 0.1 * 0.5;
  int decayed = 0, kept = 0;
  for (const auto& [name, w0] : before) {
    const Tensor& w1 = after.at(name);
    ASSERT_EQ(w1.numel(), w0.numel()) << name;
    const bool decays = trainable(name) && expected_to_decay(name);
    (decays ? decayed : kept) += 1;
    for (int64_t i = 0; i < w0.numel(); ++i) {
      const float a = w0.data_as<float>()[i], b = w1.data_as<float>()[i];
      if (decays) {
        // The update runs in fp64 and is stored as f32: one rounding.
        ASSERT_NEAR(b, a * factor, 1e-7 * std::abs(a) + 1e-30) << name << "[" << i << "] should decay";
      } else {
        ASSERT_EQ(b, a) << name << "[" << i << "] should not change";
      }
    }
  }
  EXPECT_GT(decayed, 0);
  EXPECT_GT(kept, 0);
}

void check_decay_groups(const std::string& preset, const std::function<bool(const std::string&)>& trainable) {
  check_decay_groups(preset_config(preset), trainable);
}

TEST(WeightDecayGroups, HydraHeadDecaysMatricesNotNormsGatesOrGdnScalars) {
  // hydrahead-tiny: FA and GDN heads in one fused projection, so gate rows (no decay) sit beside
  // projection rows (decay) in one runtime tensor, and the fusion's norm and γ.
  check_decay_groups("hydrahead-tiny", [](const std::string&) { return true; });
}

// The fusion gate: its u are rows of the fused projection (no decay, beside rows that decay), b a
// runtime tensor of its own.
TEST(WeightDecayGroups, FusionGateTakesNoDecay) {
  ModelConfig c = preset_config("hydrahead-tiny");
  c.fusion = ops::Fusion::gate;
  check_decay_groups(c, [](const std::string&) { return true; });
}

TEST(WeightDecayGroups, Qwen3TeacherShape) {
  check_decay_groups("qwen3-tiny", [](const std::string&) { return true; });
}

TEST(WeightDecayGroups, FrozenParametersStayBitIdentical) {
  // The align stage's trainable set: the attention block only; the MLP, norms outside it, the
  // embedding and lm_head are frozen.
  check_decay_groups("hydrahead-tiny", [](const std::string& name) { return param_traits(name).attention_block; });
}

}  // namespace
}  // namespace hydra::test
