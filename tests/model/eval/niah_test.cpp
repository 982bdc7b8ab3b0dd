// NIAH tasks and scoring (model/eval/niah.h, model/eval/niah_set.h), in one process:
//  - the generator: exact length, needle placement at depths 0/50/100, the query and the answer
//    span at the end, markers only where the format puts them, determinism, multikey distractors,
//    multivalue answers, value lengths;
//  - the scorer on hand-written logits (ties, NaN, log-probability by hand) and end to end on a
//    model whose arg-max is known (tests/common/known_argmax_model.h): passing and failing verdicts
//    and the answer log-probability against the closed form; and against Hugging Face greedy
//    generation (tests/fixtures/gen_niah_greedy.py): the teacher-forced verdict is generate's;
//  - the HDF5 eval-set format: round trip and the errors a bad set gets.
#include <cmath>
#include <set>

#include "model/hf_import.h"
#include "model/eval/niah.h"
#include "model/eval/niah_set.h"
#include "parallel/self_communicator.h"
#include "runtime/hdf5_file.h"
#include "tests/common/known_argmax_model.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

using niah::Markers;
using niah::Sample;
using niah::Task;
using niah::TaskParams;

constexpr int64_t kVocab = 256;

TaskParams params_for(Task task) {
  TaskParams p;
  p.task = task;
  return p;
}

// The needle's tokens at its position: NEEDLE key IS value END.
void expect_needle_at(const Sample& s, const niah::Needle& n, const Markers& m) {
  std::vector<int32_t> expected{m.needle};
  expected.insert(expected.end(), n.key.begin(), n.key.end());
  expected.push_back(m.is);
  expected.insert(expected.end(), n.value.begin(), n.value.end());
  expected.push_back(m.end);
  ASSERT_LE(n.position + static_cast<int64_t>(expected.size()), static_cast<int64_t>(s.ids.size()));
  const std::vector<int32_t> got(s.ids.begin() + n.position, s.ids.begin() + n.position + expected.size());
  EXPECT_EQ(got, expected) << "needle at " << n.position;
}

// Everything a sample must satisfy whatever its task: exact length, needles where they say, only
// content ids outside needles/query/answer, the query then the answer at the very end.
void expect_well_formed(const Sample& s, const TaskParams& p, int64_t length) {
  const Markers m = niah::markers_for(kVocab);
  ASSERT_EQ(static_cast<int64_t>(s.ids.size()), length);
  EXPECT_EQ(s.answer_start + s.answer_length, length);
  ASSERT_EQ(static_cast<int64_t>(s.needles.size()), p.num_needles());
  std::vector<bool> structural(static_cast<size_t>(length), false);
  for (const auto& n : s.needles) {
    expect_needle_at(s, n, m);
    EXPECT_GE(static_cast<int64_t>(n.value.size()), p.value_length_min);
    EXPECT_LE(static_cast<int64_t>(n.value.size()), p.value_length_max);
    for (int64_t i = 0; i < p.needle_length(static_cast<int64_t>(n.value.size())); ++i) {
      EXPECT_FALSE(structural[n.position + i]) << "needles overlap at " << n.position + i;
      structural[n.position + i] = true;
    }
  }
  const int64_t q = s.answer_start - p.query_length();
  std::vector<int32_t> query{m.query};
  query.insert(query.end(), s.key.begin(), s.key.end());
  query.push_back(m.is);
  EXPECT_EQ(std::vector<int32_t>(s.ids.begin() + q, s.ids.begin() + s.answer_start), query);
  for (int64_t i = 0; i < q; ++i) {
    if (!structural[i]) {
      EXPECT_LT(s.ids[i], m.content) << "filler at " << i << " is a marker";
    }
  }
  EXPECT_EQ(s.needle_position, s.needles[0].position);
}

TEST(NiahTokens, MarkersComeFromTheTopOfTheVocabulary) {
  const Markers m = niah::markers_for(256);
  EXPECT_EQ(m.needle, 255);
  EXPECT_EQ(m.is, 254);
  EXPECT_EQ(m.end, 253);
  EXPECT_EQ(m.query, 252);
  EXPECT_EQ(m.sep, 251);
  EXPECT_EQ(m.content, 248);
  EXPECT_NE(error_of([] { niah::markers_for(20); }).find("a vocabulary of 20 tokens is too small"), std::string::npos);
  EXPECT_EQ(niah::parse_task("multikey"), Task::multikey);
  EXPECT_NE(error_of([] { niah::parse_task("needle"); }).find("unknown NIAH task 'needle'"), std::string::npos);
}

TEST(NiahGenerator, SingleNeedleAtDepths0_50_100AndAnswerAtTheEnd) {
  const TaskParams p = params_for(Task::single);
  const int64_t length = 300;
  for (int64_t depth : {0, 50, 100}) {
    const Sample s = niah::generate_sample(p, kVocab, 7, length, depth, 1);
    expect_well_formed(s, p, length);
    const niah::Needle& n = s.needles[0];
    const int64_t region = s.answer_start - p.query_length();
    const int64_t fill = region - p.needle_length(static_cast<int64_t>(n.value.size()));
    EXPECT_EQ(n.position, (2 * depth * fill + 100) / 200) << "depth " << depth;
    if (depth == 0) {
      EXPECT_EQ(n.position, 0);
    }
    if (depth == 100) {
      EXPECT_EQ(n.position + p.needle_length(static_cast<int64_t>(n.value.size())), region);
    }
    // The answer is the needle's value: the last tokens of the sample.
    EXPECT_EQ(std::vector<int32_t>(s.answer().begin(), s.answer().end()), n.value);
    EXPECT_EQ(s.key, n.key);
  }
  EXPECT_NE(error_of([&] { niah::generate_sample(p, kVocab, 7, length, 101, 0); }).find("depth 101 is outside 0..100"),
            std::string::npos);
  EXPECT_EQ(p.min_length(), 9 + 4 + 4);
  EXPECT_NO_THROW(niah::generate_sample(p, kVocab, 7, p.min_length(), 50, 0));
  EXPECT_NE(error_of([&] { niah::generate_sample(p, kVocab, 7, p.min_length() - 1, 50, 0); })
                .find("length 16 is too short for NIAH task single: its needles, query and answer need up to 17 tokens"),
            std::string::npos);
}

TEST(NiahGenerator, DeterministicAndOnlyTheDepthMovesTheNeedle) {
  const TaskParams p = params_for(Task::multikey);
  const Sample a = niah::generate_sample(p, kVocab, 3, 512, 40, 2);
  const Sample b = niah::generate_sample(p, kVocab, 3, 512, 40, 2);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.answer_start, b.answer_start);
  EXPECT_NE(a.ids, niah::generate_sample(p, kVocab, 4, 512, 40, 2).ids);  // seed
  EXPECT_NE(a.ids, niah::generate_sample(p, kVocab, 3, 512, 40, 3).ids);  // sample index
  // Another depth: the same keys, values and filler; only the primary needle moves.
  const Sample c = niah::generate_sample(p, kVocab, 3, 512, 90, 2);
  EXPECT_NE(a.ids, c.ids);
  ASSERT_EQ(a.needles.size(), c.needles.size());
  for (size_t j = 0; j < a.needles.size(); ++j) {
    EXPECT_EQ(a.needles[j].key, c.needles[j].key);
    EXPECT_EQ(a.needles[j].value, c.needles[j].value);
  }
  EXPECT_GT(c.needles[0].position, a.needles[0].position);
  const auto filler_of = [](const Sample& s) {
    std::vector<bool> in_needle(s.ids.size(), false);
    for (const auto& n : s.needles) {
      for (size_t i = 0; i < 5 + n.value.size(); ++i) in_needle[n.position + i] = true;
    }
    std::vector<int32_t> out;
    for (int64_t i = 0; i < s.answer_start; ++i) {
      if (!in_needle[i]) out.push_back(s.ids[i]);
    }
    return out;
  };
  EXPECT_EQ(filler_of(a), filler_of(c));
}

TEST(NiahGenerator, MultikeyDistractorsHaveOtherKeysAndValues) {
  TaskParams p = params_for(Task::multikey);
  p.distractors = 5;
  for (int64_t index = 0; index < 20; ++index) {
    const Sample s = niah::generate_sample(p, kVocab, 1, 400, 30, index);
    expect_well_formed(s, p, 400);
    std::set<std::vector<int32_t>> keys;
    for (const auto& n : s.needles) keys.insert(n.key);
    EXPECT_EQ(keys.size(), s.needles.size()) << "keys must be distinct";
    for (size_t j = 1; j < s.needles.size(); ++j) EXPECT_NE(s.needles[j].value, s.needles[0].value);
    EXPECT_EQ(s.key, s.needles[0].key);
    EXPECT_EQ(std::vector<int32_t>(s.answer().begin(), s.answer().end()), s.needles[0].value);
  }
}

TEST(NiahGenerator, MultivalueAnswerIsEveryValueInContextOrder) {
  const TaskParams p = params_for(Task::multivalue);
  const Markers m = niah::markers_for(kVocab);
  for (int64_t depth : {0, 50, 100}) {
    const Sample s = niah::generate_sample(p, kVocab, 9, 200, depth, 0);
    expect_well_formed(s, p, 200);
    std::vector<niah::Needle> in_order = s.needles;
    std::sort(in_order.begin(), in_order.end(), [](const auto& x, const auto& y) { return x.position < y.position; });
    std::vector<int32_t> expected;
    std::set<std::vector<int32_t>> distinct;
    for (const auto& n : in_order) {
      EXPECT_EQ(n.key, s.key) << "every needle has the queried key";
      if (!expected.empty()) expected.push_back(m.sep);
      expected.insert(expected.end(), n.value.begin(), n.value.end());
      distinct.insert(n.value);
    }
    EXPECT_EQ(distinct.size(), 3u);
    EXPECT_EQ(std::vector<int32_t>(s.answer().begin(), s.answer().end()), expected);
    if (depth == 0) {
      EXPECT_EQ(s.needles[0].position, 0);
    }
  }
}

TEST(NiahGenerator, ValueLengthsCoverTheRange) {
  TaskParams p = params_for(Task::single);
  p.value_length_min = 1;
  p.value_length_max = 5;
  std::set<size_t> seen;
  for (int64_t index = 0; index < 60; ++index) seen.insert(niah::generate_sample(p, kVocab, 0, 64, 50, index).needles[0].value.size());
  EXPECT_EQ(seen, (std::set<size_t>{1, 2, 3, 4, 5}));
  p.value_length_min = 3;
  p.value_length_max = 2;
  EXPECT_NE(error_of([&] { p.validate(kVocab); }).find("value length 3..2"), std::string::npos);
}

TEST(NiahScore, HandWrittenLogits) {
  // Row 0 predicts 2 (logits 1, 2, 3, 0): log p(2) = 3 − log(e + e² + e³ + 1).
  // Row 1 ties ids 0 and 3: the lowest id (0) is the prediction.
  Tensor logits = Tensor::empty({2, 4}, DType::f32);
  const float values[] = {1, 2, 3, 0, 5, -1, 0, 5};
  std::copy(std::begin(values), std::end(values), logits.data_as<float>());
  const double norm0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + 1.0);
  const double norm1 = std::log(2 * std::exp(5.0) + std::exp(-1.0) + 1.0);
  const std::vector<int32_t> pass{2, 0}, tie_loses{2, 3};
  const niah::AnswerScore a = niah::score_answer(logits, pass);
  EXPECT_TRUE(a.correct);
  EXPECT_EQ(a.predicted, (std::vector<int32_t>{2, 0}));
  EXPECT_NEAR(a.logprob, (3 - norm0) + (5 - norm1), 1e-6);
  const niah::AnswerScore b = niah::score_answer(logits, tie_loses);
  EXPECT_FALSE(b.correct);
  EXPECT_NEAR(b.logprob, (3 - norm0) + (5 - norm1), 1e-6);  // 3 ties 0: the same probability
  logits.data_as<float>()[5] = std::nanf("");
  const niah::AnswerScore c = niah::score_answer(logits, pass);
  EXPECT_FALSE(c.correct);
  EXPECT_EQ(c.predicted[1], -1);
  EXPECT_TRUE(std::isnan(c.logprob));
}

// The single-task sample whose answer tokens are distinct (so a next-token chain can produce it).
Sample chain_sample(int64_t length) {
  TaskParams p = params_for(Task::single);
  for (int64_t index = 0;; ++index) {
    Sample s = niah::generate_sample(p, 64, 5, length, 50, index);
    const std::set<int32_t> distinct(s.answer().begin(), s.answer().end());
    if (s.answer_length >= 3 && static_cast<int64_t>(distinct.size()) == s.answer_length) return s;
  }
}

// next[] that makes the model emit `s`'s answer after the query's IS marker.
std::vector<int32_t> chain_for(const Sample& s) {
  std::vector<int32_t> next(64, 0);
  next[static_cast<size_t>(s.ids[s.answer_start - 1])] = s.answer()[0];
  for (int64_t j = 0; j + 1 < s.answer_length; ++j) next[static_cast<size_t>(s.answer()[j])] = s.answer()[j + 1];
  return next;
}

TEST(NiahScore, KnownArgmaxModelPassesAndFailsAsComputedByHand) {
  SelfCommunicator self;
  const Sample s = chain_sample(48);
  const int64_t n = s.answer_length;
  // Tolerance 1e-5: the forward is fp32 (RMSNorm with an fp64 sum); the closed form is fp64.
  {
    KnownArgmaxModel m = make_known_argmax_model(chain_for(s));
    const niah::AnswerScore r = niah::evaluate_sample(Model(m.config, m.params), self, s);
    EXPECT_TRUE(r.correct);
    EXPECT_EQ(r.predicted, std::vector<int32_t>(s.answer().begin(), s.answer().end()));
    EXPECT_NEAR(r.logprob, static_cast<double>(n) * m.logprob_hit(), 1e-5);
  }
  {
    // The second answer token is followed by a wrong one: answer[2] gets logit 0.
    std::vector<int32_t> next = chain_for(s);
    const int32_t wrong = s.answer()[2] == 1 ? 2 : 1;
    next[static_cast<size_t>(s.answer()[1])] = wrong;
    KnownArgmaxModel m = make_known_argmax_model(next);
    const niah::AnswerScore r = niah::evaluate_sample(Model(m.config, m.params), self, s);
    EXPECT_FALSE(r.correct);
    EXPECT_EQ(r.predicted[2], wrong);
    EXPECT_EQ(r.predicted[0], s.answer()[0]);
    EXPECT_NEAR(r.logprob, static_cast<double>(n - 1) * m.logprob_hit() + m.logprob_miss(), 1e-5);
  }
  {
    // A tie at the first answer position: a lower id beats the answer, a higher one does not.
    const int32_t is = s.ids[s.answer_start - 1], first = s.answer()[0];
    for (int32_t rival : {int32_t{0}, int32_t{55}}) {
      if (rival == first) continue;
      KnownArgmaxModel m = make_known_argmax_model(chain_for(s));
      m.set_logit(is, rival, 0.5f);
      const niah::AnswerScore r = niah::evaluate_sample(Model(m.config, m.params), self, s);
      EXPECT_EQ(r.correct, rival > first) << "rival " << rival << " vs " << first;
      EXPECT_EQ(r.predicted[0], std::min(rival, first));
      const double tied = m.peak - std::log(2 * std::exp(m.peak) + 62.0);
      EXPECT_NEAR(r.logprob, tied + static_cast<double>(n - 1) * m.logprob_hit(), 1e-5);
    }
  }
}

// The generated answer's tokens agree with the teacher-forced arg-maxes up to and including the
// first mismatch; after it they may differ (generation feeds its own token, not the reference).
void expect_same_until_first_miss(const niah::AnswerScore& tf, const niah::AnswerScore& gen, std::span<const int32_t> answer,
                                  const std::string& what) {
  ASSERT_EQ(tf.predicted.size(), answer.size()) << what;
  ASSERT_EQ(gen.predicted.size(), answer.size()) << what;
  EXPECT_EQ(tf.correct, gen.correct) << what;
  for (size_t j = 0; j < answer.size(); ++j) {
    EXPECT_EQ(gen.predicted[j], tf.predicted[j]) << what << " token " << j;
    if (tf.predicted[j] != answer[j]) break;
  }
}

// Scoring by generation (greedy decoding with the cache) on the model whose arg-max is known: the
// hand-computed verdicts of the teacher-forced test above, and log p of the generated tokens.
TEST(NiahScore, GenerationGivesTheTeacherForcedVerdicts) {
  SelfCommunicator self;
  const Sample s = chain_sample(48);
  const int64_t n = s.answer_length;
  const std::vector<int32_t> answer(s.answer().begin(), s.answer().end());
  {
    KnownArgmaxModel m = make_known_argmax_model(chain_for(s));
    const Model model(m.config, m.params);
    const niah::AnswerScore g = niah::generate_answer(model, self, s);
    EXPECT_TRUE(g.correct);
    EXPECT_EQ(g.predicted, answer);
    EXPECT_NEAR(g.logprob, static_cast<double>(n) * m.logprob_hit(), 1e-5);
    expect_same_until_first_miss(niah::evaluate_sample(model, self, s), g, answer, "chain");
  }
  {
    // answer[1] is followed by a wrong token: generation continues from it (next[wrong] = 0).
    std::vector<int32_t> next = chain_for(s);
    const int32_t wrong = s.answer()[2] == 1 ? 2 : 1;
    next[static_cast<size_t>(s.answer()[1])] = wrong;
    KnownArgmaxModel m = make_known_argmax_model(next);
    const Model model(m.config, m.params);
    const niah::AnswerScore g = niah::generate_answer(model, self, s);
    EXPECT_FALSE(g.correct);
    EXPECT_EQ(g.predicted[0], answer[0]);
    EXPECT_EQ(g.predicted[1], answer[1]);
    EXPECT_EQ(g.predicted[2], wrong);
    if (n > 3) {
      EXPECT_EQ(g.predicted[3], next[static_cast<size_t>(wrong)]);
    }
    EXPECT_NEAR(g.logprob, static_cast<double>(n) * m.logprob_hit(), 1e-5) << "every generated token is the arg-max";
    expect_same_until_first_miss(niah::evaluate_sample(model, self, s), g, answer, "broken chain");
  }
  for (int32_t rival : {int32_t{0}, int32_t{55}}) {
    // A tie at the first answer position: generation takes the lower id, as teacher forcing does.
    if (rival == answer[0]) continue;
    KnownArgmaxModel m = make_known_argmax_model(chain_for(s));
    m.set_logit(s.ids[s.answer_start - 1], rival, 0.5f);
    const Model model(m.config, m.params);
    const niah::AnswerScore g = niah::generate_answer(model, self, s);
    EXPECT_EQ(g.correct, rival > answer[0]) << "rival " << rival;
    EXPECT_EQ(g.predicted[0], std::min(rival, answer[0]));
    expect_same_until_first_miss(niah::evaluate_sample(model, self, s), g, answer, "tie " + std::to_string(rival));
  }
}

// Every task's samples, on a model that answers some of them (the chain of one sample) and a random
// HydraHead model: the two scorings give the same verdict on every sample.
TEST(NiahScore, GenerationAndTeacherForcingAgreeOnEverySample) {
  SelfCommunicator self;
  const Sample first = chain_sample(48);
  KnownArgmaxModel m = make_known_argmax_model(chain_for(first));
  const Model known(m.config, m.params);
  const ModelConfig c = preset_config("hydrahead-tiny");
  const Model random(c, random_parameters(c, 9));
  int64_t correct = 0;
  for (const Model* model : {&known, &random}) {
    for (Task task : {Task::single, Task::multikey, Task::multivalue}) {
      for (int64_t i = 0; i < 4; ++i) {
        const Sample s = niah::generate_sample(params_for(task), model->config().vocab_size, 5, 64, 25 * i, i);
        const std::vector<int32_t> answer(s.answer().begin(), s.answer().end());
        const niah::AnswerScore tf = niah::evaluate_sample(*model, self, s), g = niah::generate_answer(*model, self, s);
        expect_same_until_first_miss(tf, g, answer, niah::task_name(task) + " sample " + std::to_string(i));
        correct += g.correct ? 1 : 0;
      }
    }
    const Sample s = first;
    const niah::AnswerScore g = niah::generate_answer(*model, self, s), tf = niah::evaluate_sample(*model, self, s);
    expect_same_until_first_miss(tf, g, std::vector<int32_t>(s.answer().begin(), s.answer().end()), "chain sample");
    correct += g.correct ? 1 : 0;
  }
  EXPECT_GE(correct, 1) << "the chain sample passes on the known model";
}

TEST(NiahScore, RecallCountsTheAnswersItemsInAnyOrder) {
  const std::vector<int32_t> answer = {3, 4, 90, 5, 90, 6, 7};  // v1 SEP v2 SEP v3 with SEP = 90
  const auto items = niah::answer_items(answer, 90);
  ASSERT_EQ(items.size(), 3u);
  EXPECT_EQ(items[1], std::vector<int32_t>{5});
  EXPECT_EQ(niah::answer_items(answer, -1).size(), 1u);
  EXPECT_DOUBLE_EQ(niah::item_recall(answer, items), 1.0);
  EXPECT_DOUBLE_EQ(niah::item_recall(std::vector<int32_t>{6, 7, 90, 3, 4, 90, 5}, items), 1.0) << "order-free";
  EXPECT_DOUBLE_EQ(niah::item_recall(std::vector<int32_t>{3, 4, 90, 1, 90, 6, 1}, items), 1.0 / 3.0) << "v3 cut";
  EXPECT_DOUBLE_EQ(niah::item_recall(std::vector<int32_t>{4, 3}, items), 0.0) << "items are runs, not sets";
  EXPECT_DOUBLE_EQ(niah::item_recall(std::vector<int32_t>{}, {}), 1.0);
  EXPECT_EQ(niah::parse_scoring("generate"), niah::Scoring::generate);
  EXPECT_NE(error_of([] { niah::parse_scoring("greedy"); }).find("unknown scoring 'greedy'"), std::string::npos);
}

TEST(NiahScore, VerdictsMatchHfGreedyGeneration) {
  // The answers of tests/fixtures/niah/greedy_set.h5 were produced by transformers' generate
  // (greedy, KV cache) on this checkpoint, every third one corrupted. Log-probabilities: HF teacher
  // forcing; tolerance 1e-4 (both fp32 forwards; measured ~1e-6).
  const LoadedCheckpoint ck = import_hf_checkpoint(fixture_dir() + "/hf/gqa_untied");
  const Model model(ck.config, ck.params);
  const std::string path = fixture_dir() + "/niah/greedy_set.h5";
  const niah::EvalSet set = niah::read_eval_set(path, ck.config.vocab_size);
  const H5File ref = H5File::open_read(path);
  const Tensor correct = ref.read("reference_correct"), logprob = ref.read("reference_logprob");
  ASSERT_EQ(static_cast<int64_t>(set.samples.size()), correct.numel());
  SelfCommunicator self;
  int64_t passing = 0;
  for (size_t i = 0; i < set.samples.size(); ++i) {
    const niah::AnswerScore r = niah::evaluate_sample(model, self, set.samples[i]);
    EXPECT_EQ(r.correct, correct.data_as<int32_t>()[i] == 1) << "sample " << i;
    EXPECT_NEAR(r.logprob, logprob.data_as<float>()[i], 1e-4) << "sample " << i;
    passing += r.correct ? 1 : 0;
  }
  EXPECT_EQ(passing, 16);
}

TEST(NiahSet, RoundTripAndErrors) {
  TempDir dir;
  niah::EvalSet set{.task = "multikey", .source = "test", .samples = {}};
  for (int64_t depth : {0, 100}) {
    for (int64_t i = 0; i < 2; ++i) set.samples.push_back(niah::generate_sample(params_for(Task::multikey), kVocab, 2, 128, depth, i));
  }
  const std::string path = dir.file("set.h5");
  niah::write_eval_set(path, set);
  const niah::EvalSet back = niah::read_eval_set(path, kVocab);
  EXPECT_EQ(back.task, "multikey");
  EXPECT_EQ(back.source, "test");
  ASSERT_EQ(back.samples.size(), set.samples.size());
  for (size_t i = 0; i < set.samples.size(); ++i) {
    const Sample &a = set.samples[i], &b = back.samples[i];
    EXPECT_EQ(a.ids, b.ids);
    EXPECT_EQ(a.answer_start, b.answer_start);
    EXPECT_EQ(a.answer_length, b.answer_length);
    EXPECT_EQ(a.length, b.length);
    EXPECT_EQ(a.depth, b.depth);
    EXPECT_EQ(a.index, b.index);
    EXPECT_EQ(a.needle_position, b.needle_position);
  }
  EXPECT_NE(error_of([&] { niah::read_eval_set(path, 200); }).find("is outside the model's vocabulary [0, 200)"),
            std::string::npos);
  // Hand-built broken sets (what a buggy Python writer could produce).
  const auto broken = [&](int64_t answer_start, int64_t last_offset, const char* format) {
    H5File f = H5File::create(dir.file("bad.h5"));
    f.set_attribute("format", std::string(format));
    f.set_attribute("format_version", int64_t{1});
    f.set_attribute("task", std::string("single"));
    std::vector<int32_t> ids{1, 2, 3, 4, 5, 6};
    std::vector<int64_t> offset{0, last_offset}, start{answer_start}, count{2}, label{6}, depth{50};
    f.write("input_ids", TensorView(ids.data(), DType::i32, Device::host, {6}));
    f.write("sample_offset", TensorView(offset.data(), DType::i64, Device::host, {2}));
    f.write("answer_start", TensorView(start.data(), DType::i64, Device::host, {1}));
    f.write("answer_length", TensorView(count.data(), DType::i64, Device::host, {1}));
    f.write("length", TensorView(label.data(), DType::i64, Device::host, {1}));
    f.write("depth", TensorView(depth.data(), DType::i64, Device::host, {1}));
    f.close();
    return error_of([&] { niah::read_eval_set(dir.file("bad.h5"), kVocab); });
  };
  EXPECT_EQ(broken(4, 6, niah::kEvalSetFormat), "(no error)");
  EXPECT_NE(broken(5, 6, niah::kEvalSetFormat).find("sample 0: answer [5, 7) must lie in [1, 6]"), std::string::npos);
  EXPECT_NE(broken(0, 6, niah::kEvalSetFormat).find("answer [0, 2)"), std::string::npos);
  EXPECT_NE(broken(4, 5, niah::kEvalSetFormat).find("'sample_offset' must run from 0 to the 6 entries"), std::string::npos);
  EXPECT_NE(broken(4, 6, "hydrahead-checkpoint").find("not a NIAH eval set"), std::string::npos);
}

}  // namespace
}  // namespace hydra::test
