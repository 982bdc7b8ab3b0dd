#include "model/cost.h"

#include <algorithm>

#include <fmt/format.h>

#include "kernels/delta_rule/delta_rule.h"
#include "model/model.h"
#include "model/params.h"
#include "model/weight_layout.h"
#include "runtime/error.h"
#include "runtime/host_memory.h"
#if HYDRA_CUDA
#include "runtime/cuda_memory.h"
#endif

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

std::string MemoryEstimate::describe() const {
  const double g = 1024.0 * 1024.0 * 1024.0;
  return fmt::format("{:.1f} GiB (weights {:.1f}, transient init {:.1f}, activations {:.1f})", total() / g, weights / g,
                     init_extra / g, activations / g);
}

MemoryEstimate estimate_prefill_memory(const ModelConfig& c, int64_t local_tokens, int world, Device device) {
  MemoryEstimate m;
  const double b = device == Device::cuda ? 2.0 : 4.0;  // bf16 on GPUs, the fp32 reference on the host
  const double t = static_cast<double>(local_tokens), D = static_cast<double>(c.hidden_size);
  const double d = static_cast<double>(c.head_dim), H = static_cast<double>(c.num_heads);
  m.weights = static_cast<double>(parameter_count(c)) * b;
  // The parameter set the runtime copies are built from: drawn or placed in bf16 on the GPU; on the
  // host the f32 tensors read from the checkpoint (or drawn), alive while the model is built.
  m.init_extra = device == Device::cuda ? m.weights : static_cast<double>(parameter_count(c)) * 4.0;
  double peak = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerLayout layout = layer_layout(c, l);
    const double hfa = static_cast<double>(layout.h_fa), gfa = static_cast<double>(layout.g_fa);
    const double hg = static_cast<double>(layout.h_gdn), in_rows = static_cast<double>(layout.columns.rows);
    const double base = 2 * t * D * b + t * in_rows * b + t * H * d * b;  // x, x_norm, projection, head buffer
    const double fa = t * hfa * d * 4 + hfa * t * 4 + (world > 1 ? 2 * t * gfa * 2 * d * b : 0) + t * H * d * b;
    const double gdn = hg > 0 ? t * 3 * hg * d * b + 2 * t * hg * 4 +        // conv output, β and g
                                    4 * t * hg * d * b + t * hg * 4 +        // W, U, K̃, V' and γ
                                    (t / static_cast<double>(ops::kDeltaRuleChunk) + 1) * hg * d * d * b  // chunk states
                              : 0;
    const double mlp_rows = std::min<double>(t, static_cast<double>(kMlpTileTokens));
    const double mlp = mlp_rows * (D + 3 * static_cast<double>(c.intermediate_size)) * b;
    peak = std::max({peak, base + std::max(fa, gdn), 2 * t * D * b + mlp});
  }
  m.activations = peak * 1.05;  // allocator rounding and small temporaries
  return m;
}

int64_t loss_chunk_rows(int64_t vocab) { return std::max<int64_t>(1, (int64_t{1} << 29) / std::max<int64_t>(vocab, 1)); }

MemoryEstimate estimate_training_memory(const ModelConfig& c, int64_t local_tokens, int ranks_per_sequence,
                                        const ModelConfig* teacher, Device device, bool align,
                                        KeptActivations keep) {
  MemoryEstimate m;
  const double b = device == Device::cuda ? 2.0 : 4.0, a = 4.0;  // storage and accumulator bytes
  const double t = static_cast<double>(local_tokens), D = static_cast<double>(c.hidden_size);
  const double d = static_cast<double>(c.head_dim), H = static_cast<double>(c.num_heads);
  const double I = static_cast<double>(c.intermediate_size), V = static_cast<double>(c.vocab_size);
  const double params = static_cast<double>(parameter_count(c));
  // Weights in the compute dtype; masters, moments and gradients in fp32 (the CPU path keeps the
  // masters beside its fp32 weights too).
  m.weights = params * b + (teacher ? static_cast<double>(parameter_count(*teacher)) * b : 0.0);
  m.init_extra = params * 4.0 * a;
  double saved = 0, layer_peak = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const LayerLayout layout = layer_layout(c, l);
    const double hfa = static_cast<double>(layout.h_fa), gfa = static_cast<double>(layout.g_fa);
    const double hg = static_cast<double>(layout.h_gdn), rows = static_cast<double>(layout.columns.rows);
    saved += t * D * b + t * hfa * d * b + hfa * t * a;
    if (keep.gdn_outputs) saved += t * hg * d * b;
    if (keep.projection && c.is_hydra()) saved += t * rows * b;
    if (l < keep.mlp_layers) saved += t * 2 * I * b;
    // β, g and the q/k inverse norms: 4·hg fp32 per row.
    const double recompute = t * (3 * D * b + 2 * rows * b + 4 * H * d * b + 2 * hfa * d * b + 4 * hg * a);
    const double backward = t * (2 * D * b + 3 * H * d * b + 3 * hg * d * b + 3 * (hfa + 2 * gfa) * d * a + 2 * hg * a) +
                            (ranks_per_sequence > 1 ? 3 * t * gfa * 2 * d * a : 0.0);
    const double mlp_rows = std::min<double>(t, static_cast<double>(kMlpTileTokens));
    const double mlp = mlp_rows * (3 * D + 6 * I) * b;
    layer_peak = std::max(layer_peak, recompute + backward + mlp);
  }
  if (align) saved = (static_cast<double>(c.num_layers) + 1) * t * D * b + saved / static_cast<double>(c.num_layers);
  const double chunk = std::min(t, static_cast<double>(loss_chunk_rows(c.vocab_size)));
  const double loss = chunk * V * (a + b) * (teacher && !align ? 2 : 1) + t * D * a;
  m.activations = (saved + std::max(layer_peak, loss) + t * D * a) * 1.05;
  return m;
}

namespace {
struct Available {
  double bytes = 0;
  std::string where;
};
Available available_memory(Device device, int ranks_on_host) {
  Available out;
#if HYDRA_CUDA
  if (device == Device::cuda) {
    out.bytes = static_cast<double>(cuda_memory_stats().free_device);
    out.where = "the GPU";
  }
#endif
  if (device == Device::host) {
    out.bytes = host_available_bytes() / std::max(1, ranks_on_host);
    out.where = ranks_on_host > 1 ? fmt::format("each of this host's {} ranks", ranks_on_host) : std::string("this host");
  }
  return out;
}
}  // namespace

bool fits_memory_plan(const MemoryEstimate& estimate, Device device, int ranks_on_host) {
  return estimate.total() < 0.95 * available_memory(device, ranks_on_host).bytes;
}

void check_memory_plan(const MemoryEstimate& estimate, Device device, const std::string& what, int ranks_on_host) {
  const double g = 1024.0 * 1024.0 * 1024.0;
  const Available available = available_memory(device, ranks_on_host);
  HYDRA_USER_CHECK(estimate.total() < 0.95 * available.bytes, "{} needs about {} per rank, but {} has {:.1f} GiB "
                   "available; use more ranks (on more nodes) or a shorter --seq-len", what, estimate.describe(),
                   available.where, available.bytes / g);
}

}  // namespace hydra
