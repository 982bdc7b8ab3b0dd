#include "model/train/evaluation.h"

#include <algorithm>

#include "runtime/error.h"
#include "runtime/stop_request.h"

namespace hydra::train {
namespace {

// The seed of the NIAH samples scored during training (--eval-niah): fixed, so every evaluation of
// a run (and of every run) scores the same samples; eval-niah's default seed differs, and synth's
// training documents use a seed derived from their own (model/train/synth.h), so neither repeats them.
constexpr uint64_t kNiahEvalSeed = 7919;

}  // namespace

LossSums reduce_loss_sums(Communicator& comm, const LossSums& local, int* stop_votes) {
  Tensor buf = Tensor::empty({5}, DType::f64);
  double* b = buf.data_as<double>();
  b[0] = local.loss;
  b[1] = static_cast<double>(local.tokens);
  b[2] = local.answer_loss;
  b[3] = static_cast<double>(local.answer_tokens);
  b[4] = stop_votes && stop_signal() != 0 ? 1.0 : 0.0;
  all_reduce_sum_host(comm, buf);
  if (stop_votes) *stop_votes = static_cast<int>(b[4]);
  return LossSums{b[0], static_cast<int64_t>(b[1]), b[2], static_cast<int64_t>(b[3])};
}

double mean_loss(const LossSums& total) { return total.loss / static_cast<double>(std::max<int64_t>(total.tokens, 1)); }

nlohmann::json loss_fields(const LossSums& s, const std::string& prefix) {
  auto mean = [](double sum, int64_t n) { return n > 0 ? nlohmann::json(sum / static_cast<double>(n)) : nlohmann::json(); };
  return {{prefix + "answer_loss", mean(s.answer_loss, s.answer_tokens)},
          {prefix + "answer_tokens", s.answer_tokens},
          {prefix + "other_loss", mean(s.loss - s.answer_loss, s.tokens - s.answer_tokens)},
          {prefix + "counted_tokens", s.tokens}};
}

LossSums held_out_loss(const StageRun& run, Communicator& world, const TokenWindows& data, const HeldOutShare& share) {
  HYDRA_ASSERT(share.batch_seqs >= 1 && share.replicas >= 1 && share.windows <= data.count(),
               "held-out share of {} windows (batch {}, {} replicas) over {} windows", share.windows, share.batch_seqs,
               share.replicas, data.count());
  LossSums local;
  std::vector<Window> batch;
  for (int64_t i = share.replica; i < share.windows; i += share.replicas) {
    batch.push_back(data.window_in_order(data.evaluation_index(i)));  // file order, or a blend's draws
    if (static_cast<int64_t>(batch.size()) == share.batch_seqs || i + share.replicas >= share.windows) {
      local += stage_loss(run, batch, 1.0, nullptr);
      batch.clear();
    }
  }
  return reduce_loss_sums(world, local);
}

NiahEvaluation niah_evaluation(const std::vector<std::string>& task_names, int64_t vocab, int64_t seq_len,
                               int64_t samples) {
  NiahEvaluation eval{.tasks = {}, .seq_len = seq_len, .samples = samples};
  for (const std::string& name : task_names) eval.tasks.push_back(niah::TaskParams{.task = niah::parse_task(name)});
  for (const niah::TaskParams& p : eval.tasks) {
    p.validate(vocab);
    HYDRA_USER_CHECK(p.min_length() <= seq_len, "--eval-niah {}: a sample needs at least {} tokens, --seq-len is {}",
                     niah::task_name(p.task), p.min_length(), seq_len);
  }
  return eval;
}

std::vector<NiahScore> niah_scores(const Model& model, SequenceGroups& groups, const NiahEvaluation& eval) {
  const int64_t vocab = model.config().vocab_size, tasks = static_cast<int64_t>(eval.tasks.size());
  // [tasks, 2]: this group's correct answers and summed log-probability per task (group rank 0 only).
  Tensor sums = Tensor::zeros({tasks, 2}, DType::f64);
  for (int64_t t = 0; t < tasks; ++t) {
    const niah::TaskParams& p = eval.tasks[static_cast<size_t>(t)];
    for (int64_t i = groups.replica(); i < eval.samples; i += groups.replicas()) {
      const int64_t depth = eval.samples > 1 ? 100 * i / (eval.samples - 1) : 50;
      const niah::Sample sample = niah::generate_sample(p, vocab, kNiahEvalSeed, eval.seq_len, depth, i);
      const niah::AnswerScore score = niah::evaluate_sample(model, groups.sequence(), sample);
      if (!groups.group_lead()) continue;  // every rank of the group holds the same score
      sums.data_as<double>()[2 * t] += score.correct ? 1 : 0;
      sums.data_as<double>()[2 * t + 1] += score.logprob;
    }
  }
  all_reduce_sum_host(groups.world(), sums);
  std::vector<NiahScore> scores;
  const double n = static_cast<double>(eval.samples);
  for (int64_t t = 0; t < tasks; ++t) {
    scores.push_back({niah::task_name(eval.tasks[static_cast<size_t>(t)].task), sums.data_as<double>()[2 * t] / n,
                      sums.data_as<double>()[2 * t + 1] / n});
  }
  return scores;
}

}  // namespace hydra::train
