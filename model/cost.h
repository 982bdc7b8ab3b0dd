// What a prefill or a training window costs in floating-point operations (for TFLOP/s, MFU and
// fraction of peak). Memory plans: model/memory_plan.h.
#pragma once

#include <cstdint>

#include "model/config.h"

namespace hydra {

struct FlopCount {
  double gemm = 0;       // projections, W_o, MLP (2·M·N·K each)
  double attention = 0;  // FA heads, causal: 2·T²·d per head (QKᵀ and PV over the visible half)
  double gdn = 0;        // chunked delta rule, ~(6d² + 8Cd) per token and head (C = 64)
  double logits = 0;     // the LM head, 2·T·D·V: every position in training, none in a prefill
  double total() const { return gemm + attention + gdn + logits; }
};

// Whole-sequence prefill FLOPs (all ranks together) for T tokens: the layers; a prefill forms only
// the last position's logits (2·D·V, not counted).
FlopCount prefill_flops(const ModelConfig& config, int64_t tokens);

enum class LogitHead { none, every_position };
// One training window's forward (all ranks together): the layers as in a prefill, plus the LM head
// over every position when the loss reads logits (cross-entropy, KL; not the per-layer alignment).
// MFU counts 3× this per window (DESIGN.md §1.5): the backward's two GEMMs per forward GEMM, no
// recomputation, no teacher forward.
FlopCount training_forward_flops(const ModelConfig& config, int64_t tokens, LogitHead head);
// Causal attention FLOPs for T tokens and `heads` heads of dim d.
double causal_attention_flops(int64_t tokens, int64_t heads, int64_t head_dim);
// Chunked gated delta rule FLOPs (forward), as above.
double delta_rule_flops(int64_t tokens, int64_t heads, int64_t head_dim);

}  // namespace hydra
