#include "model/cost.h"

#include "kernels/delta_rule/delta_rule.h"
#include "model/weight_layout.h"

namespace hydra {

double causal_attention_flops(int64_t tokens, int64_t heads, int64_t head_dim) {
  const double t = static_cast<double>(tokens);
  return 2.0 * t * t * static_cast<double>(head_dim) * static_cast<double>(heads);
}

double delta_rule_flops(int64_t tokens, int64_t heads, int64_t head_dim) {
  const double d = static_cast<double>(head_dim), c = static_cast<double>(ops::kDeltaRuleChunk);
  return static_cast<double>(tokens) * static_cast<double>(heads) * (6.0 * d * d + 8.0 * c * d);
}

FlopCount prefill_flops(const ModelConfig& c, int64_t tokens) {
  FlopCount f;
  const double t = static_cast<double>(tokens), D = static_cast<double>(c.hidden_size);
  const double d = static_cast<double>(c.head_dim), H = static_cast<double>(c.num_heads);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerLayout layout = layer_layout(c, l);  // the fused projection's rows, without the padding
    const double in_rows = static_cast<double>(layout.columns.used);
    const int64_t fa_heads = layout.h_fa, gdn_heads = layout.h_gdn;
    f.gemm += 2.0 * t * D * (in_rows + H * d + 3.0 * static_cast<double>(c.intermediate_size));
    f.attention += causal_attention_flops(tokens, fa_heads, c.head_dim);
    f.gdn += delta_rule_flops(tokens, gdn_heads, c.head_dim);
  }
  return f;
}

FlopCount training_forward_flops(const ModelConfig& c, int64_t tokens, LogitHead head) {
  FlopCount f = prefill_flops(c, tokens);
  if (head == LogitHead::every_position) {
    f.logits = 2.0 * static_cast<double>(tokens) * static_cast<double>(c.hidden_size) * static_cast<double>(c.vocab_size);
  }
  return f;
}

}  // namespace hydra
