// Log-softmax over the vocabulary and the per-token cross-entropy (negative log-likelihood),
// computed with the max subtracted, with fp64 sums (host float32 or float64 views).
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// out, logits: [T, V]; out may alias logits.
void log_softmax(const TensorView& out, const TensorView& logits);

// nll [T] = −log softmax(logits[t])[targets[t]]; logits [T, V], targets [T] int32 in [0, V).
void cross_entropy(const TensorView& nll, const TensorView& logits, const TensorView& targets);

}  // namespace hydra::ops
