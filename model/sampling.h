// Choosing the next token from a row of logits (hydra generate): greedy arg-max, or a seeded draw
// after temperature, top-k and top-p (nucleus) filtering. Draw n of a run is a pure function of
// (seed, n) (runtime/random.h), so every rank, and every rerun, picks the same token. Before either,
// an optional repetition penalty lowers the logits of the tokens a sequence already holds.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace hydra {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy (the arg-max; the lowest id among equal maxima)
  int64_t top_k = 0;         // keep the k most likely tokens (0: all)
  double top_p = 1.0;        // then the smallest most-likely set whose probability reaches p (1: all)
  uint64_t seed = 0;
  double repetition_penalty = 1.0;  // > 0; 1: off (apply_repetition_penalty)
  bool greedy() const { return temperature <= 0.0; }
};

// logits [V] (finite). `draw` selects the uniform number of the seeded stream (callers use one per
// (sequence, generated token)). Ties in ranking go to the lower id.
int32_t sample_token(std::span<const float> logits, const SamplingParams& params, uint64_t draw);

// The repetition penalty of CTRL (Keskar et al. 2019) as transformers' RepetitionPenaltyLogitsProcessor
// applies it: for every id in `seen` (distinct ids), a positive logit is divided by `penalty` and a
// negative one multiplied by it (fp32, like the logits), so F > 1 makes every seen token less likely
// whatever its sign. The other logits are untouched. `penalty` = 1 changes nothing.
void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> seen, double penalty);

// The distinct ids a sequence holds so far, its prompt's and its new tokens' (what the penalty
// reads), sorted: memory grows with the distinct ids, at most the vocabulary, not with the length.
class SeenTokens {
 public:
  explicit SeenTokens(std::span<const int32_t> ids);
  void add(int32_t id);
  std::span<const int32_t> ids() const { return ids_; }

 private:
  std::vector<int32_t> ids_;  // sorted, distinct
};

}  // namespace hydra
