// The training objectives (DESIGN.md §1.5) as one sequence's forward and backward on this rank's
// tokens, accumulating parameter gradients. The loss heads walk the tokens in chunks, so no [T, V]
// tensor ever exists: a chunk's logits are computed, turned into their gradient in place
// (kernels/loss), and multiplied back into the hidden states' gradient and lm_head's.
//
// Means are token-weighted over every rank and micro-batch: each call returns the SUM of its
// tokens' losses and their count, and scales its gradient by `grad_scale` — 1 / (the global token
// count of the step) — so the gradients of all calls add up to the gradient of the global mean.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace hydra::train {

struct LossSums {
  double loss = 0;     // Σ over this call's tokens (unscaled)
  int64_t tokens = 0;  // tokens that carry a loss
  // The part of the above whose targets are retrieval answers (TokenRows::answer; 0 when none marked).
  double answer_loss = 0;
  int64_t answer_tokens = 0;
  LossSums& operator+=(const LossSums& o) {
    loss += o.loss;
    tokens += o.tokens;
    answer_loss += o.answer_loss;
    answer_tokens += o.answer_tokens;
    return *this;
  }
};

// Next-token cross-entropy on final hidden states [T_loc, D]: rows with target ≥ 0 count (a loss
// mask sets the others to −1, parallel/layout.h). d_hidden [T_loc, D] (acc dtype) ← grad_scale ·
// ∂Σloss/∂hidden; lm_head's gradient accumulates into `grads` (the embedding's when tied; skipped
// when undefined). d_hidden undefined: the loss only. `answer` [T_loc] (optional): rows whose target
// is a retrieval answer, summed apart as well (LossSums::answer_loss).
LossSums cross_entropy_head(const Model& model, const TensorView& hidden, const TensorView& targets,
                            double grad_scale, const TensorView& d_hidden, ModelTensors& grads,
                            std::span<const uint8_t> answer = {});

// KL(p_teacher ‖ p_student) at temperature 1 on the rows whose target counts (targets ≥ 0; the same
// rows the cross-entropy would count), teacher logits computed chunk by chunk from the teacher's
// final hidden states of the same tokens. `answer` as for cross_entropy_head.
LossSums distillation_head(const Model& student, const Model& teacher, const TensorView& hidden,
                           const TensorView& teacher_hidden, const TensorView& targets, double grad_scale,
                           const TensorView& d_hidden, ModelTensors& grads, std::span<const uint8_t> answer = {});

// A loss head's results and gradient scale in device buffers rather than host values: what a step
// replayed as a CUDA graph needs (model/train/trainer.cpp, DESIGN.md §1.5 "The step as a CUDA graph").
// The head adds its rows' losses into `sums` (no host read) and its kernels read the gradient scale
// from `grad_scale` when they run, not when they are launched; the caller counts the targets on the
// host beforehand (the head returns no counts). Cross-entropy only. The loss kernel reads the scale
// from the device when it runs (ops::cross_entropy_with_grad's scale_at_run_time): the same product
// as a scale passed by value, so the same bits. On the host the value is read when the head runs.
struct DeviceLossHead {
  TensorView sums;        // [2] f64 on the model's device: += Σ row losses, Σ those whose target is an answer
  TensorView answer;      // [T_loc] i32 on the model's device: 1 where the target is an answer (undefined: none)
  TensorView grad_scale;  // [1] f32 on the model's device
};

// The rows whose target counts (≥ 0) and those of them marked as answers, from host targets [T_loc]
// (loss sums 0): what a DeviceLossHead's caller counts before the step.
LossSums count_targets(const TensorView& host_targets, std::span<const uint8_t> answer);

enum class Objective { cross_entropy, distillation };

// One sequence: forward saving what the backward needs (model.h LayerSaved), the loss head, then
// the backward layer by layer (freeing each layer's saved tensors as it goes) and the embedding.
// rows: ids, targets [T_loc] int32 in local order (targets −1: no loss) and the answer flags.
// `teacher` is required for distillation (it runs forward in the same process on the same tokens).
// With `grads` null only the loss is computed (evaluation: a plain forward, nothing saved).
// With `device_head` (cross-entropy with grads only) the loss head is a DeviceLossHead: rows.ids and
// rows.targets must then be on the model's device, grad_scale is not used and the sums returned are 0.
LossSums sequence_gradients(ForwardContext& context, const Model& model, const TokenRows& rows, Objective objective,
                            double grad_scale, ModelTensors* grads, const Model* teacher = nullptr,
                            const DeviceLossHead* device_head = nullptr);

// Layer-wise alignment (stage 1): the teacher runs forward; student layer l receives the teacher's
// input to layer l and is trained to match the teacher's output of layer l,
//   L = Σ_l Σ_t ‖y_s,l(t) − y_t,l(t)‖² / D   (summed here; grad_scale = 1 / global token count),
// each layer's backward stopping at its input. Returns the loss sum over layers and the tokens
// (counted once). `layer_loss` (optional, size L) receives each layer's unscaled sum. With `grads`
// null only the loss is computed.
LossSums alignment_gradients(ForwardContext& context, const Model& student, const Model& teacher,
                             const TensorView& ids, double grad_scale, ModelTensors* grads,
                             std::vector<double>* layer_loss = nullptr);

// Sums every gradient tensor over the ranks of `comm` (the data- and sequence-parallel reduction:
// each rank's gradients hold only its own tokens' contributions). Collective.
void all_reduce_gradients(Communicator& comm, ModelTensors& grads);

// What `hydra gradients` computes: the gradient of the mean next-token cross-entropy of one
// sequence `ids` (global order; the last token has no target) over the targets `counted` marks
// (loss_mask, same length as ids; empty: all), the ranks of `comm` each taking their zigzag share.
// Collective; every rank returns the same sums and gradients (checkpoint names, host f32). With no
// target counted the sums are zero and so are the gradients.
struct NamedGradients {
  LossSums sums;
  NamedTensors grads;
};
// `document_starts` (empty: one document) packs several documents into the sequence (DESIGN.md
// §3.6): each runs as if alone and the targets that would cross a boundary are not counted.
NamedGradients next_token_gradients(Communicator& comm, const Model& model, std::span<const int32_t> ids,
                                    std::span<const uint8_t> counted = {}, std::span<const int64_t> document_starts = {});

}  // namespace hydra::train
