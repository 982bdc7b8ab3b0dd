#include "model/eval/niah_run.h"

#include <chrono>
#include <cmath>
#include <map>

#include "model/nonfinite.h"
#include "parallel/agreement.h"
#include "runtime/log.h"
#include "runtime/sizes.h"

namespace hydra::niah {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The layout must admit every length for this rank count (same rule and message as hydra forward),
// and a HydraHead model's segments must hold the conv halo. `where` prefixes the message (a set's sample).
void check_length_for_ranks(int64_t length, const ModelConfig& config, int ranks, const std::string& where = "") {
  SequenceLayout layout;
  try {
    layout = SequenceLayout::zigzag(length, ranks, 0);
  } catch (const UserError& e) {
    HYDRA_USER_FAIL("{}{}", where, e.what());
  }
  if (ranks > 1 && config.is_hydra()) {
    HYDRA_USER_CHECK(layout.segment_length() >= config.conv_kernel - 1,
                     "{}length {} on {} ranks gives segments of {} token(s), shorter than the conv halo ({} rows); use a "
                     "longer sequence or fewer ranks",
                     where, length, ranks, layout.segment_length(), config.conv_kernel - 1);
  }
}

}  // namespace

int64_t EvalPlan::total_samples() const {
  int64_t n = 0;
  for (const CellPlan& c : cells) n += c.samples;
  return n;
}

EvalPlan plan_generated(const std::vector<TaskParams>& tasks, const std::vector<int64_t>& lengths,
                        const std::vector<int64_t>& depths, int64_t samples, uint64_t seed, const ModelConfig& config,
                        int ranks) {
  const int64_t vocab = config.vocab_size;
  EvalPlan plan;
  for (const TaskParams& p : tasks) {
    p.validate(vocab);
    for (int64_t length : lengths) {
      HYDRA_USER_CHECK(length >= p.min_length(),
                       "--lengths: {} is too short for NIAH task {}: its needles, query and answer need up to {} tokens",
                       length, task_name(p.task), p.min_length());
    }
  }
  for (int64_t length : lengths) {
    check_length_for_ranks(length, config, ranks);
    plan.longest = std::max(plan.longest, length);
  }
  for (size_t t = 0; t < tasks.size(); ++t) {
    plan.tasks.push_back(task_name(tasks[t].task));
    for (int64_t length : lengths) {
      for (int64_t depth : depths) {
        const TaskParams p = tasks[t];
        plan.cells.push_back(CellPlan{static_cast<int>(t), length, depth, samples, [p, vocab, seed, length, depth](int64_t i) {
                                        return generate_sample(p, vocab, seed, length, depth, i);
                                      }});
      }
    }
  }
  return plan;
}

EvalPlan plan_eval_set(std::shared_ptr<const EvalSet> set, const std::string& source, const ModelConfig& config,
                       int ranks) {
  EvalPlan plan;
  plan.tasks.push_back(set->task);
  std::map<std::pair<int64_t, int64_t>, size_t> cell_of;  // (length, depth) -> cell index
  auto members = std::make_shared<std::vector<std::vector<size_t>>>();
  for (size_t i = 0; i < set->samples.size(); ++i) {
    const Sample& s = set->samples[i];
    check_length_for_ranks(static_cast<int64_t>(s.ids.size()), config, ranks, fmt::format("{}: sample {}: ", source, i));
    plan.longest = std::max(plan.longest, static_cast<int64_t>(s.ids.size()));
    const auto [it, fresh] = cell_of.try_emplace({s.length, s.depth}, plan.cells.size());
    if (fresh) {
      plan.cells.push_back(CellPlan{0, s.length, s.depth, 0, {}});
      members->emplace_back();
    }
    (*members)[it->second].push_back(i);
    ++plan.cells[it->second].samples;
  }
  for (size_t c = 0; c < plan.cells.size(); ++c) {
    plan.cells[c].sample = [set, members, c](int64_t i) { return set->samples[(*members)[c][static_cast<size_t>(i)]]; };
  }
  return plan;
}

EvalTotals run_plan(const Model& model, Communicator& comm, const EvalPlan& plan, Report& report,
                    const std::function<void(const Report&)>& after_cell) {
  report.tasks = plan.tasks;
  report.cells_total = static_cast<int64_t>(plan.cells.size());
  EvalTotals totals;
  for (size_t c = 0; c < plan.cells.size(); ++c) {
    const CellPlan& cell = plan.cells[c];
    const std::string& task = plan.tasks[static_cast<size_t>(cell.task)];
    const auto cell_start = Clock::now();
    CellResult result{.task = cell.task, .length = cell.length, .depth = cell.depth, .samples = cell.samples};
    std::vector<SampleResult> rows;
    for (int64_t i = 0; i < cell.samples; ++i) {
      const Sample sample = cell.sample(i);
      const auto sample_start = Clock::now();
      const std::string which =
          fmt::format("sample {} of cell {} (task {}, length {}, depth {}%)", i, c + 1, task, cell.length, cell.depth);
      RunFingerprint fields;
      fields.add_tokens("sample tokens", sample.ids);
      fields.add("answer span", fmt::format("{} + {}", sample.answer_start, sample.answer_length));
      agree_across_ranks(comm, fields, which);
      const AnswerScore score = evaluate_sample(model, comm, sample);
      if (!std::isfinite(score.logprob)) {  // all-reduced: every rank takes this branch together
        fail_nonfinite(model, comm, sample.ids, fmt::format("eval-niah: the answer's log-probability in {} is", which));
      }
      const std::span<const int32_t> answer = sample.answer();
      rows.push_back(SampleResult{.task = cell.task,
                                  .length = sample.length,
                                  .depth = sample.depth,
                                  .index = sample.index,
                                  .answer_start = sample.answer_start,
                                  .needle_position = sample.needle_position,
                                  .correct = score.correct,
                                  .logprob = score.logprob,
                                  .seconds = seconds_since(sample_start),
                                  .answer = std::vector<int32_t>(answer.begin(), answer.end()),
                                  .predicted = score.predicted});
      result.correct += score.correct ? 1 : 0;
      result.mean_logprob += score.logprob / static_cast<double>(cell.samples);
    }
    result.seconds = seconds_since(cell_start);
    totals.samples += cell.samples;
    totals.correct += result.correct;
    totals.logprob += result.mean_logprob * static_cast<double>(cell.samples);
    report.add_cell(result, std::move(rows));
    log::info("niah {} length {} depth {}%: accuracy {:.3f} ({}/{}), mean logprob {:.3f}, {:.2f} s [cell {}/{}]", task,
              format_size(cell.length), cell.depth, result.accuracy(), result.correct, result.samples,
              result.mean_logprob, result.seconds, c + 1, plan.cells.size());
    if (after_cell) after_cell(report);
  }
  return totals;
}

}  // namespace hydra::niah
