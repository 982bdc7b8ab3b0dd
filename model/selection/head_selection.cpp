// Head scoring, composite and budgets; the definitions and the division of work are in
// head_selection.h. Observers (model/model.h LayerObserver) record, patch and ablate head outputs;
// they go through host f32 copies where the model's tensors are elsewhere, so the same code runs
// on a CUDA model.
#include "model/selection/head_selection.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/embedding/embedding.h"
#include "kernels/matmul/matmul.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/swiglu/swiglu.h"
#include "model/nonfinite.h"
#include "parallel/sequence_groups.h"

namespace hydra::heads {
namespace {

using Clock = std::chrono::steady_clock;

Grid zeros(int64_t layers, int64_t heads) {
  return Grid(static_cast<size_t>(layers), std::vector<double>(static_cast<size_t>(heads), 0.0));
}

// A host f32 contiguous view of `v`: `v` itself when it is one, else a copy kept in `holder`.
TensorView host_f32(const TensorView& v, Tensor& holder) {
  if (v.on_host() && v.dtype() == DType::f32 && v.is_contiguous()) return v;
  holder = to(v, Device::host, DType::f32);
  return holder.view();
}

// Runs `edit` on a host f32 contiguous form of `o` and writes the result back into `o`.
template <class F>
void edit_host_f32(const TensorView& o, F&& edit) {
  Tensor holder;
  const TensorView h = host_f32(o, holder);
  edit(h);
  if (holder.defined()) copy_into(o, holder);
}

// Which local rows of a sequence-parallel forward hold global positions [start, start + count):
// pairs (local row, position − start). Zigzag segments are contiguous runs of positions.
std::vector<std::pair<int64_t, int64_t>> local_rows_in(const SequenceLayout& layout, int64_t start, int64_t count) {
  std::vector<std::pair<int64_t, int64_t>> rows;
  for (const Segment& seg : layout.local_segments()) {
    const int64_t lo = std::max(seg.start, start), hi = std::min(seg.start + seg.length, start + count);
    for (int64_t pos = lo; pos < hi; ++pos) rows.emplace_back(seg.local_offset + pos - seg.start, pos - start);
  }
  return rows;
}

// Records, for every layer, the rows of positions [start, start + count) of every head's output
// that this rank holds, host f32 [count, H, d] in model head order (rows held by the sequence
// group's other ranks stay zero).
class RowRecorder final : public LayerObserver {
 public:
  RowRecorder(int64_t layers, const SequenceLayout& layout, int64_t start, int64_t count)
      : count_(count), rows_at_(local_rows_in(layout, start, count)), rows_(static_cast<size_t>(layers)) {}
  void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) override {
    Tensor holder;
    const TensorView src = host_f32(o, holder);
    Tensor out = Tensor::zeros({count_, src.size(1), src.size(2)}, DType::f32);
    for (const auto& [row, at] : rows_at_) {
      for (size_t p = 0; p < head_of.size(); ++p) {
        copy_into(out.view().select(0, at).select(0, head_of[p]), src.select(0, row).select(0, static_cast<int64_t>(p)));
      }
    }
    rows_[static_cast<size_t>(layer)] = std::move(out);
  }
  std::vector<Tensor>& rows() { return rows_; }

 private:
  int64_t count_;
  std::vector<std::pair<int64_t, int64_t>> rows_at_;
  std::vector<Tensor> rows_;
};

// Replaces some heads' outputs at positions [start, start + count) of one layer with cached rows
// (this rank's rows of them).
class HeadPatcher final : public LayerObserver {
 public:
  HeadPatcher(int64_t layer, std::vector<int64_t> heads, const SequenceLayout& layout, int64_t start,
              const Tensor& cached)  // cached [count, H, d], model order
      : layer_(layer), heads_(std::move(heads)), rows_at_(local_rows_in(layout, start, cached.size(0))), cached_(cached) {}
  void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) override {
    if (layer != layer_) return;
    edit_host_f32(o, [&](const TensorView& h) {
      for (int64_t head : heads_) {
        const int64_t p = std::find(head_of.begin(), head_of.end(), static_cast<int>(head)) - head_of.begin();
        for (const auto& [row, at] : rows_at_) copy_into(h.select(0, row).select(0, p), cached_.view().select(0, at).select(0, head));
      }
    });
  }

 private:
  int64_t layer_;
  std::vector<int64_t> heads_;
  std::vector<std::pair<int64_t, int64_t>> rows_at_;
  const Tensor& cached_;
};

// Sets one head's output of one layer to a constant vector at every row (mean ablation).
class HeadMeanAblator final : public LayerObserver {
 public:
  HeadMeanAblator(int64_t layer, int64_t head, const std::vector<float>& mean) : layer_(layer), head_(head), mean_(mean) {}
  void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) override {
    if (layer != layer_) return;
    const int64_t p = std::find(head_of.begin(), head_of.end(), static_cast<int>(head_)) - head_of.begin();
    edit_host_f32(o, [&](const TensorView& h) {
      const int64_t heads = h.size(1), d = h.size(2);
      float* data = h.data_as<float>();
      for (int64_t t = 0; t < h.size(0); ++t) std::copy(mean_.begin(), mean_.end(), data + (t * heads + p) * d);
    });
  }

 private:
  int64_t layer_, head_;
  const std::vector<float>& mean_;
};

// Accumulates Σ_t o[t, h, :] per layer and model head, fp64 [L][H][d].
class HeadOutputSums final : public LayerObserver {
 public:
  HeadOutputSums(int64_t layers, int64_t heads, int64_t d)
      : d_(d), sums_(static_cast<size_t>(layers), std::vector<std::vector<double>>(static_cast<size_t>(heads), std::vector<double>(static_cast<size_t>(d)))) {}
  void on_head_outputs(int64_t layer, const TensorView& o, std::span<const int> head_of) override {
    Tensor holder;
    const TensorView h = host_f32(o, holder);
    const float* data = h.data_as<const float>();
    const int64_t heads = h.size(1);
    for (int64_t t = 0; t < h.size(0); ++t) {
      for (int64_t p = 0; p < heads; ++p) {
        std::vector<double>& s = sums_[static_cast<size_t>(layer)][static_cast<size_t>(head_of[static_cast<size_t>(p)])];
        for (int64_t k = 0; k < d_; ++k) s[static_cast<size_t>(k)] += data[(t * heads + p) * d_ + k];
      }
    }
  }
  const std::vector<std::vector<std::vector<double>>>& sums() const { return sums_; }

 private:
  int64_t d_;
  std::vector<std::vector<std::vector<double>>> sums_;
};

// One sequence over the sequence group `seq` (zigzag layout; a world of one runs it whole): this
// rank's rows of the residual stream before the final norm [T_loc, D] (the normed hidden state is
// model.final_norm of it), and the layout that says which positions they are.
struct LocalRows {
  SequenceLayout layout;
  Tensor rows;  // [T_loc, D]
};

LocalRows run_forward_residual(const Model& model, Communicator& seq, const std::vector<int32_t>& ids, LayerObserver* observer) {
  const int64_t total = static_cast<int64_t>(ids.size());
  LocalRows out{group_layout(seq, total), {}};
  Tensor local = Tensor::empty({out.layout.local_length()}, DType::i32);  // [T_loc], local order
  for (const Segment& s : out.layout.local_segments()) {
    std::copy_n(ids.begin() + s.start, s.length, local.data_as<int32_t>() + s.local_offset);
  }
  ForwardContext context{.comm = seq, .layout = out.layout, .observer = observer};
  out.rows = model.forward_residual(context, local.view());
  return out;
}

LocalRows run_forward(const Model& model, Communicator& seq, const std::vector<int32_t>& ids, LayerObserver* observer) {
  LocalRows out = run_forward_residual(model, seq, ids, observer);
  out.rows = model.final_norm(out.rows);
  return out;
}

// logits [n, V] of hidden rows [first, first + n), host f32.
Tensor row_logits(const Model& model, const Tensor& hidden, int64_t first, int64_t n) {
  Tensor logits = Tensor::empty({n, model.config().vocab_size}, DType::f32, model.device());
  model.lm_head(logits, hidden.view().narrow(0, first, n));
  return logits.device() == Device::host ? logits : to(logits, Device::host, DType::f32);
}

struct AnswerEval {
  double logprob = 0;     // Σ_j log p(a_j)
  double logit_diff = 0;  // Σ_j logit(a_j) − logit(a'_j)
};

// The answer rows a−1+j are scored by the ranks that hold them; one all-reduce of [2, n] (one
// owner per slot, exact) gives every rank of the group every row, summed over j in order.
AnswerEval evaluate_answer(const Model& model, Communicator& seq, const LocalRows& hidden, const CalibrationPrompt& p,
                           const std::string& what) {
  const std::span<const int32_t> answer = p.answer();
  const int64_t vocab = model.config().vocab_size, n = p.answer_length;
  Tensor rows = Tensor::zeros({2, n}, DType::f64);
  double* r = rows.data_as<double>();
  for (const auto& [row, j] : local_rows_in(hidden.layout, p.answer_start - 1, n)) {
    const Tensor logits = row_logits(model, hidden.rows, row, 1);
    const std::span<const float> values(logits.data_as<const float>(), static_cast<size_t>(vocab));
    r[j] = niah::score_token(values, answer[static_cast<size_t>(j)]).logprob;
    r[n + j] = static_cast<double>(values[static_cast<size_t>(answer[static_cast<size_t>(j)])]) -
               values[static_cast<size_t>(p.corrupted_answer[static_cast<size_t>(j)])];
  }
  if (seq.size() > 1) all_reduce_sum_host(seq, rows);
  AnswerEval e;
  for (int64_t j = 0; j < n; ++j) {
    e.logprob += r[j];
    e.logit_diff += r[n + j];
  }
  HYDRA_USER_CHECK(std::isfinite(e.logprob) && std::isfinite(e.logit_diff),
                   "{}: the answer's log-probability is not finite ({}); the checkpoint's weights or activations are "
                   "not finite",
                   what, e.logprob);
  return e;
}

// Σ over t < T−1 of −log p(ids[t+1] | ids[..t]) from this rank's hidden rows, lm_head in row
// chunks, summed over the group (one all-reduce). Every rank of the group returns the sum.
double sequence_nll(const Model& model, Communicator& seq, const LocalRows& hidden, const std::vector<int32_t>& ids,
                    const std::string& what) {
  const int64_t total = static_cast<int64_t>(ids.size()), vocab = model.config().vocab_size;
  constexpr int64_t kChunk = 256;  // rows per lm_head call: bounds the [rows, V] logits buffer
  Tensor nll = Tensor::zeros({1}, DType::f64);
  for (const Segment& seg : hidden.layout.local_segments()) {
    const int64_t predicting = std::min(seg.length, total - 1 - seg.start);  // rows with a next token
    for (int64_t t0 = 0; t0 < predicting; t0 += kChunk) {
      const int64_t n = std::min(kChunk, predicting - t0);
      const Tensor logits = row_logits(model, hidden.rows, seg.local_offset + t0, n);
      for (int64_t r = 0; r < n; ++r) {
        const niah::TokenScore s = niah::score_token({logits.data_as<const float>() + r * vocab, static_cast<size_t>(vocab)},
                                                     ids[static_cast<size_t>(seg.start + t0 + r + 1)]);
        nll.data_as<double>()[0] -= s.logprob;
      }
    }
  }
  if (seq.size() > 1) all_reduce_sum_host(seq, nll);
  HYDRA_USER_CHECK(std::isfinite(nll.data_as<double>()[0]), "{}: the next-token log-likelihood is not finite", what);
  return nll.data_as<double>()[0];
}

// What every sequence group computes once per prompt: the caches and the direct-effect readout
// vectors (each rank: of the rows it holds).
struct PromptCache {
  std::vector<Tensor> clean, corrupted;  // per layer: host f32 [R, H, d], rows [patch_start, T), model order; this rank's rows
  double logprob_clean = 0, logprob_corrupt = 0;
  double logit_diff_clean = 0, logit_diff_corrupt = 0;
  // For answer positions p_j with a_j ≠ a'_j that this rank holds: the row in the caches and
  // r_j = w_final ⊙ (U[a_j] − U[a'_j]) / rms_clean(p_j), fp64 [D].
  std::vector<int64_t> readout_rows;
  std::vector<std::vector<double>> readout;
};

PromptCache build_prompt_cache(const Model& model, Communicator& seq, const CalibrationPrompt& p, size_t index) {
  const ModelConfig& c = model.config();
  const int64_t rows = p.length() - p.patch_start, D = c.hidden_size;
  HYDRA_ASSERT(p.patch_start >= 0 && p.patch_start <= p.answer_start - 1 && p.corrupted.size() == p.clean.size(),
               "calibration prompt {}: patch start {} after answer {}", index, p.patch_start, p.answer_start);
  PromptCache cache;
  const std::string what = fmt::format("calibration prompt {}", index);
  const SequenceLayout layout = group_layout(seq, p.length());
  RowRecorder clean_rec(c.num_layers, layout, p.patch_start, rows), corrupt_rec(c.num_layers, layout, p.patch_start, rows);
  const LocalRows residual = run_forward_residual(model, seq, p.clean, &clean_rec);
  const AnswerEval clean = evaluate_answer(model, seq, {residual.layout, model.final_norm(residual.rows)}, p, what);
  const AnswerEval corrupt =
      evaluate_answer(model, seq, run_forward(model, seq, p.corrupted, &corrupt_rec), p, what + " (corrupted)");
  cache.clean = std::move(clean_rec.rows());
  cache.corrupted = std::move(corrupt_rec.rows());
  cache.logprob_clean = clean.logprob;
  cache.logprob_corrupt = corrupt.logprob;
  cache.logit_diff_clean = clean.logit_diff;
  cache.logit_diff_corrupt = corrupt.logit_diff;

  // The final residual (before the final norm) at the answer-predicting positions this rank holds.
  const int64_t first = p.answer_start - 1 - p.patch_start, n = p.answer_length;
  const Tensor w_final = to(model.final_norm_weight(), Device::host, DType::f32);
  const float* w = w_final.data_as<const float>();
  for (const auto& [row, j] : local_rows_in(residual.layout, p.answer_start - 1, n)) {
    const int32_t a = p.answer()[static_cast<size_t>(j)], b = p.corrupted_answer[static_cast<size_t>(j)];
    if (a == b) continue;  // the logit difference is identically zero
    const Tensor x = to(residual.rows.view().select(0, row), Device::host, DType::f32);  // [D]
    const float* xr = x.data_as<const float>();
    double mean_sq = 0;
    for (int64_t k = 0; k < D; ++k) mean_sq += static_cast<double>(xr[k]) * xr[k];
    const double rms = std::sqrt(mean_sq / static_cast<double>(D) + c.rms_norm_eps);
    const Tensor ua = to(model.lm_head_weight().view().select(0, a), Device::host, DType::f32);
    const Tensor ub = to(model.lm_head_weight().view().select(0, b), Device::host, DType::f32);
    std::vector<double> r(static_cast<size_t>(D));
    for (int64_t k = 0; k < D; ++k) {
      r[static_cast<size_t>(k)] = w[k] * (static_cast<double>(ua.data_as<const float>()[k]) - ub.data_as<const float>()[k]) / rms;
    }
    cache.readout_rows.push_back(first + j);
    cache.readout.push_back(std::move(r));
  }
  return cache;
}

// direct(l, h) of one prompt: Σ_j r_j · W_o,h (o_clean − o_corrupt)(p_j) over the rows this rank
// holds (the group's ranks' parts add up to the whole); w_o [D, d] host f32.
double direct_effect(const PromptCache& cache, int64_t layer, int64_t head, const Tensor& w_o) {
  const int64_t D = w_o.size(0), d = w_o.size(1);
  const float* w = w_o.data_as<const float>();
  double total = 0;
  for (size_t j = 0; j < cache.readout_rows.size(); ++j) {
    const TensorView oc = cache.clean[static_cast<size_t>(layer)].view().select(0, cache.readout_rows[j]).select(0, head);
    const TensorView ox = cache.corrupted[static_cast<size_t>(layer)].view().select(0, cache.readout_rows[j]).select(0, head);
    std::vector<double> delta(static_cast<size_t>(d));
    for (int64_t k = 0; k < d; ++k) {
      delta[static_cast<size_t>(k)] = static_cast<double>(oc.data_as<const float>()[k]) - ox.data_as<const float>()[k];
    }
    const std::vector<double>& r = cache.readout[j];
    for (int64_t i = 0; i < D; ++i) {
      double c = 0;
      for (int64_t k = 0; k < d; ++k) c += w[i * d + k] * delta[static_cast<size_t>(k)];
      total += r[static_cast<size_t>(i)] * c;
    }
  }
  return total;
}

}  // namespace

namespace {

// The plain text's clean next-token NLL per sequence and every head's mean output over its positions
// (the mean ablation's replacement), from one forward per sequence and one all-reduce of [L, H, d].
struct TextBaseline {
  std::vector<double> nll_clean;
  int64_t predictions = 0;
  std::vector<std::vector<std::vector<float>>> means;  // [L][H][d]
};

TextBaseline measure_text(const Model& teacher, Communicator& seq, std::span<const std::vector<int32_t>> lm_text) {
  const ModelConfig& c = teacher.config();
  const int64_t L = c.num_layers, H = c.num_heads, d = c.head_dim;
  TextBaseline out;
  HeadOutputSums sums(L, H, d);
  int64_t text_positions = 0;
  for (size_t m = 0; m < lm_text.size(); ++m) {
    HYDRA_ASSERT(lm_text[m].size() >= 2, "plain-text sequence {} of {} tokens", m, lm_text[m].size());
    const LocalRows hidden = run_forward(teacher, seq, lm_text[m], &sums);
    out.nll_clean.push_back(sequence_nll(teacher, seq, hidden, lm_text[m], fmt::format("plain-text sequence {}", m)));
    text_positions += static_cast<int64_t>(lm_text[m].size());
    out.predictions += static_cast<int64_t>(lm_text[m].size()) - 1;
  }
  // The group's sums of its rows (one all-reduce of [L, H, d]), then the means.
  Tensor summed = Tensor::empty({L, H, d}, DType::f64);
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t h = 0; h < H; ++h) {
      const std::vector<double>& v = sums.sums()[static_cast<size_t>(l)][static_cast<size_t>(h)];
      std::copy(v.begin(), v.end(), summed.data_as<double>() + (l * H + h) * d);
    }
  }
  if (seq.size() > 1) all_reduce_sum_host(seq, summed);
  out.means.assign(static_cast<size_t>(L), std::vector<std::vector<float>>(static_cast<size_t>(H)));
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t k = 0; k < d; ++k) {
        const double s = summed.data_as<double>()[(l * H + h) * d + k];
        out.means[l][h].push_back(text_positions > 0 ? static_cast<float>(s / static_cast<double>(text_positions)) : 0.0f);
      }
    }
  }
  return out;
}

// What this rank's group scored: its (layer, head) jobs' summed drops (total, direct, lm) and, with
// group patching, its (layer, g) jobs' (all but one: g < H; the whole layer, in column 0: g = H).
struct JobSums {
  Grid drop, direct, lm_drop, group_drop, layer_drop;
};

// The single-head jobs (l·H + h ≡ this group, mod the groups), reporting each layer done.
void score_single_heads(const Model& teacher, SequenceGroups& groups, std::span<const CalibrationPrompt> prompts,
                        std::span<const std::vector<int32_t>> lm_text, const std::vector<PromptCache>& caches,
                        const TextBaseline& text, const ScoringOptions& options, Clock::time_point start, JobSums& s) {
  const int64_t L = teacher.config().num_layers, H = teacher.config().num_heads;
  Communicator& seq = groups.sequence();
  const int rank = groups.replica(), ranks = groups.replicas();
  int64_t my_jobs = 0, done = 0;
  for (int64_t j = 0; j < L * H; ++j) my_jobs += j % ranks == rank ? 1 : 0;
  for (int64_t l = 0; l < L; ++l) {
    bool any = false;
    for (int64_t h = 0; h < H; ++h) {
      if ((l * H + h) % ranks != rank) continue;
      any = true;
      const Tensor w_o = to(teacher.head_output_projection(l, h), Device::host, DType::f32);  // [D, d]
      for (size_t i = 0; i < prompts.size(); ++i) {
        const CalibrationPrompt& p = prompts[i];
        const SequenceLayout layout = group_layout(seq, p.length());
        HeadPatcher patch(l, {h}, layout, p.patch_start, caches[i].corrupted[static_cast<size_t>(l)]);
        const AnswerEval patched = evaluate_answer(teacher, seq, run_forward(teacher, seq, p.clean, &patch), p,
                                                   fmt::format("calibration prompt {} with head ({}, {}) patched", i, l, h));
        s.drop[l][h] += caches[i].logprob_clean - patched.logprob;
        s.direct[l][h] += direct_effect(caches[i], l, h, w_o);
      }
      for (size_t m = 0; m < lm_text.size(); ++m) {
        HeadMeanAblator ablate(l, h, text.means[l][h]);
        const LocalRows hidden = run_forward(teacher, seq, lm_text[m], &ablate);
        s.lm_drop[l][h] += sequence_nll(teacher, seq, hidden, lm_text[m],
                                        fmt::format("plain-text sequence {} with head ({}, {}) ablated", m, l, h)) -
                           text.nll_clean[m];
      }
      ++done;
    }
    if (any && options.on_layer_done) {
      options.on_layer_done(ScoringProgress{l, done, my_jobs, std::chrono::duration<double>(Clock::now() - start).count()});
    }
  }
}

// Group patching: job (l, g), g = H for the whole layer, else every head of l but g; spread over the
// groups like the single-head jobs.
void score_groups(const Model& teacher, SequenceGroups& groups, std::span<const CalibrationPrompt> prompts,
                  const std::vector<PromptCache>& caches, JobSums& s) {
  const int64_t L = teacher.config().num_layers, H = teacher.config().num_heads;
  Communicator& seq = groups.sequence();
  const int rank = groups.replica(), ranks = groups.replicas();
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t g = 0; g <= H; ++g) {
      if ((l * (H + 1) + g) % ranks != rank) continue;
      std::vector<int64_t> patched;
      for (int64_t h = 0; h < H; ++h)
        if (h != g) patched.push_back(h);
      for (size_t i = 0; i < prompts.size(); ++i) {
        const CalibrationPrompt& p = prompts[i];
        const SequenceLayout layout = group_layout(seq, p.length());
        HeadPatcher patch(l, patched, layout, p.patch_start, caches[i].corrupted[static_cast<size_t>(l)]);
        const AnswerEval e = evaluate_answer(teacher, seq, run_forward(teacher, seq, p.clean, &patch), p,
                                             fmt::format("calibration prompt {} with {} heads of layer {} patched", i,
                                                         patched.size(), l));
        (g == H ? s.layer_drop[l][0] : s.group_drop[l][g]) += caches[i].logprob_clean - e.logprob;
      }
    }
  }
}

// Every rank gets every job's sums: the direct effects first summed over each group's ranks (each
// summed the rows it holds), then [5, L, H] values as f32 (hi, lo) pairs, one rank per slot (the
// rank 0 of the group that ran the job), all-reduced over the world. Returns the pairs.
Tensor exchange_sums(SequenceGroups& groups, int64_t L, int64_t H, JobSums& s) {
  Communicator& seq = groups.sequence();
  if (seq.size() > 1) {
    Tensor parts = Tensor::empty({L, H}, DType::f64);
    for (int64_t l = 0; l < L; ++l) std::copy(s.direct[l].begin(), s.direct[l].end(), parts.data_as<double>() + l * H);
    all_reduce_sum_host(seq, parts);
    for (int64_t l = 0; l < L; ++l) std::copy_n(parts.data_as<double>() + l * H, H, s.direct[l].begin());
  }
  Tensor buffer = Tensor::zeros({5, L, H, 2}, DType::f32);
  float* b = buffer.data_as<float>();
  const Grid* grids[5] = {&s.drop, &s.direct, &s.lm_drop, &s.group_drop, &s.layer_drop};
  for (int64_t g = 0; g < 5 && groups.group_lead(); ++g) {
    for (int64_t l = 0; l < L; ++l) {
      for (int64_t h = 0; h < H; ++h) {
        const double v = (*grids[g])[l][h];
        const float hi = static_cast<float>(v);
        b[((g * L + l) * H + h) * 2] = hi;
        b[((g * L + l) * H + h) * 2 + 1] = static_cast<float>(v - hi);
      }
    }
  }
  all_reduce_sum_host(groups.world(), buffer);
  return buffer;
}

}  // namespace

HeadScores score_heads(const Model& teacher, SequenceGroups& groups, std::span<const CalibrationPrompt> prompts,
                       std::span<const std::vector<int32_t>> lm_text, const ScoringOptions& options) {
  const ModelConfig& c = teacher.config();
  HYDRA_USER_CHECK(c.arch == Arch::qwen3, "head selection scores a Qwen3 teacher's heads; this model is {}",
                   arch_name(c.arch));
  HYDRA_USER_CHECK(!prompts.empty(), "head selection needs at least one calibration prompt");
  const int64_t L = c.num_layers, H = c.num_heads;
  const auto start = Clock::now();
  Communicator& seq = groups.sequence();

  // 1. Caches: every group, every prompt and every text sequence.
  std::vector<PromptCache> caches;
  for (size_t i = 0; i < prompts.size(); ++i) caches.push_back(build_prompt_cache(teacher, seq, prompts[i], i));
  const TextBaseline text = measure_text(teacher, seq, lm_text);
  const int64_t predictions = text.predictions;

  // 2. This group's (layer, head) jobs; 2b. its group-patching jobs.
  JobSums sums{zeros(L, H), zeros(L, H), zeros(L, H), zeros(L, H), zeros(L, H)};
  score_single_heads(teacher, groups, prompts, lm_text, caches, text, options, start, sums);
  if (options.group_patching) score_groups(teacher, groups, prompts, caches, sums);

  // 3. Every rank gets every job's sums.
  const Tensor buffer = exchange_sums(groups, L, H, sums);
  const float* b = buffer.data_as<float>();
  const int ranks = groups.replicas();

  HeadScores out;
  out.prompts = static_cast<int64_t>(prompts.size());
  out.lm_sequences = static_cast<int64_t>(lm_text.size());
  out.lm_predictions = predictions;
  const double n = static_cast<double>(prompts.size());
  for (const PromptCache& pc : caches) {
    out.logprob_clean += pc.logprob_clean / n;
    out.logprob_corrupt += pc.logprob_corrupt / n;
    out.logit_diff_clean += pc.logit_diff_clean / n;
    out.logit_diff_corrupt += pc.logit_diff_corrupt / n;
  }
  for (double v : text.nll_clean) out.lm_nll_clean += predictions > 0 ? v / static_cast<double>(predictions) : 0.0;
  out.total_denominator = out.logprob_clean - out.logprob_corrupt;
  out.total_normalized = out.total_denominator >= kMinLogprobGap;
  const double total_scale = out.total_normalized ? out.total_denominator : 1.0;
  out.total = zeros(L, H);
  out.direct = zeros(L, H);
  out.lm = zeros(L, H);
  out.groups = options.group_patching;
  if (out.groups) {
    out.all_but_one = zeros(L, H);
    out.layer_total.assign(static_cast<size_t>(L), 0.0);
  }
  for (int64_t l = 0; l < L; ++l) {
    for (int64_t h = 0; h < H; ++h) {
      const auto value = [&](int64_t g) {
        return static_cast<double>(b[((g * L + l) * H + h) * 2]) + b[((g * L + l) * H + h) * 2 + 1];
      };
      out.total[l][h] = value(0) / n / total_scale;
      out.direct[l][h] = value(1) / n;
      out.lm[l][h] = predictions > 0 ? value(2) / static_cast<double>(predictions) : 0.0;
      if (options.group_patching) out.all_but_one[l][h] = value(3) / n / total_scale;
    }
    if (options.group_patching) {
      out.layer_total[static_cast<size_t>(l)] = (static_cast<double>(b[((4 * L + l) * H) * 2]) + b[((4 * L + l) * H) * 2 + 1]) / n / total_scale;
    }
  }
  out.forwards = ranks * (2 * out.prompts + out.lm_sequences) + L * H * (out.prompts + out.lm_sequences) +
                 (options.group_patching ? L * (H + 1) * out.prompts : 0);
  // The scores are the same on every rank (all-reduced), so every rank takes this branch together;
  // each group locates the first non-finite stage (over its ranks, as scored).
  const auto finite = [](double v) { return std::isfinite(v); };
  bool all_finite = finite(out.logprob_clean) && finite(out.logprob_corrupt) && finite(out.lm_nll_clean);
  for (const Grid* g : {&out.total, &out.direct, &out.lm}) {
    for (const auto& row : *g) all_finite = all_finite && std::all_of(row.begin(), row.end(), finite);
  }
  if (!all_finite) fail_nonfinite(teacher, seq, prompts.front().clean, "select-heads: the head scores are");
  return out;
}

Concentration concentration(const Grid& direct) {
  Concentration out;
  std::vector<double> positive;
  for (const auto& row : direct) {
    double layer = 0;
    for (double v : row) {
      positive.push_back(std::max(v, 0.0));
      layer += positive.back();
    }
    out.layer_share.push_back(layer);
    out.positive_total += layer;
  }
  const double total = out.positive_total;
  for (double& s : out.layer_share) s = total > 0 ? s / total : 0.0;
  std::sort(positive.begin(), positive.end(), std::greater<>());
  const int n = static_cast<int>(positive.size());
  double running = 0;
  for (int k = 1; k <= n; ++k) {
    running += positive[static_cast<size_t>(k - 1)];
    if ((k & (k - 1)) == 0 || k == n) out.top_share.emplace_back(k, total > 0 ? running / total : 0.0);
  }
  double entropy = 0;
  for (double v : positive) {
    if (v > 0) entropy -= v / total * std::log(v / total);
  }
  out.effective_heads = total > 0 ? std::exp(entropy) : 0.0;
  return out;
}

CompositeScores composite_scores(const HeadScores& scores, const ScoreWeights& weights) {
  const auto scale = [](const Grid& g) {
    double m = 0;
    for (const auto& row : g)
      for (double v : row) m = std::max(m, std::abs(v));
    return m;
  };
  CompositeScores out;
  out.scale_total = scale(scores.total);
  out.scale_direct = scale(scores.direct);
  out.scale_lm = scale(scores.lm);
  const auto part = [](double weight, double value, double s) { return s > 0 ? weight * value / s : 0.0; };
  out.composite = scores.total;
  for (size_t l = 0; l < out.composite.size(); ++l) {
    for (size_t h = 0; h < out.composite[l].size(); ++h) {
      out.composite[l][h] = part(weights.total, scores.total[l][h], out.scale_total) +
                            part(weights.direct, scores.direct[l][h], out.scale_direct) +
                            part(weights.lm, scores.lm[l][h], out.scale_lm);
    }
  }
  return out;
}

void Budget::validate(int64_t num_layers, int64_t num_heads) const {
  if (mode == BudgetMode::per_layer) {
    HYDRA_USER_CHECK(heads >= 1 && heads <= num_heads,
                     "--budget {} with --per-layer: a layer has {} heads, so the budget must be in 1..{}", heads, num_heads,
                     num_heads);
  } else {
    HYDRA_USER_CHECK(heads >= 1 && heads <= num_layers * num_heads,
                     "--budget {}: the model has {} heads ({} layers x {}), so the budget must be in 1..{}", heads,
                     num_layers * num_heads, num_layers, num_heads, num_layers * num_heads);
  }
}

std::vector<std::vector<int>> choose_fa_heads(const Grid& composite, const Budget& budget) {
  const int64_t L = static_cast<int64_t>(composite.size());
  HYDRA_ASSERT(L > 0, "no layers to choose from");
  const int64_t H = static_cast<int64_t>(composite.front().size());
  budget.validate(L, H);
  for (const auto& row : composite) {
    HYDRA_ASSERT(static_cast<int64_t>(row.size()) == H, "ragged score grid");
    for (double v : row) HYDRA_ASSERT(std::isfinite(v), "non-finite composite score {}", v);
  }
  std::vector<std::vector<int>> fa(static_cast<size_t>(L));
  // Candidates (layer, head) in (layer, head) order; a stable sort by descending score keeps that
  // order among ties.
  std::vector<std::pair<int64_t, int64_t>> all;
  for (int64_t l = 0; l < L; ++l)
    for (int64_t h = 0; h < H; ++h) all.emplace_back(l, h);
  const auto by_score = [&](const auto& x, const auto& y) { return composite[x.first][x.second] > composite[y.first][y.second]; };
  if (budget.mode == BudgetMode::global) {
    std::stable_sort(all.begin(), all.end(), by_score);
    for (int64_t k = 0; k < budget.heads; ++k) fa[all[k].first].push_back(static_cast<int>(all[k].second));
  } else {
    for (int64_t l = 0; l < L; ++l) {
      std::vector<std::pair<int64_t, int64_t>> layer(all.begin() + l * H, all.begin() + (l + 1) * H);
      std::stable_sort(layer.begin(), layer.end(), by_score);
      for (int64_t k = 0; k < budget.heads; ++k) fa[l].push_back(static_cast<int>(layer[k].second));
    }
  }
  for (auto& heads : fa) std::sort(heads.begin(), heads.end());
  return fa;
}

}  // namespace hydra::heads
