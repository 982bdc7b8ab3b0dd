// Calibration data for head selection (DESIGN.md §1.4): retrieval prompts with their corrupted twins,
// and plain-text sequences. model/selection/head_selection.h scores heads on them.
//
// A retrieval prompt is a NIAH sample (model/eval/niah.h): [haystack with needles][query][answer], the
// answer teacher-forced at the end. Its corrupted twin is the same sample with the value of the
// queried needle(s) changed and nothing else: same length, same filler, keys, markers, query, and
// the same (clean) answer tokens at the end. Running both and comparing the model's log p(clean
// answer) isolates what the heads carry from the needle value to the answer. Two sources:
//  * generated samples (the built-in token-space generator) — corrupt_generated: every value token
//    of every needle whose key is the queried key (single/multikey: the primary needle; multivalue:
//    all of the key's values) is replaced by a different content id,
//      v' = (v + 1 + u) mod C,  u = bits(seed, "select-heads/corrupt/<length>/<depth>/<index>", k) mod (C − 1)
//    (C content ids, k the running count of replaced tokens), so v' ≠ v for every token. The
//    corrupted answer is what the corrupted needles state (multivalue: the new values joined by SEP
//    in context order). Patching starts at the QUERY marker: positions [a − 2 − key_length, T).
//  * eval sets (model/eval/niah_set.h, e.g. natural-language sets) — corrupt_with_donor: the sample
//    records no needle structure, so every occurrence of its answer token sequence inside the
//    context [0, a − 1) is replaced by a donor answer of the same length: that of the next sample
//    in the set (cyclically) whose answer has the same length and differs. UserError when the answer
//    does not occur in the context (its tokenization must match the needle's) or no donor exists.
//    The query start is unknown, so patching covers the answer-predicting positions: [a − 1, T).
// Patched positions always hold the same tokens in both prompts (they come after every corrupted
// token): a patched head output differs from the clean one only through what the head read.
// Plain text: `count` sequences of uniform random ids (default), or consecutive windows of a token
// file (--lm-text).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/eval/niah.h"
#include "model/eval/niah_set.h"

namespace hydra::heads {

struct CalibrationPrompt {
  std::vector<int32_t> clean;             // [T]
  std::vector<int32_t> corrupted;         // [T]: clean with the queried needle value(s) changed
  int64_t answer_start = 0;               // a ≥ 1: the answer is clean[a, a+n), equal in corrupted
  int64_t answer_length = 0;              // n ≥ 1
  std::vector<int32_t> corrupted_answer;  // [n]: the answer the corrupted needle(s) state
  int64_t patch_start = 0;                // activation patching replaces head outputs at [patch_start, T)

  int64_t length() const { return static_cast<int64_t>(clean.size()); }
  std::span<const int32_t> answer() const {
    return std::span<const int32_t>(clean).subspan(static_cast<size_t>(answer_start), static_cast<size_t>(answer_length));
  }
};

// A generated sample's corrupted twin (header comment). The sample must come from generate_sample.
CalibrationPrompt corrupt_generated(const niah::Sample& sample, int64_t vocab_size, uint64_t seed);
// An eval-set sample's corrupted twin with `donor` (an answer of the same length that differs);
// `where` names the sample in UserErrors.
CalibrationPrompt corrupt_with_donor(const niah::Sample& sample, std::span<const int32_t> donor, const std::string& where);

// `count` generated prompts of `length` tokens: sample i has index i and depth round(100·i/(count−1))
// (50 for a single prompt), so the needles sweep the context. UserErrors for impossible settings.
std::vector<CalibrationPrompt> generated_prompts(const niah::TaskParams& params, int64_t vocab_size, uint64_t seed,
                                                 int64_t length, int64_t count);
// Every sample of an eval set, each with its donor (header comment); `source` names the file.
std::vector<CalibrationPrompt> eval_set_prompts(const niah::EvalSet& set, const std::string& source);

// `count` sequences of `length` uniform ids in [0, vocab) from (seed, "select-heads/lm/<i>").
std::vector<std::vector<int32_t>> random_text(int64_t vocab_size, uint64_t seed, int64_t length, int64_t count);
// The first `count` non-overlapping windows of `length` tokens; UserError naming `source` when the
// tokens are fewer than count·length.
std::vector<std::vector<int32_t>> text_windows(const std::vector<int32_t>& tokens, int64_t length, int64_t count,
                                               const std::string& source);

}  // namespace hydra::heads
