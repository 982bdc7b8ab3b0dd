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
// The graph step runs the optimizer's tail on the device (gradient norm, clip, guard, AdamW, zeroing:
// ops::DeviceUpdate) and is read one step late: its logged gradient norms, clip scales and learning
// rates are held to the eager step's by the same rule as the losses, with the clip active and the
// learning rate changing every step. A step whose loss is not finite (an inf injected into a weight)
// is refused by both with the same message and the same weights left.
// Without a GPU the tests report SKIPPED.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/model/train/fixed_step_run.h"

namespace hydra::test {
namespace {

struct GraphCase {
  const char* preset;
  int64_t seq_len, batch_seqs;
};

// A logged number of each step line (the norm, the clip scale, the learning rate).
std::vector<double> logged(const FixedStepRun& r, const char* key) {
  std::vector<double> v;
  for (const auto& line : r.lines) v.push_back(line.at(key).get<double>());
  return v;
}

bool same_bits(const FixedStepRun& a, const FixedStepRun& b) {
  if (a.losses != b.losses) return false;
  for (const char* key : {"grad_norm", "clip_scale", "lr"}) {
    if (logged(a, key) != logged(b, key)) return false;
  }
  for (const auto& [name, t] : a.weights) {
    if (std::memcmp(t.data(), b.weights.at(name).data(), t.nbytes()) != 0) return false;
  }
  return true;
}

// graph against eager: bit for bit where two eager runs agree bit for bit, else as close to the first
// as the second is (the rule of the file header) — losses, logged norms and clip scales, weights.
void expect_graph_equals_eager(const FixedStepRun& graph, const FixedStepRun& eager, const FixedStepRun& again) {
  ASSERT_EQ(graph.losses.size(), eager.losses.size());
  ASSERT_EQ(graph.lines.size(), eager.lines.size());
  if (same_bits(eager, again)) {
    EXPECT_TRUE(same_bits(graph, eager)) << "the eager runs agree bit for bit; the graph run must too";
    return;
  }
  EXPECT_EQ(logged(graph, "lr"), logged(eager, "lr"));  // the schedule: host arithmetic on both sides
  const auto close = [](const std::vector<double>& g, const std::vector<double>& e, const std::vector<double>& a,
                        const char* what) {
    for (size_t s = 0; s < e.size(); ++s) {
      const double noise = std::abs(a[s] - e[s]);
      EXPECT_LE(std::abs(g[s] - e[s]), std::max(4 * noise, 1e-6 * std::abs(e[s]))) << what << " of step " << s + 1;
    }
  };
  close(graph.losses, eager.losses, again.losses, "loss");
  for (const char* key : {"grad_norm", "clip_scale"}) close(logged(graph, key), logged(eager, key), logged(again, key), key);
  for (const auto& [name, t] : eager.weights) {
    const double noise = rms_ratio(again.weights.at(name), t);
    EXPECT_LE(rms_ratio(graph.weights.at(name), t), std::max(4 * noise, 1e-6)) << name;
  }
}

constexpr int64_t kSteps = 6, kAccum = 2;

// Case g trained kSteps steps of kAccum micro-batches from the same weights and data: eagerly twice
// (the second gives the eager step's run-to-run noise) and as a graph; `poison` as run_fixed_step's.
struct EagerTwiceAndGraph {
  FixedStepRun eager, again, graph;
};
EagerTwiceAndGraph run_eager_twice_and_graph(const GraphCase& g, const std::string& poison = "") {
  TempDir dir;
  const std::string data =
      write_masked_tokens(dir.file("d.h5"), kSteps * g.batch_seqs * kAccum * g.seq_len + 1, g.seq_len, 9);
  auto run = [&](train::StepMode mode, const std::string& name) {
    return run_fixed_step(mode, g.preset, Device::cuda, DType::bf16, data, dir.file(name), kSteps, g.seq_len,
                          g.batch_seqs, kAccum, poison);
  };
  FixedStepRun eager = run(train::StepMode::eager, "eager"), again = run(train::StepMode::eager, "again");
  return {std::move(eager), std::move(again), run(train::StepMode::graph, "graph")};
}

TEST(CudaTraining, GraphStepEqualsTheEagerStep) {
  HYDRA_REQUIRE_GPU();
  for (const GraphCase& g : {GraphCase{"hydrahead-tiny", 64, 4}, GraphCase{"qwen3-tiny", 64, 4},
                             GraphCase{"qwen3-synth", 256, 2}}) {
    SCOPED_TRACE(g.preset);
    const auto [eager, again, graph] = run_eager_twice_and_graph(g);
    ASSERT_EQ(eager.error, "");
    ASSERT_EQ(graph.error, "");
    ASSERT_EQ(eager.losses.size(), static_cast<size_t>(kSteps));
    ASSERT_EQ(graph.losses.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(graph.losses[0], eager.losses[0]) << "step 1: the same forward from the same weights";
    expect_graph_equals_eager(graph, eager, again);
    // The tail's conditions: the clip active in some step, a learning rate that changes every step.
    const std::vector<double> clip = logged(eager, "clip_scale"), lr = logged(eager, "lr");
    EXPECT_LT(*std::min_element(clip.begin(), clip.end()), 1.0) << "the clip must be active in some step";
    EXPECT_EQ(std::set<double>(lr.begin(), lr.end()).size(), lr.size()) << "the learning rate must change every step";
    std::set<int64_t> counted;
    for (const auto& line : eager.lines) counted.insert(line.at("counted_tokens").get<int64_t>());
    EXPECT_GT(counted.size(), 1u) << "the steps' scales must differ";
    EXPECT_EQ(graph.summary.graph_steps, kSteps - 1);  // captured at step 2, replayed from then on
    ASSERT_EQ(graph.summary.fresh_blocks.size(), static_cast<size_t>(kSteps));
    for (int64_t s = 1; s < kSteps; ++s) EXPECT_EQ(graph.summary.fresh_blocks[static_cast<size_t>(s)], 0u) << "step " << s + 1;
    for (size_t s = 0; s < graph.lines.size(); ++s) EXPECT_EQ(graph.lines[s].at("cuda_graph").get<bool>(), s >= 1);
  }
}

TEST(CudaTraining, GraphStepRefusesANonFiniteStepAsTheEagerStepDoes) {
  HYDRA_REQUIRE_GPU();
  for (const GraphCase& g : {GraphCase{"qwen3-tiny", 64, 4}, GraphCase{"qwen3-synth", 256, 2}}) {
    SCOPED_TRACE(g.preset);
    // An inf injected into the final norm's weight: step 1's logits, loss and gradient are not
    // finite. Step 2 is launched (captured) before step 1 is read: its update must be skipped too.
    const auto [eager, again, graph] = run_eager_twice_and_graph(g, "model.norm.weight");
    ASSERT_NE(eager.error.find("stopped before applying the update"), std::string::npos) << eager.error;
    ASSERT_NE(eager.error.find("step 1: the loss is"), std::string::npos) << eager.error;
    EXPECT_EQ(again.error, eager.error);
    EXPECT_EQ(graph.error, eager.error) << "the same step refused with the same numbers";
    expect_graph_equals_eager(graph, eager, again);  // the steps before it, and the weights left
  }
}

}  // namespace
}  // namespace hydra::test
