// RULER's task families beyond vanilla NIAH, in token space (the markers, Draws and Sample of
// model/eval/niah.h; eval-niah --task runs them beside single/multikey/multivalue, so they share
// the plan, --sp, --score, the outputs and the set format). Every answer is a list of items joined
// by SEP, scored as NIAH is (exact match: the greedy verdict) and by recall (the fraction of items
// present in the output, order-free: RULER's string_match_all, niah.h item_recall).
//   multiquery  `queries` needles NEEDLE k_i IS v_i END with distinct keys (the first at the depth,
//               the others uniform); query QUERY k_1 SEP k_2 ... SEP k_Q IS; answer v_1 SEP ... v_Q
//               (query order).
//   vartrack    `chains` chains of `hops` hops: NEEDLE x_0 IS v END, then NEEDLE x_1 IS x_0 END, ...,
//               NEEDLE x_h IS x_{h−1} END in context order (chain 0's first statement at the depth,
//               its hops after it; other chains anywhere, in order); variables are key_length ids,
//               all distinct, values distinct and never equal to a variable; query QUERY v_0 IS;
//               answer x_0 SEP x_1 ... SEP x_h (every variable that holds v_0, in chain order).
//   cwe         common-words extraction: a list of words (key_length ids each, every occurrence
//               followed by SEP) in which `common_words` words occur `common_freq` times each and
//               as many other words as fit occur `uncommon_freq` times each, shuffled; the rest of
//               the region is END padding at its start; query QUERY IS; answer the common words
//               joined by SEP in order of first occurrence.
//   fwe         frequent-words extraction: as many word occurrences as fit, each drawn from a Zipf
//               law (exponent `zipf_alpha`) over `fwe_words` distinct words (0: occurrences / 4);
//               answer the `top_words` most frequent, most frequent first. Draws whose top counts
//               tie (no strict ranking of the top_words + 1 most frequent) are redrawn (attempt a of
//               the sample's stream, up to 64; UserError after).
// cwe and fwe have no needle and no depth: eval-niah gives them one cell per length (depth 0).
// Determinism as for NIAH: a sample is a function of (seed, task, length, depth, index).
#pragma once

#include <set>
#include <string>
#include <vector>

#include "model/eval/niah.h"

namespace hydra::niah {

// content^power, saturating at 2^40 (only compared against small counts): how many distinct
// sequences of `power` tokens a vocabulary of `content` tokens holds (the generators' capacity checks).
int64_t count_sequences(int64_t content, int64_t power);

// The shortest sample of a RULER family task (the longest items), its longest answer, and the
// UserErrors for impossible knobs. Called by TaskParams for these tasks.
int64_t ruler_min_length(const TaskParams& p);
int64_t ruler_max_answer_length(const TaskParams& p);
void ruler_validate(const TaskParams& p, const Markers& m);
// Whether the task places anything at a depth (multiquery, vartrack) or not (cwe, fwe).
bool task_has_depth(Task task);

// A task's knobs sized to a sample length as RULER sizes them (eval-niah --suite ruler), every knob
// whose flag is in `fixed` (e.g. "--common-freq") left as given:
//   cwe  below 4K tokens RULER counts each common word 6 times and each other word once
//        (--common-freq 6, --uncommon-freq 1; 30 and 3 from 4K on);
//   fwe  RULER draws from length/50 distinct words (--fwe-words, at least --top-words + 1);
// then, while the sample does not fit the length, the task's count knob shrinks one step at a time
// (cwe --common-words, then --common-freq down to --uncommon-freq + 1; fwe --top-words; multiquery
// --queries down to 2; vartrack --hops, then --chains; multivalue --values down to 2; multikey
// --distractors down to 1). `changes` names each knob changed ("--common-freq 30 -> 6"); a task that
// still does not fit is left as it is (the plan's length check names it).
struct SizedTask {
  TaskParams params;
  std::vector<std::string> changes;
};
SizedTask size_task_to_length(const TaskParams& p, int64_t length, const std::set<std::string>& fixed);
// RULER's seven families in token space, in its table's order: the tasks `eval-niah --suite ruler` runs.
const std::vector<Task>& ruler_suite_tasks();
// Whether a task is one of RULER's families beyond NIAH (multiquery, vartrack, cwe, fwe), scored by
// generation by default (RULER's metric reads generated text).
bool is_ruler_family(Task task);

// A sample of a RULER family task (header comment); arguments checked by generate_sample.
Sample generate_ruler_sample(const TaskParams& p, const Markers& m, uint64_t seed, int64_t length, int64_t depth,
                             int64_t index);

}  // namespace hydra::niah
