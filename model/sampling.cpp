#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "runtime/error.h"
#include "runtime/random.h"

namespace hydra {

int32_t sample_token(std::span<const float> logits, const SamplingParams& params, uint64_t draw) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  HYDRA_ASSERT(vocab > 0, "sampling from an empty logits row");
  if (params.greedy()) return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  // Probabilities at the temperature (fp64, max-subtracted).
  const double inv_t = 1.0 / params.temperature;
  const double top = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) p[static_cast<size_t>(i)] = std::exp((logits[static_cast<size_t>(i)] - top) * inv_t);
  // Candidates in decreasing probability (ties: lower id first). Only as many as the filters need are
  // ranked: k for top-k, else a prefix grown until it holds probability p.
  const auto before = [&](int32_t a, int32_t b) {
    const double pa = p[static_cast<size_t>(a)], pb = p[static_cast<size_t>(b)];
    return pa > pb || (pa == pb && a < b);
  };
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  int64_t keep = params.top_k > 0 ? std::min(params.top_k, vocab) : vocab;
  if (keep < vocab) std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), before);
  if (params.top_p < 1.0) {  // the nucleus of what top-k kept, on its renormalised distribution
    double kept_mass = 0;
    for (int64_t i = 0; i < keep; ++i) kept_mass += p[static_cast<size_t>(ids[static_cast<size_t>(i)])];
    const double target = params.top_p * kept_mass;
    for (int64_t ranked = keep < vocab ? keep : std::min<int64_t>(vocab, 64);; ranked = std::min(keep, ranked * 4)) {
      if (keep == vocab) std::partial_sort(ids.begin(), ids.begin() + ranked, ids.end(), before);
      double acc = 0;
      int64_t n = 0;
      while (n < ranked && acc < target) acc += p[static_cast<size_t>(ids[static_cast<size_t>(n++)])];
      if (acc >= target || ranked == keep) {
        keep = std::max<int64_t>(n, 1);
        break;
      }
    }
  }
  double mass = 0;
  for (int64_t i = 0; i < keep; ++i) mass += p[static_cast<size_t>(ids[static_cast<size_t>(i)])];
  const double u = RandomStream{params.seed, hash_name("sample")}.uniform(draw) * mass;
  double acc = 0;
  for (int64_t i = 0; i < keep; ++i) {
    acc += p[static_cast<size_t>(ids[static_cast<size_t>(i)])];
    if (u < acc) return ids[static_cast<size_t>(i)];
  }
  return ids[static_cast<size_t>(keep - 1)];  // rounding at the very end of the cumulative sum
}

void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> seen, double penalty) {
  HYDRA_ASSERT(penalty > 0.0, "repetition penalty {} (must be > 0)", penalty);
  if (penalty == 1.0) return;
  const float f = static_cast<float>(penalty);
  for (const int32_t id : seen) {
    HYDRA_ASSERT(id >= 0 && static_cast<size_t>(id) < logits.size(), "seen token {} outside [0, {})", id, logits.size());
    float& x = logits[static_cast<size_t>(id)];
    x = x < 0.0f ? x * f : x / f;
  }
}

SeenTokens::SeenTokens(std::span<const int32_t> ids) : ids_(ids.begin(), ids.end()) {
  std::sort(ids_.begin(), ids_.end());
  ids_.erase(std::unique(ids_.begin(), ids_.end()), ids_.end());
}

void SeenTokens::add(int32_t id) {
  const auto at = std::lower_bound(ids_.begin(), ids_.end(), id);
  if (at == ids_.end() || *at != id) ids_.insert(at, id);
}

}  // namespace hydra
