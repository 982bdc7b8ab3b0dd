// A Qwen3 whose needle retrieval runs through one known head, for head-selection tests: the
// planted head must rank first, a head with a zero W_o slice must score exactly zero.
//
// Shape: V = 48 (ids 40..47 are the NIAH markers, model/eval/niah.h), D = 64, 2 layers, H = 4 query
// heads, G = 2 KV heads, d = 16, MLP 32, rope_theta 1e6. Token classes: filler/key ids 0..23,
// "value" ids 24..39. Embedding row t = e_t + e_63 (a constant feature) + e_62 for value ids.
// The planted head (layer 1, head 2, KV head 1):
//   q  = W_q x̂ puts x̂[63] (> 0 for every token) on channel 7; after q_norm (weight α on 7): 4α·e_7;
//   k  = W_k x̂: channel 7 reads the value feature x̂[62], channel 15 reads x̂[63] − x̂[62], so after
//        k_norm (weight β on 7 and 15) a value token's key is 4β·e_7 and any other token's 4β·e_15;
//   RoPE pairs channels (7, 15) at frequency θ_7 = 1e6^(−7/8) ≈ 5.6e-6 rad per position: over a few
//   hundred positions the rotation is < 2e-3 rad, so scores are 4αβ = 36 for value tokens and ~0
//   for the rest: every query attends to the (one) value token of its context;
//   v  = W_v x̂ copies x̂[24..40) into channels 0..15, so the output is ≈ 4.6·e_{value−24};
//   W_o maps channel i back to residual dimension 24 + i.
// lm_head reads residual dimension t into the logit of value id t (other rows zero) and the final
// norm weight is 1, so the answer position's logits peak (≈ 7.7) at the needle's value: the model
// retrieves, and only through that head. Every other head keeps random weights (N(0, 0.02²): small
// W_o), except head 1 of layer 0 whose W_o slice is exactly zero. MLPs stay random (small).
#pragma once

#include <vector>

#include "model/model.h"
#include "model/eval/niah.h"
#include "model/params.h"
#include "runtime/random.h"

namespace hydra::test {

struct NeedleHeadModel {
  ModelConfig config;
  NamedTensors params;
  int64_t planted_layer = 1, planted_head = 2;
  int64_t zero_layer = 0, zero_head = 1;
  static constexpr int32_t kFillerEnd = 24, kValueBegin = 24, kValueEnd = 40;
};

inline NeedleHeadModel make_needle_head_model(uint64_t seed = 5) {
  NeedleHeadModel m;
  ModelConfig& c = m.config;
  c.arch = Arch::qwen3;
  c.vocab_size = 48;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.intermediate_size = 32;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = false;
  c.validate();
  m.params = random_parameters(c, seed);
  const int64_t D = c.hidden_size, d = c.head_dim;
  const auto at = [&](const std::string& name) -> float* { return m.params.at(name).data_as<float>(); };
  const auto zero = [&](const std::string& name) { fill(m.params.at(name), 0.0f); };
  const auto ones = [&](const std::string& name) { fill(m.params.at(name), 1.0f); };

  zero("model.embed_tokens.weight");
  for (int64_t t = 0; t < c.vocab_size; ++t) {
    float* row = at("model.embed_tokens.weight") + t * D;
    row[t] = 1.0f;
    row[63] = 1.0f;
    if (t >= NeedleHeadModel::kValueBegin && t < NeedleHeadModel::kValueEnd) row[62] = 1.0f;
  }
  zero("lm_head.weight");
  for (int64_t t = NeedleHeadModel::kValueBegin; t < NeedleHeadModel::kValueEnd; ++t) at("lm_head.weight")[t * D + t] = 1.0f;
  ones("model.norm.weight");
  for (int64_t l = 0; l < c.num_layers; ++l) ones(layer_prefix(l) + "input_layernorm.weight");

  const std::string p = layer_prefix(m.planted_layer) + "self_attn.";
  const int64_t h = m.planted_head, g = c.kv_head_of(h);
  float* wq = at(p + "q_proj.weight");  // [H·d, D]
  for (int64_t r = 0; r < d; ++r)
    for (int64_t k = 0; k < D; ++k) wq[(h * d + r) * D + k] = 0.0f;
  wq[(h * d + 7) * D + 63] = 1.0f;
  float* wk = at(p + "k_proj.weight");  // [G·d, D]
  float* wv = at(p + "v_proj.weight");
  for (int64_t r = 0; r < d; ++r) {
    for (int64_t k = 0; k < D; ++k) {
      wk[(g * d + r) * D + k] = 0.0f;
      wv[(g * d + r) * D + k] = 0.0f;
    }
    wv[(g * d + r) * D + NeedleHeadModel::kValueBegin + r] = 1.0f;
  }
  wk[(g * d + 7) * D + 62] = 1.0f;
  wk[(g * d + 15) * D + 63] = 1.0f;
  wk[(g * d + 15) * D + 62] = -1.0f;
  at(p + "q_norm.weight")[7] = 3.0f;  // α
  at(p + "k_norm.weight")[7] = 3.0f;  // β
  at(p + "k_norm.weight")[15] = 3.0f;
  float* wo = at(p + "o_proj.weight");  // [D, H·d]
  for (int64_t r = 0; r < D; ++r)
    for (int64_t k = 0; k < d; ++k) wo[r * c.num_heads * d + h * d + k] = r == NeedleHeadModel::kValueBegin + k ? 1.0f : 0.0f;

  float* wz = at(layer_prefix(m.zero_layer) + "self_attn.o_proj.weight");
  for (int64_t r = 0; r < D; ++r)
    for (int64_t k = 0; k < d; ++k) wz[r * c.num_heads * d + m.zero_head * d + k] = 0.0f;
  return m;
}

// A single-needle sample of `length` tokens for this model: filler/key ids below kFillerEnd, the
// needle NEEDLE k1 k2 IS value END at `needle_at`, then QUERY k1 k2 IS and the answer `value`.
inline niah::Sample needle_head_sample(int64_t length, int64_t needle_at, int32_t value, uint64_t seed) {
  const niah::Markers m = niah::markers_for(48);
  const RandomStream rng{seed, hash_name("needle-head-sample")};
  uint64_t next = 0;
  const auto filler = [&] { return static_cast<int32_t>(rng.bits(next++) % NeedleHeadModel::kFillerEnd); };
  niah::Sample s;
  s.key = {filler(), filler()};
  std::vector<int32_t> needle{m.needle, s.key[0], s.key[1], m.is, value, m.end};
  const std::vector<int32_t> query{m.query, s.key[0], s.key[1], m.is};
  const int64_t fill = length - static_cast<int64_t>(needle.size() + query.size()) - 1;
  for (int64_t i = 0; i < fill; ++i) {
    if (i == needle_at) s.ids.insert(s.ids.end(), needle.begin(), needle.end());
    s.ids.push_back(filler());
  }
  if (needle_at >= fill) s.ids.insert(s.ids.end(), needle.begin(), needle.end());
  s.ids.insert(s.ids.end(), query.begin(), query.end());
  s.answer_start = static_cast<int64_t>(s.ids.size());
  s.ids.push_back(value);
  s.answer_length = 1;
  s.length = length;
  s.needle_position = std::min(needle_at, fill);
  return s;
}

}  // namespace hydra::test
