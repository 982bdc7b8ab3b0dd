// Generation on one CPU process: decode with the cache is exact against recomputation.
// Greedy tokens equal the arg-max of a full forward over prompt + generated tokens, and the logits
// each token was chosen from equal that forward's logits at its position, for the teacher, a
// HydraHead model and a layer-wise hybrid, with prompts of different lengths decoded as a batch.
// Also: the cache's prefill length rule, sampling (seeded, filters), stop tokens and cache sizes.
// Tolerance 2e-5 relative on logits: fp32, and the decode path sums in another order than the
// prefill (the GDN step against the chunked form, attention over the cache against the causal pass).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/generate.h"
#include "model/kv_cache.h"
#include "model/params.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

constexpr double kTol = 2e-5;

std::vector<int32_t> prompt_of(int64_t n, int64_t vocab, uint64_t salt) {
  return strided_ids(n, vocab, 7919, 13 + static_cast<int64_t>(salt) * 101);
}

ModelConfig layerwise_hybrid() {
  ModelConfig c = preset_config("qwen3-tiny");
  c.arch = Arch::hydrahead;
  c.num_layers = 3;
  c.fa_heads = {{}, {0, 1, 2, 3}, {}};
  return c;
}

void expect_decode_equals_recomputation(const ModelConfig& config, const std::string& what) {
  const Model model(config, random_parameters(config, 5));
  SelfCommunicator self;
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(1, config.vocab_size, 0), prompt_of(9, config.vocab_size, 1),
                                                     prompt_of(70, config.vocab_size, 2)};
  GenerateOptions options{.max_new_tokens = 6, .keep_logits = true};
  const std::vector<GeneratedSequence> out = generate(self, model, prompts, options);
  ASSERT_EQ(out.size(), prompts.size());
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto& seq = out[b];
    ASSERT_EQ(seq.tokens.size(), 6u) << what;
    EXPECT_EQ(seq.prefilled, static_cast<int64_t>(prompts[b].size()) - 1) << what << ": one rank prefills all but the last";
    std::vector<int32_t> all = prompts[b];
    all.insert(all.end(), seq.tokens.begin(), seq.tokens.end() - 1);
    const Tensor ref = full_logits(model, all);
    const int64_t vocab = config.vocab_size, t0 = static_cast<int64_t>(prompts[b].size()) - 1;
    for (size_t i = 0; i < seq.tokens.size(); ++i) {
      const TensorView row = ref.view().narrow(0, t0 + static_cast<int64_t>(i), 1);
      const float* r = static_cast<const float*>(row.data());
      EXPECT_EQ(seq.tokens[i], std::max_element(r, r + vocab) - r) << what << " prompt " << b << " token " << i;
      Tensor kept = Tensor::empty({1, vocab}, DType::f32);
      std::copy_n(seq.logits.data() + i * vocab, vocab, kept.data_as<float>());
      expect_close(kept, clone(row), kTol, what + " prompt " + std::to_string(b) + " logits of token " + std::to_string(i));
    }
  }
}

TEST(Generate, TeacherGreedyDecodeEqualsFullForward) { expect_decode_equals_recomputation(preset_config("qwen3-tiny"), "qwen3-tiny"); }
TEST(Generate, HydraHeadGreedyDecodeEqualsFullForward) {
  expect_decode_equals_recomputation(preset_config("hydrahead-tiny"), "hydrahead-tiny");
}
// Every fusion variant (the gate reads the decoded row's own x̂).
TEST(Generate, FusionVariantsGreedyDecodeEqualsFullForward) {
  for (const ops::Fusion fusion : ops::kFusions) {
    ModelConfig c = preset_config("hydrahead-tiny");
    c.fusion = fusion;
    expect_decode_equals_recomputation(c, std::string("hydrahead-tiny fusion ") + ops::fusion_name(fusion));
  }
}
TEST(Generate, LayerwiseHybridGreedyDecodeEqualsFullForward) {
  expect_decode_equals_recomputation(layerwise_hybrid(), "layer-wise hybrid");
}

// A repetition penalty: each token is the arg-max of the full forward's logits at its position after
// the penalty over the ids of the prompt and the tokens before it; the kept logits are the model's.
TEST(Generate, RepetitionPenaltyEqualsPenalizedRecomputation) {
  const ModelConfig config = preset_config("hydrahead-tiny");
  const Model model(config, random_parameters(config, 8));
  SelfCommunicator self;
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(14, config.vocab_size, 7), prompt_of(4, config.vocab_size, 8)};
  const double penalty = 3.0;
  const auto out = generate(self, model, prompts,
                            {.max_new_tokens = 8, .sampling = {.repetition_penalty = penalty}, .keep_logits = true});
  const auto plain = generate(self, model, prompts, {.max_new_tokens = 8});
  const int64_t vocab = config.vocab_size;
  bool changed = false;
  for (size_t b = 0; b < prompts.size(); ++b) {
    changed = changed || out[b].tokens != plain[b].tokens;
    std::vector<int32_t> all = prompts[b];
    all.insert(all.end(), out[b].tokens.begin(), out[b].tokens.end() - 1);
    const Tensor ref = full_logits(model, all);
    const int64_t t0 = static_cast<int64_t>(prompts[b].size()) - 1;
    for (size_t i = 0; i < out[b].tokens.size(); ++i) {
      const float* r = ref.data_as<float>() + (t0 + static_cast<int64_t>(i)) * vocab;
      std::vector<float> row(r, r + vocab);
      const SeenTokens seen(std::span<const int32_t>(all.data(), prompts[b].size() + i));
      apply_repetition_penalty(row, seen.ids(), penalty);
      EXPECT_EQ(out[b].tokens[i], std::max_element(row.begin(), row.end()) - row.begin()) << "prompt " << b << " token " << i;
      for (int64_t v = 0; v < vocab; ++v) {
        EXPECT_NEAR(out[b].logits[i * static_cast<size_t>(vocab) + static_cast<size_t>(v)], r[v], kTol * (1 + std::abs(r[v])));
      }
    }
  }
  EXPECT_TRUE(changed) << "a penalty of 3 changed no token: the test shows nothing";
}

TEST(Generate, BatchEqualsPromptsAlone) {
  const ModelConfig config = preset_config("hydrahead-tiny");
  const Model model(config, random_parameters(config, 6));
  SelfCommunicator self;
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(12, config.vocab_size, 3), prompt_of(3, config.vocab_size, 4)};
  const GenerateOptions options{.max_new_tokens = 5, .sampling = {.temperature = 0.9, .top_k = 50, .top_p = 0.9, .seed = 3}};
  const auto batch = generate(self, model, prompts, options);
  // Alone, a prompt is index 0 and the draws are keyed by prompt index, so compare greedy runs.
  GenerateOptions greedy = options;
  greedy.sampling = {};
  const auto together = generate(self, model, prompts, greedy);
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto alone = generate(self, model, {prompts[b]}, greedy);
    EXPECT_EQ(alone[0].tokens, together[b].tokens) << "prompt " << b;
    EXPECT_EQ(batch[b].tokens.size(), 5u);
  }
  // Sampling is a function of the seed: the same run twice gives the same tokens, another seed others.
  const auto again = generate(self, model, prompts, options);
  for (size_t b = 0; b < prompts.size(); ++b) EXPECT_EQ(again[b].tokens, batch[b].tokens);
  GenerateOptions other = options;
  other.sampling.seed = 4;
  const auto reseeded = generate(self, model, prompts, other);
  EXPECT_TRUE(reseeded[0].tokens != batch[0].tokens || reseeded[1].tokens != batch[1].tokens);
}

TEST(Generate, StopTokenEndsASequence) {
  const ModelConfig config = preset_config("qwen3-tiny");
  const Model model(config, random_parameters(config, 7));
  SelfCommunicator self;
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(5, config.vocab_size, 5), prompt_of(8, config.vocab_size, 6)};
  const auto free_run = generate(self, model, prompts, {.max_new_tokens = 6});
  // Stop on the third token of prompt 0: that sequence ends there (the stop token kept), the other
  // runs on unless it meets the same token.
  const int32_t stop = free_run[0].tokens[2];
  const auto stopped = generate(self, model, prompts, {.max_new_tokens = 6, .stop_tokens = {stop}});
  const size_t first = static_cast<size_t>(std::find(free_run[0].tokens.begin(), free_run[0].tokens.end(), stop) -
                                           free_run[0].tokens.begin());
  EXPECT_EQ(stopped[0].tokens, std::vector<int32_t>(free_run[0].tokens.begin(), free_run[0].tokens.begin() + first + 1));
  EXPECT_TRUE(stopped[0].stopped);
  const auto& other = free_run[1].tokens;
  const size_t other_end = std::min(other.size(), static_cast<size_t>(std::find(other.begin(), other.end(), stop) - other.begin()) + 1);
  EXPECT_EQ(stopped[1].tokens, std::vector<int32_t>(other.begin(), other.begin() + other_end));
}

TEST(Generate, PrefillLengthRule) {
  const ModelConfig hydra = preset_config("hydrahead-tiny"), teacher = preset_config("qwen3-tiny");
  EXPECT_EQ(prefill_length(hydra, 1, 1), 0);
  EXPECT_EQ(prefill_length(hydra, 10, 1), 9);
  EXPECT_EQ(prefill_length(teacher, 10, 2), 8);
  EXPECT_EQ(prefill_length(teacher, 9, 2), 8);
  EXPECT_EQ(prefill_length(teacher, 8, 2), 4);
  // GDN segments need K − 1 = 3 tokens: 2P·3 = 12 on two ranks.
  EXPECT_EQ(prefill_length(hydra, 12, 2), 0);
  EXPECT_EQ(prefill_length(hydra, 13, 2), 12);
  EXPECT_EQ(prefill_length(hydra, 40, 3), 36);
  // Rows: prefill/P plus a round-robin share of (rest of the prompt + new tokens − 1).
  EXPECT_EQ(cache_rows_needed(teacher, 10, 5, 2), 4 + 3);
  EXPECT_EQ(cache_rows_needed(teacher, 10, 1, 1), 9 + 1);
}

TEST(Generate, CacheBytesPerToken) {
  // hydrahead-1.7b: 2 · 1 KV head · 128 · 2 bytes per layer, 28 layers (≈ 14.3 KB); the teacher 8×.
  const KvCacheBytes h = kv_cache_bytes(preset_config("hydrahead-1.7b"), DType::bf16, DType::f32);
  const KvCacheBytes t = kv_cache_bytes(preset_config("qwen3-1.7b"), DType::bf16, DType::f32);
  EXPECT_EQ(h.per_token, 28.0 * 2 * 128 * 2);
  EXPECT_EQ(t.per_token, 8 * h.per_token);
  EXPECT_EQ(h.per_slot, 28.0 * (14 * 128 * 128 * 4 + 3 * 3 * 14 * 128 * 2));
  EXPECT_EQ(t.per_slot, 0.0);
}

// The penalty in closed form: seen ids' positive logits / F, negative × F, zero and unseen untouched;
// the seen set is the distinct ids, so a repeated id is penalized once.
TEST(Sampling, RepetitionPenaltyClosedForm) {
  const std::vector<float> base = {2.0f, -1.5f, 0.0f, 3.0f, -0.25f, 1.0f};
  const SeenTokens seen(std::vector<int32_t>{4, 0, 1, 0, 2, 4});
  EXPECT_EQ(std::vector<int32_t>(seen.ids().begin(), seen.ids().end()), (std::vector<int32_t>{0, 1, 2, 4}));
  std::vector<float> row = base;
  apply_repetition_penalty(row, seen.ids(), 2.0);
  EXPECT_EQ(row, (std::vector<float>{1.0f, -3.0f, 0.0f, 3.0f, -0.5f, 1.0f}));
  // F < 1 raises them instead; 1 changes nothing.
  row = base;
  apply_repetition_penalty(row, seen.ids(), 0.5);
  EXPECT_EQ(row, (std::vector<float>{4.0f, -0.75f, 0.0f, 3.0f, -0.125f, 1.0f}));
  row = base;
  apply_repetition_penalty(row, seen.ids(), 1.0);
  EXPECT_EQ(row, base);
  // Greedy after the penalty: with 0 seen, its 3.5 / 2 = 1.75 falls below 2's 2.0; with 2 seen too
  // (added twice, kept once), 1.75 beats 2's 1.0 and 1's 1.0.
  SeenTokens grown(std::vector<int32_t>{0});
  row = {3.5f, 1.0f, 2.0f};
  apply_repetition_penalty(row, grown.ids(), 2.0);
  EXPECT_EQ(sample_token(row, {}, 0), 2) << "1.75 < 2.0";
  grown.add(2);
  grown.add(2);
  EXPECT_EQ(grown.ids().size(), 2u);
  row = {3.5f, 1.0f, 2.0f};
  apply_repetition_penalty(row, grown.ids(), 2.0);
  EXPECT_EQ(sample_token(row, {}, 0), 0) << "1.75 > 1.0";
}

TEST(Sampling, GreedyFiltersAndSeeds) {
  const std::vector<float> logits = {0.5f, 2.0f, 2.0f, -1.0f, 1.5f};
  EXPECT_EQ(sample_token(logits, {}, 0), 1) << "greedy: the lowest id among equal maxima";
  // top-k 1 is greedy whatever the temperature and the draw.
  for (uint64_t draw = 0; draw < 20; ++draw) EXPECT_EQ(sample_token(logits, {.temperature = 5.0, .top_k = 1, .seed = 9}, draw), 1);
  // top-k 3 keeps {1, 2, 4}; a tiny top-p keeps only the most likely.
  std::vector<int> seen(5, 0);
  for (uint64_t draw = 0; draw < 400; ++draw) ++seen[static_cast<size_t>(sample_token(logits, {.temperature = 1.0, .top_k = 3, .seed = 1}, draw))];
  EXPECT_EQ(seen[0] + seen[3], 0);
  EXPECT_GT(seen[1], 0);
  EXPECT_GT(seen[2], 0);
  EXPECT_GT(seen[4], 0);
  for (uint64_t draw = 0; draw < 50; ++draw) EXPECT_EQ(sample_token(logits, {.temperature = 1.0, .top_p = 0.1, .seed = 2}, draw), 1);
  // top-p 0.7 of p ∝ e^{l}: {1, 2} hold 0.32 + 0.32 < 0.7, with 4 (0.19) 0.83 ≥ 0.7: three kept.
  std::fill(seen.begin(), seen.end(), 0);
  for (uint64_t draw = 0; draw < 400; ++draw) ++seen[static_cast<size_t>(sample_token(logits, {.temperature = 1.0, .top_p = 0.7, .seed = 3}, draw))];
  EXPECT_EQ(seen[0] + seen[3], 0);
  EXPECT_GT(seen[4], 0);
  // A large vocabulary with a nucleus that needs more than the first ranked block.
  std::vector<float> flat(1000, 0.0f);
  std::fill(seen.begin(), seen.end(), 0);
  int64_t high = 0;
  for (uint64_t draw = 0; draw < 200; ++draw) high = std::max<int64_t>(high, sample_token(flat, {.temperature = 1.0, .top_p = 0.9, .seed = 4}, draw));
  EXPECT_GT(high, 500) << "the nucleus of a flat distribution holds 900 tokens";
  EXPECT_LT(high, 900);
  // Same seed and draw: same token; the draw index changes it.
  EXPECT_EQ(sample_token(flat, {.temperature = 1.0, .seed = 5}, 7), sample_token(flat, {.temperature = 1.0, .seed = 5}, 7));
}

}  // namespace
}  // namespace hydra::test
