// The memory plan of a training step (hydra train, hydra plan) and the choice of what its forward
// keeps: the step's own pass run shape-only (model/memory_plan.h), over the weights and the
// optimizer's state (model/train/optimizer.h) held for the whole run.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/config.h"
#include "model/layer_buffers.h"
#include "model/memory_plan.h"
#include "parallel/communicator.h"

namespace hydra {

// Per-rank plan for a training step on `local_tokens` rows: the step's pass run shape-only
// (model/memory_plan.h plan_pass: model/train/objective.cpp sequence_gradients — cross-entropy, or
// distillation with a teacher — or alignment_gradients with `align`), over the weights, the
// gradients of every parameter, the fp32 masters and moments (whole with `optimizer_shards` 1; with ZeRO-1 over W ranks,
// this rank's ⌈N/W⌉ of each plus the reduce-scatter/all-gather bucket: model/train/optimizer.h),
// the teacher's weights and forward (align/distill), every layer's kept tensors, the loss chunks
// and one layer's recomputation and backward. Element types: bf16 + fp32 on cuda, `host_dtype`
// (f32; f64 for gradient checks) on the host. `documents` as above (a micro-batch of several
// windows packs them as documents).
MemoryEstimate estimate_training_memory(const ModelConfig& config, int64_t local_tokens, int ranks_per_sequence,
                                        const ModelConfig* teacher, Device device, bool align,
                                        KeptActivations keep = {}, bool documents = true,
                                        DType host_dtype = DType::f32, int optimizer_shards = 1);
// The optimizer's bytes per rank in that plan: gradients (whole), masters and both moments (whole,
// or this rank's share of `optimizer_shards` ranks) and, sharded, the collectives' bucket.
double optimizer_bytes(const ModelConfig& config, Device device, DType host_dtype, int optimizer_shards);

// What a training forward keeps (hydra train --kept-activations, or any caller of run_training).
// Keeping activations spares the backward recomputation: the GDN outputs (a delta-rule forward per
// layer) first, the projection (an in_proj GEMM per layer) second, then the MLP's gate/up (an mlp_in
// GEMM, the largest, but also the most memory: T·2I per layer) for as many layers as fit.
enum class KeptPolicy {
  none,            // only what the backward cannot do without
  gdn,             // the GDN outputs
  gdn_proj,        // and the fused projection
  gdn_proj_mlp,    // and every layer's MLP gate/up
  most_that_fits,  // the first of the above, most kept first (the MLP's for as many layers as fit),
                   // whose plan fits on every rank
};
KeptPolicy parse_kept_policy(const std::string& name);  // none, gdn, gdn+proj, gdn+proj+mlp, auto; UserError otherwise

// The activations to keep under `policy` for a model of `layers` layers. `plan` prices a training
// step keeping a candidate (estimate_training_memory with the run's shapes); most_that_fits tries
// the candidates in order and takes the first that fits_memory_plan on every rank of `comm` (one
// all-reduce of the misfits, so all ranks choose the same; collective), or none when none fits.
KeptActivations choose_kept_activations(KeptPolicy policy, int64_t layers,
                                        const std::function<MemoryEstimate(const KeptActivations&)>& plan,
                                        Device device, int ranks_on_host, Communicator& comm);

}  // namespace hydra
