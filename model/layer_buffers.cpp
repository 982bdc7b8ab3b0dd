#include "model/layer_buffers.h"

#include <algorithm>

namespace hydra {

LayerBuffers layer_buffers(const ModelConfig& c, const LayerLayout& layout, int64_t t, DType dtype, DType acc) {
  const int64_t D = c.hidden_size, H = c.num_heads, d = c.head_dim, I = c.intermediate_size;
  const int64_t hfa = layout.h_fa, gfa = layout.g_fa, hg = layout.h_gdn, rows = layout.columns.rows;
  const int64_t n = std::min(t, kMlpTileTokens);
  return LayerBuffers{
      .input = {{t, D}, dtype},
      .fa_out = {{t, hfa, d}, dtype},
      .fa_lse = {{hfa, t}, acc},
      .gdn_out = {{t, hg, d}, dtype},
      .mlp_gate_up = {{t, 2 * I}, dtype},
      .x_norm = {{t, D}, dtype},
      .proj = {{t, rows}, dtype},
      .heads = {{t, H, d}, dtype},
      .fa_q = {{t, hfa, d}, dtype},
      .fa_k = {{t, gfa, d}, dtype},
      .fa_acc = {{t, hfa, d}, acc},
      .conv = {{t, 3 * hg * d}, dtype},
      .inv_norm = {{t, 2 * hg}, acc},
      .gate = {{t, hg}, acc},
      .tile_x_norm = {{n, D}, dtype},
      .tile_gate_up = {{n, 2 * I}, dtype},
      .tile_h = {{n, I}, dtype},
      .tile_dy = {{n, D}, dtype},
      .tile_dh = {{n, I}, dtype},
      .tile_dgate_up = {{n, 2 * I}, dtype},
      .tile_dx_norm = {{n, D}, dtype},
      .dx_operand = {{t, D}, dtype},
      .d_heads = {{t, H, d}, dtype},
      .d_proj = {{t, rows}, dtype},
      .d_attn = {{t, hfa, d}, dtype},
      .d_fa_q = {{t, hfa, d}, acc},
      .d_fa_kv = {{t, gfa, d}, acc},
      .d_conv = {{t, 3 * hg * d}, dtype},
      .d_qk = {{t, hg, d}, dtype},
      .d_x_norm = {{t, D}, dtype},
  };
}

int64_t loss_chunk_rows(int64_t vocab) { return std::max<int64_t>(1, (int64_t{1} << 29) / std::max<int64_t>(vocab, 1)); }

LossBuffers loss_buffers(const ModelConfig& c, int64_t tokens, DType dtype, DType acc) {
  const int64_t n = std::max<int64_t>(1, std::min(tokens, loss_chunk_rows(c.vocab_size)));
  return {.logits = {{n, c.vocab_size}, acc}, .row_loss = {{n}, acc}, .operand = {{n, c.vocab_size}, dtype}};
}

}  // namespace hydra
