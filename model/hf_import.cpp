#include "model/hf_import.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "model/hf_export.h"
#include "model/params.h"
#include "runtime/atomic_file.h"
#include "runtime/safetensors.h"

namespace hydra {
namespace fs = std::filesystem;

namespace {

nlohmann::json read_json(const std::string& path, const char* what) {
  require_readable_file(path, what);
  std::ifstream in(path);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    HYDRA_USER_FAIL("{}: not valid JSON ({})", path, e.what());
  }
}

template <class T>
T value_or(const nlohmann::json& j, const char* key, T fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  return it->get<T>();
}

double rope_theta_of(const nlohmann::json& hf, const std::string& source) {
  // transformers ≥ 5 moved rope_theta into rope_parameters; older configs have it at the top.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    const auto it = hf.find(key);
    if (it == hf.end() || it->is_null()) continue;
    HYDRA_USER_CHECK(it->is_object(), "{}: '{}' is not an object", source, key);
    const std::string type = value_or<std::string>(*it, "rope_type", value_or<std::string>(*it, "type", "default"));
    HYDRA_USER_CHECK(type == "default", "{}: RoPE type '{}' is not supported (only the default rotary embedding)",
                     source, type);
    if (it->contains(config_key(&ModelConfig::rope_theta))) return it->at(config_key(&ModelConfig::rope_theta)).get<double>();
  }
  return value_or<double>(hf, config_key(&ModelConfig::rope_theta), 10000.0);
}

}  // namespace

ModelConfig config_from_hf_json(const nlohmann::json& hf, const std::string& source) {
  ModelConfig c;
  HYDRA_USER_CHECK(hf.is_object(), "{}: not a JSON object", source);
  try {
    const std::string type = value_or<std::string>(hf, "model_type", "");
    HYDRA_USER_CHECK(type == "qwen3" || type == kHydraHeadModelType,
                     "{}: model_type '{}' is not supported (hydra imports qwen3 and hydrahead folders)", source, type);
    HYDRA_USER_CHECK(!value_or<bool>(hf, "attention_bias", false), "{}: attention_bias = true is not supported",
                     source);
    HYDRA_USER_CHECK(!value_or<bool>(hf, "use_sliding_window", false), "{}: sliding-window attention is not supported",
                     source);
    const std::string act = value_or<std::string>(hf, "hidden_act", "silu");
    HYDRA_USER_CHECK(act == "silu", "{}: hidden_act '{}' is not supported (silu only)", source, act);
    if (type == kHydraHeadModelType) {
      // An export of a hybrid (model/hf_export.h): its keys are hydra's own config keys, every one
      // present; config_from_json reads and bounds them (the FA head lists included).
      const int64_t version = json_integer(hf.at("hydrahead_version"), fmt::format("{}: hydrahead_version", source));
      HYDRA_USER_CHECK(version >= 1 && version <= kHydraHeadExportVersion,
                       "{}: hydrahead_version {} is not supported (this hydra reads version {})", source, version,
                       kHydraHeadExportVersion);
      nlohmann::json own = hf;
      own["arch"] = arch_name(Arch::hydrahead);
      own[config_key(&ModelConfig::rope_theta)] = rope_theta_of(hf, source);
      own.erase(kFusionKey);  // the fusion is read under its exported name only (absent: scale_norm)
      if (hf.contains(kHfFusionKey)) own[kFusionKey] = hf.at(kHfFusionKey);
      return config_from_json(own, source);
    }
    c.arch = Arch::qwen3;
    const auto integer = [&](const char* key, int64_t fallback, bool required) {
      const auto it = hf.find(key);
      if (it == hf.end() || it->is_null()) {
        HYDRA_USER_CHECK(!required, "{}: missing or malformed field ('{}' is missing)", source, key);
        return fallback;
      }
      return json_integer(*it, fmt::format("{}: {}", source, key));
    };
    // The keys of model/config.h's table; HF's defaults where a key may be absent.
    const auto required = [&](int64_t ModelConfig::*field) { c.*field = integer(config_key(field), 0, true); };
    required(&ModelConfig::vocab_size);
    required(&ModelConfig::hidden_size);
    required(&ModelConfig::num_layers);
    required(&ModelConfig::num_heads);
    c.num_kv_heads = integer(config_key(&ModelConfig::num_kv_heads), c.num_heads, false);
    c.head_dim = integer(config_key(&ModelConfig::head_dim), c.num_heads > 0 ? c.hidden_size / c.num_heads : 0, false);
    required(&ModelConfig::intermediate_size);
    c.rms_norm_eps = value_or<double>(hf, config_key(&ModelConfig::rms_norm_eps), 1e-6);
    c.rope_theta = rope_theta_of(hf, source);
    c.tie_word_embeddings = value_or<bool>(hf, config_key(&ModelConfig::tie_word_embeddings), false);
  } catch (const nlohmann::json::exception& e) {
    HYDRA_USER_FAIL("{}: missing or malformed field ({})", source, e.what());
  }
  try {
    c.validate();
  } catch (const UserError& e) {
    HYDRA_USER_FAIL("{}: {}", source, e.what());
  }
  return c;
}

LoadedCheckpoint import_hf_checkpoint(const std::string& directory) {
  std::error_code ec;
  HYDRA_USER_CHECK(fs::is_directory(directory, ec), "{}: not a directory (expected an HF checkpoint folder)",
                   directory);
  const fs::path dir(directory);
  LoadedCheckpoint out;
  out.config = config_from_hf_json(read_json((dir / "config.json").string(), "config.json"),
                                   (dir / "config.json").string());

  // Which file holds which tensor.
  std::map<std::string, std::string> file_of;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    const nlohmann::json idx = read_json(index.string(), "safetensors index");
    HYDRA_USER_CHECK(idx.contains("weight_map") && idx["weight_map"].is_object(), "{}: no weight_map",
                     index.string());
    for (const auto& [name, file] : idx["weight_map"].items()) {
      HYDRA_USER_CHECK(file.is_string(), "{}: weight_map['{}'] is {}, not a file name", index.string(), name,
                       file.dump().substr(0, 80));
      const std::string shard = file.get<std::string>();
      HYDRA_USER_CHECK(!shard.empty() && shard.find('/') == std::string::npos,
                       "{}: weight_map['{}'] = '{}' is not a file name in the checkpoint folder", index.string(), name,
                       shard);
      file_of[name] = (dir / shard).string();
    }
  } else {
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
    }
    HYDRA_USER_CHECK(!files.empty(), "{}: no *.safetensors file and no model.safetensors.index.json", directory);
    for (const std::string& f : files) {
      const SafetensorsFile file(f);
      for (const auto& [name, entry] : file.entries()) {
        // Without an index nothing says which copy is meant: directory order would pick one.
        const auto [it, fresh] = file_of.emplace(name, f);
        HYDRA_USER_CHECK(fresh, "{}: tensor '{}' is in both {} and {}, and no model.safetensors.index.json says which "
                         "to use (remove the stale file or add an index)", directory, name,
                         fs::path(it->second).filename().string(), fs::path(f).filename().string());
      }
    }
  }
  std::map<std::string, std::unique_ptr<SafetensorsFile>> open;
  for (const ParamSpec& spec : parameter_specs(out.config)) {
    const auto it = file_of.find(spec.name);
    HYDRA_USER_CHECK(it != file_of.end(), "{}: tensor '{}' is not in the checkpoint{}", directory, spec.name,
                     fusion_note(out.config, spec.name));
    auto& file = open[it->second];
    if (!file) file = std::make_unique<SafetensorsFile>(it->second);
    HYDRA_USER_CHECK(file->contains(spec.name), "{}: tensor '{}' is listed in the index but missing", it->second,
                     spec.name);
    const SafetensorsEntry& entry = file->entries().at(spec.name);
    HYDRA_USER_CHECK(entry.shape == spec.shape, "{}: tensor '{}' has shape {}, the config needs {}", it->second,
                     spec.name, format_shape(entry.shape), format_shape(spec.shape));
  }
  // Every tensor the folder holds is one the config uses: a tensor left over means the config and
  // the weights disagree (layers dropped, tie_word_embeddings flipped), which must not pass silently.
  // Rotary inv_freq buffers (older transformers saved them) are recomputed from the config.
  std::map<std::string, bool> used;
  for (const ParamSpec& spec : parameter_specs(out.config)) used[spec.name] = true;
  std::vector<std::string> unused;
  for (const auto& [name, file] : file_of) {
    const bool buffer = name.size() >= 21 && name.ends_with("rotary_emb.inv_freq");
    if (!used.count(name) && !buffer) unused.push_back(name);
  }
  const bool tied_copy = out.config.tie_word_embeddings && unused.size() == 1 && unused[0] == "lm_head.weight";
  if (!unused.empty() && !tied_copy) {
    HYDRA_USER_FAIL("{}: {} tensor(s) the config does not use, first '{}' (config.json: {} layers, "
                    "tie_word_embeddings = {}){}; the config and the weights disagree", directory, unused.size(),
                    unused.front(), out.config.num_layers, out.config.tie_word_embeddings,
                    fusion_note(out.config, unused.front()));
  }
  for (const ParamSpec& spec : parameter_specs(out.config)) {
    out.params.emplace(spec.name, open.at(file_of.at(spec.name))->read(spec.name, DType::f32));
  }
  if (tied_copy) {
    // A tied model saved with its lm_head anyway: accepted only if it is the embedding itself.
    const auto& file = file_of.at("lm_head.weight");
    const SafetensorsFile lm(file);
    const Tensor head = lm.read("lm_head.weight", DType::f32);
    const Tensor& embed = out.params.at("model.embed_tokens.weight");
    HYDRA_USER_CHECK(head.nbytes() == embed.nbytes() && std::memcmp(head.data(), embed.data(), head.nbytes()) == 0,
                     "{}: config.json says tie_word_embeddings = true, but lm_head.weight differs from "
                     "model.embed_tokens.weight (the config and the weights disagree)", directory);
  }
  validate_parameters(out.config, out.params, directory);
  return out;
}

}  // namespace hydra
