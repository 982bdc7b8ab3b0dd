#include "model/hf_export.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <system_error>

#include <unistd.h>

#include "model/nonfinite.h"
#include "runtime/json_integer.h"
#include "model/params.h"
#include "runtime/atomic_file.h"
#include "runtime/checkpoint.h"
#include "runtime/fault.h"
#include "runtime/safetensors.h"

namespace hydra {
namespace fs = std::filesystem;

namespace {

// "out/" and "out" name the same folder; the temporary and the rename need its last component.
fs::path folder_path(const std::string& out_dir) {
  fs::path p = fs::path(out_dir).lexically_normal();
  if (p.filename().empty() && p.has_parent_path()) p = p.parent_path();
  return p;
}

std::string shard_name(size_t index, size_t count) {
  return count == 1 ? "model.safetensors" : fmt::format("model-{:05d}-of-{:05d}.safetensors", index + 1, count);
}

// Tensors in parameter order, cut into shards: a shard closes before a tensor would take it past
// `max_bytes` (a tensor larger than that gets a shard of its own), as transformers shards.
std::vector<std::vector<SafetensorsTensorSpec>> plan_shards(const std::vector<SafetensorsTensorSpec>& tensors,
                                                             int64_t max_bytes) {
  std::vector<std::vector<SafetensorsTensorSpec>> shards(1);
  uint64_t used = 0;
  for (const SafetensorsTensorSpec& t : tensors) {
    const uint64_t bytes = safetensors_bytes(t.dtype, t.shape);
    if (!shards.back().empty() && used + bytes > static_cast<uint64_t>(max_bytes)) {
      shards.emplace_back();
      used = 0;
    }
    shards.back().push_back(t);
    used += bytes;
  }
  return shards;
}

void write_json(const fs::path& path, const nlohmann::json& json) {
  std::ofstream out(path, std::ios::binary);
  out << json.dump(2) << "\n";
  out.flush();
  HYDRA_USER_CHECK(out.good(), "{}: writing failed (disk full or over a file size limit?)", destination_of(path.string()));
}

}  // namespace

nlohmann::json hf_config_json(const ModelConfig& c, DType dtype, int64_t max_position_embeddings) {
  // The keys and spelling of a Qwen3 config.json as transformers writes it, for transformers 4.51
  // (the first with Qwen3) to 5.x: `dtype` and `rope_parameters` are 5.x's keys (4.56 on reads
  // `dtype` too); `torch_dtype` and a top-level `rope_theta` are what 4.x reads (5.x accepts both
  // and converts them). No rope_scaling key (absent means the default rotary embedding in both, and
  // 5.x warns about the key). The model's own keys from the shared table (model/config.h), then the
  // keys only HF has.
  nlohmann::json j = config_to_json(c);
  j.erase("arch");
  if (j.contains(kFusionKey)) {  // a hybrid's fusion under its exported name
    j[kHfFusionKey] = j[kFusionKey];
    j.erase(kFusionKey);
  }
  const char* dtype_key = dtype == DType::bf16 ? "bfloat16" : "float32";
  j.update({
      {"architectures", {c.is_hydra() ? kHydraHeadArchitecture : "Qwen3ForCausalLM"}},
      {"model_type", c.is_hydra() ? kHydraHeadModelType : "qwen3"},
      {"attention_bias", false},
      {"attention_dropout", 0.0},
      {"dtype", dtype_key},
      {"hidden_act", "silu"},
      {"initializer_range", 0.02},
      {"max_position_embeddings", max_position_embeddings},
      {"max_window_layers", c.num_layers},
      {"rope_parameters", {{"rope_theta", c.rope_theta}, {"rope_type", "default"}}},
      {"sliding_window", nullptr},
      {"torch_dtype", dtype_key},
      {"use_cache", true},
      {"use_sliding_window", false},
  });
  if (c.is_hydra()) {
    j["hydrahead_version"] = kHydraHeadExportVersion;
    // transformers' trust_remote_code: the classes in the folder's hydrahead.py.
    const std::string module = fs::path(kHydraHeadModelingFile).stem().string();
    j["auto_map"] = {{"AutoConfig", module + ".HydraHeadConfig"},
                     {"AutoModelForCausalLM", module + "." + kHydraHeadArchitecture}};
  }
  return j;
}

std::vector<std::string> tokenizer_files_in(const std::string& directory) {
  std::error_code ec;
  HYDRA_USER_CHECK(fs::is_directory(directory, ec), "{}: tokenizer folder does not exist", directory);
  std::vector<std::string> found;
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                           "merges.txt", "added_tokens.json", "tokenizer.model", "chat_template.jinja"}) {
    if (fs::is_regular_file(fs::path(directory) / name, ec)) found.push_back(name);
  }
  const bool has_tokenizer = std::any_of(found.begin(), found.end(), [](const std::string& f) {
    return f == "tokenizer.json" || f == "tokenizer_config.json" || f == "tokenizer.model";
  });
  HYDRA_USER_CHECK(has_tokenizer, "{}: no tokenizer.json, tokenizer_config.json or tokenizer.model in the tokenizer folder",
                   directory);
  // The JSON files are copied as they are: each must be a JSON object (transformers refuses the folder
  // otherwise), checked before anything is written.
  for (const std::string& name : found) {
    if (!name.ends_with(".json")) continue;
    const fs::path path = fs::path(directory) / name;
    std::ifstream in(path);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    HYDRA_USER_CHECK(!j.is_discarded() && j.is_object(), "{}: not a JSON object (the tokenizer files are copied into the "
                     "export as they are)", path.string());
  }
  return found;
}

nlohmann::json generation_config_json(const std::string& directory) {
  const fs::path dir(directory);
  const auto read = [&](const char* name) {
    const fs::path path = dir / name;
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return nlohmann::json();
    std::ifstream in(path);
    try {
      nlohmann::json j = nlohmann::json::parse(in);
      HYDRA_USER_CHECK(j.is_object(), "{}: not a JSON object", path.string());
      return j;
    } catch (const nlohmann::json::exception& e) {
      HYDRA_USER_FAIL("{}: not valid JSON ({})", path.string(), e.what());
    }
  };
  nlohmann::json generation = read("generation_config.json");
  if (generation.is_null()) generation = nlohmann::json::object();
  const nlohmann::json config = read("tokenizer_config.json");
  nlohmann::json tokenizer;  // tokenizer.json, parsed only if a token is not in added_tokens_decoder
  bool tokenizer_read = false;

  // tokenizer_config.json names a special token by its text ("<|endoftext|>", or an AddedToken
  // object with "content"); its id comes from the added tokens, else from the model's vocabulary.
  const auto id_of = [&](const std::string& key, const std::string& text) -> int64_t {
    if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
      for (const auto& [id, entry] : config["added_tokens_decoder"].items()) {
        if (!entry.is_object() || entry.value("content", "") != text) continue;
        const bool digits = std::all_of(id.begin(), id.end(), [](unsigned char ch) { return std::isdigit(ch) != 0; });
        HYDRA_USER_CHECK(!id.empty() && id.size() <= 18 && digits,
                         "{}: tokenizer_config.json added_tokens_decoder key '{}' is not a token id", directory, id);
        return std::stoll(id);
      }
    }
    if (!tokenizer_read) {
      tokenizer = read("tokenizer.json");
      tokenizer_read = true;
    }
    if (tokenizer.is_object()) {
      for (const auto& entry : tokenizer.value("added_tokens", nlohmann::json::array())) {
        if (entry.is_object() && entry.value("content", "") == text && entry.contains("id")) {
          return json_integer(entry["id"], directory + "/tokenizer.json added_tokens id of '" + text + "'");
        }
      }
      const nlohmann::json vocab = tokenizer.contains("model") ? tokenizer["model"].value("vocab", nlohmann::json())
                                                                 : nlohmann::json();
      if (vocab.is_object() && vocab.contains(text)) {
        return json_integer(vocab[text], directory + "/tokenizer.json vocab id of '" + text + "'");
      }
      if (vocab.is_array()) {  // Unigram: [[piece, score], ...], the id is the index
        for (size_t i = 0; i < vocab.size(); ++i) {
          if (vocab[i].is_array() && !vocab[i].empty() && vocab[i][0] == text) return static_cast<int64_t>(i);
        }
      }
    }
    HYDRA_USER_FAIL("{}: tokenizer_config.json names {} '{}', which neither its added_tokens_decoder nor "
                    "tokenizer.json defines", directory, key, text);
  };
  try {
    for (const char* name : {"bos", "eos", "pad"}) {
      const std::string key = fmt::format("{}_token", name), id_key = fmt::format("{}_token_id", name);
      if (generation.contains(id_key) && !generation[id_key].is_null()) continue;  // the folder's own wins
      if (!config.is_object() || !config.contains(key)) continue;
      const nlohmann::json& token = config[key];
      std::string text;
      if (token.is_string()) {
        text = token.get<std::string>();
      } else if (token.is_object() && token.contains("content") && token["content"].is_string()) {
        text = token["content"].get<std::string>();
      } else {
        HYDRA_USER_CHECK(token.is_null(), "{}: tokenizer_config.json {} is neither a string nor a token object",
                         directory, key);
        continue;
      }
      generation[id_key] = id_of(key, text);
    }
    // No eos named: the separator cluster/tokenize_text.py ends every document with, as hydra
    // generate stops by default (model/token_text.h default_stop_ids).
    if (!generation.contains("eos_token_id") || generation["eos_token_id"].is_null()) {
      if (!tokenizer_read) {
        tokenizer = read("tokenizer.json");
        tokenizer_read = true;
      }
      for (const char* text : {"<|endoftext|>", "</s>", "<eos>"}) {
        bool found = false;
        for (const auto& entry : tokenizer.is_object() ? tokenizer.value("added_tokens", nlohmann::json::array())
                                                       : nlohmann::json::array()) {
          if (entry.is_object() && entry.value("content", "") == text && entry.contains("id")) {
            generation["eos_token_id"] = entry["id"].get<int64_t>();
            found = true;
            break;
          }
        }
        if (found) break;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    HYDRA_USER_FAIL("{}: malformed tokenizer file ({})", directory, e.what());
  }
  return generation;
}

void check_generation_ids(const nlohmann::json& generation, int64_t vocab_size, const std::string& source) {
  if (!generation.is_object()) return;
  for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id"}) {
    if (!generation.contains(key) || generation[key].is_null()) continue;
    const nlohmann::json ids = generation[key].is_array() ? generation[key] : nlohmann::json::array({generation[key]});
    for (const nlohmann::json& id : ids) {
      HYDRA_USER_CHECK(id.is_number_integer(), "{}: {} {} is not a token id", source, key, id.dump());
      const int64_t v = id.get<int64_t>();
      HYDRA_USER_CHECK(v >= 0 && v < vocab_size, "{}: {} {} is outside the model's vocabulary [0, {})", source, key, v,
                       vocab_size);
    }
  }
}

void check_export_destination(const std::string& out_dir) {
  HYDRA_USER_CHECK(!out_dir.empty(), "no export folder given");
  const fs::path dir = folder_path(out_dir);
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    HYDRA_USER_CHECK(fs::is_directory(dir, ec), "{}: exists and is not a folder", out_dir);
    HYDRA_USER_CHECK(fs::is_empty(dir, ec), "{}: folder exists and is not empty (export writes a new folder: remove it "
                     "or choose another --out)", out_dir);
  }
  // The temporary folder is created beside the destination: its parent must take new entries.
  const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
  HYDRA_USER_CHECK(fs::is_directory(parent, ec), "{}: directory {} for the export folder does not exist", out_dir,
                   parent.string());
  HYDRA_USER_CHECK(access(parent.c_str(), W_OK) == 0, "{}: directory {} for the export folder is not writable", out_dir,
                   parent.string());
}

HfExportResult export_hf_checkpoint(const std::string& checkpoint, const std::string& out_dir,
                                    const HfExportOptions& options) {
  HYDRA_USER_CHECK(options.max_shard_bytes > 0, "the shard size must be positive (got {})", options.max_shard_bytes);
  check_export_destination(out_dir);
  std::vector<std::string> tokenizer;
  nlohmann::json generation = nlohmann::json::object();  // written always: what is known (the tokenizer's ids)
  if (!options.tokenizer_dir.empty()) {
    tokenizer = tokenizer_files_in(options.tokenizer_dir);
    generation = generation_config_json(options.tokenizer_dir);
  }

  // Every check on the checkpoint before anything is written: names, shapes, stored types.
  const CheckpointReader reader(checkpoint);
  HfExportResult result;
  result.config = read_model_config(checkpoint);
  const std::vector<ParamSpec> specs = parameter_specs(result.config);
  bool all_bf16 = true;
  std::set<std::string> expected;
  for (const ParamSpec& spec : specs) {
    expected.insert(spec.name);
    HYDRA_USER_CHECK(reader.contains(spec.name), "{}: tensor '{}' is missing", checkpoint, spec.name);
    const DatasetInfo info = reader.info(spec.name);
    HYDRA_USER_CHECK(info.dtype == DType::f32 || info.dtype == DType::bf16,
                     "{}: tensor '{}' is {}, expected float32 or bfloat16", checkpoint, spec.name, dtype_name(info.dtype));
    HYDRA_USER_CHECK(info.shape == spec.shape, "{}: tensor '{}' has shape {}, the config needs {}", checkpoint,
                     spec.name, format_shape(info.shape), format_shape(spec.shape));
    all_bf16 = all_bf16 && info.dtype == DType::bf16;
  }
  for (const std::string& name : reader.names()) {
    HYDRA_USER_CHECK(expected.count(name), "{}: unexpected tensor '{}' for this config", checkpoint, name);
  }
  check_generation_ids(generation, result.config.vocab_size, options.tokenizer_dir + " (the tokenizer)");
  result.dtype = options.dtype.value_or(all_bf16 ? DType::bf16 : DType::f32);
  HYDRA_USER_CHECK(result.dtype == DType::f32 || result.dtype == DType::bf16, "export dtype must be f32 or bf16");

  std::vector<SafetensorsTensorSpec> tensors;
  for (const ParamSpec& spec : specs) tensors.push_back({spec.name, result.dtype, spec.shape});
  const auto shards = plan_shards(tensors, options.max_shard_bytes);

  // The folder is built under `.NAME.tmp-PID` beside the destination (removed on SIGTERM/SIGINT
  // while registered, swept by the next export after a kill -9) and renamed when complete.
  const fs::path dest = folder_path(out_dir);
  const fs::path parent = dest.has_parent_path() ? dest.parent_path() : fs::path(".");
  sweep_stale_temporaries(parent.string(), dest.filename().string());
  const fs::path temp = temporary_path_for(dest.string());
  fs::remove_all(temp);
  ScopedTemporary registration(temp.string(), ScopedTemporary::Kind::directory);
  std::error_code ec;
  fs::create_directory(temp, ec);
  HYDRA_USER_CHECK(!ec, "{}: cannot create the export folder ({})", out_dir, ec.message());
  try {
    nlohmann::json weight_map = nlohmann::json::object();
    const std::map<std::string, std::string> metadata = {{"format", "pt"}};
    for (size_t s = 0; s < shards.size(); ++s) {
      const std::string name = shard_name(s, shards.size());
      SafetensorsWriter writer((temp / name).string(), shards[s], metadata);
      for (const SafetensorsTensorSpec& t : shards[s]) {
        // f32 -> bf16 rounds to nearest even (runtime/dtype.h); bf16 -> bf16 and f32 -> f32 copy the
        // stored bits; bf16 -> f32 is exact.
        NamedTensors one;
        one.emplace(t.name, reader.read(t.name, result.dtype));
        if (options.nonfinite == NonFinite::refuse) check_finite_parameters(one, checkpoint);
        writer.write(one.at(t.name));
        weight_map[t.name] = name;
        ++result.tensors;
      }
      writer.close();
      result.tensor_bytes += writer.data_bytes();
      result.files.push_back(name);
      maybe_inject_fault("save");
    }
    if (shards.size() > 1) {
      write_json(temp / "model.safetensors.index.json",
                 {{"metadata", {{"total_size", result.tensor_bytes}}}, {"weight_map", weight_map}});
      result.files.push_back("model.safetensors.index.json");
    }
    write_json(temp / "config.json", hf_config_json(result.config, result.dtype, options.max_position_embeddings));
    result.files.push_back("config.json");
    if (result.config.is_hydra()) {  // the modeling code transformers' trust_remote_code imports
      const std::string_view code = hf_modeling_code();
      std::ofstream out(temp / kHydraHeadModelingFile, std::ios::binary);
      out.write(code.data(), static_cast<std::streamsize>(code.size()));
      out.flush();
      HYDRA_USER_CHECK(out.good(), "{}: writing failed (disk full?)",
                       destination_of((temp / kHydraHeadModelingFile).string()));
      result.files.push_back(kHydraHeadModelingFile);
    }
    write_json(temp / "generation_config.json", generation);
    result.files.push_back("generation_config.json");
    result.generation = generation;
    for (const std::string& f : tokenizer) {
      fs::copy_file(fs::path(options.tokenizer_dir) / f, temp / f, ec);
      HYDRA_USER_CHECK(!ec, "{}: cannot copy into the export ({})", (fs::path(options.tokenizer_dir) / f).string(),
                       ec.message());
      result.files.push_back(f);
    }
    // rename(2) replaces an empty directory; one that filled up meanwhile makes it fail.
    fs::rename(temp, dest, ec);
    HYDRA_USER_CHECK(!ec, "{}: cannot move the finished export into place ({})", out_dir, ec.message());
  } catch (...) {
    fs::remove_all(temp, ec);
    throw;
  }
  registration.release();
  return result;
}

}  // namespace hydra
