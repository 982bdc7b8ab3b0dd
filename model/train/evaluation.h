// Evaluation, shared by `hydra train --eval-data/--eval-niah` (trainer.cpp) and `hydra eval-lm`
// (launch/cmd_eval_lm.cpp), so a model's eval-lm figure is its training run's evaluation loss on the
// same files and length: one held-out loss (the stage's objective over the first N windows in file
// order, cut as training cuts them: data.h), one reduction of loss sums over the ranks, one NIAH
// scorer at the training length, and the JSON fields of a loss split into answers and the rest.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/eval/niah.h"
#include "model/train/stage.h"
#include "parallel/sequence_groups.h"

namespace hydra::train {

// Σ loss and token counts over the ranks of `comm` (host doubles: exact for counts below 2^53).
// Each rank counted only its own tokens, so the sums are the global ones. With `stop_votes`, the
// same all-reduce also counts the ranks that received a stop signal (runtime/stop_request.h):
// every rank gets the same count, so all stop after the same step. Collective.
LossSums reduce_loss_sums(Communicator& comm, const LossSums& local, int* stop_votes = nullptr);

// Σloss / tokens (0 when nothing counted).
double mean_loss(const LossSums& total);

// The JSON fields of a loss split into retrieval answers and the rest, each name after `prefix`:
// answer_loss, answer_tokens, other_loss, counted_tokens (the means null where nothing counted).
nlohmann::json loss_fields(const LossSums& total, const std::string& prefix);

// Which held-out windows a rank evaluates: the first `windows` windows in file order (a blend: its
// first draws, data.h evaluation_index), window i on
// data-parallel replica i % replicas, packed `batch_seqs` at a time (as training packs them).
struct HeldOutShare {
  int64_t windows = 0;
  int64_t batch_seqs = 1;
  int replica = 0, replicas = 1;
};

// The stage's loss (run.stage: cross-entropy, KL or alignment MSE) over the share, summed over every
// rank of `world` (run.sequence is this rank's sequence group within it). No gradient. Collective.
LossSums held_out_loss(const StageRun& run, Communicator& world, const TokenWindows& data, const HeldOutShare& share);

// NIAH accuracy at one length (--eval-niah): eval-niah's generator with a fixed seed, so every
// evaluation of a run (and of every run) scores the same samples, depths spread over 0..100.
struct NiahEvaluation {
  std::vector<niah::TaskParams> tasks;
  int64_t seq_len = 0;
  int64_t samples = 32;  // per task
};
// The tasks named, each checked against the vocabulary and the length (UserError before any work).
NiahEvaluation niah_evaluation(const std::vector<std::string>& task_names, int64_t vocab, int64_t seq_len,
                               int64_t samples);

struct NiahScore {
  std::string task;
  double accuracy = 0;      // greedy answers right / samples
  double mean_logprob = 0;  // the answers' log-probability, mean over samples
};
// Every sample scored once: sample i of each task on sequence group i mod groups (the replicas split
// the samples instead of repeating them), the counts and log-probabilities summed over the groups.
// Every rank returns the same scores. Collective over groups.world().
std::vector<NiahScore> niah_scores(const Model& model, SequenceGroups& groups, const NiahEvaluation& eval);

}  // namespace hydra::train
