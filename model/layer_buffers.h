// Every buffer a layer's passes allocate and the loss head's chunk, as shapes and element types:
// the table model_forward.cpp, model_backward.cpp and model/train/objective.cpp allocate from, so a
// buffer's shape is written once, beside the code that allocates it (each allocation names the
// buffer, runtime/memory_label.h, for the memory plans, model/memory_plan.h, which run the passes).
// Also what a training forward may keep beyond the minimum (KeptActivations).
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/weight_layout.h"
#include "runtime/buffer_spec.h"
#include "runtime/dtype.h"

namespace hydra {

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
// trading memory for recomputation (ForwardContext::keep; hydra train takes what its memory plan,
// model/train/training_plan.h, fits on every rank):
struct KeptActivations {
  bool gdn_outputs = false;  // the GDN heads' outputs: no delta-rule forward in the backward (T·H_gdn·d per layer)
  bool projection = false;   // a HydraHead layer's fused projection: no in_proj GEMM in the backward (T·rows)
  int64_t mlp_layers = 0;    // layers 0..mlp_layers−1 keep the MLP's gate/up: no mlp_in GEMM in their backward (T·2I)
};

// Rows of a training loss chunk for a vocabulary of `vocab` (model/train/objective.cpp walks the
// logits in these): the [rows, V] fp32 logits stay near 2 GiB. Each
// chunk's lm_head gradient GEMM reads and writes the whole fp32 [V, D] gradient (1.2 GB at
// Qwen3-1.7B), so fewer, larger chunks move less (at 1 GiB chunks that was 75 passes per 128K window).
int64_t loss_chunk_rows(int64_t vocab);

// The loss head's buffers for T = `tokens` rows (model/train/objective.cpp walks the logits in
// chunks of n = min(T, loss_chunk_rows(V)) rows).
struct LossBuffers {
  BufferSpec logits;    // [n, V], acc (a distillation's teacher logits too)
  BufferSpec row_loss;  // [n], acc
  BufferSpec operand;   // [n, V], storage type: the logits' gradient as the lm_head GEMM's operand,
                        // its own buffer only where the storage type is not acc (the CPU reuses the logits)
};
LossBuffers loss_buffers(const ModelConfig& config, int64_t tokens, DType dtype, DType acc);

}  // namespace hydra
