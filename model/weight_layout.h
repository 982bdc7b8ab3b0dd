// The one description of how a checkpoint's tensors (HF parameter paths, model/params.h) become the
// runtime tensors a layer computes with, and back. The model packs with it (Model::Model), the
// gradients and trained weights are unpacked with it (hydra gradients, hydra train), the optimizer
// takes its weight-decay groups from it, and the cost model counts the fused rows with it.
//
// Runtime layout of a layer:
//  - heads in "physical" order: FA heads first, then GDN heads (the teacher: identity order), so
//    each branch reads one contiguous column block; fusion weights, γ and W_o's columns follow it.
//  - one fused input projection, rows
//      qwen3:      [W_q (H·d) | W_k (G·d) | W_v (G·d)]
//      hydrahead:  [W_q FA (H_fa·d) | W_k (G_fa·d) | W_v (G_fa·d) | W_fgate (H_fa·d) |
//                   W_q GDN (H_gdn·d) | W_kl (H_gdn·d) | W_vl (H_gdn·d) | w_a (H_gdn) | w_b (H_gdn) |
//                   u (H, physical order; fusion gate only)]
//    zero-padded to a multiple of 64 rows so every column block of its output starts 16-byte aligned
//    on the GPU (the padding rows stay zero: their gradient is zero and never applied);
//  - the MLP's gate and up projections stacked [2I, D]; the three GDN conv weights stacked [3·H_gdn·d, K].
// Every runtime tensor is covered by pieces: a piece copies `length` rows (or, for W_o, columns) of a
// checkpoint tensor to a range of one runtime tensor. Pieces never overlap, so packing and unpacking
// are exact inverses.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace hydra {

// The runtime tensors of one layer.
enum class Slot : uint8_t {
  input_norm,  // [D]
  in_proj,     // [rows (padded), D]
  q_norm,      // [d]  (teacher, or a layer with FA heads)
  k_norm,      // [d]
  conv,        // [3·H_gdn·d, K]   q, k, v channels
  a_log,       // [H_gdn]
  dt_bias,     // [H_gdn]
  fuse_norm,   // [H, d]   physical order (HydraHead; fusions with a norm)
  fuse_gamma,  // [H]      (fusions with a γ)
  o_proj,      // [D, H·d] columns in physical order
  post_norm,   // [D]
  mlp_in,      // [2I, D]  gate rows then up rows
  mlp_down,    // [D, I]
  fuse_gate_bias,  // [H]   physical order (HydraHead, fusion gate); the gate's u are rows of in_proj
};
inline constexpr int kSlotCount = 14;
const char* slot_name(Slot slot);

// Which optimizer group a parameter belongs to (DESIGN.md §1.5): norms, gates, A_log, dt_bias and γ take no
// weight decay; the align stage trains only the attention block.
struct ParamTraits {
  bool weight_decay = true;
  bool attention_block = false;  // projections, gates, conv, A_log, dt_bias, q/k norms, fusion, W_o
};
ParamTraits param_traits(const std::string& checkpoint_name);

struct Piece {
  std::string name;       // checkpoint tensor
  Slot slot;              // runtime tensor of the layer
  int dim = 0;            // 0: rows (1-D tensors: elements), 1: columns (W_o)
  int64_t src_begin = 0;  // along `dim` in the checkpoint tensor
  int64_t dst_begin = 0;  // along `dim` in the runtime tensor
  int64_t length = 0;
};

// Column blocks of the fused projection's output [T, rows] (−1 where the layer has no such block).
struct ProjectionColumns {
  int64_t fa_q = -1, fa_k = -1, fa_v = -1, fa_gate = -1;  // FA (all heads of the teacher)
  int64_t gdn_qkv = -1, gdn_a = -1, gdn_b = -1;           // GDN: q|k|v channels, then a, b
  int64_t fuse_gate = -1;                                 // the fusion gate's logits u_h·x̂, H (physical order)
  int64_t used = 0;                                       // rows before the padding
  int64_t rows = 0;                                       // padded to kProjectionAlign
};
inline constexpr int64_t kProjectionAlign = 64;

struct LayerLayout {
  int64_t layer = 0;
  bool hydra = false;
  int64_t h_fa = 0, g_fa = 0, h_gdn = 0;  // FA query heads, their KV heads, GDN heads (teacher: H, G, 0)
  std::vector<int> head_of;               // physical position -> model head
  std::vector<int> fa_kv_of;              // FA head (physical) -> row block of the FA k/v (0..g_fa−1)
  ProjectionColumns columns;
  std::vector<Piece> pieces;

  // Shape of a runtime tensor; empty when the layer has no such tensor (no FA or no GDN heads).
  std::vector<int64_t> shape(Slot slot, const ModelConfig& config) const;
  bool has(Slot slot, const ModelConfig& config) const { return !shape(slot, config).empty(); }
};

LayerLayout layer_layout(const ModelConfig& config, int64_t layer);

// Runtime name of a layer tensor ("layers.3.in_proj"), for messages and the optimizer's state.
std::string runtime_name(int64_t layer, Slot slot);

}  // namespace hydra
