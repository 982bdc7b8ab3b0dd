// The distributed NIAH scorer (niah::score_answer_rows) under mpirun, P = 1..4. The answer rows
// sit at the end of the sequence; with short segments they are split between the owners of the
// last two segments (ranks 0 and 1), so the all-reduce of the per-row verdicts is exercised.
//  - A model whose arg-max is known (tests/common/known_argmax_model.h): every rank must return
//    the hand-computed verdict and log-probability.
//  - A random HydraHead model: every rank's P-rank result equals the single-process result it
//    computes itself (same arg-max tokens; log-probability within 1e-4, fp32 summation order).
//  - Sequence groups (parallel/sequence_groups.h): gather gives every rank each group's values;
//    the in-training NIAH evaluation split over the groups (every sp dividing P) scores each sample
//    once and equals the one-process result.
#include <set>

#include "model/eval/niah.h"
#include "model/train/evaluation.h"
#include "model/params.h"
#include "parallel/mpi_communicator.h"
#include "parallel/sequence_groups.h"
#include "parallel/self_communicator.h"
#include "tests/common/known_argmax_model.h"
#include "tests/common/test_util.h"
#include "tests/parallel/parallel_test_util.h"

namespace hydra::test {
namespace {

// Ranks owning the answer's rows a−1 .. a+n−2.
std::set<int> row_owners(const SequenceLayout& layout, int64_t a, int64_t n) {
  std::set<int> owners;
  for (int r = 0; r < layout.world_size(); ++r) {
    for (const Segment& s : layout.segments_of(r)) {
      if (s.start < a - 1 + n && a - 1 < s.start + s.length) owners.insert(r);
    }
  }
  return owners;
}

TEST(NiahParallel, KnownArgmaxVerdictOnEveryRank) {
  MpiCommunicator& comm = world();
  niah::TaskParams p;
  p.value_length_min = p.value_length_max = 4;
  const int64_t length = 24;  // admissible for P = 1..4; P = 3, 4: the answer rows cross a segment boundary
  niah::Sample s;
  for (int64_t index = 0;; ++index) {
    s = niah::generate_sample(p, 64, 21, length, 50, index);
    if (std::set<int32_t>(s.answer().begin(), s.answer().end()).size() == 4) break;
  }
  const SequenceLayout layout = SequenceLayout::zigzag(length, comm.size(), comm.rank());
  if (comm.size() >= 3) {
    EXPECT_EQ(row_owners(layout, s.answer_start, 4), (std::set<int>{0, 1}));
  }
  std::vector<int32_t> next(64, 0);
  next[static_cast<size_t>(s.ids[s.answer_start - 1])] = s.answer()[0];
  for (int j = 0; j < 3; ++j) next[static_cast<size_t>(s.answer()[j])] = s.answer()[j + 1];
  {
    const KnownArgmaxModel m = make_known_argmax_model(next);
    const niah::AnswerScore r = niah::evaluate_sample(Model(m.config, m.params), comm, s);
    EXPECT_TRUE(r.correct);
    EXPECT_NEAR(r.logprob, 4 * m.logprob_hit(), 1e-5);  // fp32 forward vs fp64 closed form
  }
  // Break the last step (its row is owned by rank 0) and the first (rank 1 when P ≥ 3).
  next[static_cast<size_t>(s.answer()[2])] = s.answer()[3] == 1 ? 2 : 1;
  next[static_cast<size_t>(s.ids[s.answer_start - 1])] = s.answer()[0] == 1 ? 2 : 1;
  const KnownArgmaxModel m = make_known_argmax_model(next);
  const niah::AnswerScore r = niah::evaluate_sample(Model(m.config, m.params), comm, s);
  EXPECT_FALSE(r.correct);
  EXPECT_EQ(r.predicted, (std::vector<int32_t>{next[static_cast<size_t>(s.ids[s.answer_start - 1])], s.answer()[1],
                                               s.answer()[2], next[static_cast<size_t>(s.answer()[2])]}));
  EXPECT_NEAR(r.logprob, 2 * m.logprob_hit() + 2 * m.logprob_miss(), 1e-5);
}

TEST(NiahParallel, RandomHydraModelMatchesOneProcess) {
  MpiCommunicator& comm = world();
  const ModelConfig c = preset_config("hydrahead-tiny");
  const Model model(c, random_parameters(c, 4));
  niah::TaskParams p;
  p.task = niah::Task::multivalue;  // the longest answers
  SelfCommunicator self;
  for (int64_t depth : {0, 100}) {
    const niah::Sample s = niah::generate_sample(p, c.vocab_size, 8, 48, depth, 0);
    const niah::AnswerScore one = niah::evaluate_sample(model, self, s);
    const niah::AnswerScore many = niah::evaluate_sample(model, comm, s);
    EXPECT_EQ(many.predicted, one.predicted);
    EXPECT_EQ(many.correct, one.correct);
    EXPECT_NEAR(many.logprob, one.logprob, 1e-4);
    EXPECT_TRUE(std::isfinite(one.logprob));
  }
}

TEST(SequenceGroups, GatherGivesEveryRankEachGroupsValues) {
  MpiCommunicator& comm = world();
  for (int sp = 1; sp <= comm.size(); ++sp) {
    if (comm.size() % sp != 0) continue;
    SequenceGroups groups(comm, sp);
    EXPECT_EQ(groups.replicas(), comm.size() / sp);
    EXPECT_EQ(groups.replica(), comm.rank() / sp);
    EXPECT_EQ(groups.sp(), sp);
    // Group g sends g values g·100 + j (none for g = 0): lengths differ; only the lead's count.
    std::vector<double> mine;
    for (int j = 0; j < groups.replica(); ++j) mine.push_back(groups.replica() * 100.0 + j + 0.25);
    if (!groups.group_lead()) mine.assign(3, -1.0);  // ignored
    const std::vector<std::vector<double>> all = groups.gather(mine);
    ASSERT_EQ(static_cast<int>(all.size()), groups.replicas());
    for (int g = 0; g < groups.replicas(); ++g) {
      ASSERT_EQ(static_cast<int>(all[static_cast<size_t>(g)].size()), g) << "sp " << sp;
      for (int j = 0; j < g; ++j) EXPECT_EQ(all[static_cast<size_t>(g)][static_cast<size_t>(j)], g * 100.0 + j + 0.25);
    }
  }
}

TEST(SequenceGroups, TrainingNiahEvaluationSplitsTheSamples) {
  MpiCommunicator& comm = world();
  const ModelConfig c = preset_config("hydrahead-tiny");
  const Model model(c, random_parameters(c, 6));
  const train::NiahEvaluation eval = train::niah_evaluation({"single", "multivalue"}, c.vocab_size, 48, 5);
  SelfCommunicator self;
  SequenceGroups alone(self, 0);
  const std::vector<train::NiahScore> one = train::niah_scores(model, alone, eval);
  ASSERT_EQ(one.size(), 2u);
  for (int sp = 1; sp <= comm.size(); ++sp) {
    if (comm.size() % sp != 0) continue;
    SequenceGroups groups(comm, sp);
    const std::vector<train::NiahScore> split = train::niah_scores(model, groups, eval);
    ASSERT_EQ(split.size(), one.size());
    for (size_t t = 0; t < one.size(); ++t) {
      EXPECT_EQ(split[t].task, one[t].task);
      EXPECT_EQ(split[t].accuracy, one[t].accuracy) << "sp " << sp;
      // Each of the 5 samples counted once: a repeated or missing sample would move the mean by ~1 nat.
      EXPECT_NEAR(split[t].mean_logprob, one[t].mean_logprob, 1e-4) << "sp " << sp << " task " << one[t].task;
      EXPECT_TRUE(std::isfinite(one[t].mean_logprob));
    }
  }
}

}  // namespace
}  // namespace hydra::test
