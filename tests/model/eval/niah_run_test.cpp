// The NIAH run (model/eval/niah_run.h) as a library: the plans check every length before any weight
// is read, cells run in plan order with the callback after each, a model that retrieves scores 1 and
// one that does not scores what evaluate_sample gives sample by sample.
#include "model/eval/niah_run.h"

#include <gtest/gtest.h>

#include "model/eval/niah_set.h"
#include "model/params.h"
#include "parallel/self_communicator.h"
#include "tests/common/needle_head_model.h"
#include "tests/common/test_util.h"

namespace hydra::test {
namespace {

TEST(NiahPlan, GeneratedPlanHasEveryCellInTaskLengthDepthOrder) {
  const ModelConfig c = preset_config("qwen3-tiny");
  niah::TaskParams single, multikey;
  multikey.task = niah::Task::multikey;
  const niah::EvalPlan plan = niah::plan_generated({single, multikey}, {64, 128}, {0, 50, 100}, 3, 7, c, 1);
  ASSERT_EQ(plan.cells.size(), 12u);
  EXPECT_EQ(plan.tasks, (std::vector<std::string>{"single", "multikey"}));
  EXPECT_EQ(plan.longest, 128);
  EXPECT_EQ(plan.total_samples(), 36);
  EXPECT_EQ(plan.cells[0].task, 0);
  EXPECT_EQ(plan.cells[4].length, 128);
  EXPECT_EQ(plan.cells[4].depth, 50);
  EXPECT_EQ(plan.cells[11].task, 1);
  // Sample i of a cell is the generator's sample of (seed, task, length, depth, i).
  const niah::Sample s = plan.cells[4].sample(2);
  const niah::Sample expected = niah::generate_sample(single, c.vocab_size, 7, 128, 50, 2);
  EXPECT_EQ(s.ids, expected.ids);
  EXPECT_EQ(s.answer_start, expected.answer_start);
}

TEST(NiahPlan, LengthsAreCheckedAgainstTheTaskAndTheRanks) {
  const ModelConfig c = preset_config("hydrahead-tiny");
  niah::TaskParams single;
  EXPECT_NE(error_of([&] { niah::plan_generated({single}, {4}, {50}, 1, 0, c, 1); }).find("too short for NIAH task single"),
            std::string::npos);
  EXPECT_NE(error_of([&] { niah::plan_generated({single}, {66}, {50}, 1, 0, c, 2); }).find("66 is not divisible by 2P = 4"),
            std::string::npos);
  // 64 tokens on 16 ranks: segments of 2 tokens, shorter than the conv halo of a HydraHead model.
  EXPECT_NE(error_of([&] { niah::plan_generated({single}, {64}, {50}, 1, 0, c, 16); }).find("shorter than the conv halo"),
            std::string::npos);
}

TEST(NiahRun, ARetrievingModelScoresOneAndTheCallbackSeesEveryCell) {
  const NeedleHeadModel m = make_needle_head_model();
  const Model model(m.config, m.params);
  niah::EvalPlan plan;
  plan.tasks = {"needle-head"};
  for (int64_t depth : {10, 50, 90}) {
    plan.cells.push_back(niah::CellPlan{0, 96, depth, 2, [depth](int64_t i) {
                                          niah::Sample s = needle_head_sample(96, 96 * depth / 100, 30, 11 + i);
                                          s.depth = depth;
                                          s.index = i;
                                          return s;
                                        }});
  }
  plan.longest = 96;
  SelfCommunicator comm;
  SequenceGroups groups(comm, 0);
  niah::Report report;
  std::vector<size_t> seen;
  const niah::EvalTotals totals =
      niah::run_plan(model, groups, plan, report, [&](const niah::Report& r) { seen.push_back(r.cells.size()); });
  EXPECT_EQ(seen, (std::vector<size_t>{1, 2, 3}));
  EXPECT_EQ(report.cells_total, 3);
  ASSERT_EQ(report.cells.size(), 3u);
  EXPECT_EQ(report.cells[1].depth, 50);
  EXPECT_EQ(report.samples.size(), 6u);
  EXPECT_EQ(totals.samples, 6);
  EXPECT_EQ(totals.correct, 6);
  EXPECT_DOUBLE_EQ(totals.accuracy(), 1.0);
  EXPECT_LT(totals.mean_logprob(), 0.0);
}

// An eval set's item_separator splits each answer into items for recall: the retrieving model
// predicts the needle's value at every answer position, so of the answer [value, SEP, other value]
// it finds the first item and not the second: recall 1/2 read with the separator, 0 as one item.
TEST(NiahRun, EvalSetItemSeparatorSplitsTheAnswerForRecall) {
  const NeedleHeadModel m = make_needle_head_model();
  const Model model(m.config, m.params);
  const int32_t sep = niah::markers_for(48).sep;
  auto set = std::make_shared<niah::EvalSet>();
  set->task = "two-items";
  set->item_separator = sep;
  for (int64_t i = 0; i < 2; ++i) {
    niah::Sample s = needle_head_sample(94, 20 + 30 * i, 30, 11 + i);  // its answer: the value 30
    s.ids.insert(s.ids.end(), {sep, 31});
    s.answer_length = 3;
    s.length = 96;
    s.depth = 50;
    s.index = i;
    set->samples.push_back(s);
  }
  TempDir dir;
  for (const int32_t separator : {sep, -1}) {
    set->item_separator = separator;
    niah::write_eval_set(dir.file("set.h5"), *set);
    const auto back = std::make_shared<const niah::EvalSet>(niah::read_eval_set(dir.file("set.h5"), 48));
    EXPECT_EQ(back->item_separator, separator);
    const niah::EvalPlan plan = niah::plan_eval_set(back, "set.h5", m.config, 1);
    EXPECT_EQ(plan.item_separator, (std::vector<int32_t>{separator}));
    SelfCommunicator comm;
    SequenceGroups groups(comm, 0);
    niah::Report report;
    niah::run_plan(model, groups, plan, report, {});
    ASSERT_EQ(report.samples.size(), 2u);
    for (const auto& r : report.samples) {
      EXPECT_EQ(r.predicted, (std::vector<int32_t>{30, 30, 30})) << "the model retrieves the needle's value";
      EXPECT_FALSE(r.correct);
      EXPECT_DOUBLE_EQ(r.recall, separator >= 0 ? 0.5 : 0.0) << "separator " << separator;
    }
  }
  // An item_separator outside the vocabulary is refused by name.
  set->item_separator = 47;
  niah::write_eval_set(dir.file("set.h5"), *set);
  EXPECT_NE(error_of([&] { niah::read_eval_set(dir.file("set.h5"), 40); }).find("item_separator 47"), std::string::npos);
}

TEST(NiahRun, VerdictsAreThoseOfEvaluateSample) {
  const ModelConfig c = preset_config("hydrahead-tiny");
  const Model model(c, random_parameters(c, 3));
  niah::TaskParams single;
  const niah::EvalPlan plan = niah::plan_generated({single}, {64}, {0, 100}, 2, 5, c, 1);
  SelfCommunicator comm;
  SequenceGroups groups(comm, 0);
  niah::Report report;
  const niah::EvalTotals totals = niah::run_plan(model, groups, plan, report, {});
  ASSERT_EQ(report.samples.size(), 4u);
  double logprob = 0;
  for (size_t i = 0; i < report.samples.size(); ++i) {
    const niah::Sample s = plan.cells[i / 2].sample(static_cast<int64_t>(i % 2));
    const niah::AnswerScore direct = niah::evaluate_sample(model, comm, s);
    EXPECT_EQ(report.samples[i].correct, direct.correct) << i;
    EXPECT_DOUBLE_EQ(report.samples[i].logprob, direct.logprob) << i;
    EXPECT_EQ(report.samples[i].predicted, direct.predicted) << i;
    logprob += direct.logprob;
  }
  EXPECT_NEAR(totals.logprob, logprob, 1e-9 * std::abs(logprob));
}

}  // namespace
}  // namespace hydra::test
