// Conversion of a Qwen3 teacher into a HydraHead student (DESIGN.md §1.3, parameter migration).
//
//  copied:     embedding, every norm, the MLP, W_o, lm_head; FA heads' W_q rows, q_norm, k_norm
//              and the W_k / W_v rows of their KV heads;
//  FA heads:   W_fgate = 0 (the gate starts at sigmoid(0) = ½ on every channel);
//  GDN heads:  W_q rows copied; W_kl[h] = W_k[g(h)], W_vl[h] = W_v[g(h)] (channel repetition);
//              conv taps [0, …, 0, 1] (identity before SiLU); w_a, w_b ~ N(0, 0.02²);
//              A_log = ln U(1, 16); dt_bias = softplus⁻¹(dt), dt log-uniform in [1e-3, 0.1];
//  fusion:     (the variant's tensors, kernels/fusion/fusion.h) w_fuse = 1; γ_h = RMS of the teacher's
//              head-h attention output over calibration tokens (so y_h starts at the teacher's scale),
//              else 1; for `scale` (no norm) γ_h = that RMS over the RMS of the student's own head-h
//              output, the earlier layers already scaled (calibrate_scale_gamma); the fusion gate's u = 0 and b = 0 (2σ(0) = 1, so a
//              converted gate student computes what scale_norm does).
// The random draws come from (seed, parameter name): reproducible and order-independent.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "model/model.h"

namespace hydra {

// The student's config: the teacher's shape with the given FA head sets and fusion.
ModelConfig student_config(const ModelConfig& teacher, const std::vector<std::vector<int>>& fa_heads,
                           ops::Fusion fusion = ops::Fusion::scale_norm);

// Calibration tokens (hydra convert --calib), cut into windows: window w is tokens [w·L, (w + 1)·L) of
// the stream, L = seq_len, with the document starts inside it (the file's document_offsets), so every
// document runs as if alone and the attention cost stays linear in the tokens. Sums over the windows
// give the same statistic as one sequence of all the tokens, but for the context each token sees.
struct CalibrationWindows {
  int64_t seq_len = 0, windows = 0;
  std::vector<int32_t> ids;                           // [windows · seq_len]
  std::vector<std::vector<int64_t>> document_starts;  // per window: 0 and the starts inside it, or empty
  int64_t tokens() const { return windows * seq_len; }
  std::span<const int32_t> window(int64_t w) const {
    return std::span<const int32_t>(ids).subspan(static_cast<size_t>(w * seq_len), static_cast<size_t>(seq_len));
  }
  // All of `tokens` as one window of one document.
  static CalibrationWindows whole(std::vector<int32_t> tokens);
};
// The first `max_tokens` tokens of a token file (all: max_tokens ≤ 0) in windows of `seq_len`: the
// partial window at the end is left out; a stream shorter than one window is one window of the longest
// length the layout admits on `ranks` (UserError when none; or when seq_len itself is not admissible,
// naming --calib-seq-len). Reads only those tokens and offsets.
CalibrationWindows read_calibration_windows(const std::string& path, int64_t vocab, int64_t seq_len, int64_t max_tokens,
                                            int ranks);
// Called after each window of a calibration pass (rank 0 prints progress): the window done, of how many.
using CalibrationProgress = std::function<void(int64_t done, int64_t total)>;

// RMS over tokens and channels of every head's attention output (before W_o), [L][H], from one
// sequence-parallel teacher forward per window (every rank passes the same windows).
std::vector<std::vector<double>> measure_head_rms(const Model& teacher, Communicator& comm,
                                                  const CalibrationWindows& calib, const CalibrationProgress& progress = {});
inline std::vector<std::vector<double>> measure_head_rms(const Model& teacher, Communicator& comm,
                                                         const std::vector<int32_t>& tokens) {
  return measure_head_rms(teacher, comm, CalibrationWindows::whole(tokens));
}

// γ of the `scale` fusion, [L][H], from `student` (fusion scale, γ = 1) over the windows (the same on
// every rank): layer by layer, γ_h = the teacher's head RMS over the student's own head RMS with the
// earlier layers already scaled, so every scaled head output has the teacher's RMS over the tokens; 1
// where the student's head is all zeros. Every window's residual stream is kept between layers
// (tokens · D values per rank over P ranks); each layer runs twice per window (measure, then apply).
std::vector<std::vector<double>> calibrate_scale_gamma(const Model& student, Communicator& comm,
                                                       const CalibrationWindows& calib,
                                                       const std::vector<std::vector<double>>& teacher_rms,
                                                       const CalibrationProgress& progress = {});
inline std::vector<std::vector<double>> calibrate_scale_gamma(const Model& student, Communicator& comm,
                                                              const std::vector<int32_t>& tokens,
                                                              const std::vector<std::vector<double>>& teacher_rms) {
  return calibrate_scale_gamma(student, comm, CalibrationWindows::whole(tokens), teacher_rms);
}

// gamma: [L][H] (from measure_head_rms, or calibrate_scale_gamma for `scale`) or empty for γ = 1.
NamedTensors convert_parameters(const ModelConfig& teacher_config, const NamedTensors& teacher,
                                const ModelConfig& student, uint64_t seed,
                                const std::vector<std::vector<double>>& gamma);

}  // namespace hydra
