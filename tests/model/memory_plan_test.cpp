// The memory plans (model/memory_plan.h) against what the CPU path allocates: the host tensors'
// live-byte counter (runtime/host_memory.h) measures the peak of a training step and of a
// prefill. The plan must be within 5% of it (the target on the GPU), both in all (weights and
// optimizer state included) and in the part above what the whole run holds (the activations).
// The plan runs the passes' own code shape-only (runtime/memory_timeline.h), so on the host it must
// also be exact to the byte: a branch that allocates in the real run and not in the shape-only one
// (or the other way round) fails here even when it is far below 5% (a [T] row of lse). The
// configurations put the peak in different places: the last layer's backward, the first layer's
// GDN or FA branch, the loss head (a wide vocabulary).
#include <gtest/gtest.h>

#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "kernels/delta_rule/delta_rule.h"
#include "model/generate.h"
#include "model/memory_plan.h"
#include "model/model.h"
#include "model/params.h"
#include "model/prefill.h"
#include "model/train/objective.h"
#include "model/train/optimizer.h"
#include "model/train/training_plan.h"
#include "parallel/gdn_scan.h"
#include "parallel/self_communicator.h"
#include "runtime/host_memory.h"
#include "tests/common/test_util.h"

namespace hydra {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;

double in_use() { return static_cast<double>(host_tensor_stats().in_use); }

void expect_within(double plan, double measured, double tolerance, const std::string& what) {
  EXPECT_LE(std::abs(plan - measured), tolerance * measured)
      << what << ": plan " << plan << " bytes, measured " << measured << " (" << 100.0 * (plan - measured) / measured
      << "%)";
}

struct Measured {
  double held = 0;  // weights, gradients and optimizer state (or the weights alone)
  double peak = 0;  // the step's or prefill's peak, all included
};

enum class Kind { cross_entropy, distill, align };

Measured measure_training(const ModelConfig& c, int64_t t, KeptActivations keep, Kind kind,
                          const ModelConfig* teacher_config, DType dtype) {
  const double before = in_use();
  Measured m;
  Model model(c, random_parameters(c, 3), Device::host, dtype);
  std::optional<Model> teacher;
  if (teacher_config) teacher.emplace(*teacher_config, random_parameters(*teacher_config, 4), Device::host, dtype);
  train::AdamW optimizer(model, {}, [](const std::string&) { return true; });
  m.held = in_use() - before;
  SelfCommunicator comm;
  // Two windows packed as documents, as hydra train packs a micro-batch of --batch-seqs 2.
  const SequenceLayout layout = SequenceLayout::zigzag(t, 1, 0, {0, t / 2});
  const std::vector<int32_t> ids = test::strided_ids(t, c.vocab_size, 7, 3);
  host_tensor_reset_peak();
  {
    const TokenRows rows = layout.token_rows(ids);
    ForwardContext context{comm, layout};
    context.keep = keep;
    if (kind == Kind::align) {
      train::alignment_gradients(context, model, *teacher, rows.ids, 1.0 / static_cast<double>(t), &optimizer.grads());
    } else {
      train::sequence_gradients(context, model, rows,
                                kind == Kind::distill ? train::Objective::distillation : train::Objective::cross_entropy,
                                1.0 / static_cast<double>(t), &optimizer.grads(), teacher ? &*teacher : nullptr);
    }
  }
  m.peak = static_cast<double>(host_tensor_stats().peak) - before;
  return m;
}

// A preset, or "wide-vocab": qwen3-tiny with 16K tokens, where the loss head's chunk is the peak.
ModelConfig config_named(const std::string& name) {
  if (name != "wide-vocab") return preset_config(name);
  ModelConfig c = preset_config("qwen3-tiny");
  c.vocab_size = 16384;
  return c;
}

void check_training(const std::string& preset, int64_t t, KeptActivations keep, Kind kind = Kind::cross_entropy,
                    DType dtype = DType::f32) {
  const ModelConfig c = config_named(preset);
  const ModelConfig teacher = preset_config("qwen3-tiny");
  const bool with_teacher = kind != Kind::cross_entropy;
  const Measured m = measure_training(c, t, keep, kind, with_teacher ? &teacher : nullptr, dtype);
  const MemoryEstimate plan = estimate_training_memory(c, t, 1, with_teacher ? &teacher : nullptr, Device::host,
                                                       kind == Kind::align, keep, true, dtype);
  const std::string what = fmt::format("{} {} training, {} tokens, kept gdn {} proj {} mlp {}, kind {}", preset,
                                       dtype_name(dtype), t, keep.gdn_outputs, keep.projection, keep.mlp_layers,
                                       static_cast<int>(kind));
  std::cout << fmt::format("{}: plan {:.3f} MiB (held {:.3f}, activations {:.3f}, peak at {}); measured {:.3f} MiB "
                           "(held {:.3f}, activations {:.3f})\n",
                           what, (plan.weights + plan.activations) / kMiB, plan.weights / kMiB, plan.activations / kMiB,
                           plan.peak_at, m.peak / kMiB, m.held / kMiB, (m.peak - m.held) / kMiB);
  expect_within(plan.weights, m.held, 0.05, what + " (held)");
  expect_within(plan.activations, m.peak - m.held, 0.05, what + " (activations)");
  expect_within(plan.weights + plan.activations, m.peak, 0.05, what + " (peak)");
  EXPECT_EQ(plan.weights, m.held) << what;
  EXPECT_EQ(plan.activations, m.peak - m.held) << what;
}

TEST(MemoryPlan, TrainingStepOnTheHost) {
  for (const std::string preset : {"qwen3-tiny", "hydrahead-tiny", "wide-vocab"}) {
    for (const int64_t t : {256, 1000}) check_training(preset, t, {});
  }
}

TEST(MemoryPlan, TrainingStepWithKeptActivations) {
  check_training("hydrahead-tiny", 512, {.gdn_outputs = true});
  check_training("hydrahead-tiny", 512, {.gdn_outputs = true, .projection = true});
  check_training("hydrahead-tiny", 512, {.gdn_outputs = true, .projection = true, .mlp_layers = 1});
  check_training("hydrahead-tiny", 512, {.gdn_outputs = true, .projection = true, .mlp_layers = 2});
  check_training("qwen3-tiny", 512, {.mlp_layers = 2});
}

TEST(MemoryPlan, Float64TrainingStep) {  // the gradient checks' element type
  check_training("hydrahead-tiny", 512, {.gdn_outputs = true}, Kind::cross_entropy, DType::f64);
}

TEST(MemoryPlan, DistillationAndAlignmentSteps) {
  check_training("hydrahead-tiny", 512, {}, Kind::distill);
  check_training("hydrahead-tiny", 512, {.gdn_outputs = true}, Kind::align);
}

TEST(MemoryPlan, PrefillOnTheHost) {
  for (const std::string preset : {"qwen3-tiny", "hydrahead-tiny", "wide-vocab"}) {
    for (const int64_t t : {256, 2048}) {
      const ModelConfig c = config_named(preset);
      const double before = in_use();
      const Model model(c, random_parameters(c, 5));
      const double held = in_use() - before;
      SelfCommunicator comm;
      const SequenceLayout layout = SequenceLayout::zigzag(t, 1, 0);
      host_tensor_reset_peak();
      timed_prefill(comm, layout, model, test::strided_ids(t, c.vocab_size, 7, 3), PrefillRun{});
      const double peak = static_cast<double>(host_tensor_stats().peak) - before;
      const MemoryEstimate plan = estimate_prefill_memory(c, t, 1, Device::host, false);
      const std::string what = fmt::format("{} prefill, {} tokens", preset, t);
      std::cout << fmt::format("{}: plan {:.3f} MiB (weights {:.3f}, activations {:.3f}, peak at {}); measured "
                               "{:.3f} MiB (weights {:.3f}, activations {:.3f})\n",
                               what, (plan.weights + plan.activations) / kMiB, plan.weights / kMiB,
                               plan.activations / kMiB, plan.peak_at, peak / kMiB, held / kMiB, (peak - held) / kMiB);
      expect_within(plan.weights, held, 0.05, what + " (weights)");
      expect_within(plan.activations, peak - held, 0.05, what + " (activations)");
      expect_within(plan.weights + plan.activations, peak, 0.05, what + " (peak)");
      EXPECT_EQ(plan.weights, held) << what;
      EXPECT_EQ(plan.activations, peak - held) << what;
    }
  }
}

// How the GPU plan moves with its inputs (its bytes against a GPU's measured peak:
// tests/model/cuda_memory_plan_test.cpp, on a GPU): half the tokens per rank on two ranks about
// halves the activations and keeps the weights; each kept activation costs its tensors; a teacher
// adds its weights (distill) or its residual stream at every layer boundary (align); fp32 on the
// host costs more than bf16 on the GPU.
TEST(MemoryPlan, GpuPlanMovesWithItsInputs) {
  const ModelConfig c = preset_config("hydrahead-1.7b");
  const MemoryEstimate prefill = estimate_prefill_memory(c, 524288, 1, Device::cuda, false);
  const MemoryEstimate two = estimate_prefill_memory(c, 262144, 2);
  EXPECT_EQ(two.weights, prefill.weights);
  EXPECT_LT(two.activations, 0.6 * prefill.activations);
  EXPECT_GT(two.activations, 0.4 * prefill.activations);
  // What each kept activation costs: T·H_gdn·d bf16 per layer for the GDN outputs.
  const double gdn_only = estimate_training_memory(c, 131072, 1, nullptr, Device::cuda, false, {.gdn_outputs = true}).total() -
                          estimate_training_memory(c, 131072, 1, nullptr, Device::cuda, false).total();
  EXPECT_NEAR(gdn_only, 28 * 131072.0 * 14 * 128 * 2, 0.02 * gdn_only);
  const ModelConfig teacher = preset_config("qwen3-1.7b");
  const MemoryEstimate plain = estimate_training_memory(c, 65536, 1, nullptr, Device::cuda, false);
  EXPECT_GT(estimate_training_memory(c, 65536, 1, &teacher, Device::cuda, false).weights, plain.weights);
  EXPECT_GT(estimate_training_memory(c, 65536, 1, &teacher, Device::cuda, true).activations, 29 * 65536.0 * 2048 * 2);
  EXPECT_GT(estimate_training_memory(c, 65536, 1, nullptr, Device::host, false).weights, plain.weights);
}

// Every buffer a pass allocates names itself (runtime/memory_label.h), so a plan's peak always says
// which buffer it is: every pass the plans run, on the host and the GPU, on 1, 2 and 8 ranks, with
// and without kept activations, a teacher (distill, align) and packed documents.
TEST(MemoryPlan, EveryBufferOfAPassIsNamed) {
  const ModelConfig teacher = preset_config("qwen3-tiny");
  for (const std::string preset : {"qwen3-tiny", "hydrahead-tiny"}) {
    const ModelConfig c = preset_config(preset);
    for (const Device device : {Device::host, Device::cuda}) {
      for (const int p : {1, 2, 8}) {
        const std::string what = fmt::format("{} on {} rank(s), {}", preset, p, device_name(device));
        const KeptActivations all{.gdn_outputs = true, .projection = true, .mlp_layers = c.num_layers};
        for (const KeptActivations keep : {KeptActivations{}, all}) {
          EXPECT_EQ(estimate_training_memory(c, 192, p, nullptr, device, false, keep).unnamed_buffers, 0) << what;
        }
        EXPECT_EQ(estimate_training_memory(c, 192, p, &teacher, device, false).unnamed_buffers, 0) << what << " distill";
        EXPECT_EQ(estimate_training_memory(c, 192, p, &teacher, device, true).unnamed_buffers, 0) << what << " align";
        for (const bool documents : {false, true}) {
          EXPECT_EQ(estimate_prefill_memory(c, 192, p, device, documents).unnamed_buffers, 0) << what << " prefill";
        }
      }
    }
  }
}

// ZeRO-1 in the training plan: the fp32 masters and moments (12 bytes a parameter) spread over W
// ranks, the gradients (4 bytes) whole on each. hydrahead-8b (8.19B parameters): replicated, the
// optimizer alone is 16 bytes a parameter (over 120 GiB, more than an H200 holds); over 8 ranks
// 4 + 12/8 bytes a parameter plus one bucket, and the whole plan's weights term falls by as much.
TEST(MemoryPlan, ShardedOptimizerInTheTrainingPlan) {
  const ModelConfig c = preset_config("hydrahead-8b");
  const double n = static_cast<double>(parameter_count(c)), gib = 1024.0 * 1024.0 * 1024.0;
  const double replicated = optimizer_bytes(c, Device::cuda, DType::f32, 1);
  const double sharded = optimizer_bytes(c, Device::cuda, DType::f32, 8);
  EXPECT_GT(replicated, 16 * n);
  EXPECT_GT(replicated / gib, 120.0);
  EXPECT_GT(sharded, (4 + 12.0 / 8) * n);
  EXPECT_LT(sharded, (4 + 12.0 / 8) * n + 4 * 32 * 1048576.0 + 1e8) << "more than a 32M-element bucket and padding";
  const MemoryEstimate one = estimate_training_memory(c, 8192, 1, nullptr, Device::cuda, false);
  const MemoryEstimate eight =
      estimate_training_memory(c, 8192, 1, nullptr, Device::cuda, false, {}, true, DType::f32, 8);
  EXPECT_EQ(one.optimizer, replicated);
  EXPECT_EQ(eight.optimizer, sharded);
  EXPECT_DOUBLE_EQ(one.weights - eight.weights, replicated - sharded);
  EXPECT_EQ(one.activations, eight.activations);
}

// The plan by part (MemoryPart: hydra plan's columns): each hold is tagged where the planner makes
// it and the timeline records every part's bytes at the peak, so the parts add up to the peak
// (`activations`) to the byte — for training and prefill, on 1, 2 and 8 ranks, host and cuda
// element types, and models with and without GDN heads. What each part holds is checked against
// the specs it comes from: a model without GDN heads has no GDN maps; on P > 1 ranks a training
// step peaking in the last layer's backward still holds every GDN layer's kept maps and initial
// states (gdn_scan_buffers); keeping the GDN outputs adds their bytes to the activations part only;
// a peak inside the delta-rule kernel's workspace counts it as a workspace.
double sum_of_parts(const MemoryEstimate& m) {
  double sum = 0;
  for (const double bytes : m.parts) sum += bytes;
  return sum;
}

TEST(MemoryPlan, PartsAddUpToThePeak) {
  for (const std::string preset : {"qwen3-tiny", "hydrahead-tiny", "hydrahead-1.7b"}) {
    const ModelConfig c = preset_config(preset);
    const bool has_gdn = c.is_hydra();
    for (const Device device : {Device::host, Device::cuda}) {
      for (const int p : {1, 2, 8}) {
        const int64_t t = preset == "hydrahead-1.7b" ? 16384 : 2 * 96;  // per rank
        const std::string what = fmt::format("{} on {} rank(s), {}", preset, p, device_name(device));
        for (const KeptActivations keep : {KeptActivations{}, KeptActivations{.gdn_outputs = true, .projection = true}}) {
          const MemoryEstimate train = estimate_training_memory(c, t, p, nullptr, device, false, keep);
          SCOPED_TRACE(what + " training, peak at " + train.peak_at);
          EXPECT_GT(train.activations, 0);
          EXPECT_EQ(sum_of_parts(train), train.activations);
          for (const double bytes : train.parts) EXPECT_GE(bytes, 0);
          EXPECT_GT(train.part(MemoryPart::activations), 0);
          EXPECT_EQ(train.part(MemoryPart::cache), 0);
          EXPECT_EQ(train.part(MemoryPart::outputs), 0);
          if (!has_gdn) {
            EXPECT_EQ(train.part(MemoryPart::gdn_maps), 0);
          }
          const std::string last_backward = fmt::format("layer {} backward", c.num_layers - 1);
          if (has_gdn && p > 1 && train.peak_at.rfind(last_backward, 0) == 0) {
            double kept = 0;  // every GDN layer's own segments' M and initial states
            for (int64_t l = 0; l < c.num_layers; ++l) {
              const LayerLayout lay = layer_layout(c, l);
              if (lay.h_gdn == 0) continue;
              const GdnScanBuffers b = gdn_scan_buffers(p, 2, lay.h_gdn, c.head_dim, c.head_dim, DType::f32);
              kept += b.kept_maps.bytes() + b.initial_states.bytes();
            }
            EXPECT_GE(train.part(MemoryPart::gdn_maps), kept);
          }
        }
        const MemoryEstimate prefill = estimate_prefill_memory(c, t, p, device, true);
        SCOPED_TRACE(what + " prefill, peak at " + prefill.peak_at);
        EXPECT_EQ(sum_of_parts(prefill), prefill.activations);
        EXPECT_GT(prefill.part(MemoryPart::activations), 0);
        EXPECT_EQ(prefill.part(MemoryPart::cache) + prefill.part(MemoryPart::outputs), 0);
        if (!has_gdn) {
          EXPECT_EQ(prefill.part(MemoryPart::gdn_maps), 0);
        }
      }
    }
  }
  // Kept GDN outputs, T·H_gdn·d per GDN layer in the storage type, are activations: at the same
  // peak (the last layer's backward) only that part grows, by exactly their bytes.
  const ModelConfig c = preset_config("hydrahead-1.7b");
  const int64_t t = 65536;
  const MemoryEstimate none = estimate_training_memory(c, t, 1, nullptr, Device::cuda, false);
  const MemoryEstimate gdn = estimate_training_memory(c, t, 1, nullptr, Device::cuda, false, {.gdn_outputs = true});
  ASSERT_EQ(none.peak_at, gdn.peak_at);
  double outputs = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {  // every layer's, the last one's until its backward ends
    outputs += BufferSpec{{t, layer_layout(c, l).h_gdn, c.head_dim}, DType::bf16}.bytes();
  }
  const double grown = gdn.part(MemoryPart::activations) - none.part(MemoryPart::activations);
  EXPECT_EQ(grown, outputs) << none.describe() << " vs " << gdn.describe();
  EXPECT_EQ(gdn.part(MemoryPart::workspaces), none.part(MemoryPart::workspaces));
  EXPECT_EQ(gdn.part(MemoryPart::gdn_maps), none.part(MemoryPart::gdn_maps));
  // A 512K prefill on one GPU peaks inside the GDN kernel's chunk workspace (delta_rule_prepare_buffers),
  // which is a workspace: that part holds at least it.
  const MemoryEstimate prefill = estimate_prefill_memory(c, 524288, 1, Device::cuda, false);
  ASSERT_NE(prefill.peak_at.find("GDN chunk workspace"), std::string::npos) << prefill.describe();
  int64_t h_gdn = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) h_gdn = std::max(h_gdn, layer_layout(c, l).h_gdn);
  EXPECT_GE(prefill.part(MemoryPart::workspaces),
            ops::delta_rule_prepare_buffers(524288, h_gdn, c.head_dim, true, false).bytes());
  // describe() names the parts the command errors print.
  EXPECT_NE(none.describe().find("activations"), std::string::npos) << none.describe();
  EXPECT_NE(none.describe().find("workspaces"), std::string::npos) << none.describe();
}

// hydra forward's logits and generation's cache are held through the pass: on top of the peak, in
// their own parts, so the parts still add up.
TEST(MemoryPlan, OutputsAndCacheAreTheirOwnParts) {
  const ModelConfig c = preset_config("hydrahead-tiny");
  for (const Device device : {Device::host, Device::cuda}) {
    const MemoryEstimate prefill = estimate_prefill_memory(c, 512, 2, device);
    const MemoryEstimate forward = estimate_forward_memory(c, 1024, 512, 2, 0, device, true);
    EXPECT_EQ(sum_of_parts(forward), forward.activations);
    EXPECT_GT(forward.part(MemoryPart::outputs), 0);
    EXPECT_EQ(forward.activations - prefill.activations, forward.part(MemoryPart::outputs));
    const MemoryEstimate generation = estimate_generation_memory(c, {300, 500}, 64, 2, device, true);
    EXPECT_EQ(sum_of_parts(generation), generation.activations);
    EXPECT_GT(generation.part(MemoryPart::cache), 0);
  }
}

TEST(MemoryPlan, RefusesWhatDoesNotFitWithTheEstimate) {
  MemoryEstimate huge;
  huge.activations = 1e18;  // an exabyte: more than any host has
  try {
    check_memory_plan(huge, Device::host, "a test run");
    FAIL() << "an exabyte plan was accepted";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("a test run needs about"), std::string::npos) << message;
    EXPECT_NE(message.find("GiB available"), std::string::npos) << message;
  }
  MemoryEstimate small;
  small.activations = 1024;
  EXPECT_NO_THROW(check_memory_plan(small, Device::host, "a small run"));
}

TEST(MemoryPlan, CountsHostTensors) {
  const double before = in_use();
  host_tensor_reset_peak();
  {
    const Tensor a = Tensor::empty({1000}, DType::f32);
    EXPECT_EQ(in_use() - before, 4032);  // rounded to 64 bytes
  }
  EXPECT_EQ(in_use(), before);
  EXPECT_EQ(static_cast<double>(host_tensor_stats().peak) - before, 4032);
}

}  // namespace
}  // namespace hydra
