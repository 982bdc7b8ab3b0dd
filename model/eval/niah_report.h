// What `hydra eval-niah` writes: JSON lines, an HDF5 copy, and the accuracy table. Kept apart from
// the subcommand so the formats are in one place. Rank 0 calls these; files are written atomically
// (AtomicFile) and rewritten after every cell, so a long run that dies keeps its finished cells.
//
// JSON lines (--out), one object per line, each cell's sample lines followed by its cell line:
//   {"type":"sample","task","length","depth","sample","correct","recall","logprob","answer_start",
//    "answer_length","needle_position","answer":[ids],"predicted":[ids],"score","seconds"}
//   {"type":"cell","task","length","depth","samples","correct","accuracy","mean_recall","mean_logprob","score","seconds"}
//   and in a cell line, "sized": the knobs sized to its length ("--common-freq 30 -> 6"), when any.
// `score` is the scoring mode, "teacher-forced" or "generate", in every line.
// `logprob` is the answer's log-probability (natural log, summed over its tokens); a non-finite
// value is written as null (eval-niah stops at one instead, model/nonfinite.h). `predicted` holds
// the arg-max at each answer position (−1: invalid row) when teacher-forced, the generated tokens
// with --score generate (then `logprob` is theirs: the answer's when correct). `recall` is the
// fraction of the answer's items found in `predicted`, in any order (model/eval/niah.h).
// HDF5 copy (--out-h5), format "hydrahead-niah-results" version 1: root attributes format,
// format_version, model, source, ranks, seed, scoring, tasks (JSON list of names), cells_done, cells_total;
// per sample [N]: sample_task (int32 index into tasks), sample_length, sample_depth, sample_index,
// sample_answer_start, sample_needle_position (int64), sample_correct (int32 0/1), sample_recall,
// sample_logprob, sample_seconds (float32); answers ragged: answer_offset [N+1] int64, answer_tokens and
// predicted_tokens [Σn] int32; per cell [C]: cell_task (int32), cell_length, cell_depth,
// cell_samples, cell_correct (int64), cell_accuracy, cell_mean_recall, cell_mean_logprob, cell_seconds (float32).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hydra::niah {

struct SampleResult {
  int task = 0;  // index into Report::tasks
  int64_t length = 0, depth = 0, index = 0;
  int64_t answer_start = 0, needle_position = -1;
  bool correct = false;
  double recall = 0;  // fraction of the answer's items in `predicted`
  double logprob = 0;
  double seconds = 0;
  std::vector<int32_t> answer, predicted;  // [n] each
};

struct CellResult {
  int task = 0;
  int64_t length = 0, depth = 0;
  int64_t samples = 0, correct = 0;
  double mean_recall = 0;
  double mean_logprob = 0;
  double seconds = 0;
  std::string sized;  // the task's knobs sized to this length (eval-niah --suite ruler), "" when none
  double accuracy() const { return samples > 0 ? static_cast<double>(correct) / static_cast<double>(samples) : 0.0; }
};

struct Report {
  std::string model, source;
  int ranks = 1;
  uint64_t seed = 0;
  std::string scoring = "teacher-forced";  // or "generate"
  int64_t cells_total = 0;
  std::vector<std::string> tasks;
  std::vector<SampleResult> samples;  // in run order; each cell's samples are contiguous
  std::vector<CellResult> cells;

  // Adds a finished cell: its samples (already scored) and the aggregate.
  void add_cell(const CellResult& cell, std::vector<SampleResult> cell_samples);
};

void write_jsonl(const std::string& path, const Report& report);
void write_results_h5(const std::string& path, const Report& report);
// Accuracy per task: rows depth, columns length, with a mean row and column.
std::string format_table(const Report& report);
// RULER's summary table: rows tasks, columns lengths, each entry the mean recall in percent over
// the task's samples at that length (all depths; RULER's score), an average row over the tasks and
// an average column over the lengths.
std::string format_ruler_table(const Report& report);

}  // namespace hydra::niah
