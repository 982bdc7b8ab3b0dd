// τ, the log-position scale of a query's scores (attention.h AttentionParams::tau_log_base): for a
// log base a > 0, τ(p) = log(p + a) / log(a) at the query's position p within its document
// (mask::tau_position); 1 when off. The one place the formula is written, for the host and the
// device: the CPU reference and the decode kernel take the fp64 form, the flash forward and backward
// kernels the fp32 form with 1 / log(a) computed once on the host (inverse_log_tau_base).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/attention/attention_mask.h"

namespace hydra::ops {

HYDRA_ATTENTION_HD double tau_f64(int64_t position, double log_base) {
  return log_base > 0 ? log(static_cast<double>(position) + log_base) / log(log_base) : 1.0;
}

HYDRA_ATTENTION_HD float tau_f32(int64_t position, float log_base, float inv_log_base) {
  return log_base > 0.0f ? logf(static_cast<float>(position) + log_base) * inv_log_base : 1.0f;
}

// 1 / log(a) for tau_f32 (0 when τ is off).
inline float inverse_log_tau_base(double log_base) {
  return log_base > 0 ? static_cast<float>(1.0 / std::log(log_base)) : 0.0f;
}

}  // namespace hydra::ops
