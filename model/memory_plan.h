// The memory of a training step and of a prefill, described once (after llm.c's activation spec):
//  - LayerBuffers: the shape and element type of every buffer a layer's passes allocate. The
//    forward (model_forward.cpp) and the backward (model_backward.cpp) allocate from it, and the
//    planners price the same entries, so a buffer that changes shape changes the plan with it.
//  - The planners (memory_plan.cpp) replay the passes' allocations and frees in the order the code
//    makes them (model_forward.cpp, model_backward.cpp, model/train/objective.cpp, model/prefill.cpp,
//    parallel/, and on cuda the GDN kernels' own workspaces) on a MemoryTimeline, whose peak is
//    the estimate: the peak of what the code holds, not a sum of per-phase guesses. Each hold names
//    its MemoryPart (activations, workspaces, GDN maps, ...), and the estimate carries every part's
//    bytes at that peak, which add up to it (hydra plan prints them). The buffers of other files
//    come from the spec functions beside their allocations (ring_buffers, attention_merge_buffers,
//    gdn_scan_buffers, conv_halo_buffers, delta_rule_prepare_buffers, delta_rule_backward_buffers,
//    kv_cache_spec, decode_engine_buffers); nothing is restated here.
// Element types follow the device: bf16 storage and fp32 accumulators on cuda, f32 (f64 for
// gradient checks) on the host; host-only buffers (token rows, the copies read back) count on the
// host path only. tests/model/memory_plan_test.cpp (and, on P = 1..4 ranks,
// tests/parallel/memory_plan_parallel_test.cpp) hold the host plans to the byte against the peak
// that the host tensors' counter (runtime/host_memory.h) measures.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weight_layout.h"
#include "runtime/buffer_spec.h"
#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace hydra {

class Communicator;

// Tokens per MLP tile: the MLP's [T, 2I] intermediate never exists whole at long context.
inline constexpr int64_t kMlpTileTokens = 32768;

// Every buffer one layer's forward and backward allocate, for T_loc = t rows; `dtype` is the
// model's (storage), `acc` its accumulator type (Model::acc_dtype()). Physical head order.
struct LayerBuffers {
  // Kept for the backward (model.h LayerSaved); a kept projection is `proj` below.
  BufferSpec input;        // [T, D]: the residual stream entering the layer
  BufferSpec fa_out;       // [T, H_fa, d]: the attention output before the gate, storage type
  BufferSpec fa_lse;       // [H_fa, T], acc
  BufferSpec gdn_out;      // [T, H_gdn, d] (KeptActivations::gdn_outputs)
  BufferSpec mlp_gate_up;  // [T, 2I] (KeptActivations::mlp_layers)
  // The attention block (every pass).
  BufferSpec x_norm;       // [T, D]
  BufferSpec proj;         // [T, rows]: the fused projection, padding rows included
  BufferSpec heads;        // [T, H, d]: per-head outputs; `fused` (the replay's) has the same shape
  BufferSpec fa_q, fa_k;   // [T, H_fa, d], [T, G_fa, d]
  BufferSpec fa_acc;       // [T, H_fa, d], acc: the ring's merged output
  BufferSpec conv;         // [T, 3·H_gdn·d]
  BufferSpec inv_norm;     // [T, 2·H_gdn], acc
  BufferSpec gate;         // [T, H_gdn], acc: β, g (and their gradients)
  // One MLP token tile (forward, and the backward's recomputation).
  BufferSpec tile_x_norm, tile_gate_up, tile_h;  // [n, D], [n, 2I], [n, I]
  // The backward's own.
  BufferSpec tile_dy, tile_dh, tile_dgate_up, tile_dx_norm;  // [n, D], [n, I], [n, 2I], [n, D]
  BufferSpec dx_operand;   // [T, D]: dx in the storage type (W_o's GEMM operand)
  BufferSpec d_heads;      // [T, H, d]: d_fused and d_heads
  BufferSpec d_proj;       // [T, rows]
  BufferSpec d_attn;       // [T, H_fa, d]: through the output gate
  BufferSpec d_fa_q, d_fa_kv;  // [T, H_fa, d], [T, G_fa, d], acc
  BufferSpec d_conv;       // [T, 3·H_gdn·d]
  BufferSpec d_qk;         // [T, H_gdn, d]: dq̂, dk̂ before the L2 norm and RoPE
  BufferSpec d_x_norm;     // [T, D]
};
LayerBuffers layer_buffers(const ModelConfig& config, const LayerLayout& layout, int64_t tokens, DType dtype,
                           DType acc);

// What a forward that saves for the backward (model.h LayerSaved) keeps beyond the minimum, each
// trading memory for recomputation (ForwardContext::keep; hydra train takes what its memory plan
// fits on every rank):
struct KeptActivations {
  bool gdn_outputs = false;  // the GDN heads' outputs: no delta-rule forward in the backward (T·H_gdn·d per layer)
  bool projection = false;   // a HydraHead layer's fused projection: no in_proj GEMM in the backward (T·rows)
  int64_t mlp_layers = 0;    // layers 0..mlp_layers−1 keep the MLP's gate/up: no mlp_in GEMM in their backward (T·2I)
};

// Rows of a training loss chunk for a vocabulary of `vocab` (model/train/objective.cpp walks the
// logits in these; the memory plan prices one): the [rows, V] fp32 logits stay near 2 GiB. Each
// chunk's lm_head gradient GEMM reads and writes the whole fp32 [V, D] gradient (1.2 GB at
// Qwen3-1.7B), so fewer, larger chunks move less (at 1 GiB chunks that was 75 passes per 128K window).
int64_t loss_chunk_rows(int64_t vocab);

// The loss head's buffers for T = `tokens` rows (model/train/objective.cpp walks the logits in
// chunks of n = min(T, loss_chunk_rows(V)) rows; the plan prices the same).
struct LossBuffers {
  BufferSpec logits;    // [n, V], acc (a distillation's teacher logits too)
  BufferSpec row_loss;  // [n], acc
  BufferSpec operand;   // [n, V], storage type: the logits' gradient as the lm_head GEMM's operand,
                        // its own buffer only where the storage type is not acc (the CPU reuses the logits)
};
LossBuffers loss_buffers(const ModelConfig& config, int64_t tokens, DType dtype, DType acc);

// What a held buffer is, for the plan's parts (hydra plan prints them): every hold is tagged with
// one at its source, and the timeline records each part's bytes at the peak, so the parts add up to
// the peak exactly.
enum class MemoryPart {
  activations,  // the residual stream, token rows, kept tensors and a layer's own buffers (LayerBuffers)
  workspaces,   // the ops' scratch: ring K/V and dK/dV, document bounds, attention merge parts and delta,
                // the delta-rule kernels' workspaces, the fusion's row scalars, the loss head's logit chunks
  gdn_maps,     // the GDN scan (gdn_scan_buffers): states, segment maps (gathered and kept), folded initial
                // states, state gradients; and the conv halos (conv_halo_buffers)
  cache,        // generation: the K/V and GDN cache and the decode engine's persistent buffers
  outputs,      // hydra forward: the logits it returns (and, on the host, their assembly and the ids)
};
inline constexpr int kMemoryPartCount = 5;
const char* memory_part_name(MemoryPart part);  // "activations", "workspaces", "GDN maps", "cache", "outputs"
using MemoryParts = std::array<double, kMemoryPartCount>;  // bytes, indexed by MemoryPart

// Live bytes over a replayed pass: hold() what the code allocates, release() what it frees; the
// peak, where it was reached and what each part held then. Blocks are rounded as the device's
// allocator rounds them.
class MemoryTimeline {
 public:
  using Id = size_t;
  explicit MemoryTimeline(Device device) : device_(device) {}
  Id hold(const BufferSpec& buffer, MemoryPart part, const char* what) { return hold_bytes(buffer.bytes(), part, what); }
  Id hold_bytes(double bytes, MemoryPart part, const char* what);
  // A buffer on the host whatever the device (token rows, results read back): counted on the host path only.
  Id hold_host(const BufferSpec& buffer, MemoryPart part, const char* what);
  void release(Id id);
  void set_stage(std::string stage) { stage_ = std::move(stage); }
  Device device() const { return device_; }
  double live() const { return live_; }
  double peak() const { return peak_; }
  const MemoryParts& peak_parts() const { return peak_parts_; }  // each part's bytes at the peak; they sum to peak()
  const std::string& peak_at() const { return peak_at_; }  // "layer 27 backward: d_conv"

 private:
  struct Held {
    double bytes;  // < 0: released
    MemoryPart part;
  };
  Device device_;
  std::vector<Held> held_;
  MemoryParts live_parts_{}, peak_parts_{};
  double live_ = 0, peak_ = 0;
  std::string stage_, peak_at_;
};

struct MemoryEstimate {
  double weights = 0;      // bytes held for the whole run: weights (a teacher's too), gradients and optimizer state
  double optimizer = 0;    // of which gradients, masters and moments (training plans; 0 elsewhere)
  double init_extra = 0;   // beyond `weights` while the model is built: the parameter set it is placed from
  double activations = 0;  // beyond `weights` at the pass's peak: everything the pass holds, the sum of `parts`
  MemoryParts parts{};     // `activations` by part (MemoryPart) at that peak
  std::string peak_at;     // where the pass peaks
  double part(MemoryPart p) const { return parts[static_cast<size_t>(p)]; }
  // A buffer held through the whole pass (a command's outputs, the cache): on top of the peak, in its part.
  void add(MemoryPart p, double bytes);
  double total() const { return weights + (init_extra > activations ? init_extra : activations); }
  // "22.6 GiB (weights 3.2, build 3.2, peak 19.4: activations 12.1, workspaces 4.0, GDN maps 3.3, at layer 0 forward: GDN conv)"
  std::string describe() const;
};

// Per-rank plan for a prefill of `local_tokens` rows on `world` ranks (model/prefill.cpp: the
// forward, the final norm, the last position's logits): bf16 on cuda; f32 on the host, where the
// checkpoint's f32 copy (read whole before the model is built) is the transient part. `documents`:
// the sequence packs several documents (the attention's document bounds, [T] i64 each).
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

// Per-rank plan for `hydra generate` (model/generate.h) of prompts of `prompt_lengths` tokens with up
// to `max_new_tokens` each on `world` ranks: the longest prompt's prefill, the cache (kv_cache_spec,
// every slot at the largest per-slot row count) and the decode engine's persistent buffers
// (decode_engine_buffers). `sampled`: the engine keeps the host copy of the logits.
MemoryEstimate estimate_generation_memory(const ModelConfig& config, const std::vector<int64_t>& prompt_lengths,
                                          int64_t max_new_tokens, int world, Device device, bool sampled);

// Per-rank plan for a training step on `local_tokens` rows (model/train/objective.cpp
// sequence_gradients, or alignment_gradients with `align`): weights, the gradients of every
// parameter, the fp32 masters and moments (whole with `optimizer_shards` 1; with ZeRO-1 over W ranks,
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
