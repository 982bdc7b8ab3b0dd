#include "model/weight_layout.h"

#include <algorithm>

#include <fmt/format.h>

#include "model/params.h"
#include "runtime/error.h"

namespace hydra {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int64_t padded(int64_t rows) { return (rows + kProjectionAlign - 1) / kProjectionAlign * kProjectionAlign; }

}  // namespace

const char* slot_name(Slot slot) {
  switch (slot) {
    case Slot::input_norm: return "input_norm";
    case Slot::in_proj: return "in_proj";
    case Slot::q_norm: return "q_norm";
    case Slot::k_norm: return "k_norm";
    case Slot::conv: return "conv";
    case Slot::a_log: return "a_log";
    case Slot::dt_bias: return "dt_bias";
    case Slot::fuse_norm: return "fuse_norm";
    case Slot::fuse_gamma: return "fuse_gamma";
    case Slot::o_proj: return "o_proj";
    case Slot::post_norm: return "post_norm";
    case Slot::mlp_in: return "mlp_in";
    case Slot::mlp_down: return "mlp_down";
    case Slot::fuse_gate_bias: return "fuse_gate_bias";
  }
  return "?";
}

std::string runtime_name(int64_t layer, Slot slot) { return fmt::format("layers.{}.{}", layer, slot_name(slot)); }

ParamTraits param_traits(const std::string& name) {
  ParamTraits t;
  // Norm weights, the gates (the FA output gate, the GDN β / decay projections and the fusion gate's
  // u and b), A_log, dt_bias and γ: no weight decay (DESIGN.md §1.5).
  for (const char* suffix : {"norm.weight", "layernorm.weight", "fa_gate_proj.weight", "gdn_a_proj.weight",
                             "gdn_b_proj.weight", "gdn_A_log", "gdn_dt_bias", "fuse_gamma", "fuse_gate.weight",
                             "fuse_gate.bias"}) {
    if (ends_with(name, suffix)) t.weight_decay = false;
  }
  t.attention_block = name.find(".self_attn.") != std::string::npos;
  return t;
}

std::vector<int64_t> LayerLayout::shape(Slot slot, const ModelConfig& c) const {
  const int64_t D = c.hidden_size, d = c.head_dim, H = c.num_heads, I = c.intermediate_size;
  switch (slot) {
    case Slot::input_norm:
    case Slot::post_norm: return {D};
    case Slot::in_proj: return {columns.rows, D};
    case Slot::q_norm:
    case Slot::k_norm: return h_fa > 0 ? std::vector<int64_t>{d} : std::vector<int64_t>{};
    case Slot::conv: return h_gdn > 0 ? std::vector<int64_t>{3 * h_gdn * d, c.conv_kernel} : std::vector<int64_t>{};
    case Slot::a_log:
    case Slot::dt_bias: return h_gdn > 0 ? std::vector<int64_t>{h_gdn} : std::vector<int64_t>{};
    case Slot::fuse_norm: return hydra && ops::fusion_has_norm(c.fusion) ? std::vector<int64_t>{H, d} : std::vector<int64_t>{};
    case Slot::fuse_gamma: return hydra && ops::fusion_has_gamma(c.fusion) ? std::vector<int64_t>{H} : std::vector<int64_t>{};
    case Slot::fuse_gate_bias: return hydra && ops::fusion_has_gate(c.fusion) ? std::vector<int64_t>{H} : std::vector<int64_t>{};
    case Slot::o_proj: return {D, H * d};
    case Slot::mlp_in: return {2 * I, D};
    case Slot::mlp_down: return {D, I};
  }
  return {};
}

LayerLayout layer_layout(const ModelConfig& c, int64_t l) {
  HYDRA_ASSERT(l >= 0 && l < c.num_layers, "layer {} of {}", l, c.num_layers);
  const int64_t D = c.hidden_size, d = c.head_dim, H = c.num_heads, G = c.num_kv_heads, I = c.intermediate_size;
  const std::string p = layer_prefix(l);
  LayerLayout out;
  out.layer = l;
  out.hydra = c.is_hydra();
  std::vector<Piece>& pieces = out.pieces;
  auto add = [&](const std::string& name, Slot slot, int dim, int64_t src, int64_t dst, int64_t length) {
    pieces.push_back(Piece{p + name, slot, dim, src, dst, length});
  };
  add("input_layernorm.weight", Slot::input_norm, 0, 0, 0, D);
  add("post_attention_layernorm.weight", Slot::post_norm, 0, 0, 0, D);
  add("mlp.gate_proj.weight", Slot::mlp_in, 0, 0, 0, I);
  add("mlp.up_proj.weight", Slot::mlp_in, 0, 0, I, I);
  add("mlp.down_proj.weight", Slot::mlp_down, 0, 0, 0, D);
  ProjectionColumns& col = out.columns;

  if (!c.is_hydra()) {
    out.h_fa = H;
    out.g_fa = G;
    for (int h = 0; h < H; ++h) {
      out.head_of.push_back(h);
      out.fa_kv_of.push_back(static_cast<int>(c.kv_head_of(h)));
    }
    col.fa_q = 0;
    col.fa_k = H * d;
    col.fa_v = (H + G) * d;
    col.used = (H + 2 * G) * d;
    add("self_attn.q_proj.weight", Slot::in_proj, 0, 0, col.fa_q, H * d);
    add("self_attn.k_proj.weight", Slot::in_proj, 0, 0, col.fa_k, G * d);
    add("self_attn.v_proj.weight", Slot::in_proj, 0, 0, col.fa_v, G * d);
    add("self_attn.q_norm.weight", Slot::q_norm, 0, 0, 0, d);
    add("self_attn.k_norm.weight", Slot::k_norm, 0, 0, 0, d);
    add("self_attn.o_proj.weight", Slot::o_proj, 1, 0, 0, H * d);
    col.rows = padded(col.used);
    return out;
  }

  const std::vector<int>& fa = c.fa_heads_of(l);
  const std::vector<int> gdn = c.gdn_heads_of(l);
  const std::vector<int> fa_kv = c.fa_kv_heads_of(l);
  out.h_fa = static_cast<int64_t>(fa.size());
  out.g_fa = static_cast<int64_t>(fa_kv.size());
  out.h_gdn = static_cast<int64_t>(gdn.size());
  out.head_of = fa;
  out.head_of.insert(out.head_of.end(), gdn.begin(), gdn.end());
  for (int h : fa) {
    const int kv = static_cast<int>(c.kv_head_of(h));
    out.fa_kv_of.push_back(static_cast<int>(std::find(fa_kv.begin(), fa_kv.end(), kv) - fa_kv.begin()));
  }
  const int64_t hfa = out.h_fa, gfa = out.g_fa, hg = out.h_gdn;
  int64_t at = 0;
  if (hfa > 0) {
    col.fa_q = at;
    col.fa_k = col.fa_q + hfa * d;
    col.fa_v = col.fa_k + gfa * d;
    col.fa_gate = col.fa_v + gfa * d;
    at = col.fa_gate + hfa * d;
    for (int64_t j = 0; j < hfa; ++j) add("self_attn.q_proj.weight", Slot::in_proj, 0, fa[j] * d, col.fa_q + j * d, d);
    add("self_attn.k_proj.weight", Slot::in_proj, 0, 0, col.fa_k, gfa * d);
    add("self_attn.v_proj.weight", Slot::in_proj, 0, 0, col.fa_v, gfa * d);
    add("self_attn.fa_gate_proj.weight", Slot::in_proj, 0, 0, col.fa_gate, hfa * d);
    add("self_attn.q_norm.weight", Slot::q_norm, 0, 0, 0, d);
    add("self_attn.k_norm.weight", Slot::k_norm, 0, 0, 0, d);
  }
  if (hg > 0) {
    col.gdn_qkv = at;
    col.gdn_a = col.gdn_qkv + 3 * hg * d;
    col.gdn_b = col.gdn_a + hg;
    at = col.gdn_b + hg;
    for (int64_t j = 0; j < hg; ++j) {
      add("self_attn.q_proj.weight", Slot::in_proj, 0, gdn[j] * d, col.gdn_qkv + j * d, d);
    }
    add("self_attn.gdn_k_proj.weight", Slot::in_proj, 0, 0, col.gdn_qkv + hg * d, hg * d);
    add("self_attn.gdn_v_proj.weight", Slot::in_proj, 0, 0, col.gdn_qkv + 2 * hg * d, hg * d);
    add("self_attn.gdn_a_proj.weight", Slot::in_proj, 0, 0, col.gdn_a, hg);
    add("self_attn.gdn_b_proj.weight", Slot::in_proj, 0, 0, col.gdn_b, hg);
    add("self_attn.gdn_q_conv.weight", Slot::conv, 0, 0, 0, hg * d);
    add("self_attn.gdn_k_conv.weight", Slot::conv, 0, 0, hg * d, hg * d);
    add("self_attn.gdn_v_conv.weight", Slot::conv, 0, 0, 2 * hg * d, hg * d);
    add("self_attn.gdn_A_log", Slot::a_log, 0, 0, 0, hg);
    add("self_attn.gdn_dt_bias", Slot::dt_bias, 0, 0, 0, hg);
  }
  if (ops::fusion_has_gate(c.fusion)) {
    col.fuse_gate = at;
    at += H;
  }
  col.used = at;
  col.rows = padded(at);
  for (int64_t pos = 0; pos < H; ++pos) {  // fusion and W_o follow the physical head order
    const int64_t h = out.head_of[static_cast<size_t>(pos)];
    if (ops::fusion_has_norm(c.fusion)) add("self_attn.fuse_norm.weight", Slot::fuse_norm, 0, h, pos, 1);
    if (ops::fusion_has_gamma(c.fusion)) add("self_attn.fuse_gamma", Slot::fuse_gamma, 0, h, pos, 1);
    if (ops::fusion_has_gate(c.fusion)) {
      add("self_attn.fuse_gate.weight", Slot::in_proj, 0, h, col.fuse_gate + pos, 1);
      add("self_attn.fuse_gate.bias", Slot::fuse_gate_bias, 0, h, pos, 1);
    }
    add("self_attn.o_proj.weight", Slot::o_proj, 1, h * d, pos * d, d);
  }
  return out;
}

}  // namespace hydra
