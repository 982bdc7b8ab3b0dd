// The memory plans (model/memory_plan.h) on P ranks: each rank's measured peak of host tensor
// bytes (runtime/host_memory.h) in a sequence-parallel training step and prefill against the plan
// for its T/P rows — the ring's K/V buffers and gradient accumulators, the GDN segment maps and
// initial states, the conv halos. Exact to the byte, as on one rank (tests/model/memory_plan_test.cpp),
// and within the 5% the GPU plan is held to.
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "model/memory_plan.h"
#include "model/model.h"
#include "model/params.h"
#include "model/prefill.h"
#include "model/train/objective.h"
#include "model/train/optimizer.h"
#include "model/train/training_plan.h"
#include "parallel/gdn_scan.h"
#include "runtime/host_memory.h"
#include "tests/common/test_util.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {
namespace {

double in_use() { return static_cast<double>(host_tensor_stats().in_use); }

void expect_plan(double plan, double measured, const std::string& what) {
  EXPECT_LE(std::abs(plan - measured), 0.05 * measured) << what << ": plan " << plan << ", measured " << measured;
  EXPECT_EQ(plan, measured) << what;
}

// `held`: bytes held before the pass (weights, gradients, optimizer state); `peak`: all included.
void expect_plan(const MemoryEstimate& plan, double held, double peak, const std::string& what) {
  if (world().rank() == 0) {
    std::printf("%s: plan %.3f MiB (activations %.3f, at %s), measured %.3f MiB\n", what.c_str(),
                (plan.weights + plan.activations) / 1048576.0, plan.activations / 1048576.0, plan.peak_at.c_str(),
                peak / 1048576.0);
  }
  expect_plan(plan.weights, held, what + " (held)");
  expect_plan(plan.activations, peak - held, what + " (activations)");
  double parts = 0;  // the peak by part (hydra plan's columns) adds up to the measured peak too
  for (const double bytes : plan.parts) parts += bytes;
  EXPECT_EQ(parts, peak - held) << what << " (the parts: " << plan.describe() << ")";
}

TEST(MemoryPlan, SequenceParallelTrainingStepAndPrefill) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  const int64_t t = 2 * p * 96;
  for (const std::string preset : {"qwen3-tiny", "hydrahead-tiny"}) {
    const ModelConfig c = preset_config(preset);
    const std::string what = fmt::format("{} on rank {}/{}", preset, comm.rank(), p);
    {  // a training step: two windows packed as documents, as hydra train packs --batch-seqs 2
      const double before = in_use();
      Model model(c, random_parameters(c, 3));
      train::AdamW optimizer(model, {}, [](const std::string&) { return true; });
      const double held = in_use() - before;
      const SequenceLayout layout = SequenceLayout::zigzag(t, p, comm.rank(), {0, t / 2});
      const std::vector<int32_t> ids = strided_ids(t, c.vocab_size, 7, 3);
      host_tensor_reset_peak();
      {
        const TokenRows rows = layout.token_rows(ids);
        ForwardContext context{comm, layout};
        train::sequence_gradients(context, model, rows, train::Objective::cross_entropy, 1.0 / static_cast<double>(t),
                                  &optimizer.grads());
      }
      const double peak = static_cast<double>(host_tensor_stats().peak) - before;
      expect_plan(estimate_training_memory(c, t / p, p, nullptr, Device::host, false), held, peak,
                  fmt::format("{} training, {} tokens", what, t));
    }
    {  // a prefill
      const double before = in_use();
      const Model model(c, random_parameters(c, 5));
      const double held = in_use() - before;
      const SequenceLayout layout = SequenceLayout::zigzag(t, p, comm.rank());
      host_tensor_reset_peak();
      timed_prefill(comm, layout, model, strided_ids(t, c.vocab_size, 7, 3), PrefillRun{});
      const double peak = static_cast<double>(host_tensor_stats().peak) - before;
      expect_plan(estimate_prefill_memory(c, t / p, p, Device::host, false), held, peak,
                  fmt::format("{} prefill, {} tokens", what, t));
    }
  }
}

// What a GDN layer keeps for its backward across ranks (GdnSaved): its local segments'
// initial states and M, from the host live-byte counter — 2 segments × H·(dk·dv + dk·dk) fp32 at
// any P ≥ 2 for the same tokens per rank, so the bytes at P = 2 and P = 8 (CTest runs this suite
// at P = 1..4 and 8) are the same number; before the maps were made independent of P every rank kept [P, 2, H·(dk² + dk·dv)].
TEST(MemoryPlan, GdnKeptBytesIndependentOfRankCount) {
  MpiCommunicator& comm = world();
  const int p = comm.size();
  if (p == 1) GTEST_SKIP() << "one rank keeps no GDN maps";
  const int64_t h = 2, dk = 16, dv = 16, per_rank = 2 * 48, t = per_rank * p;
  const SequenceLayout layout = SequenceLayout::zigzag(t, p, comm.rank());
  ASSERT_EQ(layout.local_length(), per_rank);
  const Tensor q = random_tensor({per_rank, h, dk}, 31), k = random_tensor({per_rank, h, dk}, 32);
  const Tensor v = random_tensor({per_rank, h, dv}, 33), g = uniform_tensor({per_rank, h}, 34, -0.3f, 0.0f);
  const Tensor beta = uniform_tensor({per_rank, h}, 35, 0.0f, 1.0f);
  Tensor out = Tensor::empty({per_rank, h, dv}, DType::f32);
  GdnSaved saved;
  const double before = in_use();
  gdn_sequence_parallel(comm, layout, out, q, k, v, g, beta, {}, nullptr, &saved);
  const double kept = in_use() - before;
  const double expected = 2.0 * static_cast<double>(h * (dk * dv + dk * dk)) * 4;  // 64-byte multiples here
  EXPECT_EQ(kept, expected) << "GDN bytes kept for the backward on " << p << " ranks";
  if (comm.rank() == 0) std::printf("GDN kept bytes per rank and layer at P=%d: %.0f (%lld tokens per rank)\n", p, kept,
                                    static_cast<long long>(per_rank));
}

}  // namespace
}  // namespace hydra::test
