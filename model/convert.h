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
#include <vector>

#include "model/model.h"

namespace hydra {

// The student's config: the teacher's shape with the given FA head sets and fusion.
ModelConfig student_config(const ModelConfig& teacher, const std::vector<std::vector<int>>& fa_heads,
                           ops::Fusion fusion = ops::Fusion::scale_norm);

// RMS over tokens and channels of every head's attention output (before W_o), [L][H], from a
// sequence-parallel teacher forward over `tokens` (every rank passes the same tokens).
std::vector<std::vector<double>> measure_head_rms(const Model& teacher, Communicator& comm,
                                                  const std::vector<int32_t>& tokens);

// γ of the `scale` fusion, [L][H], from one sequence-parallel forward of `student` (fusion scale,
// γ = 1) over `tokens` (the same on every rank): layer by layer, γ_h = the teacher's head RMS over
// the student's own head RMS with the earlier layers already scaled, so every scaled head output
// has the teacher's RMS over the tokens; 1 where the student's head is all zeros.
std::vector<std::vector<double>> calibrate_scale_gamma(const Model& student, Communicator& comm,
                                                       const std::vector<int32_t>& tokens,
                                                       const std::vector<std::vector<double>>& teacher_rms);

// gamma: [L][H] (from measure_head_rms, or calibrate_scale_gamma for `scale`) or empty for γ = 1.
NamedTensors convert_parameters(const ModelConfig& teacher_config, const NamedTensors& teacher,
                                const ModelConfig& student, uint64_t seed,
                                const std::vector<std::vector<double>>& gamma);

}  // namespace hydra
