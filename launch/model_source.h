// Where a subcommand's model comes from: a checkpoint (--model FILE.h5), or a shape with random weights
// (--weight-seed N, nothing but the shape read from disk: speed runs, demos, and the start of a
// pretraining run) — a preset (--preset NAME) or a JSON config (--config FILE.json: an HF config.json
// of model_type qwen3 or hydrahead, or hydra's own config object), either with --vocab N for a
// tokenizer's vocabulary (cluster/train_tokenizer.py). Shared by
// every subcommand that runs a model, with one set of flags and one validation. The weights' seed is
// --weight-seed in every command; --seed, where a command has none of its own, is refused by name
// (it used to be the weight seed there, while generate, train, eval-niah and select-heads use it for
// their sampling, data or task seed).
#pragma once

#include <cstdint>
#include <string>

#include "launch/cli.h"
#include "model/model.h"
#include "parallel/device_world.h"

namespace hydra {

struct ModelSource {
  std::string model_path;
  std::string preset;
  std::string config_file;        // --config
  int64_t vocab = 0;              // --vocab (0: the preset's or the config's)
  uint64_t seed = 0;              // --weight-seed
  std::string old_seed;           // --seed where the command has no seed of its own: refused
  bool allow_nonfinite = false;  // load a checkpoint whose weights hold NaN/Inf (model/nonfinite.h)

  enum class OwnSeed { no, yes };  // yes: the command binds a --seed of its own (sampling, data order)
  void bind(po::options_description& options, OwnSeed own_seed = OwnSeed::no);
  // --allow-nonfinite alone (commands that bind --model/--preset themselves).
  static void bind_allow_nonfinite(po::options_description& options, bool* flag);
  // Exactly one of --model / --preset / --config; a named preset must exist; the file must be
  // readable; --vocab goes with --preset or --config.
  void validate() const;
  // The config alone (cheap: reads only the checkpoint's attributes), for input checks.
  ModelConfig config() const;
  // Config and host f32 parameters.
  LoadedCheckpoint parameters() const;
  // The model placed on `device` in `dtype` (host: f32; cuda: bf16), running with `kernels`
  // (App::kernels). A preset draws its weights directly on the device; a checkpoint is read on the
  // host and placed.
  Model build(Device device, DType dtype, const ops::KernelOptions& kernels) const;
  std::string describe() const;
  bool random_weights() const { return model_path.empty(); }
  // The weights for the ranks' agreement: a checkpoint's every dataset (add_file_datasets); a
  // preset's weights are fixed by its name and --weight-seed, which the options already hold.
  void add_contents(RunFingerprint& fingerprint) const;
};

// The config of a shape: a preset or a JSON config file (`config_file`: an HF config.json, model_type
// qwen3 or hydrahead, or hydra's own config JSON with "arch"), with the vocabulary replaced when
// vocab > 0; validated (UserError naming the file or the preset).
ModelConfig shape_config(const std::string& preset, const std::string& config_file, int64_t vocab);

// The start every command that runs a model shares (eval-lm, eval-niah, forward, generate, gradients,
// prefill, select-heads), in two halves around the command's own input checks, which add to `inputs`:
//   ModelRun run = ModelRun::begin(app, opt.model, opt.device);  // config, device, dtype, fingerprint
//   ... the command's checks; run.inputs.add(...) ...
//   ModelRun::Started started = run.start(app, opt.model, opt.device, opt.nccl_timeout);
struct ModelRun {
  ModelConfig config;     // the model's (cheap: a checkpoint's attributes)
  Device device;          // --device on this rank (resolve_device)
  DType dtype;            // the device's storage type
  RunFingerprint inputs;  // what the ranks agree on, begun with the model's fields
  static ModelRun begin(App& app, const ModelSource& source, const std::string& device_flag);

  // The weights join the fingerprint and the ranks agree on it (before the first collective); then
  // the device world is made and the model built (load_s: the build's wall time).
  struct Started {
    DeviceWorld world;
    Model model;
    double load_s = 0;
  };
  Started start(App& app, const ModelSource& source, const std::string& device_flag, double nccl_timeout);
};

}  // namespace hydra
