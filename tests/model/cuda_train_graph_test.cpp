// hydra train --cuda-graph on against --cuda-graph off on the GPU (model/train/fixed_step.h): the
// same init, the same data, 6 steps of 2 micro-batches: the graph replays the eager step's kernels
// in the same order, with the loss gradient's scale — which changes every step, because the windows
// count different numbers of targets — read from a device scalar. The graph is captured at step 2
// and replayed from then on, and no step after the first allocates a tensor block.
//
// Equality: the GPU backward is not deterministic in its last bits (the FA backward adds dQ with fp32
// atomics, the GDN backward some gradients: trainer.h), so two EAGER runs are run first. Where they
// agree bit for bit, the graph run must equal them bit for bit (losses and every trained weight);
// where they do not, it must agree with the first as closely as the second does (each weight's
// ‖graph − eager‖ / ‖eager‖ at most 4× that of the two eager runs, or 1e-6; each loss likewise) —
// a wrong scale or a stale input would be off by orders more. Step 1's loss (a forward from the same
// weights, no atomics) must be equal bit for bit in every case. The hybrid (FA + GDN heads) and the
// softmax teacher at tiny sizes, and qwen3-synth (the speed target's model) at 2 windows of 256.
// Without a GPU the test reports SKIPPED.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "tests/model/train/fixed_step_run.h"

namespace hydra::test {
namespace {

struct GraphCase {
  const char* preset;
  int64_t seq_len, batch_seqs;
};

bool same_bits(const FixedStepRun& a, const FixedStepRun& b) {
  if (a.losses != b.losses) return false;
  for (const auto& [name, t] : a.weights) {
    if (std::memcmp(t.data(), b.weights.at(name).data(), t.nbytes()) != 0) return false;
  }
  return true;
}

TEST(CudaTraining, GraphStepEqualsTheEagerStep) {
  HYDRA_REQUIRE_GPU();
  constexpr int64_t kSteps = 6, kAccum = 2;
  for (const GraphCase& g : {GraphCase{"hydrahead-tiny", 64, 4}, GraphCase{"qwen3-tiny", 64, 4},
                             GraphCase{"qwen3-synth", 256, 2}}) {
    SCOPED_TRACE(g.preset);
    TempDir dir;
    const std::string data =
        write_masked_tokens(dir.file("d.h5"), kSteps * g.batch_seqs * kAccum * g.seq_len + 1, g.seq_len, 9);
    auto run = [&](train::StepMode mode, const std::string& name) {
      return run_fixed_step(mode, g.preset, Device::cuda, DType::bf16, data, dir.file(name), kSteps, g.seq_len,
                            g.batch_seqs, kAccum);
    };
    const FixedStepRun eager = run(train::StepMode::eager, "eager"), again = run(train::StepMode::eager, "again");
    const FixedStepRun graph = run(train::StepMode::graph, "graph");
    ASSERT_EQ(eager.losses.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(graph.losses.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(graph.losses[0], eager.losses[0]) << "step 1: the same forward from the same weights";
    if (same_bits(eager, again)) {
      EXPECT_TRUE(same_bits(graph, eager)) << "the eager runs agree bit for bit; the graph run must too";
    } else {
      for (size_t s = 0; s < eager.losses.size(); ++s) {
        const double noise = std::abs(again.losses[s] - eager.losses[s]);
        EXPECT_LE(std::abs(graph.losses[s] - eager.losses[s]), std::max(4 * noise, 1e-6 * std::abs(eager.losses[s])))
            << "step " << s + 1;
      }
      for (const auto& [name, t] : eager.weights) {
        const double noise = rms_ratio(again.weights.at(name), t);
        EXPECT_LE(rms_ratio(graph.weights.at(name), t), std::max(4 * noise, 1e-6)) << name;
      }
    }
    std::set<int64_t> counted;
    for (const auto& line : eager.lines) counted.insert(line.at("counted_tokens").get<int64_t>());
    EXPECT_GT(counted.size(), 1u) << "the steps' scales must differ";
    EXPECT_EQ(graph.summary.graph_steps, kSteps - 1);  // captured at step 2, replayed from then on
    ASSERT_EQ(graph.summary.fresh_blocks.size(), static_cast<size_t>(kSteps));
    for (int64_t s = 1; s < kSteps; ++s) EXPECT_EQ(graph.summary.fresh_blocks[static_cast<size_t>(s)], 0u) << "step " << s + 1;
    for (size_t s = 0; s < graph.lines.size(); ++s) EXPECT_EQ(graph.lines[s].at("cuda_graph").get<bool>(), s >= 1);
  }
}

}  // namespace
}  // namespace hydra::test
