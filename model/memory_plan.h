// The memory of a pass, derived from the pass itself (after llm.c, whose activation table is both the
// allocation and the memory count). A plan runs the pass's own code in a shape-only run
// (runtime/memory_timeline.h): a model of meta tensors (shape_only_model), as rank 0 of a PlanWorld
// of P ranks (parallel/plan_world.h), over a layout of the pass's length. Every tensor the pass
// allocates is held on a timeline from its allocation until its last handle goes, under the name and
// part its allocation gives it (runtime/memory_label.h); the ops compute nothing, and an op whose GPU
// launcher allocates workspaces holds them from the launcher's own spec (kernels/common.h). So the
// plan is the pass's own allocations in its own order: a buffer the code adds is in the plan by being
// allocated, with no second description to keep. The timeline's peak is the estimate, with where it
// falls ("layer 27 backward: d_conv") and each part's bytes there (MemoryPart: activations,
// workspaces, GDN maps; they add up to it, and hydra plan prints them); the weights, gradients and
// optimizer state, held for the whole run, are added from the model's layout (runtime_tensor_bytes).
//
// On the host the plan is exact to the byte against the host tensors' live-byte counter
// (runtime/host_memory.h): tests/model/memory_plan_test.cpp and, on P = 1..4 and 8 ranks,
// tests/parallel/memory_plan_parallel_test.cpp. On a GPU the plan is held to the peak measured in the
// same test (cuda_memory_stats; skipped without a GPU): the kernels' small scratch (norm and conv
// partial sums, sort keys) is not held. Element types follow the device: bf16 storage and fp32
// accumulators on cuda, f32 (f64 for gradient checks) on the host; a host tensor (token rows, the
// copies read back) counts on the host path only.
//
// The plans: estimate_prefill_memory and estimate_forward_memory here, estimate_training_memory in
// model/train/training_plan.h, estimate_generation_memory in model/generate.h.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "model/config.h"
#include "model/model.h"
#include "runtime/memory_timeline.h"

namespace hydra {

struct MemoryEstimate {
  double weights = 0;      // bytes held for the whole run: weights (a teacher's too), gradients and optimizer state
  double optimizer = 0;    // of which gradients, masters and moments (training plans; 0 elsewhere)
  double init_extra = 0;   // beyond `weights` while the model is built: the parameter set it is placed from
  double activations = 0;  // beyond `weights` at the pass's peak: everything the pass holds, the sum of `parts`
  MemoryParts parts{};     // `activations` by part (MemoryPart) at that peak
  std::string peak_at;     // where the pass peaks
  double allocated = 0;    // every allocation of the pass added up (what a step arena holds: train --cuda-graph on)
  int64_t unnamed_buffers = 0;  // allocations of the pass that gave no name (runtime/memory_label.h; kept at 0)
  double part(MemoryPart p) const { return parts[static_cast<size_t>(p)]; }
  // A buffer held through the whole pass (a command's outputs, the cache): on top of the peak, in its part.
  void add(MemoryPart p, double bytes);
  double total() const { return weights + (init_extra > activations ? init_extra : activations); }
  // "22.6 GiB (weights 3.2, build 3.2, peak 19.4: activations 12.1, workspaces 4.0, GDN maps 3.3, at layer 0 forward: GDN conv)"
  std::string describe() const;
};

// ---- The shape-only runs ----

// A plan's element types on `device`: bf16 storage and fp32 accumulators on cuda; `host_dtype` (f32,
// or f64 for gradient checks) for both on the host.
struct PlanTypes {
  DType dtype, acc;
};
PlanTypes plan_types(Device device, DType host_dtype = DType::f32);

// The model `config` on `device` in `dtype`, its tensors meta (built in a shape-only run of its own,
// so its weights are no part of a pass's timeline): what a plan's pass runs.
Model shape_only_model(const ModelConfig& config, Device device, DType dtype);
// Gradients of every parameter of `model` in its acc_dtype(), meta likewise.
ModelTensors shape_only_gradients(const Model& model);

// Runs `pass` in a shape-only run on rank 0 of `world` ranks, its context's layout `local_tokens`
// rows per rank (with `documents`, a sequence that may be packed: the layout carries document
// bounds and cuts no segment at a document start, SequenceLayout::with_document_bounds, the most
// any packing holds), starting at stage `stage`. Returns the pass's peak, by part and where.
MemoryEstimate plan_pass(Device device, int world, int64_t local_tokens, bool documents, const char* stage,
                         const std::function<void(ForwardContext& context)>& pass);

// The runtime tensors of a model (Model's constructor: GEMM weights in `dtype`, the rest in `acc`),
// or, with `tensors_dtype`, every tensor in that type (gradients, moments, masters); each tensor
// rounded as the device's allocator rounds it.
double runtime_tensor_bytes(const ModelConfig& config, Device device, DType dtype, DType acc,
                            std::optional<DType> tensors_dtype = {});

// ---- Command plans ----

// Per-rank plan for a prefill of `local_tokens` rows on `world` ranks (model/prefill.h
// prefill_last_logits: the forward, the final norm, the last position's logits): bf16 on cuda; f32
// on the host, where the checkpoint's f32 copy (read whole before the model is built) is the
// transient part. `documents`: the sequence packs several documents (the attention's document
// bounds, [T] i64 each).
MemoryEstimate estimate_prefill_memory(const ModelConfig& config, int64_t local_tokens, int world,
                                       Device device = Device::cuda, bool documents = true);

// Per-rank plan for `hydra forward` (launch/cmd_forward.cpp): the prefill of `local_tokens` rows of a
// `total_tokens` sequence and, with `logits_out`, every rank's fp32 logits [T_loc, V] (plus, on the
// host path, rank 0's assembled [T, V] with one incoming block, and the whole sequence's ids [T] i32
// that every rank reads).
MemoryEstimate estimate_forward_memory(const ModelConfig& config, int64_t total_tokens, int64_t local_tokens, int world,
                                       int rank, Device device, bool logits_out, bool documents = true);
// Its parts: this rank's logits [T_loc, V] f32 (0 without logits_out), and what the command holds
// on the host whatever the device (the logits or their copy, rank 0's assembly, the ids).
double forward_logits_bytes(const ModelConfig& config, int64_t local_tokens, bool logits_out);
double forward_host_bytes(const ModelConfig& config, int64_t total_tokens, int64_t local_tokens, int rank,
                          bool logits_out);

// ---- Fitting ----

// Whether the estimate fits what check_memory_plan allows (95% of the memory this rank can use).
bool fits_memory_plan(const MemoryEstimate& estimate, Device device, int ranks_on_host = 1);
// The same rule for a memory of `bytes` (hydra plan: a GPU of a given size).
bool fits_in(const MemoryEstimate& estimate, double bytes);

// Refuses (UserError naming `what` and the estimate) a run whose estimate exceeds the memory this
// rank can use: the GPU's free memory (split among the ranks that share it when the node's
// `ranks_on_host` ranks outnumber its GPUs), or for the CPU path the host's available memory
// (runtime/host_memory.h) shared by the `ranks_on_host` ranks of this node.
// `remedy` ends the message: what the user can change (the command's own flags).
void check_memory_plan(const MemoryEstimate& estimate, Device device, const std::string& what, int ranks_on_host = 1,
                       const std::string& remedy = "use more ranks (on more nodes) or a shorter --seq-len");

}  // namespace hydra
