// Choices among equivalent kernels and measurement switches, as one value that launch/ reads once
// (from the environment, launch/kernel_options.cpp, README "Kernel options"), validates, and passes
// down: the model copies them into each op's parameters (AttentionParams, DeltaRuleParams) and into
// run_concurrently. Nothing below launch/ reads the environment for them. Defaults are the
// production choices; the others exist to compare kernels and to time stages.
#pragma once

#include "kernels/attention/attention.h"
#include "kernels/delta_rule/delta_rule.h"
#include "runtime/concurrency.h"

namespace hydra::ops {

struct KernelOptions {
  AttentionKernel attention = AttentionKernel::automatic;                    // HYDRA_ATTENTION_KERNEL
  AttentionBackwardKernel attention_backward = AttentionBackwardKernel::automatic;  // HYDRA_ATTENTION_BWD_KERNEL
  int gdn_segments = 0;                    // HYDRA_GDN_SEGMENTS: the in-GPU split of the delta rule (0: chosen)
  GdnProfile gdn_profile = GdnProfile::off;  // HYDRA_GDN_PROFILE
  Branches branches = Branches::concurrent;  // HYDRA_SERIAL_BRANCHES
  // HYDRA_DECODE_PDL: the decode engine launches its step's kernels with programmatic dependent
  // launch (runtime/programmatic_launch.h); off until measured.
  bool decode_pdl = false;
};

}  // namespace hydra::ops
