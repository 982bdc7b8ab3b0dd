// A model whose arg-max is known in closed form, for the NIAH scorer tests (unit and multi-rank).
//
// A one-layer Qwen3 with V = D = 64 whose attention and MLP output projections are zero, so the
// residual stream of token t stays its embedding row; the embedding is the identity (row t = e_t)
// and the final norm weight is 1, so the hidden row is s·e_t with s = 1/sqrt(1/D + eps), and the
// logits row of token t is s·lm_head[:, t]. With lm_head[next[t], t] = a and 0 elsewhere, the row
// holds L = s·a at next[t] and 0 at the other V − 1 ids: arg-max next[t], and
//   log p(next[t]) = L − log(e^L + V − 1),   log p(other) = −log(e^L + V − 1).
// Tests may add more entries to lm_head (ties) before building the Model. Attention and the MLP
// still run (random q/k/v, gate/up), so the test goes through the real forward and layout code.
#pragma once

#include <cmath>
#include <vector>

#include "model/model.h"
#include "model/params.h"

namespace hydra::test {

struct KnownArgmaxModel {
  ModelConfig config;
  NamedTensors params;
  double peak = 0;  // L: the logit at next[t]

  int64_t vocab() const { return config.vocab_size; }
  Tensor& lm_head() { return params.at("lm_head.weight"); }  // [V, D]
  void set_logit(int32_t token, int32_t id, float weight) { lm_head().data_as<float>()[id * config.hidden_size + token] = weight; }
  double log_norm() const { return std::log(std::exp(peak) + static_cast<double>(vocab() - 1)); }
  double logprob_hit() const { return peak - log_norm(); }
  double logprob_miss() const { return -log_norm(); }
};

// next [V]: the arg-max after each token.
inline KnownArgmaxModel make_known_argmax_model(const std::vector<int32_t>& next, float a = 0.5f) {
  KnownArgmaxModel m;
  ModelConfig& c = m.config;
  c.arch = Arch::qwen3;
  c.vocab_size = 64;
  c.hidden_size = 64;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 32;
  c.intermediate_size = 16;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  c.validate();
  HYDRA_ASSERT(static_cast<int64_t>(next.size()) == c.vocab_size, "next has {} entries", next.size());
  m.params = random_parameters(c, 11);
  const auto zero = [&](const std::string& name) { fill(m.params.at(name), 0.0f); };
  zero("model.layers.0.self_attn.o_proj.weight");
  zero("model.layers.0.mlp.down_proj.weight");
  zero("model.embed_tokens.weight");
  zero("lm_head.weight");
  fill(m.params.at("model.norm.weight"), 1.0f);
  float* embed = m.params.at("model.embed_tokens.weight").data_as<float>();
  for (int64_t t = 0; t < c.vocab_size; ++t) embed[t * c.hidden_size + t] = 1.0f;
  for (int64_t t = 0; t < c.vocab_size; ++t) m.set_logit(static_cast<int32_t>(t), next[static_cast<size_t>(t)], a);
  m.peak = a / std::sqrt(1.0 / static_cast<double>(c.hidden_size) + c.rms_norm_eps);
  return m;
}

}  // namespace hydra::test
