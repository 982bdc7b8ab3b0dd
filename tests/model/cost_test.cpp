// The cost model (model/cost.h): FLOP counts against formulas written out by hand for the
// teacher and the 7:1 hybrid, and the memory plans against the peaks hydra measured on an H200
// (cluster/results/h200-2026-12-01: prefill 512K, finetune 64K/128K): a plan may overestimate a
// little, never underestimate, or the memory check would let a run start that then fails.
#include "model/config.h"
#include "model/cost.h"
#include "runtime/error.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TEST(Cost, TeacherFlopsAreTheDenseFormula) {
  const ModelConfig c = preset_config("qwen3-1.7b");
  const double t = 8192, D = 2048, H = 16, G = 8, d = 128, I = 6144, L = 28;
  const FlopCount f = prefill_flops(c, 8192);
  // Per layer: q, k, v (H·d + 2·G·d rows), W_o (H·d), gate/up/down (3·I), each 2·T·D·rows; causal
  // attention 2·T²·d per head (the visible half of QKᵀ and of PV).
  EXPECT_DOUBLE_EQ(f.gemm, L * 2 * t * D * (H * d + 2 * G * d + H * d + 3 * I));
  EXPECT_DOUBLE_EQ(f.attention, L * 2 * t * t * d * H);
  EXPECT_EQ(f.gdn, 0.0);
  EXPECT_DOUBLE_EQ(f.total(), f.gemm + f.attention);
}

TEST(Cost, HybridFlopsCountEachBranchOnce) {
  const ModelConfig c = preset_config("hydrahead-1.7b");  // FA heads {0, 1}: one KV group; 14 GDN heads
  const double t = 524288, D = 2048, d = 128, I = 6144, L = 28, hfa = 2, gfa = 1, hg = 14;
  // Fused rows: q of every head, the FA heads' k, v and output gate, the GDN heads' own k, v, and a, b.
  const double rows = 16 * d + 2 * gfa * d + hfa * d + 2 * hg * d + 2 * hg;
  const FlopCount f = prefill_flops(c, 524288);
  EXPECT_DOUBLE_EQ(f.gemm, L * 2 * t * D * (rows + 16 * d + 3 * I));
  EXPECT_DOUBLE_EQ(f.attention, L * 2 * t * t * d * hfa);
  EXPECT_DOUBLE_EQ(f.gdn, L * t * hg * (6 * d * d + 8 * 64 * d));
  // What hydra prefill reported for this shape on the H200 (its JSON line).
  EXPECT_NEAR(f.gemm, 1.602572557221888e15, 1e3);
  EXPECT_NEAR(f.attention, 3.940649673949184e15, 1e3);
}

TEST(Cost, TrainingCountsTheLmHeadOverEveryPosition) {
  const ModelConfig c = preset_config("hydrahead-1.7b");
  const double t = 65536, D = 2048, V = 151936;
  const FlopCount layers = prefill_flops(c, 65536);
  EXPECT_EQ(layers.logits, 0.0);  // a prefill forms the last position's logits only
  const FlopCount f = training_forward_flops(c, 65536, LogitHead::every_position);
  EXPECT_DOUBLE_EQ(f.logits, 2 * t * D * V);
  EXPECT_DOUBLE_EQ(f.gemm, layers.gemm);
  EXPECT_DOUBLE_EQ(f.attention, layers.attention);
  EXPECT_DOUBLE_EQ(f.gdn, layers.gdn);
  EXPECT_DOUBLE_EQ(f.total(), layers.total() + 2 * t * D * V);
  // At 64K the LM head is about 13% of hydrahead-1.7b's training forward.
  EXPECT_NEAR(f.logits / f.total(), 0.133, 0.002);
  // The alignment stage's loss reads each layer's output, not logits.
  const FlopCount align = training_forward_flops(c, 65536, LogitHead::none);
  EXPECT_EQ(align.logits, 0.0);
  EXPECT_DOUBLE_EQ(align.total(), layers.total());
}

TEST(Cost, PrefillPlanCoversTheMeasuredPeakAndScalesWithTheShare) {
  const ModelConfig c = preset_config("hydrahead-1.7b");
  const MemoryEstimate one = estimate_prefill_memory(c, 524288, 1);
  // Measured on one H200: peak 31.4 GiB (v1 GDN kernels), 22.6 GiB (fused); weights 3.4 GiB.
  EXPECT_GE(one.total(), 31.4 * kGiB);
  EXPECT_LT(one.total(), 1.5 * 31.4 * kGiB);
  EXPECT_NEAR(one.weights / kGiB, 3.4, 0.1);
  // Half the tokens per rank on 2 ranks: the activations about halve, the weights stay.
  const MemoryEstimate two = estimate_prefill_memory(c, 262144, 2);
  EXPECT_EQ(two.weights, one.weights);
  EXPECT_LT(two.activations, 0.6 * one.activations);
  EXPECT_GT(two.activations, 0.4 * one.activations);
  EXPECT_LT(estimate_prefill_memory(c, 4096, 1).total(), one.total());
}

TEST(Cost, TrainingPlanCoversTheMeasuredPeaks) {
  const ModelConfig c = preset_config("hydrahead-1.7b");
  // hydra train --stage finetune on one H200 (2026-12-03, cluster/results/h200-2026-12-03/train):
  // peak 46.82 / 62.74 GiB at 64K / 128K tokens with --kept-activations none, 73.41 / 115.91 GiB
  // with gdn+proj (what auto chose there); 2026-12-04 (h200-2026-12-04): 115.42 GiB at 64K with
  // the MLP gate/up kept in all 28 layers, 124.94 GiB at 128K with it in 3 (auto's choices).
  struct Measured {
    int64_t tokens;
    KeptActivations keep;
    double gib;
  };
  const KeptActivations all{.gdn_outputs = true, .projection = true};
  for (const Measured& r : {Measured{65536, {}, 46.82}, Measured{131072, {}, 62.74}, Measured{65536, all, 73.41},
                            Measured{131072, all, 115.91},
                            Measured{65536, {.gdn_outputs = true, .projection = true, .mlp_layers = 28}, 115.42},
                            Measured{131072, {.gdn_outputs = true, .projection = true, .mlp_layers = 3}, 124.94}}) {
    const MemoryEstimate m = estimate_training_memory(c, r.tokens, 1, nullptr, Device::cuda, false, r.keep);
    EXPECT_GE(m.total(), r.gib * kGiB) << r.tokens << " kept " << r.keep.gdn_outputs << " mlp " << r.keep.mlp_layers;
    EXPECT_LT(m.total(), 1.3 * r.gib * kGiB) << r.tokens << " kept " << r.keep.gdn_outputs << " mlp " << r.keep.mlp_layers;
  }
  // Keeping only the GDN outputs costs T·H_gdn·d bf16 per layer.
  const double gdn_only = estimate_training_memory(c, 131072, 1, nullptr, Device::cuda, false, {.gdn_outputs = true}).total() -
                          estimate_training_memory(c, 131072, 1, nullptr, Device::cuda, false).total();
  EXPECT_NEAR(gdn_only, 1.05 * 28 * 131072.0 * 14 * 128 * 2, 1e6);
  // The MLP's gate/up: T·2I bf16 in each of the first mlp_layers layers.
  const KeptActivations mlp10{.gdn_outputs = true, .projection = true, .mlp_layers = 10};
  const double mlp_cost = estimate_training_memory(c, 65536, 1, nullptr, Device::cuda, false, mlp10).total() -
                          estimate_training_memory(c, 65536, 1, nullptr, Device::cuda, false, all).total();
  EXPECT_NEAR(mlp_cost, 1.05 * 10 * 65536.0 * 2 * 6144 * 2, 1e6);
  // A teacher in the same process (distill) adds its weights; align adds the teacher's residual
  // stream at every layer boundary.
  const ModelConfig teacher = preset_config("qwen3-1.7b");
  const MemoryEstimate plain = estimate_training_memory(c, 65536, 1, nullptr, Device::cuda, false);
  const MemoryEstimate distill = estimate_training_memory(c, 65536, 1, &teacher, Device::cuda, false);
  const MemoryEstimate align = estimate_training_memory(c, 65536, 1, &teacher, Device::cuda, true);
  EXPECT_GT(distill.weights, plain.weights);
  EXPECT_GT(align.activations, 0.0);
  // fp32 storage on the host path: more bytes per element than bf16 on the GPU.
  EXPECT_GT(estimate_training_memory(c, 65536, 1, nullptr, Device::host, false).weights, plain.weights);
}

TEST(Cost, MemoryPlanRefusesWhatDoesNotFitWithTheEstimate) {
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

}  // namespace
}  // namespace hydra::test
