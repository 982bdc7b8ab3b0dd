// Model configuration: the Qwen3 teacher and HydraHead students share one struct.
//
// A HydraHead config names, for every layer l, the set F_l of query heads that keep full softmax
// attention (DESIGN.md §1.2); the other heads of the layer are Gated DeltaNet heads. F_l may be empty or
// all heads, so layer-wise hybrids are the same config. A Qwen3 teacher has arch == qwen3 and no
// head sets. The config travels inside every checkpoint as JSON (root attribute "config").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kernels/fusion/fusion.h"
#include "kernels/rope/rope.h"
#include "runtime/json_integer.h"

namespace hydra {

enum class Arch { qwen3, hydrahead };

// a of the FA heads' τ(i) = ln(i + a) / ln(a) unless a config sets its own (DESIGN.md §1.2).
inline constexpr double kDefaultFaLogBase = 362.0;

struct ModelConfig {
  Arch arch = Arch::qwen3;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // D
  int64_t num_layers = 0;
  int64_t num_heads = 0;          // H, query heads
  int64_t num_kv_heads = 0;       // G
  int64_t head_dim = 0;           // d
  int64_t intermediate_size = 0;  // MLP width
  double rms_norm_eps = 1e-6;
  double rope_theta = ops::kDefaultRopeTheta;
  bool tie_word_embeddings = false;

  // HydraHead only (DESIGN.md §1.2).
  std::vector<std::vector<int>> fa_heads;  // per layer, sorted query-head indices of F_l
  double fa_log_base = kDefaultFaLogBase;  // a in tau(i) = ln(i + a) / ln(a)
  int64_t conv_kernel = 4;                 // K of the GDN short convolution
  double l2_norm_eps = 1e-6;               // GDN q/k L2 norm epsilon
  ops::Fusion fusion = ops::Fusion::scale_norm;  // how head outputs are fused before W_o (kernels/fusion)

  int64_t group_size() const { return num_heads / num_kv_heads; }  // H / G
  int64_t kv_head_of(int64_t head) const { return head / group_size(); }
  bool is_hydra() const { return arch == Arch::hydrahead; }
  bool has_gdn_heads() const;  // some layer keeps fewer FA heads than it has (a HydraHead model's GDN branch runs)
  // HydraHead layer helpers (all sorted ascending).
  const std::vector<int>& fa_heads_of(int64_t layer) const { return fa_heads.at(layer); }
  std::vector<int> gdn_heads_of(int64_t layer) const;
  // KV heads used by the layer's FA heads: the rows of its k_proj / v_proj.
  std::vector<int> fa_kv_heads_of(int64_t layer) const;

  // Throws UserError naming the first inconsistency ("num_heads 6 is not a multiple of ...").
  void validate() const;
  std::string summary() const;  // one line
};

// Bounds a config must keep (validate()): far beyond any real model, small enough that every size
// computed from them fits in 64 bits and a damaged or hostile config fails in microseconds instead
// of allocating (1e7 layers used to build 10 GB of parameter specs first).
inline constexpr int64_t kMaxLayers = 16384;
inline constexpr int64_t kMaxHeads = 16384;
inline constexpr int64_t kMaxHeadDim = 4096;
inline constexpr int64_t kMaxWidth = int64_t{1} << 22;        // hidden_size, intermediate_size
inline constexpr int64_t kMaxVocab = int64_t{1} << 31;        // ids are int32: vocab_size <= 2^31 − 1
inline constexpr double kMaxParameters = 1099511627776.0;     // 2^40

// The config keys that hydra's checkpoint JSON (config_to_json, config_from_json) and an HF
// config.json (model/hf_export.cpp writes, model/hf_import.cpp reads) share: each key's one
// spelling and the field it holds. The HydraHead keys are written for a hybrid only.
template <class T>
struct ConfigKey {
  const char* name;
  T ModelConfig::*field;
};
inline constexpr ConfigKey<int64_t> kConfigIntegerKeys[] = {
    {"vocab_size", &ModelConfig::vocab_size},          {"hidden_size", &ModelConfig::hidden_size},
    {"num_hidden_layers", &ModelConfig::num_layers},   {"num_attention_heads", &ModelConfig::num_heads},
    {"num_key_value_heads", &ModelConfig::num_kv_heads}, {"head_dim", &ModelConfig::head_dim},
    {"intermediate_size", &ModelConfig::intermediate_size}};
inline constexpr ConfigKey<double> kConfigRealKeys[] = {{"rms_norm_eps", &ModelConfig::rms_norm_eps},
                                                        {"rope_theta", &ModelConfig::rope_theta}};
inline constexpr ConfigKey<bool> kConfigBoolKeys[] = {{"tie_word_embeddings", &ModelConfig::tie_word_embeddings}};
inline constexpr ConfigKey<int64_t> kHydraIntegerKeys[] = {{"conv_kernel", &ModelConfig::conv_kernel}};
inline constexpr ConfigKey<double> kHydraRealKeys[] = {{"fa_log_base", &ModelConfig::fa_log_base},
                                                       {"l2_norm_eps", &ModelConfig::l2_norm_eps}};
inline constexpr const char* kFaHeadsKey = "fa_heads";
// The fusion variant: "fusion" in a checkpoint's config, "hydrahead_fusion" in an exported config.json;
// absent in either (files written before the variants existed): scale_norm.
inline constexpr const char* kFusionKey = "fusion";
inline constexpr const char* kHfFusionKey = "hydrahead_fusion";
// The key of a field of the tables above (import reads some keys with defaults of its own).
template <class T, size_t N>
constexpr const char* config_key_in(const ConfigKey<T> (&keys)[N], T ModelConfig::*field) {
  for (const ConfigKey<T>& k : keys) {
    if (k.field == field) return k.name;
  }
  return nullptr;
}
constexpr const char* config_key(int64_t ModelConfig::*field) { return config_key_in(kConfigIntegerKeys, field); }
constexpr const char* config_key(double ModelConfig::*field) { return config_key_in(kConfigRealKeys, field); }
constexpr const char* config_key(bool ModelConfig::*field) { return config_key_in(kConfigBoolKeys, field); }

nlohmann::json config_to_json(const ModelConfig& config);
// `source` names where the JSON came from, for error messages.
ModelConfig config_from_json(const nlohmann::json& json, const std::string& source);
std::string arch_name(Arch arch);

// Presets: qwen3-tiny, hydrahead-tiny, qwen3-1.7b, hydrahead-1.7b (DESIGN.md §5), and the teachers
// trained on synthetic data, qwen3-synth (GPU) and qwen3-synth-cpu, and the language teacher trained on
// real text, qwen3-text (GPU) and qwen3-text-cpu.
ModelConfig preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace hydra
