#include "model/cost.h"

#include <algorithm>

#include <fmt/format.h>

#include "model/model.h"
#include "model/params.h"

namespace hydra {

double causal_attention_flops(int64_t tokens, int64_t heads, int64_t head_dim) {
  const double t = static_cast<double>(tokens);
  return 2.0 * t * t * static_cast<double>(head_dim) * static_cast<double>(heads);
}

double delta_rule_flops(int64_t tokens, int64_t heads, int64_t head_dim) {
  const double d = static_cast<double>(head_dim), c = 64.0;
  return static_cast<double>(tokens) * static_cast<double>(heads) * (6.0 * d * d + 8.0 * c * d);
}

FlopCount prefill_flops(const ModelConfig& c, int64_t tokens) {
  FlopCount f;
  const double t = static_cast<double>(tokens), D = static_cast<double>(c.hidden_size);
  const double d = static_cast<double>(c.head_dim), H = static_cast<double>(c.num_heads);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    double in_rows = 0;
    int64_t fa_heads = c.num_heads, gdn_heads = 0;
    if (c.is_hydra()) {
      fa_heads = static_cast<int64_t>(c.fa_heads_of(l).size());
      gdn_heads = c.num_heads - fa_heads;
      const double gfa = static_cast<double>(c.fa_kv_heads_of(l).size());
      in_rows = H * d + 2 * gfa * d + fa_heads * d + 2.0 * gdn_heads * d + 2.0 * gdn_heads;
    } else {
      in_rows = H * d + 2.0 * static_cast<double>(c.num_kv_heads) * d;
    }
    f.gemm += 2.0 * t * D * (in_rows + H * d + 3.0 * static_cast<double>(c.intermediate_size));
    f.attention += causal_attention_flops(tokens, fa_heads, c.head_dim);
    f.gdn += delta_rule_flops(tokens, gdn_heads, c.head_dim);
  }
  return f;
}

std::string MemoryEstimate::describe() const {
  const double g = 1024.0 * 1024.0 * 1024.0;
  return fmt::format("{:.1f} GiB (weights {:.1f}, transient init {:.1f}, activations {:.1f})", total() / g, weights / g,
                     init_extra / g, activations / g);
}

MemoryEstimate estimate_prefill_memory(const ModelConfig& c, int64_t local_tokens, int world) {
  MemoryEstimate m;
  const double b = 2.0;  // bf16
  const double t = static_cast<double>(local_tokens), D = static_cast<double>(c.hidden_size);
  const double d = static_cast<double>(c.head_dim), H = static_cast<double>(c.num_heads);
  m.weights = static_cast<double>(parameter_count(c)) * b;
  m.init_extra = m.weights;
  double peak = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const double hfa = c.is_hydra() ? static_cast<double>(c.fa_heads_of(l).size()) : H;
    const double gfa = c.is_hydra() ? static_cast<double>(c.fa_kv_heads_of(l).size()) : static_cast<double>(c.num_kv_heads);
    const double hg = H - hfa;
    const double in_rows = (hfa + 2 * gfa + (c.is_hydra() ? hfa : 0) + 3 * hg) * d + 2 * hg + 64;
    const double base = 2 * t * D * b + t * in_rows * b + t * H * d * b;  // x, x_norm, projection, head buffer
    const double fa = t * hfa * d * 4 + hfa * t * 4 + (world > 1 ? 2 * t * gfa * 2 * d * b : 0) + t * H * d * b;
    const double gdn = hg > 0 ? t * 3 * hg * d * b + 2 * t * hg * 4 +        // conv output, β and g
                                    4 * t * hg * d * b + t * hg * 4 +        // W, U, K̃, V' and γ
                                    (t / 64 + 1) * hg * d * d * b            // chunk states
                              : 0;
    const double mlp_rows = std::min<double>(t, static_cast<double>(kMlpTileTokens));
    const double mlp = mlp_rows * (D + 3 * static_cast<double>(c.intermediate_size)) * b;
    peak = std::max({peak, base + std::max(fa, gdn), 2 * t * D * b + mlp});
  }
  m.activations = peak * 1.05;  // allocator rounding and small temporaries
  return m;
}

}  // namespace hydra
