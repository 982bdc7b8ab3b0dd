// The fixed step of `hydra train --cuda-graph on` (model/train/fixed_step.h) on the CPU, where it runs
// without the capture (StepMode::fixed): the code a CUDA graph captures — persistent input buffers,
// the step arena, the loss sums on the device, the gradient scale from a device scalar — must give
// the eager loop's losses and weights bit for bit, and allocate no fresh tensor block after its first
// step (the condition of a capture). The windows count different numbers of targets, so the scale
// changes every step. The --cuda-graph flag's choices and refusals (trainer.h step_mode_refusal).
#include <cstring>
#include <filesystem>
#include <set>

#include "tests/model/train/fixed_step_run.h"

namespace hydra::test {
namespace {

void expect_same_weights(const NamedTensors& a, const NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.nbytes(), u.nbytes()) << name;
    EXPECT_EQ(std::memcmp(t.data(), u.data(), t.nbytes()), 0) << name << " differs";
  }
}

TEST(FixedStep, GivesTheEagerLossesAndWeightsAndAllocatesNothingAfterItsFirstStep) {
  TempDir dir;
  constexpr int64_t kSteps = 5, kSeqLen = 32, kBatch = 2, kAccum = 2;
  const std::string data = write_masked_tokens(dir.file("d.h5"), kSteps * kBatch * kAccum * kSeqLen + 1, kSeqLen, 3);
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    SCOPED_TRACE(preset);
    const FixedStepRun eager = run_fixed_step(train::StepMode::eager, preset, Device::host, DType::f32, data,
                                              dir.file(preset + "-eager"), kSteps, kSeqLen, kBatch, kAccum);
    const FixedStepRun fixed = run_fixed_step(train::StepMode::fixed, preset, Device::host, DType::f32, data,
                                              dir.file(preset + "-fixed"), kSteps, kSeqLen, kBatch, kAccum);
    ASSERT_EQ(eager.losses.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(fixed.losses, eager.losses);
    expect_same_weights(fixed.weights, eager.weights);
    // The windows' counts differ, so the scale did change between steps.
    std::set<int64_t> counted;
    for (const auto& line : eager.lines) counted.insert(line.at("counted_tokens").get<int64_t>());
    EXPECT_GT(counted.size(), 1u);
    // The arena: blocks from the first step, none fresh after it.
    ASSERT_EQ(fixed.summary.fresh_blocks.size(), static_cast<size_t>(kSteps));
    EXPECT_GT(fixed.summary.fresh_blocks[0], 0u);
    for (int64_t s = 1; s < kSteps; ++s) EXPECT_EQ(fixed.summary.fresh_blocks[static_cast<size_t>(s)], 0u) << "step " << s + 1;
    EXPECT_GT(fixed.summary.arena_blocks, 0u);
    EXPECT_GT(fixed.summary.arena_bytes, 0.0);
    EXPECT_EQ(fixed.summary.graph_steps, 0);
    EXPECT_TRUE(eager.summary.fresh_blocks.empty());
    // The step lines: no phases in the fixed step, the graph flag and fresh blocks logged.
    for (const auto& line : fixed.lines) {
      EXPECT_TRUE(line.at("phases").is_null());
      EXPECT_FALSE(line.at("cuda_graph").get<bool>());
    }
    EXPECT_TRUE(eager.lines.front().at("phases").is_object());
    // The optimizer's tail ran on the "device" (ops::DeviceUpdate, one step late): the same norms,
    // clip scales and learning rates as the eager tail, the clip active and the rate changing.
    ASSERT_EQ(fixed.lines.size(), eager.lines.size());
    std::set<double> rates;
    bool clipped = false;
    for (size_t i = 0; i < eager.lines.size(); ++i) {
      for (const char* key : {"step", "grad_norm", "clip_scale", "lr", "data_position", "counted_tokens"}) {
        EXPECT_EQ(fixed.lines[i].at(key), eager.lines[i].at(key)) << key << " of line " << i;
      }
      rates.insert(eager.lines[i].at("lr").get<double>());
      clipped = clipped || eager.lines[i].at("clip_scale").get<double>() < 1;
    }
    EXPECT_EQ(rates.size(), eager.lines.size()) << "the learning rate changes every step";
    EXPECT_TRUE(clipped) << "the clip must be active in some step";
  }
}

// A step whose loss or gradient norm is not finite (an inf injected into the final norm's weight: the
// logits, the loss and the gradient are not finite): the eager trainer stops at step 1 before
// applying its update; the fixed step, whose update runs on the "device" and whose results are read
// one step late (step 2 is launched before step 1 is read), must stop at the same step with the same
// message and leave the same weights (its guard skipped both updates).
TEST(FixedStep, RefusesANonFiniteStepAsTheEagerStepDoes) {
  TempDir dir;
  constexpr int64_t kSteps = 5, kSeqLen = 32, kBatch = 2, kAccum = 2;
  const std::string data = write_masked_tokens(dir.file("d.h5"), kSteps * kBatch * kAccum * kSeqLen + 1, kSeqLen, 3);
  for (const std::string preset : {"hydrahead-tiny", "qwen3-tiny"}) {
    SCOPED_TRACE(preset);
    auto run = [&](train::StepMode mode, const std::string& name) {
      return run_fixed_step(mode, preset, Device::host, DType::f32, data, dir.file(preset + name), kSteps, kSeqLen,
                            kBatch, kAccum, "model.norm.weight");
    };
    const FixedStepRun eager = run(train::StepMode::eager, "-eager"), fixed = run(train::StepMode::fixed, "-fixed");
    ASSERT_NE(eager.error.find("step 1: the loss is"), std::string::npos) << eager.error;
    ASSERT_NE(eager.error.find("stopped before applying the update"), std::string::npos) << eager.error;
    EXPECT_TRUE(eager.lines.empty()) << "step 1 was refused";
    EXPECT_EQ(fixed.error, eager.error);
    EXPECT_EQ(fixed.losses, eager.losses);  // the steps logged before the refused one
    expect_same_weights(fixed.weights, eager.weights);
  }
}

// Checkpoints with the late read: a step with a save due is read at once, before the next step is
// launched, so each checkpoint holds exactly the step it names — the eager run's weights at that
// step, bit for bit (were the next step launched first, its update would be in the file).
TEST(FixedStep, CheckpointsHoldTheStepTheyName) {
  TempDir dir;
  constexpr int64_t kSteps = 5, kSeqLen = 32, kBatch = 2, kAccum = 2;
  const std::string data = write_masked_tokens(dir.file("d.h5"), kSteps * kBatch * kAccum * kSeqLen + 1, kSeqLen, 3);
  auto run = [&](train::StepMode mode, const std::string& name) {
    return run_fixed_step(mode, "qwen3-tiny", Device::host, DType::f32, data, dir.file(name), kSteps, kSeqLen, kBatch,
                          kAccum, "", 2);
  };
  const FixedStepRun eager = run(train::StepMode::eager, "eager"), fixed = run(train::StepMode::fixed, "fixed");
  ASSERT_EQ(eager.error, "");
  ASSERT_EQ(fixed.error, "");
  EXPECT_EQ(fixed.summary.checkpoint.substr(dir.file("fixed").size()), eager.summary.checkpoint.substr(dir.file("eager").size()));
  for (const char* step : {"step-000004", "step-000005"}) {  // the two kept (TrainConfig::keep)
    SCOPED_TRACE(step);
    const std::string e = dir.file("eager") + "/" + step + "/model.h5", f = dir.file("fixed") + "/" + step + "/model.h5";
    ASSERT_TRUE(std::filesystem::exists(e));
    ASSERT_TRUE(std::filesystem::exists(f));
    expect_same_weights(read_model_checkpoint(f).params, read_model_checkpoint(e).params);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("fixed") + "/step-000003"));
}

TEST(FixedStep, FlagChoicesAndRefusals) {
  EXPECT_EQ(train::parse_train_graph("on"), train::StepMode::graph);
  EXPECT_EQ(train::parse_train_graph("off"), train::StepMode::eager);
  EXPECT_EQ(train::parse_train_graph("auto"), train::StepMode::eager);  // opt-in until a GPU measures it
  EXPECT_THROW(train::parse_train_graph("yes"), UserError);
  using train::Stage;
  using train::StepMode;
  EXPECT_EQ(train::step_mode_refusal(StepMode::eager, Stage::align, 4, Device::host), "");
  EXPECT_EQ(train::step_mode_refusal(StepMode::graph, Stage::pretrain, 1, Device::cuda), "");
  EXPECT_EQ(train::step_mode_refusal(StepMode::graph, Stage::finetune, 1, Device::cuda), "");
  EXPECT_EQ(train::step_mode_refusal(StepMode::fixed, Stage::pretrain, 1, Device::host), "");
  EXPECT_NE(train::step_mode_refusal(StepMode::graph, Stage::pretrain, 1, Device::host).find("--device cuda"),
            std::string::npos);
  EXPECT_NE(train::step_mode_refusal(StepMode::graph, Stage::distill, 1, Device::cuda).find("--stage distill"),
            std::string::npos);
  EXPECT_NE(train::step_mode_refusal(StepMode::graph, Stage::align, 1, Device::cuda).find("--stage align"),
            std::string::npos);
  EXPECT_NE(train::step_mode_refusal(StepMode::graph, Stage::pretrain, 2, Device::cuda).find("--sp 1"), std::string::npos);
}

}  // namespace
}  // namespace hydra::test
