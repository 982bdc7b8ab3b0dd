// The RULER families in token space (model/eval/ruler.h):
//  - each generator's samples hold what the header says, read back from the ids by an independent
//    parser (multiquery's needles and query, vartrack's chains resolved by following the
//    assignments, cwe's and fwe's word counts), at every depth and for several indices;
//  - determinism, the depth of the first statement, and the knobs' errors;
//  - the scorer (exact verdict and order-free recall, teacher-forced and generated) on models whose
//    greedy output is known in closed form: a next-token table (tests/common/known_argmax_model.h)
//    that emits the answer's items in order, swapped, or one item twice.
#include <map>
#include <set>

#include "model/eval/niah.h"
#include "model/eval/niah_run.h"
#include "model/eval/ruler.h"
#include "parallel/self_communicator.h"
#include "tests/common/known_argmax_model.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

using niah::Sample;
using niah::Task;
using niah::TaskParams;
using Word = std::vector<int32_t>;

constexpr int64_t kVocab = 256;

TaskParams params(Task task) {
  TaskParams p;
  p.task = task;
  p.common_freq = 6;  // cwe at test lengths
  p.uncommon_freq = 2;
  p.common_words = 4;
  return p;
}

// Items of the answer (split at SEP).
std::vector<Word> items_of(const Sample& s) { return niah::answer_items(s.answer(), niah::markers_for(kVocab).sep); }

// Statements NEEDLE key IS value END of the context, in order.
std::vector<std::pair<Word, Word>> statements(const Sample& s) {
  const niah::Markers m = niah::markers_for(kVocab);
  std::vector<std::pair<Word, Word>> out;
  for (int64_t i = 0; i < s.answer_start; ++i) {
    if (s.ids[i] != m.needle) continue;
    Word key, value;
    int64_t j = i + 1;
    for (; s.ids[j] != m.is; ++j) key.push_back(s.ids[j]);
    for (++j; s.ids[j] != m.end; ++j) value.push_back(s.ids[j]);
    out.emplace_back(key, value);
    i = j;
  }
  return out;
}

// Words of a cwe/fwe list (each followed by SEP), after END padding, before QUERY.
std::map<Word, int64_t> word_counts(const Sample& s, int64_t key_length) {
  const niah::Markers m = niah::markers_for(kVocab);
  std::map<Word, int64_t> counts;
  int64_t i = 0;
  while (s.ids[i] == m.end) ++i;
  while (s.ids[i] != m.query) {
    const Word w(s.ids.begin() + i, s.ids.begin() + i + key_length);
    EXPECT_EQ(s.ids[i + key_length], m.sep);
    ++counts[w];
    i += key_length + 1;
  }
  EXPECT_EQ(s.ids[i + 1], m.is);
  EXPECT_EQ(i + 2, s.answer_start);
  return counts;
}

TEST(Ruler, MultiqueryAsksEveryKeyAndAnswersTheirValues) {
  const TaskParams p = params(Task::multiquery);
  for (int64_t depth : {0, 50, 100}) {
    for (int64_t index = 0; index < 3; ++index) {
      const Sample s = niah::generate_sample(p, kVocab, 3, 256, depth, index);
      ASSERT_EQ(static_cast<int64_t>(s.ids.size()), 256);
      const auto st = statements(s);
      ASSERT_EQ(static_cast<int64_t>(st.size()), p.queries);
      std::map<Word, Word> value_of(st.begin(), st.end());
      ASSERT_EQ(static_cast<int64_t>(value_of.size()), p.queries) << "distinct keys";
      // The query: QUERY k1 SEP ... SEP kQ IS, keys in the order of the answer's values.
      const niah::Markers m = niah::markers_for(kVocab);
      const int64_t q0 = s.answer_start - 2 - p.queries * p.key_length - (p.queries - 1);
      ASSERT_EQ(s.ids[q0], m.query);
      const std::vector<Word> asked = niah::answer_items({s.ids.begin() + q0 + 1, s.ids.begin() + s.answer_start - 1}, m.sep);
      const std::vector<Word> answer = items_of(s);
      ASSERT_EQ(asked.size(), answer.size());
      for (size_t k = 0; k < asked.size(); ++k) EXPECT_EQ(value_of.at(asked[k]), answer[k]);
    }
  }
}

TEST(Ruler, VariableTrackingAnswersEveryVariableHoldingTheValue) {
  for (int64_t chains : {1, 3}) {
    TaskParams p = params(Task::vartrack);
    p.chains = chains;
    p.hops = 3;
    for (int64_t depth : {0, 40, 100}) {
      for (int64_t index = 0; index < 3; ++index) {
        const Sample s = niah::generate_sample(p, kVocab, 4, 320, depth, index);
        ASSERT_EQ(static_cast<int64_t>(s.ids.size()), 320);
        const auto st = statements(s);
        ASSERT_EQ(static_cast<int64_t>(st.size()), chains * (p.hops + 1));
        // Follow the assignments in context order: a variable holds v if it is assigned v or a
        // variable already holding v.
        std::set<Word> holds;
        for (const auto& [x, rhs] : st) {
          if (rhs == s.key || holds.count(rhs)) holds.insert(x);
        }
        const std::vector<Word> answer = items_of(s);
        EXPECT_EQ(std::set<Word>(answer.begin(), answer.end()), holds) << "depth " << depth << " index " << index;
        EXPECT_EQ(static_cast<int64_t>(answer.size()), p.hops + 1);
        // The chain's first statement sits at the depth: after round(depth·F/100) filler tokens.
        if (depth == 0) {
          EXPECT_EQ(s.needle_position, 0);
        }
      }
    }
  }
}

TEST(Ruler, CommonWordsAreTheOnesPlantedWithTheHighFrequency) {
  const TaskParams p = params(Task::cwe);
  for (int64_t length : {256, 512}) {
    for (int64_t index = 0; index < 3; ++index) {
      const Sample s = niah::generate_sample(p, kVocab, 5, length, 0, index);
      ASSERT_EQ(static_cast<int64_t>(s.ids.size()), length);
      const auto counts = word_counts(s, p.key_length);
      std::set<Word> common;
      for (const auto& [w, n] : counts) {
        EXPECT_TRUE(n == p.common_freq || n == p.uncommon_freq) << n;
        if (n == p.common_freq) common.insert(w);
      }
      EXPECT_GE(static_cast<int64_t>(counts.size()), p.common_words + 1);
      const std::vector<Word> answer = items_of(s);
      EXPECT_EQ(static_cast<int64_t>(answer.size()), p.common_words);
      EXPECT_EQ(std::set<Word>(answer.begin(), answer.end()), common);
    }
  }
}

TEST(Ruler, FrequentWordsAreTheTopCountsInOrder) {
  const TaskParams p = params(Task::fwe);
  for (int64_t length : {256, 1024}) {
    for (int64_t index = 0; index < 3; ++index) {
      const Sample s = niah::generate_sample(p, kVocab, 6, length, 0, index);
      ASSERT_EQ(static_cast<int64_t>(s.ids.size()), length);
      const auto counts = word_counts(s, p.key_length);
      std::vector<std::pair<int64_t, Word>> ranked;
      for (const auto& [w, n] : counts) ranked.emplace_back(n, w);
      std::sort(ranked.rbegin(), ranked.rend());
      const std::vector<Word> answer = items_of(s);
      ASSERT_EQ(static_cast<int64_t>(answer.size()), p.top_words);
      for (int64_t k = 0; k < p.top_words; ++k) {
        EXPECT_EQ(answer[static_cast<size_t>(k)], ranked[static_cast<size_t>(k)].second) << k;
        EXPECT_GT(ranked[static_cast<size_t>(k)].first, ranked[static_cast<size_t>(k) + 1].first) << "strict ranking";
      }
    }
  }
}

TEST(Ruler, DeterministicAndRefusesImpossibleKnobs) {
  for (Task task : {Task::multiquery, Task::vartrack, Task::cwe, Task::fwe}) {
    const TaskParams p = params(task);
    const Sample a = niah::generate_sample(p, kVocab, 9, 512, 30, 2), b = niah::generate_sample(p, kVocab, 9, 512, 30, 2);
    EXPECT_EQ(a.ids, b.ids) << niah::task_name(task);
    EXPECT_NE(a.ids, niah::generate_sample(p, kVocab, 9, 512, 30, 3).ids) << niah::task_name(task);
    EXPECT_EQ(niah::parse_task(niah::task_name(task)), task);
    EXPECT_NE(error_of([&] { niah::generate_sample(p, kVocab, 9, p.min_length() - 1, 0, 0); }).find("too short"),
              std::string::npos);
  }
  EXPECT_FALSE(niah::task_has_depth(Task::cwe));
  EXPECT_TRUE(niah::task_has_depth(Task::vartrack));
  TaskParams p = params(Task::cwe);
  p.common_freq = p.uncommon_freq;
  EXPECT_NE(error_of([&] { p.validate(kVocab); }).find("--common-freq above --uncommon-freq"), std::string::npos);
  p = params(Task::multiquery);
  p.queries = 1;
  EXPECT_NE(error_of([&] { p.validate(kVocab); }).find("at least 2 queries"), std::string::npos);
  p = params(Task::fwe);
  p.zipf_alpha = 0;
  EXPECT_NE(error_of([&] { p.validate(kVocab); }).find("--zipf-alpha must be positive"), std::string::npos);
  p = params(Task::vartrack);
  p.hops = 0;
  EXPECT_NE(error_of([&] { p.validate(kVocab); }).find("at least 1 hop"), std::string::npos);
}

// Two-item answers of one-token items (i1 SEP i2) for each family, on V = 64.
TaskParams two_items(Task task) {
  TaskParams p;
  p.task = task;
  p.key_length = 1;
  p.value_length_min = p.value_length_max = 1;
  p.queries = 2;
  p.hops = 1;
  p.common_words = 2;
  p.common_freq = 8;
  p.uncommon_freq = 3;  // 15 other words: 17 distinct one-token words of the 56 content ids
  p.top_words = 2;
  return p;
}

// The recall and verdict run_plan reports for `sample`'s plan cell on a next-token model.
niah::SampleResult score_with(const std::vector<int32_t>& next, const TaskParams& p, niah::Scoring scoring) {
  KnownArgmaxModel m = make_known_argmax_model(next);
  const Model model(m.config, m.params);
  const niah::EvalPlan plan = niah::plan_generated({p}, {128}, {50}, 1, 11, m.config, 1);
  SelfCommunicator self;
  SequenceGroups groups(self, 0);
  niah::Report report;
  niah::run_plan(model, groups, plan, report, {}, scoring);
  EXPECT_EQ(report.samples.size(), 1u);
  return report.samples.at(0);
}

TEST(Ruler, ScorersOnModelsWhoseOutputIsKnown) {
  const niah::Markers m = niah::markers_for(64);
  for (Task task : {Task::multivalue, Task::multiquery, Task::vartrack, Task::cwe, Task::fwe}) {
    TaskParams p = two_items(task);
    if (task == Task::multivalue) p.values = 2;
    const std::string name = niah::task_name(task);
    const Sample s = niah::generate_sample(p, 64, 11, 128, niah::task_has_depth(task) ? 50 : 0, 0);
    const std::vector<Word> items = niah::answer_items(s.answer(), m.sep);
    ASSERT_EQ(items.size(), 2u) << name;
    ASSERT_EQ(s.answer_length, 3) << name;
    const int32_t i1 = items[0][0], i2 = items[1][0];
    ASSERT_NE(i1, i2) << name;
    ASSERT_EQ(s.ids[s.answer_start - 1], m.is) << name;
    // The table emits IS → a, a → SEP, SEP → b: greedy output a SEP b.
    const auto table = [&](int32_t a, int32_t b) {
      std::vector<int32_t> next(64, 0);
      next[static_cast<size_t>(m.is)] = a;
      next[static_cast<size_t>(a)] = m.sep;
      next[static_cast<size_t>(m.sep)] = b;
      return next;
    };
    for (niah::Scoring scoring : {niah::Scoring::generate, niah::Scoring::teacher_forced}) {
      const std::string what = name + " " + niah::scoring_name(scoring);
      const niah::SampleResult right = score_with(table(i1, i2), p, scoring);
      EXPECT_TRUE(right.correct) << what;
      EXPECT_EQ(right.recall, 1.0) << what;
      const niah::SampleResult twice = score_with(table(i1, i1), p, scoring);
      EXPECT_FALSE(twice.correct) << what;
      EXPECT_EQ(twice.recall, 0.5) << what << ": one of two items";
    }
    // Swapped items: generation outputs i2 SEP i1 — every item present (order-free), not the exact answer.
    const niah::SampleResult swapped = score_with(table(i2, i1), p, niah::Scoring::generate);
    EXPECT_FALSE(swapped.correct) << name;
    EXPECT_EQ(swapped.recall, 1.0) << name;
    EXPECT_EQ(swapped.predicted, (std::vector<int32_t>{i2, m.sep, i1})) << name;
  }
}

}  // namespace
}  // namespace hydra::test
