// Generation over P CPU ranks against one process: the sequence-parallel prefill with a
// distributed cache (each rank keeps its zigzag rows, decode tokens dealt round robin, partial
// attention merged by log-sum-exp across ranks) gives the same tokens as one rank and the logits
// each token was chosen from agree to 1e-5 relative (fp32; only summation order differs). Teacher,
// HydraHead and a layer-wise hybrid; a batch of prompts whose lengths leave prompt tails of every
// size to the decode steps (and one too short for any prefill on these ranks); greedy and sampled,
// with and without a repetition penalty.
// Runs under mpirun with P = 1, 2, 3, 4.
#include <algorithm>

#include "model/generate.h"
#include "model/kv_cache.h"
#include "model/params.h"
#include "parallel/self_communicator.h"
#include "tests/common/test_util.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {
namespace {

constexpr double kTol = 1e-5;

std::vector<std::vector<int32_t>> prompts_for(int64_t vocab) {
  std::vector<std::vector<int32_t>> prompts;
  for (const int64_t n : {int64_t{2}, int64_t{29}, int64_t{64}, int64_t{47}}) {
    std::vector<int32_t> p(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = static_cast<int32_t>((i * 131 + n * 17 + 5) % vocab);
    prompts.push_back(p);
  }
  return prompts;
}

void expect_parallel_generation_equals_single(const ModelConfig& config, const SamplingParams& sampling,
                                              const std::string& what) {
  MpiCommunicator& comm = world();
  const Model model(config, random_parameters(config, 31));
  const auto prompts = prompts_for(config.vocab_size);
  const GenerateOptions options{.max_new_tokens = 7, .sampling = sampling, .keep_logits = true};
  SelfCommunicator self;
  const auto single = generate(self, model, prompts, options);
  const auto parallel = generate(comm, model, prompts, options);
  const int64_t vocab = config.vocab_size;
  for (size_t b = 0; b < prompts.size(); ++b) {
    const std::string where = what + " P=" + std::to_string(comm.size()) + " prompt " + std::to_string(b);
    EXPECT_EQ(parallel[b].prefilled, prefill_length(config, static_cast<int64_t>(prompts[b].size()), comm.size())) << where;
    ASSERT_EQ(parallel[b].tokens, single[b].tokens) << where;
    for (size_t i = 0; i < parallel[b].tokens.size(); ++i) {
      Tensor got = Tensor::empty({vocab}, DType::f32), want = Tensor::empty({vocab}, DType::f32);
      std::copy_n(parallel[b].logits.data() + i * vocab, vocab, got.data_as<float>());
      std::copy_n(single[b].logits.data() + i * vocab, vocab, want.data_as<float>());
      expect_close(got, want, kTol, where + " logits of token " + std::to_string(i));
    }
  }
}

TEST(Generate, TeacherOnRanksEqualsOneProcess) {
  expect_parallel_generation_equals_single(preset_config("qwen3-tiny"), {}, "qwen3-tiny greedy");
}

TEST(Generate, HydraHeadOnRanksEqualsOneProcess) {
  expect_parallel_generation_equals_single(preset_config("hydrahead-tiny"), {}, "hydrahead-tiny greedy");
  expect_parallel_generation_equals_single(preset_config("hydrahead-tiny"),
                                           {.temperature = 0.8, .top_k = 40, .top_p = 0.95, .seed = 11},
                                           "hydrahead-tiny sampled");
  // A repetition penalty: every rank penalizes the same ids of the same replicated logits.
  expect_parallel_generation_equals_single(preset_config("hydrahead-tiny"), {.repetition_penalty = 2.5},
                                           "hydrahead-tiny greedy with a repetition penalty");
  expect_parallel_generation_equals_single(preset_config("hydrahead-tiny"),
                                           {.temperature = 0.8, .top_k = 40, .seed = 11, .repetition_penalty = 1.3},
                                           "hydrahead-tiny sampled with a repetition penalty");
}

TEST(Generate, LayerwiseHybridOnRanksEqualsOneProcess) {
  ModelConfig c = preset_config("qwen3-tiny");
  c.arch = Arch::hydrahead;
  c.num_layers = 3;
  c.fa_heads = {{0, 1, 2, 3}, {}, {}};
  expect_parallel_generation_equals_single(c, {}, "layer-wise hybrid");
}

// The cache stays distributed and balanced: every rank holds its zigzag share of the prefill plus
// its round-robin share of the decode tokens, and the shares add up to the positions cached.
TEST(Generate, CacheRowsAreSplitEvenly) {
  MpiCommunicator& comm = world();
  const ModelConfig config = preset_config("hydrahead-tiny");
  const Model model(config, random_parameters(config, 32));
  const int p = comm.size();
  const int64_t prompt = 12 * p + 1;  // a prefill of 12·P tokens (segments of 6 ≥ K − 1) and one more
  std::vector<int32_t> ids(static_cast<size_t>(prompt));
  for (int64_t i = 0; i < prompt; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>(i % config.vocab_size);
  KvCache cache(model, 1, cache_rows_needed(config, prompt, 13, p), p, comm.rank());  // 13 decode rows
  const int64_t prefill = prefill_length(config, prompt, p);
  ASSERT_EQ(prefill, 12 * p);
  const SequenceLayout layout = SequenceLayout::zigzag(prefill, p, comm.rank());
  ForwardContext context{.comm = comm, .layout = layout, .cache = &cache};
  cache.begin_prefill(0, layout);
  model.forward_residual(context, layout.token_rows(std::span<const int32_t>(ids).first(static_cast<size_t>(prefill))).ids);
  cache.end_prefill(comm);
  EXPECT_EQ(cache.local_rows(0), prefill / p);
  for (int64_t step = 0; step < 13; ++step) {
    cache.begin_decode(std::vector<int64_t>{0});
    Tensor id = Tensor::empty({1}, DType::i32);
    id.data_as<int32_t>()[0] = static_cast<int32_t>(step % config.vocab_size);
    ForwardContext decode{.comm = comm, .cache = &cache};
    model.decode_step(decode, id);
    cache.end_decode();
  }
  EXPECT_EQ(cache.tokens(0), prefill + 13);
  Tensor rows = Tensor::empty({1}, DType::f32);
  rows.data_as<float>()[0] = static_cast<float>(cache.local_rows(0));
  Tensor all = Tensor::empty({p, 1}, DType::f32);
  comm.all_gather(rows, all);
  float lo = 1e9f, hi = 0, sum = 0;
  for (int r = 0; r < p; ++r) {
    const float v = all.data_as<float>()[r];
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    sum += v;
  }
  EXPECT_EQ(sum, static_cast<float>(prefill + 13));
  EXPECT_LE(hi - lo, 1.0f) << "round-robin appends keep the shares within one row";
}

}  // namespace
}  // namespace hydra::test
