// Import of Hugging Face style folders: config.json + *.safetensors (one file, or shards listed in
// model.safetensors.index.json). model_type "qwen3" is a Qwen3 checkpoint; model_type "hydrahead"
// is a HydraHead hybrid as `hydra export` writes it (model/hf_export.h: hydra's tensor names, the FA
// head sets and GDN settings in config.json). Tensors may be BF16, F16 or F32; they are converted to
// float32 (exactly, from BF16 and F16). Config keys differ across transformers versions (rope_theta at the top level or inside
// rope_parameters / rope_scaling, torch_dtype vs dtype, optional head_dim); all are accepted.
// Features this runtime does not implement (attention biases, sliding windows, scaled RoPE,
// activations other than SiLU) are refused with a message rather than imported wrongly.
#pragma once

#include <string>

#include "model/model.h"

namespace hydra {

// Maps an HF config.json object to a ModelConfig (`source` names the file in messages).
ModelConfig config_from_hf_json(const nlohmann::json& hf, const std::string& source);

// Reads the directory; every tensor's shape is checked against the config.
LoadedCheckpoint import_hf_checkpoint(const std::string& directory);

}  // namespace hydra
