#include "model/eval/niah_run.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include <fmt/ranges.h>

#include "model/eval/ruler.h"
#include "model/generate.h"
#include "model/nonfinite.h"
#include "model/sequence_length.h"
#include "parallel/agreement.h"
#include "runtime/log.h"
#include "runtime/sizes.h"

namespace hydra::niah {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// What to change when a task does not fit a length: the knob that sizes it, and --suite ruler.
std::string shrink_hint(const TaskParams& p, int64_t length, bool sized) {
  std::string knob;
  switch (p.task) {
    case Task::cwe:
      knob = fmt::format("--common-words {} x --common-freq {} words (RULER uses --common-freq 6 --uncommon-freq 1 below 4K)",
                         p.common_words, p.common_freq);
      break;
    case Task::fwe: knob = fmt::format("--top-words {}", p.top_words); break;
    case Task::multiquery: knob = fmt::format("--queries {}", p.queries); break;
    case Task::vartrack: knob = fmt::format("--chains {} x --hops {}", p.chains, p.hops); break;
    case Task::multivalue: knob = fmt::format("--values {}", p.values); break;
    case Task::multikey: knob = fmt::format("--distractors {}", p.distractors); break;
    default: knob = fmt::format("--key-length {} and --value-length up to {}", p.key_length, p.value_length_max); break;
  }
  return fmt::format("; shrink {} to fit {}{}", knob, length,
                     sized ? "" : ", or pass --suite ruler to size the knobs to each length as RULER does");
}

}  // namespace

MemoryEstimate eval_memory_estimate(const EvalPlan& plan, const ModelConfig& config, Scoring scoring, int sp,
                                    Device device) {
  return scoring == Scoring::generate
             ? estimate_generation_memory(config, {plan.longest}, plan.longest_answer, sp, device, false)
             : estimate_prefill_memory(config, plan.longest / sp, sp, device);
}

int64_t EvalPlan::total_samples() const {
  int64_t n = 0;
  for (const CellPlan& c : cells) n += c.samples;
  return n;
}

EvalPlan plan_generated(const std::vector<TaskParams>& tasks, const std::vector<int64_t>& lengths,
                        const std::vector<int64_t>& depths, int64_t samples, uint64_t seed, const ModelConfig& config,
                        int ranks, const std::set<std::string>* size_to_length) {
  const int64_t vocab = config.vocab_size;
  EvalPlan plan;
  // Each task's knobs at each length: as given, or sized to the length (--suite ruler).
  std::vector<std::vector<SizedTask>> at(tasks.size());
  for (size_t t = 0; t < tasks.size(); ++t) {
    tasks[t].validate(vocab);
    for (int64_t length : lengths) {
      at[t].push_back(size_to_length ? size_task_to_length(tasks[t], length, *size_to_length) : SizedTask{tasks[t], {}});
      const TaskParams& p = at[t].back().params;
      p.validate(vocab);
      if (!at[t].back().changes.empty()) {
        plan.sizing.push_back(fmt::format("{} at {}: {}", task_name(p.task), format_size(length),
                                          fmt::join(at[t].back().changes, ", ")));
      }
      HYDRA_USER_CHECK(length >= p.min_length(),
                       "--lengths: {} is too short for NIAH task {}: its needles, query and answer need up to {} tokens{}",
                       length, task_name(p.task), p.min_length(), shrink_hint(p, length, size_to_length != nullptr));
    }
  }
  for (int64_t length : lengths) {
    check_sequence_length(config, length, ranks);
    plan.longest = std::max(plan.longest, length);
  }
  for (size_t t = 0; t < tasks.size(); ++t) {
    plan.tasks.push_back(task_name(tasks[t].task));
    // Every multi-item answer (multivalue and the RULER families) joins its items by SEP.
    const bool one_item = tasks[t].task == Task::single || tasks[t].task == Task::multikey;
    plan.item_separator.push_back(one_item ? -1 : markers_for(vocab).sep);
    for (size_t k = 0; k < lengths.size(); ++k) {
      const int64_t length = lengths[k];
      const TaskParams p = at[t][k].params;
      plan.longest_answer = std::max(plan.longest_answer, p.max_answer_length());
      const std::string sized = fmt::format("{}", fmt::join(at[t][k].changes, ", "));
      // cwe and fwe place nothing at a depth: one cell per length (depth 0).
      for (int64_t depth : task_has_depth(tasks[t].task) ? depths : std::vector<int64_t>{0}) {
        plan.cells.push_back(CellPlan{static_cast<int>(t), length, depth, samples, [p, vocab, seed, length, depth](int64_t i) {
                                        return generate_sample(p, vocab, seed, length, depth, i);
                                      }, sized});
      }
    }
  }
  return plan;
}

EvalPlan plan_eval_set(std::shared_ptr<const EvalSet> set, const std::string& source, const ModelConfig& config,
                       int ranks) {
  EvalPlan plan;
  plan.tasks.push_back(set->task);
  plan.item_separator.push_back(set->item_separator);  // the set's own (−1: one item)
  std::map<std::pair<int64_t, int64_t>, size_t> cell_of;  // (length, depth) -> cell index
  auto members = std::make_shared<std::vector<std::vector<size_t>>>();
  for (size_t i = 0; i < set->samples.size(); ++i) {
    const Sample& s = set->samples[i];
    check_sequence_length(config, static_cast<int64_t>(s.ids.size()), ranks, fmt::format("{}: sample {}: ", source, i));
    plan.longest = std::max(plan.longest, static_cast<int64_t>(s.ids.size()));
    plan.longest_answer = std::max(plan.longest_answer, s.answer_length);
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

namespace {

// One scored sample as the doubles a group sends in the gather: correct, logprob, recall, seconds, length,
// depth, index, answer_start, needle_position, n, answer [n], predicted [n]. Ids and counts are
// below 2^53, so the doubles hold them exactly.
std::vector<double> pack(const SampleResult& r) {
  std::vector<double> v = {r.correct ? 1.0 : 0.0,
                           r.logprob,
                           r.recall,
                           r.seconds,
                           static_cast<double>(r.length),
                           static_cast<double>(r.depth),
                           static_cast<double>(r.index),
                           static_cast<double>(r.answer_start),
                           static_cast<double>(r.needle_position),
                           static_cast<double>(r.answer.size())};
  v.insert(v.end(), r.answer.begin(), r.answer.end());
  v.insert(v.end(), r.predicted.begin(), r.predicted.end());
  return v;
}

SampleResult unpack(const std::vector<double>& v, int task) {
  HYDRA_ASSERT(v.size() >= 10, "a gathered NIAH result of {} values", v.size());
  const size_t n = static_cast<size_t>(v[9]);
  HYDRA_ASSERT(v.size() == 10 + 2 * n, "a gathered NIAH result of {} values for an answer of {}", v.size(), n);
  const auto ids = [&](size_t first) {
    std::vector<int32_t> out(n);
    for (size_t j = 0; j < n; ++j) out[j] = static_cast<int32_t>(v[first + j]);
    return out;
  };
  return SampleResult{.task = task,
                      .length = static_cast<int64_t>(v[4]),
                      .depth = static_cast<int64_t>(v[5]),
                      .index = static_cast<int64_t>(v[6]),
                      .answer_start = static_cast<int64_t>(v[7]),
                      .needle_position = static_cast<int64_t>(v[8]),
                      .correct = v[0] != 0,
                      .recall = v[2],
                      .logprob = v[1],
                      .seconds = v[3],
                      .answer = ids(10),
                      .predicted = ids(10 + n)};
}

}  // namespace

EvalTotals run_plan(const Model& model, SequenceGroups& groups, const EvalPlan& plan, Report& report,
                    const std::function<void(const Report&)>& after_cell, Scoring scoring, DecodeGraph cuda_graph) {
  report.tasks = plan.tasks;
  report.scoring = scoring_name(scoring);
  report.cells_total = static_cast<int64_t>(plan.cells.size());
  Communicator& comm = groups.sequence();
  // Sample k of the run is sample item[k].second of cell item[k].first.
  std::vector<std::pair<size_t, int64_t>> item;
  for (size_t c = 0; c < plan.cells.size(); ++c) {
    for (int64_t i = 0; i < plan.cells[c].samples; ++i) item.emplace_back(c, i);
  }
  const int64_t total = static_cast<int64_t>(item.size()), width = groups.replicas();
  EvalTotals totals;
  size_t next_cell = 0;                     // the first cell not yet in the report
  std::vector<SampleResult> rows;           // its samples gathered so far
  auto cell_start = Clock::now();
  for (int64_t round = 0; round * width < total; ++round) {
    std::vector<double> mine;  // this group's result of the round (empty: no sample left for it)
    const int64_t k = round * width + groups.replica();
    if (k < total) {
      const auto [c, i] = item[static_cast<size_t>(k)];
      const CellPlan& cell = plan.cells[c];
      const std::string& task = plan.tasks[static_cast<size_t>(cell.task)];
      const Sample sample = cell.sample(i);
      const auto sample_start = Clock::now();
      const std::string which =
          fmt::format("sample {} of cell {} (task {}, length {}, depth {}%)", i, c + 1, task, cell.length, cell.depth);
      RunFingerprint fields;
      fields.add_tokens("sample tokens", sample.ids);
      fields.add("answer span", fmt::format("{} + {}", sample.answer_start, sample.answer_length));
      agree_across_ranks(comm, fields, which);
      const AnswerScore score = scoring == Scoring::generate ? generate_answer(model, comm, sample, cuda_graph)
                                                             : evaluate_sample(model, comm, sample);
      if (!std::isfinite(score.logprob)) {  // all-reduced over the group: its ranks take this branch together
        // An error on a group's ranks ends the job on every rank (launch/main.cpp): no group waits in the gather.
        fail_nonfinite(model, comm, sample.ids, fmt::format("eval-niah: the answer's log-probability in {} is", which));
      }
      const std::span<const int32_t> answer = sample.answer();
      mine = pack(SampleResult{.task = cell.task,
                               .length = sample.length,
                               .depth = sample.depth,
                               .index = sample.index,
                               .answer_start = sample.answer_start,
                               .needle_position = sample.needle_position,
                               .correct = score.correct,
                               .recall = item_recall(score.predicted, answer_items(answer, plan.item_separator.empty()
                                                                                                 ? -1
                                                                                                 : plan.item_separator[static_cast<size_t>(cell.task)])),
                               .logprob = score.logprob,
                               .seconds = seconds_since(sample_start),
                               .answer = std::vector<int32_t>(answer.begin(), answer.end()),
                               .predicted = score.predicted});
    }
    // Every group's result of the round, in sample order; cells complete in plan order.
    const std::vector<std::vector<double>> gathered = groups.gather(mine);
    for (int64_t g = 0; g < width && round * width + g < total; ++g) {
      const size_t c = item[static_cast<size_t>(round * width + g)].first;
      HYDRA_ASSERT(c == next_cell, "NIAH sample of cell {} gathered while cell {} is open", c, next_cell);
      rows.push_back(unpack(gathered[static_cast<size_t>(g)], plan.cells[c].task));
      const CellPlan& cell = plan.cells[c];
      if (static_cast<int64_t>(rows.size()) < cell.samples) continue;
      CellResult result{.task = cell.task, .length = cell.length, .depth = cell.depth, .samples = cell.samples,
                        .correct = 0, .mean_recall = 0, .mean_logprob = 0, .seconds = 0, .sized = cell.sized};
      for (const SampleResult& r : rows) {
        result.correct += r.correct ? 1 : 0;
        result.mean_logprob += r.logprob / static_cast<double>(cell.samples);
        result.mean_recall += r.recall / static_cast<double>(cell.samples);
      }
      result.seconds = seconds_since(cell_start);
      cell_start = Clock::now();
      totals.samples += cell.samples;
      totals.correct += result.correct;
      totals.logprob += result.mean_logprob * static_cast<double>(cell.samples);
      totals.recall += result.mean_recall * static_cast<double>(cell.samples);
      report.add_cell(result, std::move(rows));
      rows.clear();
      log::info("niah {} length {} depth {}%: accuracy {:.3f} ({}/{}), mean logprob {:.3f}, {:.2f} s [cell {}/{}]",
                plan.tasks[static_cast<size_t>(cell.task)], format_size(cell.length), cell.depth, result.accuracy(),
                result.correct, result.samples, result.mean_logprob, result.seconds, c + 1, plan.cells.size());
      ++next_cell;
      if (after_cell) after_cell(report);
    }
  }
  return totals;
}

}  // namespace hydra::niah
