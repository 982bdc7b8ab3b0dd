// What a prefill costs: floating-point operations (for TFLOP/s and fraction of peak) and device
// memory per rank (checked before anything is allocated, so a run that cannot fit fails in a
// second with the estimate instead of after minutes with an allocator error).
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "runtime/dtype.h"

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

struct MemoryEstimate {
  double weights = 0;      // bytes, runtime copies
  double init_extra = 0;   // transient: the parameter set the runtime copies are built from
  double activations = 0;  // peak per-layer working set
  double total() const { return weights + init_extra + activations; }
  std::string describe() const;  // "41.2 GiB (weights 3.8, init 3.8, activations 33.6)"
};

// Per-rank estimate for a prefill of `local_tokens` rows on `world` ranks: bf16 on cuda; fp32 on the
// host, where the checkpoint's f32 copy (read whole before the model is built) is the transient part.
MemoryEstimate estimate_prefill_memory(const ModelConfig& config, int64_t local_tokens, int world,
                                       Device device = Device::cuda);

// Rows of a training loss chunk for a vocabulary of `vocab` (model/train/objective.cpp walks the
// logits in these; the memory plan prices one): the [rows, V] fp32 logits stay near 2 GiB. Each
// chunk's lm_head gradient GEMM reads and writes the whole fp32 [V, D] gradient (1.2 GB at
// Qwen3-1.7B), so fewer, larger chunks move less (at 1 GiB chunks that was 75 passes per 128K window).
int64_t loss_chunk_rows(int64_t vocab);

// What a forward that saves for the backward (model.h LayerSaved) keeps beyond the minimum, each
// trading memory for recomputation (ForwardContext::keep; hydra train takes what its memory plan
// fits on every rank):
struct KeptActivations {
  bool gdn_outputs = false;  // the GDN heads' outputs: no delta-rule forward in the backward (T·H_gdn·d per layer)
  bool projection = false;   // a HydraHead layer's fused projection: no in_proj GEMM in the backward (T·rows)
  int64_t mlp_layers = 0;    // layers 0..mlp_layers−1 keep the MLP's gate/up: no mlp_in GEMM in their backward (T·2I)
};

// Per-rank estimate for a training step on `local_tokens` rows (model/train): weights, fp32 masters,
// moments and gradients, the teacher's weights (align/distill), every layer's saved input and FA
// output, one layer's recomputation and backward, and the loss chunk. `align` adds the teacher's
// residual stream at every layer boundary; `keep` what the forward keeps beyond that (below).
// Element sizes: bf16 + fp32 on cuda, fp32 on the host.
MemoryEstimate estimate_training_memory(const ModelConfig& config, int64_t local_tokens, int ranks_per_sequence,
                                        const ModelConfig* teacher, Device device, bool align,
                                        KeptActivations keep = {});

// Whether the estimate fits what check_memory_plan allows (95% of the memory this rank can use).
bool fits_memory_plan(const MemoryEstimate& estimate, Device device, int ranks_on_host = 1);

// Refuses (UserError naming `what` and the estimate) a run whose estimate exceeds the memory this
// rank can use: the GPU's free memory, or for the CPU path the host's available memory
// (runtime/host_memory.h) shared by the `ranks_on_host` ranks of this node.
void check_memory_plan(const MemoryEstimate& estimate, Device device, const std::string& what, int ranks_on_host = 1);

}  // namespace hydra
