// Calibration data for head selection (model/selection/head_calibration.h): a corrupted prompt differs from
// its clean twin exactly at the queried needle value tokens (every one of them changed, nothing
// else), keeps the clean answer, states the corrupted answer, and patches only positions after
// every corrupted token; eval-set prompts take a donor answer; plain text is deterministic; bad
// inputs get UserErrors naming the problem.
#include <set>

#include "model/selection/head_calibration.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

constexpr int64_t kVocab = 256;

class GeneratedCorruption : public ::testing::TestWithParam<niah::Task> {};

TEST_P(GeneratedCorruption, ChangesExactlyTheQueriedValues) {
  niah::TaskParams params;
  params.task = GetParam();
  const niah::Markers m = niah::markers_for(kVocab);
  const std::vector<heads::CalibrationPrompt> prompts = heads::generated_prompts(params, kVocab, 7, 301, 3);
  ASSERT_EQ(prompts.size(), 3u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const heads::CalibrationPrompt& p = prompts[i];
    const niah::Sample s = niah::generate_sample(params, kVocab, 7, 301, static_cast<int64_t>(i) * 50, static_cast<int64_t>(i));
    EXPECT_EQ(p.clean, s.ids) << "depths 0, 50, 100 in order";
    ASSERT_EQ(p.corrupted.size(), p.clean.size());
    // The positions that must change: every value token of the needles with the queried key.
    std::set<int64_t> values;
    std::vector<int32_t> corrupted_answer;
    std::vector<const niah::Needle*> queried;
    for (const niah::Needle& n : s.needles)
      if (n.key == s.key) queried.push_back(&n);
    std::sort(queried.begin(), queried.end(), [](auto* x, auto* y) { return x->position < y->position; });
    for (const niah::Needle* n : queried) {
      if (!corrupted_answer.empty()) corrupted_answer.push_back(m.sep);
      for (size_t k = 0; k < n->value.size(); ++k) {
        const int64_t at = n->position + 2 + static_cast<int64_t>(s.key.size()) + static_cast<int64_t>(k);
        values.insert(at);
        corrupted_answer.push_back(p.corrupted[at]);
      }
    }
    EXPECT_EQ(values.size() > 0, true);
    for (int64_t t = 0; t < p.length(); ++t) {
      if (values.count(t)) {
        EXPECT_NE(p.corrupted[t], p.clean[t]) << t;
        EXPECT_LT(p.corrupted[t], m.content) << "a content id";
        EXPECT_LT(t, p.patch_start);
      } else {
        EXPECT_EQ(p.corrupted[t], p.clean[t]) << t;
      }
    }
    EXPECT_EQ(p.answer_start, s.answer_start);
    EXPECT_EQ(p.corrupted_answer, corrupted_answer);
    EXPECT_EQ(p.clean[p.patch_start], m.query) << "patching starts at the query";
    EXPECT_EQ(p.patch_start, s.answer_start - 2 - params.key_length);
  }
  // Deterministic in the seed, different across seeds.
  EXPECT_EQ(heads::generated_prompts(params, kVocab, 7, 301, 3)[1].corrupted, prompts[1].corrupted);
  EXPECT_NE(heads::generated_prompts(params, kVocab, 8, 301, 3)[1].corrupted, prompts[1].corrupted);
}

INSTANTIATE_TEST_SUITE_P(Tasks, GeneratedCorruption,
                         ::testing::Values(niah::Task::single, niah::Task::multikey, niah::Task::multivalue));

TEST(HeadCalibration, EvalSetPromptsTakeADonorAnswer) {
  niah::TaskParams params;
  params.value_length_min = params.value_length_max = 2;
  niah::EvalSet set{.task = "single", .source = "test", .samples = {}};
  for (int64_t i = 0; i < 3; ++i) set.samples.push_back(niah::generate_sample(params, kVocab, 1, 64, 50, i));
  const auto prompts = heads::eval_set_prompts(set, "set.h5");
  ASSERT_EQ(prompts.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const heads::CalibrationPrompt& p = prompts[i];
    const std::span<const int32_t> donor = set.samples[(i + 1) % 3].answer();
    EXPECT_EQ(p.corrupted_answer, std::vector<int32_t>(donor.begin(), donor.end()));
    EXPECT_EQ(p.patch_start, p.answer_start - 1);
    const int64_t at = set.samples[i].needles[0].position + 4;  // NEEDLE k k IS value
    for (int64_t t = 0; t < p.length(); ++t) {
      if (t == at || t == at + 1) {
        EXPECT_EQ(p.corrupted[t], donor[t - at]);
      } else {
        EXPECT_EQ(p.corrupted[t], p.clean[t]) << t;
      }
    }
  }
  // No donor: one sample only, or every answer alike.
  niah::EvalSet one = set;
  one.samples.resize(1);
  EXPECT_NE(error_of([&] { heads::eval_set_prompts(one, "set.h5"); }).find("set.h5: sample 0: no other sample"),
            std::string::npos);
  // An answer that does not occur in the context.
  niah::Sample odd = set.samples[0];
  odd.ids[odd.needles[0].position + 4] = odd.ids[odd.answer_start] == 0 ? 1 : 0;
  const std::vector<int32_t> donor{1, 2};
  EXPECT_NE(error_of([&] { heads::corrupt_with_donor(odd, donor, "set.h5: sample 0"); }).find("do not occur in the context"),
            std::string::npos);
}

TEST(HeadCalibration, PlainText) {
  const auto a = heads::random_text(kVocab, 3, 50, 2);
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].size(), 50u);
  EXPECT_NE(a[0], a[1]);
  EXPECT_EQ(heads::random_text(kVocab, 3, 50, 2), a);
  for (int32_t t : a[1]) EXPECT_LT(t, kVocab);
  std::vector<int32_t> tokens(25);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i);
  const auto w = heads::text_windows(tokens, 10, 2, "t.h5");
  EXPECT_EQ(w[1].front(), 10);
  EXPECT_EQ(w[1].back(), 19);
  EXPECT_NE(error_of([&] { heads::text_windows(tokens, 10, 3, "t.h5"); }).find("t.h5: holds 25 tokens"), std::string::npos);
}

TEST(HeadCalibration, TooShortPromptsAreRefused) {
  niah::TaskParams params;
  EXPECT_NE(error_of([&] { heads::generated_prompts(params, kVocab, 0, 10, 2); }).find("too short"), std::string::npos);
  EXPECT_NE(error_of([&] { heads::generated_prompts(params, kVocab, 0, 100, 0); }).find("at least 1"), std::string::npos);
}

}  // namespace
}  // namespace hydra::test
