// Running a NIAH evaluation (what `hydra eval-niah` does, callable from tests): a plan of cells —
// task × length × depth, from the built-in generator or from an eval set — checked in full before
// any weight is read, then the samples run, one sequence-parallel prefill per sample.
//
// Sequence groups (parallel/sequence_groups.h, --sp): the samples of every cell, in plan order, are
// numbered k = 0, 1, ...; they run in rounds of G (the number of groups), sample k on group k mod G,
// each over its sp ranks. After each round one gather brings every group's results to every rank,
// so rank 0 adds each cell to the report in plan order the moment its last sample is in; the
// results are those of one group of all ranks (--sp W), sample for sample. Each rank generates (or
// reads from the set) only its group's samples; before a sample's collectives the group's ranks
// check that their copies agree (parallel/agreement.h), as the command does for its inputs. A non-finite log-probability ends the run on every rank, naming
// the first stage of the forward that produced it (model/nonfinite.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "model/eval/niah.h"
#include "model/eval/niah_report.h"
#include "model/eval/niah_set.h"
#include "model/memory_plan.h"
#include "parallel/sequence_groups.h"

namespace hydra::niah {

// One cell of work: its labels and how to get sample i (generated on demand, or from the set).
struct CellPlan {
  int task = 0;  // index into EvalPlan::tasks
  int64_t length = 0, depth = 0, samples = 0;
  std::function<Sample(int64_t)> sample;
  std::string sized = {};  // the knobs sized to this length (ruler.h size_task_to_length), "" when none
};

struct EvalPlan {
  std::vector<std::string> tasks;  // task names
  std::vector<int32_t> item_separator;  // per task: the id between an answer's items (−1: one item; niah.h answer_items)
  std::vector<CellPlan> cells;
  int64_t longest = 0;  // tokens of the longest sample (sizes the memory plan)
  int64_t longest_answer = 1;  // tokens of the longest answer (sizes generation's cache)
  std::vector<std::string> sizing;  // "cwe at 512: --common-freq 30 -> 6, ..." per (task, length) sized
  int64_t total_samples() const;
};

// Every (task, length, depth) cell of the generator, `samples` each. UserError for a length too
// short for its task, or one the zigzag layout over `ranks` (the ranks of a sequence group) cannot
// split (or, for a HydraHead model on several ranks, whose segments are shorter than the conv halo).
// With `size_to_length`, each task's knobs are sized to each length as RULER does (ruler.h
// size_task_to_length), the knobs named in *size_to_length (their flags) kept as given.
EvalPlan plan_generated(const std::vector<TaskParams>& tasks, const std::vector<int64_t>& lengths,
                        const std::vector<int64_t>& depths, int64_t samples, uint64_t seed, const ModelConfig& config,
                        int ranks, const std::set<std::string>* size_to_length = nullptr);
// One cell per (length, depth) label of the set, holding its samples in file order; the same
// length checks, naming the sample (`source`: the set's path).
EvalPlan plan_eval_set(std::shared_ptr<const EvalSet> set, const std::string& source, const ModelConfig& config,
                       int ranks);

// What evaluating `plan` on sequence groups of `sp` ranks needs per rank (hydra eval-niah checks it
// with check_memory_plan before any work): by generation, the longest sample's prefill, the cache
// for it and its answer and the decode engine (model/generate.h estimate_generation_memory); by
// teacher forcing, the longest sample's prefill (model/memory_plan.h estimate_prefill_memory).
MemoryEstimate eval_memory_estimate(const EvalPlan& plan, const ModelConfig& config, Scoring scoring, int sp,
                                    Device device);

struct EvalTotals {
  int64_t samples = 0, correct = 0;
  double recall = 0;   // summed over the samples
  double logprob = 0;  // summed over the samples
  double accuracy() const { return samples > 0 ? static_cast<double>(correct) / static_cast<double>(samples) : 0.0; }
  double mean_logprob() const { return samples > 0 ? logprob / static_cast<double>(samples) : 0.0; }
  double mean_recall() const { return samples > 0 ? recall / static_cast<double>(samples) : 0.0; }
};

// Runs every cell of `plan` over `groups` (header comment), each sample scored by `scoring`
// (model/eval/niah.h: teacher forcing in one prefill, or greedy generation with the cache, its decode
// steps replayed as a CUDA graph as `cuda_graph` says), adding each finished cell to `report`
// (its tasks and cells_total are set here) and calling `after_cell(report)` on every rank (the
// command writes its files there, on rank 0). Collective over groups.world(); every rank returns
// the same totals and holds the same report.
EvalTotals run_plan(const Model& model, SequenceGroups& groups, const EvalPlan& plan, Report& report,
                    const std::function<void(const Report&)>& after_cell, Scoring scoring = Scoring::teacher_forced,
                    DecodeGraph cuda_graph = DecodeGraph::automatic);

}  // namespace hydra::niah
