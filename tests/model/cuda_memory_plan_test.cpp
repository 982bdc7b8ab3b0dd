// The GPU memory plans (model/memory_plan.h) against the peak measured in the same run: the
// allocator's live tensor bytes (cuda_memory_stats().peak, what the plan counts) over a training
// step of hydrahead-1.7b at 32K tokens (recomputing everything, and keeping the GDN outputs and the
// projection) and a prefill of 128K tokens, on one GPU. The plan runs the passes' own code shape-only,
// holding what each GPU launcher allocates from the launcher's spec; it leaves out the kernels' small
// scratch (norm and conv partial sums, sort keys, the in-GPU segment maps of the delta rule), so it is
// held within 5%, in all and in the pass's own part (the activations above the weights and the
// optimizer's state). SKIPPED without a GPU.
#include <optional>

#include <fmt/format.h>

#include "model/memory_plan.h"
#include "model/model.h"
#include "model/params.h"
#include "model/prefill.h"
#include "model/train/objective.h"
#include "model/train/optimizer.h"
#include "model/train/training_plan.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

namespace hydra::test {
namespace {

#if HYDRA_CUDA
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double in_use() { return static_cast<double>(cuda_memory_stats().in_use); }

// `held`: bytes the run holds before the pass (weights, gradients, optimizer state); `peak`: all included.
void expect_plan(const MemoryEstimate& plan, double held, double peak, const std::string& what) {
  std::printf("%s: plan %.2f GiB (held %.2f, pass %.2f at %s), measured %.2f GiB (held %.2f, pass %.2f)\n",
              what.c_str(), (plan.weights + plan.activations) / kGiB, plan.weights / kGiB, plan.activations / kGiB,
              plan.peak_at.c_str(), peak / kGiB, held / kGiB, (peak - held) / kGiB);
  EXPECT_NEAR(plan.weights, held, 0.05 * held) << what << " (held)";
  EXPECT_NEAR(plan.activations, peak - held, 0.05 * (peak - held)) << what << " (the pass)";
  EXPECT_NEAR(plan.weights + plan.activations, peak, 0.05 * peak) << what << " (peak)";
}

#endif

TEST(CudaMemoryPlan, TrainingStepWithinFivePercentOfTheMeasuredPeak) {
  HYDRA_REQUIRE_GPU();
#if HYDRA_CUDA
  const ModelConfig c = preset_config("hydrahead-1.7b");
  const int64_t t = 32768;
  const KeptActivations gdn_proj{.gdn_outputs = true, .projection = true};
  for (const KeptActivations keep : {KeptActivations{}, gdn_proj}) {
    const double before = in_use();
    double held = 0, peak = 0;
    {
      Model model(c, random_parameters(c, 3, Device::cuda, DType::bf16), Device::cuda, DType::bf16);
      train::AdamW optimizer(model, {}, [](const std::string&) { return true; });
      held = in_use() - before;
      SelfCommunicator comm(Device::cuda);
      // Two windows packed as documents, as hydra train packs --batch-seqs 2.
      const SequenceLayout layout = SequenceLayout::zigzag(t, 1, 0, {0, t / 2});
      const std::vector<int32_t> ids = strided_ids(t, c.vocab_size, 7, 3);
      cuda_reset_peak();
      {
        const TokenRows rows = layout.token_rows(ids);
        ForwardContext context{comm, layout};
        context.keep = keep;
        train::sequence_gradients(context, model, rows, train::Objective::cross_entropy, 1.0 / static_cast<double>(t),
                                  &optimizer.grads());
      }
      peak = static_cast<double>(cuda_memory_stats().peak) - before;
    }
    const MemoryEstimate plan = estimate_training_memory(c, t, 1, nullptr, Device::cuda, false, keep);
    expect_plan(plan, held, peak,
                fmt::format("hydrahead-1.7b training step, {} tokens, kept gdn {} proj {}", t, keep.gdn_outputs,
                            keep.projection));
  }
#endif
}

TEST(CudaMemoryPlan, PrefillWithinFivePercentOfTheMeasuredPeak) {
  HYDRA_REQUIRE_GPU();
#if HYDRA_CUDA
  const ModelConfig c = preset_config("hydrahead-1.7b");
  const int64_t t = 131072;
  const double before = in_use();
  const Model model(c, random_parameters(c, 5, Device::cuda, DType::bf16), Device::cuda, DType::bf16);
  const double held = in_use() - before;
  SelfCommunicator comm(Device::cuda);
  cuda_reset_peak();
  timed_prefill(comm, SequenceLayout::zigzag(t, 1, 0), model, strided_ids(t, c.vocab_size, 7, 3), PrefillRun{});
  const double peak = static_cast<double>(cuda_memory_stats().peak) - before;
  expect_plan(estimate_prefill_memory(c, t, 1, Device::cuda, false), held, peak,
              fmt::format("hydrahead-1.7b prefill, {} tokens", t));
#endif
}

}  // namespace
}  // namespace hydra::test
