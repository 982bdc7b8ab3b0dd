// The four training stages (DESIGN.md §1.5) as one table: what each needs (a teacher), what it
// trains (the parameter set, its optimizer defaults), what it computes on a micro-batch (its
// objective) and what it logs (its evaluation metric, the loss split into answers, per-layer
// losses). The trainer (trainer.cpp), its evaluation (evaluation.cpp) and `hydra train`
// (launch/cmd_train.cpp) read the table instead of testing stages by name.
#pragma once

#include <string>
#include <vector>

#include "model/model.h"
#include "model/train/data.h"
#include "model/train/objective.h"
#include "runtime/phase_timer.h"

namespace hydra::train {

enum class Stage { pretrain, align, distill, finetune };
Stage parse_stage(const std::string& name);  // UserError for unknown names
const char* stage_name(Stage stage);

enum class TrainSet { all, attention };

// What a stage computes on a micro-batch (stage_loss below).
enum class StageObjective {
  cross_entropy,  // next-token cross-entropy (objective.h sequence_gradients)
  distillation,   // KL to the teacher's next-token distribution (sequence_gradients, Objective::distillation)
  alignment,      // each layer's output against the teacher's (objective.h alignment_gradients)
};

struct StageTraits {
  Stage stage;
  const char* name;
  // Needs: the teacher runs forward in the same process on the same tokens (--teacher).
  bool needs_teacher;
  bool teacher_layers_match;  // the teacher has as many layers as the student (layer l against layer l)
  // Trains: the default parameter set (--train auto) and whether only that set is allowed.
  TrainSet trains;
  bool only_that_set;
  double lr, min_lr, weight_decay;  // optimizer defaults (each overridable by its flag; cmd_train.cpp)
  // Computes.
  StageObjective objective;
  bool loss_masks;  // the data's loss_mask and document boundaries decide which targets count
  bool lm_head;     // the loss reads logits at every position (counted in the step's FLOPs)
  // Logs.
  const char* eval_metric;  // "cross_entropy", "kl", "mse"
  bool logs_answer_split;   // the loss split into retrieval answers and the rest (train.jsonl)
  bool logs_layer_loss;     // each layer's mean loss (train.jsonl "layer_loss")
};

const StageTraits& stage_traits(Stage stage);

// The teacher requirement, checked once for every door (hydra train before any weight is read,
// run_training for library callers): UserError when a stage that needs a teacher has none, or one
// that needs none is given one.
void check_teacher(Stage stage, bool teacher_given);

// Where and how a micro-batch runs: the sequence group's communicator (each window spread over it,
// zigzag layout), the step's phase timer (null: not timed) and what the forward keeps.
struct StageRun {
  Stage stage;
  Communicator& sequence;
  const Model& student;
  const Model* teacher;  // required when the stage needs one
  KeptActivations keep = {};
  PhaseTimer* timer = nullptr;
};

// A micro-batch made ready on the host (the host part of a step): its windows packed into one
// sequence, each window its own document (data.h pack_windows), this rank's layout of it over the
// sequence group, its rows (host tensors) and what it counts (the loss sums 0): the targets and
// answer targets that count (objective.h count_targets), or every row for alignment.
struct StageBatch {
  SequenceLayout layout;
  TokenRows rows;
  LossSums counted;
};
StageBatch stage_batch(const StageRun& run, const std::vector<Window>& windows);

// The stage's loss (and, with grads, the gradient scaled by grad_scale) of a micro-batch, spread
// over the sequence group. `layer_loss` (optional; alignment only) accumulates each layer's unscaled
// sum. With `device_head` (cross-entropy stages with grads): the batch's rows are on the model's
// device, the loss sums go to the head's device buffers and the scale comes from its device scalar
// (objective.h DeviceLossHead); the sums returned are then 0 (the caller holds batch.counted).
LossSums stage_loss(const StageRun& run, const StageBatch& batch, double grad_scale, ModelTensors* grads,
                    std::vector<double>* layer_loss = nullptr, const DeviceLossHead* device_head = nullptr);
inline LossSums stage_loss(const StageRun& run, const std::vector<Window>& windows, double grad_scale,
                           ModelTensors* grads, std::vector<double>* layer_loss = nullptr) {
  return stage_loss(run, stage_batch(run, windows), grad_scale, grads, layer_loss);
}

}  // namespace hydra::train
