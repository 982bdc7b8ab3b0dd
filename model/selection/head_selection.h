// Interpretability-driven head selection (DESIGN.md §1.4): which query heads of a Qwen3 teacher keep full
// attention when it becomes a HydraHead student. `hydra select-heads` (launch/cmd_select_heads.cpp)
// drives this; its output is the head-set file `hydra convert --fa-heads file:PATH` reads.
//
// Scores per (layer l, head h), on N retrieval prompts with corrupted twins and M plain-text
// sequences (model/selection/head_calibration.h). o_{l,h}(p) is the head's attention output at position p
// (before W_o); "patched positions" are [patch_start, T) of a prompt; log p(answer) is the sum of
// the answer tokens' log-probabilities, teacher forced (model/eval/niah.h).
//
//  total (activation patching). Per prompt i: lp_clean, lp_corrupt (the clean answer scored on the
//    corrupted prompt) and lp_patched(l,h): the clean run with o_{l,h} at the patched positions
//    replaced by its value on the corrupted prompt. With D = mean_i(lp_clean − lp_corrupt),
//      total(l,h) = mean_i(lp_clean − lp_patched(l,h)) / D        when D ≥ kMinLogprobGap,
//    a ratio of means (robust where a single prompt barely reacts): 1 means patching this one head
//    costs as much as corrupting the needle, 0 nothing, negative that the head worked against the
//    answer. When corruption does not lower the answer's log-probability by kMinLogprobGap on
//    average (a model that does not retrieve) the normalisation is meaningless: total is the raw
//    mean drop in nats and HeadScores::total_normalized says so.
//  direct (path patching of the direct path). The head's contribution to the final residual stream
//    is c = W_o[:, h·d:(h+1)·d] · o_{l,h}; read out through the final RMSNorm with its scale frozen
//    at the clean run's value and the unembedding U, on the logit difference between the answer
//    token a_j and the corrupted prompt's answer token a'_j at the position predicting it:
//      readout_j(c) = Σ_k w_final[k] · c[k] · (U[a_j, k] − U[a'_j, k]) / rms_clean(p_j)
//    rms_clean(p) = sqrt(mean(x_final(p)²) + eps), x_final the residual before the final norm. Clean
//    minus corrupted o_{l,h}, everything else clean (only this path changes, the frozen norm makes
//    the readout linear):
//      direct(l,h) = mean_i Σ_j [readout_j(c_clean) − readout_j(c_corrupt)]     (logits)
//    over the answer positions p_j = a − 1 + j with a_j ≠ a'_j; x_final comes from the clean
//    forward itself (Model::forward_residual, the stream before the final norm).
//  lm (general ability, mean ablation). On the plain text, o_{l,h} at every position is replaced by
//    its mean over all positions of all M clean sequences, and
//      lm(l,h) = mean over the M·(T−1) next-token predictions of (NLL_ablated − NLL_clean)   (nats/token).
//    Mean rather than zero ablation: it removes what the head says about the context while keeping
//    its constant offset (attention-sink heads have large constant outputs; zeroing them moves the
//    residual stream off its distribution and measures that shift instead of the head's function).
//  composite = w_total · total/S_total + w_direct · direct/S_direct + w_lm · lm/S_lm, with S_s the
//    max |s| over heads (a score that is 0 everywhere contributes nothing), so the weights compare
//    like with like. Signed: a head whose effect is negative (it works against the answer) is not
//    what the FA budget should buy. Defaults 1, 1, 0.5 (retrieval first, then general ability).
//  groups (optional, ScoringOptions::group_patching): the total effect of patching several heads of
//    a layer at once, normalised like total: layer_total(l) patches all H heads of layer l,
//    all_but_one(l,h) every head of layer l except h. Heads that are redundant (each alone enough)
//    have total ≈ 0 one by one but layer_total ≈ 1 and all_but_one(l,h) ≈ 0: head h alone retrieves.
//  concentration (of the positive direct effect, no forwards): per-layer share Σ_h max(direct,0) of
//    the layer over the model's; the top-k share (the k largest over the sum); the effective number
//    of heads exp(−Σ p log p), p = max(direct,0) / Σ max(direct,0) (1: one head; L·H: all equal).
//  FA sets: global top-K of composite over all (l, h) (ties: lower layer, then lower head), or
//    per layer the top K of the layer (ties: lower head); a layer may end up with no FA head.
// A head whose W_o slice is zero has total = direct = lm = 0 exactly: its output enters nothing.
//
// Work. The world is cut into sequence groups of sp ranks (parallel/sequence_groups.h; select-heads
// --sp, default 1: every rank alone). Every group builds the same inputs and runs, per prompt, one
// clean and one corrupted forward that record every layer's head outputs at the patched positions
// (the caches: each rank the rows it holds), and one clean forward per plain-text sequence
// (baseline NLL and the ablation means, summed over the group). The (layer, head) jobs j = l·H + h
// are then spread round-robin over the G groups (j mod G); a job runs N patched and M ablated
// forwards and the direct readouts (each rank over the rows it holds, summed over the group). With
// sp = 1 (the default) jobs need no communication, so the work scales with P until P = L·H;
// calibration prompts are short (a few K tokens), where sequence parallelism mostly adds latency;
// sp > 1 is for prompts too long for one rank. The duplicated cache forwards (2N + M per group)
// are small next to the L·H·(N + M)/G job forwards. One all-reduce at the end gives every rank
// every score (each slot has one non-zero contribution, from rank 0 of the group that ran the job,
// sent as an f32 hi/lo pair, so the sum reproduces the value).
// Effects of different heads are not additive, so each patched head needs its own forward. What
// would save the most: a forward that starts at layer l from a cached residual (patching layer l
// cannot change layers < l), about half the job cost on average; Model::layer_forward is that entry
// point, but the scorer does not use it yet (it would cache L residuals [T, D] per prompt).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/selection/head_calibration.h"
#include "model/model.h"
#include "parallel/sequence_groups.h"

namespace hydra::heads {

using Grid = std::vector<std::vector<double>>;  // [L][H]

// Mean drop of log p(answer) (nats) under corruption below which `total` is not normalised.
inline constexpr double kMinLogprobGap = 1e-3;

struct HeadScores {
  Grid total, direct, lm;  // header comment
  int64_t prompts = 0, lm_sequences = 0, lm_predictions = 0;
  double logprob_clean = 0, logprob_corrupt = 0;        // means over prompts of log p(answer)
  double total_denominator = 0;                          // D = mean(lp_clean − lp_corrupt)
  bool total_normalized = false;                         // D ≥ kMinLogprobGap
  double logit_diff_clean = 0, logit_diff_corrupt = 0;  // means over prompts of Σ_j logit(a_j) − logit(a'_j)
  double lm_nll_clean = 0;                               // mean next-token NLL of the plain text, nats
  int64_t forwards = 0;                                  // forward passes run, all sequence groups together
  bool groups = false;                                   // group patching ran (the two below are filled)
  std::vector<double> layer_total;                       // [L] every head of the layer patched (header)
  Grid all_but_one;                                      // [L][H] every head of layer l but h patched
};

struct ScoringProgress {
  int64_t layer = 0;      // this rank has finished its heads of this layer
  int64_t jobs_done = 0;  // of this rank's jobs
  int64_t jobs = 0;
  double seconds = 0;     // since scoring started
};

struct ScoringOptions {
  std::function<void(const ScoringProgress&)> on_layer_done;  // optional, called on every rank
  bool group_patching = false;  // also layer_total and all_but_one: (L + L·H)·N more forwards
};

// How concentrated the positive direct effect is (header comment). All zero when no head has a
// positive direct effect (effective_heads then 0).
struct Concentration {
  std::vector<double> layer_share;               // [L], sums to 1
  std::vector<std::pair<int, double>> top_share;  // (k, share of the k largest heads) for k = 1, 2, 4, ... < L·H, and L·H
  double effective_heads = 0;                     // exp(entropy)
  double positive_total = 0;                      // Σ max(direct, 0)
};
Concentration concentration(const Grid& direct);

// Scores every head of `teacher` (arch qwen3). Collective over groups.world(): every rank passes
// the same prompts and text (each of a length the zigzag layout over sp ranks admits); every rank
// returns the same scores. `lm_text` may be empty (lm = 0). A
// non-finite score ends the run on every rank, naming the first stage of the forward that turns
// non-finite on the first prompt (model/nonfinite.h).
HeadScores score_heads(const Model& teacher, SequenceGroups& groups, std::span<const CalibrationPrompt> prompts,
                       std::span<const std::vector<int32_t>> lm_text, const ScoringOptions& options = {});

struct ScoreWeights {
  double total = 1.0, direct = 1.0, lm = 0.5;
};

struct CompositeScores {
  Grid composite;
  double scale_total = 0, scale_direct = 0, scale_lm = 0;  // S_s = max |s| over heads
};
CompositeScores composite_scores(const HeadScores& scores, const ScoreWeights& weights);

enum class BudgetMode { global, per_layer };

struct Budget {
  int64_t heads = 0;  // K
  BudgetMode mode = BudgetMode::global;
  // UserError unless 1 ≤ K ≤ L·H (global) or 1 ≤ K ≤ H (per layer).
  void validate(int64_t num_layers, int64_t num_heads) const;
};

// The FA head set of every layer (sorted), chosen from composite scores [L][H] under `budget`.
std::vector<std::vector<int>> choose_fa_heads(const Grid& composite, const Budget& budget);

}  // namespace hydra::heads
