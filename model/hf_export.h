// Export of a hydra checkpoint to a Hugging Face style folder (DESIGN.md §4 "Export"):
// config.json and model.safetensors, or shards model-0000i-of-0000n.safetensors with
// model.safetensors.index.json when the tensors exceed the shard size.
//
// A Qwen3 teacher gets exactly what transformers loads as Qwen3ForCausalLM: the checkpoint's tensor
// names are already HF's (model/params.h), lm_head.weight is absent when the embeddings are tied,
// and config.json carries the Qwen3 keys (model_type "qwen3"). A HydraHead hybrid keeps its
// checkpoint names and shapes as they are, and config.json adds model_type "hydrahead",
// architectures ["HydraHeadForCausalLM"], the per-layer FA head sets and fa_log_base, conv_kernel,
// l2_norm_eps. cluster/torch/hydrahead.py loads both; model/hf_import.h reads both back.
//
// Tensors stream one at a time from the checkpoint to the shards (a 1.7B model never sits in
// memory whole). The folder is written under a temporary name beside the destination and renamed
// when complete (runtime/atomic_file.h conventions), so it appears whole or not at all.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/model.h"

namespace hydra {

inline constexpr const char* kHydraHeadModelType = "hydrahead";
inline constexpr const char* kHydraHeadArchitecture = "HydraHeadForCausalLM";
// The layout of an exported hybrid; readers refuse newer ones.
inline constexpr int64_t kHydraHeadExportVersion = 1;

struct HfExportOptions {
  // Element type of every tensor; unset: bf16 if the checkpoint stores every tensor as bf16, else f32.
  std::optional<DType> dtype;
  int64_t max_shard_bytes = int64_t{5} << 30;  // a shard closes before it would exceed this (5 GiB)
  int64_t max_position_embeddings = 131072;     // for HF tools only: hydra has no position limit
  std::string tokenizer_dir;                    // optional: tokenizer files copied from here
  NonFinite nonfinite = NonFinite::refuse;
};

struct HfExportResult {
  ModelConfig config;
  DType dtype = DType::f32;
  std::vector<std::string> files;  // written, in the folder
  int64_t tensors = 0;
  uint64_t tensor_bytes = 0;       // sum over the shards' data sections
};

// config.json of an export: the Qwen3 keys (both kinds) and, for a hybrid, its own keys.
nlohmann::json hf_config_json(const ModelConfig& config, DType dtype, int64_t max_position_embeddings);

// The tokenizer files export copies when present, and a UserError if `directory` holds none.
std::vector<std::string> tokenizer_files_in(const std::string& directory);

// UserError unless `out_dir` can become the export: absent or an empty directory, in a writable
// parent directory. Cheap; commands call it before reading the checkpoint.
void check_export_destination(const std::string& out_dir);

// Reads `checkpoint`, checks every tensor (names, shapes, dtypes, finite values unless allowed) and
// writes the folder `out_dir`. UserErrors name the file and tensor.
HfExportResult export_hf_checkpoint(const std::string& checkpoint, const std::string& out_dir,
                                    const HfExportOptions& options);

}  // namespace hydra
