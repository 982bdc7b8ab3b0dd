// Choosing the next token from a row of logits (hydra generate): greedy arg-max, or a seeded draw
// after temperature, top-k and top-p (nucleus) filtering. Draw n of a run is a pure function of
// (seed, n) (runtime/random.h), so every rank, and every rerun, picks the same token.
#pragma once

#include <cstdint>
#include <span>

namespace hydra {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy (the arg-max; the lowest id among equal maxima)
  int64_t top_k = 0;         // keep the k most likely tokens (0: all)
  double top_p = 1.0;        // then the smallest most-likely set whose probability reaches p (1: all)
  uint64_t seed = 0;
  bool greedy() const { return temperature <= 0.0; }
};

// logits [V] (finite). `draw` selects the uniform number of the seeded stream (callers use one per
// (sequence, generated token)). Ties in ranking go to the lower id.
int32_t sample_token(std::span<const float> logits, const SamplingParams& params, uint64_t draw);

}  // namespace hydra
