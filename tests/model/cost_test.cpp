// The cost model (model/cost.h): FLOP counts against formulas written out by hand for the
// teacher and the 7:1 hybrid. The memory plans: memory_plan_test.cpp.
#include "model/config.h"
#include "model/cost.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

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
  // Independently: a dense decoder's GEMMs cost 2 FLOPs per non-embedding parameter per token, and
  // the Qwen3-1.7B model card gives "Number of Parameters (Non-Embedding): 1.4B" (rounded to 0.1B).
  EXPECT_NEAR(f.gemm / (2 * t), 1.4e9, 0.05e9);
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
  // Independently of the fused layout: the hybrid drops the k/v rows of the 7 KV groups only GDN
  // heads read ((8 − 1) · 2 · d) and adds per GDN head its own k, v (2d), a, b (2) and, for the FA
  // heads, the output gate (H_fa · d): 2 FLOPs per weight per token against the teacher's GEMMs.
  const FlopCount teacher = prefill_flops(preset_config("qwen3-1.7b"), 524288);
  EXPECT_DOUBLE_EQ(f.gemm - teacher.gemm, L * 2 * t * D * (-(8 - 1) * 2 * d + hg * (2 * d + 2) + hfa * d));
  // and attention only in the FA heads: 2 of the teacher's 16.
  EXPECT_DOUBLE_EQ(f.attention, teacher.attention * 2 / 16);
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

}  // namespace
}  // namespace hydra::test
