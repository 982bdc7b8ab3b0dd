#include "model/config.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <set>

#include <nlohmann/json.hpp>

#include "runtime/error.h"

namespace hydra {

bool ModelConfig::has_gdn_heads() const {
  if (!is_hydra()) return false;
  for (int64_t l = 0; l < num_layers; ++l) {
    if (static_cast<int64_t>(fa_heads_of(l).size()) < num_heads) return true;
  }
  return false;
}

std::vector<int> ModelConfig::gdn_heads_of(int64_t layer) const {
  const std::vector<int>& fa = fa_heads.at(layer);
  std::vector<int> gdn;
  for (int h = 0; h < num_heads; ++h) {
    if (!std::binary_search(fa.begin(), fa.end(), h)) gdn.push_back(h);
  }
  return gdn;
}

std::vector<int> ModelConfig::fa_kv_heads_of(int64_t layer) const {
  std::set<int> groups;
  for (int h : fa_heads.at(layer)) groups.insert(static_cast<int>(kv_head_of(h)));
  return {groups.begin(), groups.end()};
}

void ModelConfig::validate() const {
  HYDRA_USER_CHECK(vocab_size > 0 && vocab_size < kMaxVocab, "config: vocab_size must be in 1..2^31-1 (got {})",
                   vocab_size);
  HYDRA_USER_CHECK(hidden_size > 0 && hidden_size <= kMaxWidth, "config: hidden_size must be in 1..{} (got {})",
                   kMaxWidth, hidden_size);
  HYDRA_USER_CHECK(num_layers > 0 && num_layers <= kMaxLayers, "config: num_hidden_layers must be in 1..{} (got {})",
                   kMaxLayers, num_layers);
  HYDRA_USER_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads <= kMaxHeads,
                   "config: head counts must be in 1..{} (heads {}, kv heads {})", kMaxHeads, num_heads, num_kv_heads);
  HYDRA_USER_CHECK(num_heads % num_kv_heads == 0,
                   "config: num_attention_heads {} is not a multiple of num_key_value_heads {}", num_heads,
                   num_kv_heads);
  HYDRA_USER_CHECK(head_dim > 0 && head_dim % 2 == 0 && head_dim <= kMaxHeadDim,
                   "config: head_dim must be positive, even and at most {} (got {})", kMaxHeadDim, head_dim);
  HYDRA_USER_CHECK(intermediate_size > 0 && intermediate_size <= kMaxWidth,
                   "config: intermediate_size must be in 1..{} (got {})", kMaxWidth, intermediate_size);
  HYDRA_USER_CHECK(std::isfinite(rms_norm_eps) && rms_norm_eps > 0, "config: rms_norm_eps must be positive and finite");
  HYDRA_USER_CHECK(std::isfinite(rope_theta) && rope_theta > 0, "config: rope_theta must be positive and finite");
  // An upper bound of the parameter count in floating point (no overflow): embeddings, and per layer
  // every projection of the widest layer kind plus the norms.
  const double D = static_cast<double>(hidden_size), Hd = static_cast<double>(num_heads * head_dim);
  const double G = static_cast<double>(num_kv_heads * head_dim), I = static_cast<double>(intermediate_size);
  const double H = static_cast<double>(num_heads);
  const double per_layer = D * (6.0 * Hd + 2.0 * G + 3.0 * I + 2.0 * H + 2.0) + Hd * (3.0 * 8.0 + 1.0) + 4.0 * H;
  const double params = 2.0 * static_cast<double>(vocab_size) * D + static_cast<double>(num_layers) * per_layer;
  HYDRA_USER_CHECK(params <= kMaxParameters, "config: about {:.3g} parameters ({} layers, hidden size {}, vocabulary "
                   "{}), more than the 2^40 this runtime takes", params, num_layers, hidden_size, vocab_size);
  if (arch == Arch::qwen3) {
    HYDRA_USER_CHECK(fa_heads.empty(), "config: a qwen3 config has no fa_heads");
    HYDRA_USER_CHECK(fusion == ops::Fusion::scale_norm, "config: a qwen3 teacher has no fusion (got fusion {})",
                     ops::fusion_name(fusion));
    return;
  }
  HYDRA_USER_CHECK(static_cast<int64_t>(fa_heads.size()) == num_layers,
                   "config: fa_heads lists {} layers, the model has {}", fa_heads.size(), num_layers);
  for (size_t l = 0; l < fa_heads.size(); ++l) {
    const std::vector<int>& heads = fa_heads[l];
    for (size_t i = 0; i < heads.size(); ++i) {
      HYDRA_USER_CHECK(heads[i] >= 0 && heads[i] < num_heads,
                       "config: layer {} names FA head {}, but heads are 0..{}", l, heads[i], num_heads - 1);
      HYDRA_USER_CHECK(i == 0 || heads[i] > heads[i - 1],
                       "config: layer {} FA heads must be sorted and distinct", l);
    }
  }
  HYDRA_USER_CHECK(std::isfinite(fa_log_base) && fa_log_base > 1, "config: fa_log_base must be > 1 and finite (got {})",
                   fa_log_base);
  HYDRA_USER_CHECK(conv_kernel >= 1 && conv_kernel <= 8, "config: conv_kernel must be in 1..8 (got {})",
                   conv_kernel);
  HYDRA_USER_CHECK(std::isfinite(l2_norm_eps) && l2_norm_eps > 0, "config: l2_norm_eps must be positive and finite");
}

std::string arch_name(Arch arch) { return arch == Arch::qwen3 ? "qwen3" : "hydrahead"; }

std::string ModelConfig::summary() const {
  std::string s = fmt::format("{}: {} layers, D={}, H={}, G={}, d={}, MLP {}, vocab {}, {}", arch_name(arch),
                              num_layers, hidden_size, num_heads, num_kv_heads, head_dim, intermediate_size,
                              vocab_size, tie_word_embeddings ? "tied embeddings" : "untied embeddings");
  if (is_hydra()) {
    int64_t fa = 0;
    for (const auto& l : fa_heads) fa += static_cast<int64_t>(l.size());
    s += fmt::format(", {} FA / {} GDN heads in total, fusion {}", fa, num_layers * num_heads - fa,
                     ops::fusion_name(fusion));
  }
  return s;
}

nlohmann::json config_to_json(const ModelConfig& c) {
  nlohmann::json j = {{"arch", arch_name(c.arch)}};
  for (const auto& k : kConfigIntegerKeys) j[k.name] = c.*k.field;
  for (const auto& k : kConfigRealKeys) j[k.name] = c.*k.field;
  for (const auto& k : kConfigBoolKeys) j[k.name] = c.*k.field;
  if (c.is_hydra()) {
    j[kFaHeadsKey] = c.fa_heads;
    for (const auto& k : kHydraIntegerKeys) j[k.name] = c.*k.field;
    for (const auto& k : kHydraRealKeys) j[k.name] = c.*k.field;
    j[kFusionKey] = ops::fusion_name(c.fusion);
  }
  return j;
}

ModelConfig config_from_json(const nlohmann::json& j, const std::string& source) {
  ModelConfig c;
  try {
    HYDRA_USER_CHECK(j.is_object(), "{}: config is not a JSON object", source);
    const std::string arch = j.at("arch").get<std::string>();
    if (arch == "qwen3") {
      c.arch = Arch::qwen3;
    } else if (arch == "hydrahead") {
      c.arch = Arch::hydrahead;
    } else {
      HYDRA_USER_FAIL("{}: unknown arch '{}' (expected qwen3 or hydrahead)", source, arch);
    }
    const auto integer = [&](const char* key) { return json_integer(j.at(key), fmt::format("{}: {}", source, key)); };
    for (const auto& k : kConfigIntegerKeys) c.*k.field = integer(k.name);
    for (const auto& k : kConfigRealKeys) c.*k.field = j.at(k.name).get<double>();
    for (const auto& k : kConfigBoolKeys) c.*k.field = j.at(k.name).get<bool>();
    if (c.arch == Arch::hydrahead) {
      // Read before validate(): bound the lists by the layer and head counts before building them.
      const nlohmann::json& layers = j.at(kFaHeadsKey);
      HYDRA_USER_CHECK(layers.is_array(), "{}: fa_heads is not a list of lists", source);
      HYDRA_USER_CHECK(c.num_layers > 0 && c.num_layers <= kMaxLayers &&
                           static_cast<int64_t>(layers.size()) == c.num_layers,
                       "{}: fa_heads lists {} layers, the model has {}", source, layers.size(), c.num_layers);
      for (size_t l = 0; l < layers.size(); ++l) {
        HYDRA_USER_CHECK(layers[l].is_array() && static_cast<int64_t>(layers[l].size()) <= c.num_heads,
                         "{}: fa_heads[{}] is not a list of at most {} heads", source, l, c.num_heads);
        std::vector<int> heads;
        for (const nlohmann::json& h : layers[l]) {
          const int64_t v = json_integer(h, fmt::format("{}: fa_heads[{}]", source, l));
          HYDRA_USER_CHECK(v >= 0 && v < c.num_heads, "{}: config: layer {} names FA head {}, but heads are 0..{}",
                           source, l, v, c.num_heads - 1);
          heads.push_back(static_cast<int>(v));
        }
        c.fa_heads.push_back(std::move(heads));
      }
      for (const auto& k : kHydraRealKeys) c.*k.field = j.at(k.name).get<double>();
      for (const auto& k : kHydraIntegerKeys) c.*k.field = integer(k.name);
      if (j.contains(kFusionKey)) {
        HYDRA_USER_CHECK(j.at(kFusionKey).is_string(), "{}: {} is not a string", source, kFusionKey);
        c.fusion = ops::fusion_from_name(j.at(kFusionKey).get<std::string>(), fmt::format("{}: config", source));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    HYDRA_USER_FAIL("{}: malformed model config ({})", source, e.what());
  }
  try {
    c.validate();
  } catch (const UserError& e) {
    HYDRA_USER_FAIL("{}: {}", source, e.what());
  }
  return c;
}

namespace {
ModelConfig qwen3_1_7b() {
  ModelConfig c;
  c.arch = Arch::qwen3;
  c.vocab_size = 151936;
  c.hidden_size = 2048;
  c.num_layers = 28;
  c.num_heads = 16;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate_size = 6144;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  c.tie_word_embeddings = true;
  return c;
}

// Qwen3-4B and Qwen3-8B (their config.json shapes): 36 layers of 32 query heads in 8 KV groups,
// head dim 128; 4B ties its embeddings, 8B does not.
ModelConfig qwen3_4b() {
  ModelConfig c = qwen3_1_7b();
  c.hidden_size = 2560;
  c.num_layers = 36;
  c.num_heads = 32;
  c.intermediate_size = 9728;
  return c;
}

ModelConfig qwen3_8b() {
  ModelConfig c = qwen3_4b();
  c.hidden_size = 4096;
  c.intermediate_size = 12288;
  c.tie_word_embeddings = false;
  return c;
}

ModelConfig qwen3_tiny() {
  ModelConfig c;
  c.arch = Arch::qwen3;
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;  // the smallest head dim the GPU kernels take, so tiny models run on both paths
  c.intermediate_size = 256;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  return c;
}

// Teachers trained here on `hydra synth` streams (cluster/synth/ pipeline): Qwen3 shape, 8 query heads per layer
// (so 7:1 is one FA head per layer) in 4 KV groups (Qwen3-1.7B's ratio of 2), 4 layers (so
// layerwise:4 is the 3:1 hybrid), untied embeddings. qwen3-synth (4.2M parameters, head dim 64,
// which the GPU kernels take) is sized for a few minutes of one H200; qwen3-synth-cpu (0.5M,
// head dim 16: CPU path only) for the 2-core CPU.
ModelConfig qwen3_synth() {
  ModelConfig c;
  c.arch = Arch::qwen3;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.num_layers = 4;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.intermediate_size = 768;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  return c;
}

ModelConfig qwen3_synth_cpu() {
  ModelConfig c = qwen3_synth();
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.head_dim = 16;
  c.intermediate_size = 384;
  return c;
}

// The language teacher (issue 58): a Qwen3 shape trained on the real-text corpus of cluster/corpus/
// (byte-level BPE of 16384 ids) mixed with retrieval tasks whose haystacks are that text. 8 layers of
// 16 query heads in 4 KV groups (GQA 4:1), RoPE, head dim 64, untied embeddings: 78.66M parameters
// (53.5M in the layers). 8 layers make one all-FA layer (layerwise:8@k, 16 heads) the same FA
// budget as 7:1 head-wise (2 heads a layer), so layer-wise can be set against head-wise at every
// layer position. qwen3-text-cpu keeps the vocabulary and GQA at a size the 2-core CPU trains and
// scores head by head in minutes (4 layers of 8 heads, head dim 16: CPU path only): the recipe's toy.
ModelConfig qwen3_text() {
  ModelConfig c;
  c.arch = Arch::qwen3;
  c.vocab_size = 16384;
  c.hidden_size = 768;
  c.num_layers = 8;
  c.num_heads = 16;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.intermediate_size = 2048;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 10000.0;
  c.tie_word_embeddings = false;
  return c;
}

ModelConfig qwen3_text_cpu() {
  ModelConfig c = qwen3_text();
  c.hidden_size = 64;
  c.num_layers = 4;
  c.num_heads = 8;
  c.head_dim = 16;
  c.intermediate_size = 192;
  return c;
}

ModelConfig as_hydra(ModelConfig c, std::vector<std::vector<int>> fa_heads) {
  c.arch = Arch::hydrahead;
  c.fa_heads = std::move(fa_heads);
  return c;
}
}  // namespace

std::vector<std::string> preset_names() {
  return {"qwen3-tiny",   "hydrahead-tiny", "qwen3-1.7b",   "hydrahead-1.7b", "qwen3-4b",
          "hydrahead-4b", "qwen3-8b",       "hydrahead-8b", "qwen3-synth",    "qwen3-synth-cpu",
          "qwen3-text",   "qwen3-text-cpu"};
}

ModelConfig preset_config(const std::string& name) {
  if (name == "qwen3-tiny") return qwen3_tiny();
  if (name == "qwen3-1.7b") return qwen3_1_7b();
  if (name == "qwen3-4b") return qwen3_4b();
  if (name == "qwen3-8b") return qwen3_8b();
  if (name == "qwen3-synth") return qwen3_synth();
  if (name == "qwen3-synth-cpu") return qwen3_synth_cpu();
  if (name == "qwen3-text") return qwen3_text();
  if (name == "qwen3-text-cpu") return qwen3_text_cpu();
  if (name == "hydrahead-tiny") {
    // Every layer mixes FA and GDN heads; FA heads sit in different KV groups across layers and
    // layer 1 has two FA heads sharing one group, so GQA sharing is exercised.
    return as_hydra(qwen3_tiny(), {{1}, {2, 3}});
  }
  if (name == "hydrahead-1.7b" || name == "hydrahead-4b" || name == "hydrahead-8b") {
    // DESIGN.md §5: one FA head in 8 per layer (7:1), the lowest indices (uniform without scores):
    // 2 of 16 at 1.7B, 4 of 32 at 4B and 8B.
    const ModelConfig c = name == "hydrahead-1.7b" ? qwen3_1_7b() : name == "hydrahead-4b" ? qwen3_4b() : qwen3_8b();
    std::vector<int> fa(static_cast<size_t>(c.num_heads / 8));
    for (size_t i = 0; i < fa.size(); ++i) fa[i] = static_cast<int>(i);
    return as_hydra(c, std::vector<std::vector<int>>(static_cast<size_t>(c.num_layers), fa));
  }
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  HYDRA_USER_FAIL("unknown preset '{}' (known presets: {})", name, known);
}

}  // namespace hydra
