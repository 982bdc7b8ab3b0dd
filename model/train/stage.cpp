#include "model/train/stage.h"

#include "runtime/error.h"

namespace hydra::train {
namespace {

// Optimizer defaults, chosen for each stage's job (all: warmup 5% of --steps, at most 100, gradient
// clip 1.0, AdamW β 0.9/0.95, ε 1e-8):
//   pretrain  lr 1e-3 → 1e-4, weight decay 0.1: a model from `hydra init`, trained from scratch;
//   align     lr 1e-3 → 1e-4, weight decay 0.01, attention block only: new GDN/FA parameters learn
//             their layer's function fast, nothing else moves; alignment matches every position's
//             layer output, so loss masks do not apply and no logits are computed;
//   distill   lr 1e-4 → 1e-5, weight decay 0.01: the whole student, near its aligned start;
//   finetune  lr 2e-5 → 2e-6, weight decay 0.01: long sequences, a converted model.
constexpr StageTraits kStages[] = {
    {.stage = Stage::pretrain, .name = "pretrain", .needs_teacher = false, .teacher_layers_match = false,
     .trains = TrainSet::all, .only_that_set = false, .lr = 1e-3, .min_lr = 1e-4, .weight_decay = 0.1,
     .objective = StageObjective::cross_entropy, .loss_masks = true, .lm_head = true,
     .eval_metric = "cross_entropy", .logs_answer_split = true, .logs_layer_loss = false},
    {.stage = Stage::align, .name = "align", .needs_teacher = true, .teacher_layers_match = true,
     .trains = TrainSet::attention, .only_that_set = true, .lr = 1e-3, .min_lr = 1e-4, .weight_decay = 0.01,
     .objective = StageObjective::alignment, .loss_masks = false, .lm_head = false,
     .eval_metric = "mse", .logs_answer_split = false, .logs_layer_loss = true},
    {.stage = Stage::distill, .name = "distill", .needs_teacher = true, .teacher_layers_match = false,
     .trains = TrainSet::all, .only_that_set = false, .lr = 1e-4, .min_lr = 1e-5, .weight_decay = 0.01,
     .objective = StageObjective::distillation, .loss_masks = true, .lm_head = true,
     .eval_metric = "kl", .logs_answer_split = true, .logs_layer_loss = false},
    {.stage = Stage::finetune, .name = "finetune", .needs_teacher = false, .teacher_layers_match = false,
     .trains = TrainSet::all, .only_that_set = false, .lr = 2e-5, .min_lr = 2e-6, .weight_decay = 0.01,
     .objective = StageObjective::cross_entropy, .loss_masks = true, .lm_head = true,
     .eval_metric = "cross_entropy", .logs_answer_split = true, .logs_layer_loss = false},
};

}  // namespace

const StageTraits& stage_traits(Stage stage) {
  for (const StageTraits& t : kStages) {
    if (t.stage == stage) return t;
  }
  HYDRA_ASSERT(false, "stage {} has no traits", static_cast<int>(stage));
  return kStages[0];
}

Stage parse_stage(const std::string& name) {
  for (const StageTraits& t : kStages) {
    if (name == t.name) return t.stage;
  }
  HYDRA_USER_FAIL("--stage {} is not a stage (pretrain, align, distill, finetune)", name);
}

const char* stage_name(Stage stage) { return stage_traits(stage).name; }

void check_teacher(Stage stage, bool teacher_given) {
  const StageTraits& t = stage_traits(stage);
  HYDRA_USER_CHECK(!t.needs_teacher || teacher_given, "--stage {} needs --teacher TEACHER.h5", t.name);
  HYDRA_USER_CHECK(t.needs_teacher || !teacher_given, "--stage {} takes no --teacher", t.name);
}

StageBatch stage_batch(const StageRun& run, const std::vector<Window>& windows) {
  const PackedBatch packed = pack_windows(windows);
  SequenceLayout layout = group_layout(run.sequence, static_cast<int64_t>(packed.ids.size()), packed.document_starts);
  TokenRows rows = layout.rows_of(packed.ids, packed.targets, packed.answer);
  LossSums counted = stage_traits(run.stage).objective == StageObjective::alignment
                         ? LossSums{.tokens = layout.local_length()}
                         : count_targets(rows.targets, rows.answer);
  return StageBatch{std::move(layout), std::move(rows), counted};
}

LossSums stage_loss(const StageRun& run, const StageBatch& batch, double grad_scale, ModelTensors* grads,
                    std::vector<double>* layer_loss, const DeviceLossHead* device_head) {
  const TokenRows& w = batch.rows;
  ForwardContext context{.comm = run.sequence, .layout = batch.layout, .timer = run.timer, .keep = run.keep};
  HYDRA_ASSERT(!device_head || stage_traits(run.stage).objective == StageObjective::cross_entropy,
               "a device loss head for --stage {}", stage_name(run.stage));
  switch (stage_traits(run.stage).objective) {
    case StageObjective::cross_entropy:
      return sequence_gradients(context, run.student, w, Objective::cross_entropy, grad_scale, grads, nullptr, device_head);
    case StageObjective::distillation:
      return sequence_gradients(context, run.student, w, Objective::distillation, grad_scale, grads, run.teacher);
    case StageObjective::alignment: {
      std::vector<double> per_layer;
      const LossSums s = alignment_gradients(context, run.student, *run.teacher, w.ids, grad_scale, grads, &per_layer);
      if (layer_loss) {
        layer_loss->resize(per_layer.size(), 0.0);
        for (size_t l = 0; l < per_layer.size(); ++l) (*layer_loss)[l] += per_layer[l];
      }
      return s;
    }
  }
  return {};
}

}  // namespace hydra::train
