// The training losses on a chunk of rows, forward and gradient in one pass (DESIGN.md §1.5). Callers walk
// the tokens in chunks so that no [T, V] tensor ever exists: logits of a chunk are computed, turned
// into their gradient here (in place, or into the bf16 GEMM operand), and multiplied back into the
// hidden states and lm_head.
// Per-row losses come back unscaled; `grad_scale` (typically 1 / the global token count) scales
// only the gradient, so the caller's mean is token-weighted over ranks and micro-batches.
#pragma once

#include "runtime/tensor.h"

namespace hydra::ops {

// Next-token cross-entropy, p = softmax(logits_i):
//   row_loss[i] = logsumexp(logits_i) − logits_i[target_i],  logits_i ← grad_scale (p − onehot(target_i)).
// A row whose target is negative is ignored: loss 0 and gradient 0.
// logits [n, V] fp32, targets [n] int32, row_loss [n] fp32. The gradient goes to `grad` [n, V] when
// given (on the GPU fp32 or bf16: the lm_head GEMM's operand written directly), else over the logits.
// `scale_at_run_time` ([1] f32 on the logits' device, or undefined): the scale is read from it when
// the kernel runs, in place of grad_scale (a step replayed as a CUDA graph, whose scale changes every
// step: model/train/objective.h DeviceLossHead); the same product, so the same bits.
void cross_entropy_with_grad(const TensorView& logits, const TensorView& row_loss, const TensorView& targets,
                             float grad_scale, const TensorView& grad = TensorView(),
                             const TensorView& scale_at_run_time = TensorView());

// Logit distillation at temperature 1, KL(p_t ‖ p_s) with p_t = softmax(teacher), p_s = softmax(student):
//   row_loss[i] = Σ_v p_t (log p_t − log p_s),  student_logits_i ← grad_scale (p_s − p_t).
// student_logits, teacher_logits [n, V] fp32; row_loss [n] fp32; `grad` as for cross_entropy_with_grad.
// `targets` [n] int32 (optional): a row whose target is negative (a loss mask) is ignored, loss 0 and
// gradient 0, as in cross_entropy_with_grad; only the sign is read.
void kl_divergence_with_grad(const TensorView& student_logits, const TensorView& row_loss,
                             const TensorView& teacher_logits, float grad_scale, const TensorView& grad = TensorView(),
                             const TensorView& targets = TensorView());

// Squared error between hidden states (layer-wise alignment):
//   row_loss[i] = Σ_k (a_ik − b_ik)²,  d_a_i ← grad_scale · 2 (a_i − b_i).
// a, b, d_a [n, D] (d_a may alias a; CUDA: a, b bf16 or fp32, d_a bf16 or fp32), row_loss [n] fp32.
void squared_error_with_grad(const TensorView& d_a, const TensorView& row_loss, const TensorView& a,
                             const TensorView& b, float grad_scale);

#if HYDRA_CUDA
namespace cuda_impl {  // loss.cu
void cross_entropy_with_grad(const TensorView& logits, const TensorView& row_loss, const TensorView& targets,
                             float grad_scale, const TensorView& grad, const TensorView& scale_at_run_time);
void kl_divergence_with_grad(const TensorView& student_logits, const TensorView& row_loss,
                             const TensorView& teacher_logits, float grad_scale, const TensorView& grad,
                             const TensorView& targets);
void squared_error_with_grad(const TensorView& d_a, const TensorView& row_loss, const TensorView& a,
                             const TensorView& b, float grad_scale);
}  // namespace cuda_impl
#endif

}  // namespace hydra::ops
