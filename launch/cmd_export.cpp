// hydra export: a hydra checkpoint to a Hugging Face style folder (config.json + safetensors) that
// transformers loads (Qwen3 teachers natively, hybrids with trust_remote_code through the folder's
// copy of cluster/torch/hydrahead.py), and `hydra import --hf` reads back bit for bit
// (model/hf_export.h, DESIGN.md §4).
#include <nlohmann/json.hpp>

#include <iostream>

#include "launch/cli.h"
#include "model/hf_export.h"
#include "runtime/atomic_file.h"
#include "runtime/log.h"
#include "runtime/sizes.h"

namespace hydra {
namespace {

struct ExportOptions {
  std::string model;
  std::string out;
  std::string dtype = "auto";
  std::string max_shard_size = "5G";
  std::string max_positions = "128K";
  std::string tokenizer;
  bool allow_nonfinite = false;

  void bind(po::options_description& o) {
    o.add_options()
        ("model", po::value(&model)->required(), "hydra checkpoint to export (.h5): a Qwen3 teacher or a HydraHead hybrid")
        ("out", po::value(&out)->required(), "folder to create (absent or empty): config.json, safetensors and, for a hybrid, hydrahead.py (its modeling code, which transformers runs with trust_remote_code=True); written under a temporary name and renamed when complete")
        ("dtype", po::value(&dtype)->default_value("auto"), "tensor type: bf16 (f32 rounded to nearest even), f32, or auto (bf16 if the checkpoint stores bf16, else f32)")
        ("max-shard-size", po::value(&max_shard_size)->default_value("5G"), "largest safetensors file (K/M/G = 2^10/2^20/2^30 bytes); above it: model-0000i-of-0000n shards and model.safetensors.index.json")
        ("max-position-embeddings", po::value(&max_positions)->default_value("128K"), "context length written to config.json for HF tools (lm-eval-harness truncates to it); hydra itself has no limit")
        ("tokenizer", po::value(&tokenizer), "folder whose tokenizer files (tokenizer.json, tokenizer_config.json, ...) are copied into the export, with a generation_config.json holding the tokenizer's bos/eos/pad ids (the folder's own generation_config.json kept and completed)")
        ("allow-nonfinite", po::bool_switch(&allow_nonfinite), "export weights that hold NaN or Inf instead of refusing them");
  }
  void validate() const {
    require_readable_file(model, "model");
    HYDRA_USER_CHECK(dtype == "auto" || dtype == "f32" || dtype == "bf16", "--dtype must be auto, f32 or bf16 (got '{}')",
                     dtype);
    HYDRA_USER_CHECK(parse_size(max_shard_size, "--max-shard-size") > 0, "--max-shard-size must be positive");
    HYDRA_USER_CHECK(parse_size(max_positions, "--max-position-embeddings") > 0,
                     "--max-position-embeddings must be positive");
    if (!tokenizer.empty()) {
      tokenizer_files_in(tokenizer);
      generation_config_json(tokenizer);  // its special tokens resolve (the ids are checked against the model's vocabulary later)
    }
    check_export_destination(out);
  }
};

}  // namespace

int run_export(App& app, const std::vector<std::string>& args) {
  ExportOptions opt;
  po::options_description desc("hydra export");
  opt.bind(desc);
  if (!parse_command_line(app, "export", "--model FILE.h5 --out DIR [--dtype auto|bf16|f32] [--max-shard-size 5G] [--tokenizer DIR]", desc,
                          args)) {
    return 0;
  }
  opt.validate();
  agree_on_run(app, {});
  if (app.world.rank() != 0) return 0;  // one writer
  HfExportOptions options;
  if (opt.dtype != "auto") options.dtype = opt.dtype == "bf16" ? DType::bf16 : DType::f32;
  options.max_shard_bytes = parse_size(opt.max_shard_size, "--max-shard-size");
  options.max_position_embeddings = parse_size(opt.max_positions, "--max-position-embeddings");
  options.tokenizer_dir = opt.tokenizer;
  options.nonfinite = opt.allow_nonfinite ? NonFinite::allow : NonFinite::refuse;
  const HfExportResult r = export_hf_checkpoint(opt.model, opt.out, options);
  if (!r.generation.contains("eos_token_id")) {
    log::warn("export: generation_config.json names no eos_token_id ({}): transformers' generate will stop only at "
              "max_new_tokens; give --tokenizer DIR (the folder of the model's tokenizer)",
              opt.tokenizer.empty() ? "no --tokenizer" : "the tokenizer names none");
  }
  log::info("exported {} -> {}: {}, {} tensors, {:.1f} MB of {} in {} file(s)", opt.model, opt.out, r.config.summary(),
            r.tensors, static_cast<double>(r.tensor_bytes) / 1e6, dtype_name(r.dtype), r.files.size());
  const nlohmann::json summary = {{"command", "export"}, {"model", opt.model}, {"out", opt.out},
                                  {"model_type", r.config.is_hydra() ? kHydraHeadModelType : "qwen3"},
                                  {"dtype", dtype_name(r.dtype)}, {"tensors", r.tensors},
                                  {"tensor_bytes", r.tensor_bytes}, {"files", r.files},
                                  {"generation_config", r.generation}};
  std::cout << summary.dump() << std::endl;
  return 0;
}

}  // namespace hydra
