// The stage table (model/train/stage.h) and the kept-activation choice (model/train/training_plan.h
// choose_kept_activations): the facts hydra train reads from them, and the choice under each
// policy, with a plan whose fit is known.
#include <gtest/gtest.h>

#include <string>

#include "model/memory_plan.h"
#include "model/train/stage.h"
#include "model/train/training_plan.h"
#include "parallel/self_communicator.h"
#include "runtime/error.h"

namespace hydra::train {
namespace {

TEST(Stage, NamesRoundTripAndUnknownNamesAreUserErrors) {
  for (Stage s : {Stage::pretrain, Stage::align, Stage::distill, Stage::finetune}) {
    EXPECT_EQ(parse_stage(stage_name(s)), s);
    EXPECT_EQ(stage_traits(s).stage, s);
  }
  EXPECT_THROW(parse_stage("warmup"), UserError);
}

// What DESIGN.md §1.5 says each stage is: the teacher stages, alignment's attention-only set without
// masks or logits, and the metric each evaluation reports.
TEST(Stage, TraitsSayWhatEachStageNeedsTrainsAndLogs) {
  const StageTraits& pre = stage_traits(Stage::pretrain);
  const StageTraits& align = stage_traits(Stage::align);
  const StageTraits& distill = stage_traits(Stage::distill);
  const StageTraits& fine = stage_traits(Stage::finetune);
  EXPECT_FALSE(pre.needs_teacher);
  EXPECT_FALSE(fine.needs_teacher);
  EXPECT_TRUE(align.needs_teacher && align.teacher_layers_match);
  EXPECT_TRUE(distill.needs_teacher);
  EXPECT_FALSE(distill.teacher_layers_match);
  EXPECT_EQ(align.trains, TrainSet::attention);
  EXPECT_TRUE(align.only_that_set);
  EXPECT_EQ(pre.trains, TrainSet::all);
  EXPECT_FALSE(align.loss_masks || align.lm_head || align.logs_answer_split);
  EXPECT_TRUE(align.logs_layer_loss);
  EXPECT_EQ(align.objective, StageObjective::alignment);
  EXPECT_EQ(distill.objective, StageObjective::distillation);
  EXPECT_EQ(pre.objective, StageObjective::cross_entropy);
  EXPECT_EQ(std::string(pre.eval_metric), "cross_entropy");
  EXPECT_EQ(std::string(align.eval_metric), "mse");
  EXPECT_EQ(std::string(distill.eval_metric), "kl");
  EXPECT_DOUBLE_EQ(pre.lr, 1e-3);
  EXPECT_DOUBLE_EQ(pre.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(fine.lr, 2e-5);
}

TEST(Stage, TeacherRequirementBothWays) {
  EXPECT_NO_THROW(check_teacher(Stage::align, true));
  EXPECT_NO_THROW(check_teacher(Stage::pretrain, false));
  try {
    check_teacher(Stage::distill, false);
    FAIL() << "distill without a teacher was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("needs --teacher"), std::string::npos) << e.what();
  }
  try {
    check_teacher(Stage::finetune, true);
    FAIL() << "finetune with a teacher was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("takes no --teacher"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hydra::train

namespace hydra {
namespace {

// A plan whose size grows with what is kept: fits_memory_plan compares it with the host's
// available memory, so sizes far below (1 byte) and far above (1 PB) it have a known fit.
MemoryEstimate sized(double bytes) {
  MemoryEstimate e;
  e.weights = bytes;
  return e;
}

TEST(KeptActivations, ExplicitPoliciesIgnoreThePlan) {
  SelfCommunicator self;
  const auto never_fits = [](const KeptActivations&) { return sized(1e18); };
  const KeptActivations all = choose_kept_activations(KeptPolicy::gdn_proj_mlp, 5, never_fits, Device::host, 1, self);
  EXPECT_TRUE(all.gdn_outputs && all.projection);
  EXPECT_EQ(all.mlp_layers, 5);
  const KeptActivations proj = choose_kept_activations(KeptPolicy::gdn_proj, 5, never_fits, Device::host, 1, self);
  EXPECT_TRUE(proj.gdn_outputs && proj.projection);
  EXPECT_EQ(proj.mlp_layers, 0);
  const KeptActivations gdn = choose_kept_activations(KeptPolicy::gdn, 5, never_fits, Device::host, 1, self);
  EXPECT_TRUE(gdn.gdn_outputs && !gdn.projection);
  const KeptActivations none = choose_kept_activations(KeptPolicy::none, 5, never_fits, Device::host, 1, self);
  EXPECT_FALSE(none.gdn_outputs || none.projection || none.mlp_layers > 0);
}

// most_that_fits takes the first candidate that fits, most kept first: here the MLP's gate/up fit
// in at most 2 of 5 layers, and nothing fits at all in the second case.
TEST(KeptActivations, MostThatFitsTakesTheLargestCandidateThatFits) {
  SelfCommunicator self;
  const auto up_to_two_mlp_layers = [](const KeptActivations& k) { return sized(k.mlp_layers <= 2 ? 1.0 : 1e18); };
  const KeptActivations k = choose_kept_activations(KeptPolicy::most_that_fits, 5, up_to_two_mlp_layers, Device::host, 1, self);
  EXPECT_TRUE(k.gdn_outputs && k.projection);
  EXPECT_EQ(k.mlp_layers, 2);
  const auto only_gdn = [](const KeptActivations& k) { return sized(k.projection ? 1e18 : 1.0); };
  const KeptActivations g = choose_kept_activations(KeptPolicy::most_that_fits, 5, only_gdn, Device::host, 1, self);
  EXPECT_TRUE(g.gdn_outputs && !g.projection && g.mlp_layers == 0);
  const auto nothing = [](const KeptActivations&) { return sized(1e18); };
  const KeptActivations n = choose_kept_activations(KeptPolicy::most_that_fits, 5, nothing, Device::host, 1, self);
  EXPECT_FALSE(n.gdn_outputs || n.projection || n.mlp_layers > 0);
}

TEST(KeptActivations, PolicyNames) {
  EXPECT_EQ(parse_kept_policy("auto"), KeptPolicy::most_that_fits);
  EXPECT_EQ(parse_kept_policy("gdn+proj+mlp"), KeptPolicy::gdn_proj_mlp);
  EXPECT_EQ(parse_kept_policy("gdn+proj"), KeptPolicy::gdn_proj);
  EXPECT_EQ(parse_kept_policy("gdn"), KeptPolicy::gdn);
  EXPECT_EQ(parse_kept_policy("none"), KeptPolicy::none);
  EXPECT_THROW(parse_kept_policy("most"), UserError);
}

}  // namespace
}  // namespace hydra
